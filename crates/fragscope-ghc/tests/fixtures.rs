//! Real eventlogs from GHC 9.0.2 (see fixtures/README.md): what they hold, and that every
//! cut or damaged copy reads back without a panic.

use fragscope_ghc::{End, Error, EventKind, Eventlog, HeapProfBreakdown};

const STRIP: &[u8] = include_bytes!("fixtures/pinned-strip-200000.eventlog");
const TAKE: &[u8] = include_bytes!("fixtures/pinned-take-200000.eventlog");

/// (time_ns, bytes) in file order.
type Series = Vec<(u64, u64)>;

fn live_and_size(log: &Eventlog) -> (Series, Series) {
    let mut live = Vec::new();
    let mut size = Vec::new();
    for e in &log.events {
        match e.kind {
            EventKind::HeapLive { bytes, .. } => live.push((e.time_ns, bytes)),
            EventKind::HeapSize { bytes, .. } => size.push((e.time_ns, bytes)),
            _ => {}
        }
    }
    (live, size)
}

#[test]
fn the_fixtures_hold_heap_gc_and_profile_events() {
    for (name, bytes) in [("strip", STRIP), ("take", TAKE)] {
        let log = Eventlog::parse(bytes).unwrap();
        assert_eq!(log.end, End::Complete, "{name}");
        assert_eq!(log.ghc_version(), Some("9.0.2"));
        let args = log.program_args().unwrap();
        assert_eq!(args[..3], ["./Pinned", "200000", name]);
        // GHC 9.0 predates BLOCKS_SIZE and MEM_RETURN.
        assert!(!log.header.declares(fragscope_ghc::tags::BLOCKS_SIZE));
        assert!(log.header.declares(fragscope_ghc::tags::HEAP_LIVE));

        let (live, size) = live_and_size(&log);
        assert!(live.len() > 30 && size.len() > 60, "{name}: {live:?}");
        for series in [&live, &size] {
            assert!(
                series.windows(2).all(|w| w[0].0 < w[1].0),
                "{name}: times rise"
            );
            // The program runs for about 0.2 s.
            assert!(series.last().unwrap().0 < 2_000_000_000);
        }
        assert!(live.iter().all(|&(_, b)| b < 64 << 20));
        assert!(
            size.iter().all(|&(_, b)| b % (1 << 20) == 0),
            "whole megablocks"
        );

        let info = log.events.iter().find_map(|e| match &e.kind {
            EventKind::HeapInfo(info) => Some(info.clone()),
            _ => None,
        });
        let info = info.unwrap();
        assert_eq!((info.megablock_bytes, info.block_bytes), (1 << 20, 4096));
        assert_eq!(info.generations, 2);

        let gcs: Vec<_> = log
            .events
            .iter()
            .filter_map(|e| match &e.kind {
                EventKind::GcStats(s) => Some(s),
                _ => None,
            })
            .collect();
        let gc_ends = log
            .events
            .iter()
            .filter(|e| e.kind == EventKind::GcEnd)
            .count();
        assert_eq!(gcs.len(), gc_ends);
        assert!(gcs.iter().any(|s| s.generation == 0));
        assert!(gcs.iter().any(|s| s.generation == 1));
        assert!(gcs
            .iter()
            .all(|s| s.parallel_balanced_copied_bytes.is_some()));
        assert!(gcs.iter().any(|s| s.frag_bytes > 1 << 20));

        // File order is nearly time order: GHC 9.0 writes GC_END, stamped when the
        // collection ended, after the GC_STATS_GHC stamped a little later.
        let mut gc_start = None;
        for (i, e) in log.events.iter().enumerate() {
            match e.kind {
                EventKind::GcStart => gc_start = Some(e.time_ns),
                EventKind::GcEnd => {
                    assert!(e.time_ns >= gc_start.take().unwrap());
                    assert!(matches!(log.events[i - 1].kind, EventKind::GcStats(_)));
                    assert!(log.events[i - 1].time_ns >= e.time_ns);
                }
                _ => {}
            }
        }
        let mut sorted = Eventlog::parse(bytes).unwrap();
        sorted.sort_by_time();
        assert!(sorted
            .events
            .windows(2)
            .all(|w| w[0].time_ns <= w[1].time_ns));

        let profile = log.heap_profile();
        assert_eq!(profile.breakdown, Some(HeapProfBreakdown::ClosureType));
        assert_eq!(profile.sampling_period_ns, Some(10_000_000));
        assert!(profile.samples.len() >= 5, "{name}");
        assert_eq!(profile.stray_entries, 0);
        let arr_words = profile.find_label("ARR_WORDS").unwrap();
        for s in &profile.samples {
            assert!(s.end_time_ns.unwrap() >= s.time_ns);
            assert!(s.bytes_of(arr_words) > 0);
            assert!(s.total_bytes() > s.bytes_of(arr_words));
        }
        assert!(profile
            .labels()
            .any(|(_, l)| l.ends_with("ByteString.Internal.PS")));
    }
}

/// Seed 000 in small: after the drop, `strip` keeps far more pinned ARR_WORDS and live
/// data than `take`, although both keep a tenth of the ByteStrings.
#[test]
fn strip_keeps_pinned_blocks_that_take_releases() {
    let last_plateau = |bytes: &[u8]| {
        let log = Eventlog::parse(bytes).unwrap();
        let profile = log.heap_profile();
        let arr_words = profile.find_label("ARR_WORDS").unwrap();
        let last = profile.samples.last().unwrap().bytes_of(arr_words);
        let (live, _) = live_and_size(&log);
        // The last HEAP_LIVE is the collection at exit, after the subset died.
        (last, live[live.len() - 2].1)
    };
    let (strip_arr_words, strip_live) = last_plateau(STRIP);
    let (take_arr_words, take_live) = last_plateau(TAKE);
    assert!(strip_arr_words >= 3 * take_arr_words);
    assert!(strip_live >= 3 * take_live);
}

fn header_len(bytes: &[u8]) -> usize {
    bytes.windows(4).position(|w| w == b"datb").unwrap() + 4
}

#[test]
fn a_fixture_cut_at_any_byte_reads_its_whole_events() {
    for bytes in [STRIP, TAKE] {
        let all = Eventlog::parse(bytes).unwrap().events.len();
        let header = header_len(bytes);
        let mut previous = 0;
        for cut in 0..bytes.len() {
            match Eventlog::parse(&bytes[..cut]) {
                Ok(log) => {
                    assert!(cut >= header, "cut at {cut}");
                    assert!(log.is_truncated(), "cut at {cut}");
                    let n = log.events.len();
                    assert!(n >= previous && n <= all, "cut at {cut}: {n} events");
                    match log.end {
                        End::Truncated { offset } => assert!(offset <= cut as u64),
                        End::Complete => unreachable!(),
                    }
                    previous = n;
                }
                Err(Error::TruncatedHeader { offset }) => {
                    assert!(cut < header && offset <= cut as u64, "cut at {cut}");
                }
                Err(e) => panic!("cut at {cut}: {e}"),
            }
        }
        assert_eq!(
            previous, all,
            "one byte short of the end loses only the terminator"
        );
    }
}

#[test]
fn flipped_bits_and_spliced_bytes_never_panic() {
    let mut x = 0x9E3779B97F4A7C15u64;
    let mut next = move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    for round in 0..4000 {
        let mut data = if round % 2 == 0 { STRIP } else { TAKE }.to_vec();
        match round % 3 {
            0 => {
                let at = (next() as usize) % data.len();
                data[at] ^= 1 << (next() % 8);
            }
            1 => {
                let at = (next() as usize) % data.len();
                let len = (next() as usize % 64).min(data.len() - at);
                for b in &mut data[at..at + len] {
                    *b = next() as u8;
                }
            }
            _ => {
                let from = (next() as usize) % data.len();
                let to = (next() as usize) % data.len();
                let len = (next() as usize % 512).min(data.len() - from.max(to));
                data.copy_within(from..from + len, to);
            }
        }
        if let Ok(log) = Eventlog::parse_intact(&data) {
            let _ = log.heap_profile();
            let _ = log.ghc_version();
            if let Some(e) = &log.corruption {
                assert!(e.offset().is_some());
                assert!(!e.to_string().is_empty());
            }
        }
        let _ = Eventlog::parse(&data);
    }
}
