//! Packs the raw event chunks of a trace (recorded without --pack) as the recorder would,
//! times the packing and the decoding of both forms, and checks that the packed form
//! decodes to the same records. usage: pack_speed TRACE
use std::collections::HashMap;
use std::time::{Duration, Instant};

use fragscope_trace::reader::{Chunk, TraceReader};
use fragscope_trace::{
    ChunkDecoder, ChunkKind, ChunkWriter, EventsHeader, PackedBuffer, Packer, Record, StreamTables,
};

/// Decodes every buffer in order, hands each buffer's records to `check`, and returns
/// the calls decoded and the time spent decoding.
fn decode(
    buffers: &[(EventsHeader, Vec<u8>)],
    check: &mut dyn FnMut(usize, &[Record]),
) -> (u64, Duration) {
    let mut tables: HashMap<u32, StreamTables> = HashMap::new();
    let mut records = Vec::new();
    let mut calls = 0;
    let mut spent = Duration::ZERO;
    for (i, (h, bytes)) in buffers.iter().enumerate() {
        records.clear();
        let started = Instant::now();
        let mut d = ChunkDecoder::new(bytes, h, tables.entry(h.stream).or_default());
        while let Some(r) = d.next_record().expect("decodes") {
            calls += matches!(r, Record::Alloc { .. } | Record::Free { .. }) as u64;
            records.push(r);
        }
        spent += started.elapsed();
        check(i, &records);
    }
    (calls, spent)
}

fn main() {
    let Some(path) = std::env::args().nth(1) else {
        eprintln!("usage: pack_speed TRACE");
        std::process::exit(2);
    };
    let mut r = TraceReader::open(std::path::Path::new(&path)).expect("a trace");
    let mut raw = Vec::new();
    while let Some(c) = r.next_chunk() {
        if let Chunk::Events(h, records) = c {
            assert!(!h.packed, "record the trace without --pack");
            raw.push((h, records));
        }
    }
    let mut packers: HashMap<u32, Packer> = HashMap::new();
    let mut packed = Vec::with_capacity(raw.len());
    // Output buffers touched beforehand: the recorder reuses one, so page faults are not
    // part of packing.
    let mut outs: Vec<PackedBuffer> = raw
        .iter()
        .map(|(_, r)| PackedBuffer {
            bytes: vec![0; r.len() + 64],
            section_ends: Vec::with_capacity(16),
            tables_reset: false,
        })
        .collect();
    let started = Instant::now();
    for ((h, records), out) in raw.iter().zip(&mut outs) {
        packers
            .entry(h.stream)
            .or_default()
            .pack(h.tid, h.first_tick, records, out)
            .expect("packs");
    }
    let pack_time = started.elapsed();
    // Stored as the recorder stores them (zstd level 3): whole, or in sections.
    let level: i32 = std::env::var("LEVEL").map_or(3, |l| l.parse().unwrap());
    let started = Instant::now();
    let mut w = ChunkWriter::new(Vec::new(), level).unwrap();
    for (h, records) in &raw {
        w.write_chunk(ChunkKind::Events, &h.encode_with(records))
            .unwrap();
    }
    let raw_stored = (w.bytes_written(), started.elapsed());
    let started = Instant::now();
    let mut w = ChunkWriter::new(Vec::new(), level).unwrap();
    for ((h, _), out) in raw.iter().zip(&outs) {
        let payload = h.encode_with(&out.bytes);
        let header_len = payload.len() - out.bytes.len();
        let ends: Vec<usize> = out.section_ends.iter().map(|e| e + header_len).collect();
        w.write_sections(ChunkKind::PackedEvents, &payload, &ends)
            .unwrap();
    }
    let packed_stored = (w.bytes_written(), started.elapsed());
    for ((h, _), out) in raw.iter().zip(outs) {
        packed.push((EventsHeader { packed: true, ..*h }, out.bytes));
    }
    if std::env::var_os("PACK_ONLY").is_some() {
        println!("pack {:?}", pack_time);
        return;
    }
    let mut want = Vec::new();
    let (calls, raw_time) = decode(&raw, &mut |_, r: &[Record]| want.push(r.to_vec()));
    let (_, packed_time) = decode(&packed, &mut |i, r: &[Record]| {
        assert!(r == want[i], "buffer {i} decodes differently")
    });
    let calls = calls as f64;
    let bytes = |b: &[(EventsHeader, Vec<u8>)]| b.iter().map(|(_, r)| r.len()).sum::<usize>();
    let ns = |d: Duration| d.as_secs_f64() * 1e9 / calls;
    println!(
        "{calls} calls; raw {:.2} B/call, packed {:.2} B/call (before zstd)",
        bytes(&raw) as f64 / calls,
        bytes(&packed) as f64 / calls
    );
    println!(
        "stored (zstd {level}): raw {:.2} B/call in {:.1} ns/call, packed {:.2} B/call in {:.1} ns/call",
        raw_stored.0 as f64 / calls,
        ns(raw_stored.1),
        packed_stored.0 as f64 / calls,
        ns(packed_stored.1)
    );
    println!(
        "pack {:.1} ns/call; decode raw {:.1} ns/call, packed {:.1} ns/call",
        ns(pack_time),
        ns(raw_time),
        ns(packed_time)
    );
}
