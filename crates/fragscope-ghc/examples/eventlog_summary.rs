//! Prints what an eventlog holds: `cargo run -p fragscope-ghc --example eventlog_summary -- prog.eventlog`

use std::collections::BTreeMap;

use fragscope_ghc::{End, EventKind, Eventlog};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let path = std::env::args()
        .nth(1)
        .ok_or("usage: eventlog_summary FILE")?;
    let log = Eventlog::parse_intact(&std::fs::read(&path)?)?;
    println!(
        "{path}: {} event types declared",
        log.header.event_types().len()
    );
    println!(
        "rts: {:?}, args: {:?}",
        log.rts_identifier(),
        log.program_args()
    );
    match (&log.end, &log.corruption) {
        (_, Some(e)) => println!("stopped: {e}"),
        (End::Truncated { offset }, None) => println!("truncated at byte {offset}"),
        (End::Complete, None) => println!("complete"),
    }
    let mut counts: BTreeMap<String, usize> = BTreeMap::new();
    for e in &log.events {
        let name = match &e.kind {
            EventKind::Other { tag } => format!("Other({tag})"),
            kind => format!("{kind:?}")
                .split([' ', '(', '{'])
                .next()
                .unwrap_or("")
                .to_owned(),
        };
        *counts.entry(name).or_default() += 1;
    }
    for (name, n) in &counts {
        println!("{n:>8}  {name}");
    }
    for e in &log.events {
        match &e.kind {
            EventKind::HeapLive { bytes, .. } => println!("{:>12} ns  live {bytes}", e.time_ns),
            EventKind::HeapSize { bytes, .. } => println!("{:>12} ns  size {bytes}", e.time_ns),
            EventKind::BlocksSize { bytes, .. } => println!("{:>12} ns  blocks {bytes}", e.time_ns),
            EventKind::GcStats(s) => println!(
                "{:>12} ns  gc gen {} copied {} slop {} frag {}",
                e.time_ns, s.generation, s.copied_bytes, s.slop_bytes, s.frag_bytes
            ),
            _ => {}
        }
    }
    let profile = log.heap_profile();
    println!(
        "heap profile: {:?}, {} samples",
        profile.breakdown,
        profile.samples.len()
    );
    for s in &profile.samples {
        let mut entries = s.entries.clone();
        entries.sort_by_key(|e| std::cmp::Reverse(e.residency_bytes));
        let top: Vec<String> = entries
            .iter()
            .take(3)
            .map(|e| format!("{} {}", profile.label(e.label), e.residency_bytes))
            .collect();
        println!(
            "{:>12} ns  era {} total {}  {}",
            s.time_ns,
            s.era,
            s.total_bytes(),
            top.join(", ")
        );
    }
    Ok(())
}
