//! Hand-written logs: the events GHC 9.2+ adds, other RTS layouts, blocks, and the errors.

mod common;

use common::{nul_terminated, LogBuilder, GHC_9_2};
use fragscope_ghc::{
    End, Error, Event, EventKind, EventReader, Eventlog, GcStats, HeapInfo, HeapProfBreakdown,
};

fn kinds(log: &Eventlog) -> Vec<&EventKind> {
    log.events.iter().map(|e| &e.kind).collect()
}

#[test]
fn decodes_the_memory_events_of_a_ghc_9_2_log() {
    let mut b = LogBuilder::new(GHC_9_2);
    b.begin_block(0xffff)
        .event(
            29,
            1,
            &[fields![u32: 1], b"GHC-9.2.8 rts_thr\0".to_vec()].concat(),
        )
        .event(
            30,
            2,
            &[fields![u32: 1], b"./prog\0a b\0-x\0".to_vec()].concat(),
        )
        .event(
            52,
            3,
            &fields![u32: 1, u16: 2, u64: 0, u64: 4 << 20, u64: 1 << 20, u64: 4096],
        )
        .end_block();
    b.begin_block(0)
        .event(9, 100, &[])
        .event(10, 200, &[])
        .event(
            53,
            201,
            &fields![u32: 1, u16: 1, u64: 1000, u64: 20, u64: 3000, u32: 2, u64: 600, u64: 1000, u64: 900],
        )
        .event(50, 202, &fields![u32: 1, u64: 8 << 20])
        .event(91, 203, &fields![u32: 1, u64: 5 << 20])
        .event(51, 204, &fields![u32: 1, u64: 3 << 20])
        .event(90, 205, &fields![u32: 1, u32: 8, u32: 6, u32: 2])
        .event(49, 206, &fields![u32: 1, u64: 123_456])
        .end_block();
    let log = Eventlog::parse(&b.finish()).unwrap();
    assert_eq!(log.end, End::Complete);
    assert!(!log.is_truncated());
    assert_eq!(log.rts_identifier(), Some("GHC-9.2.8 rts_thr"));
    assert_eq!(log.ghc_version(), Some("9.2.8"));
    assert_eq!(
        log.program_args().unwrap(),
        ["./prog".to_owned(), "a b".into(), "-x".into()]
    );
    assert_eq!(
        kinds(&log)[2..],
        [
            &EventKind::HeapInfo(Box::new(HeapInfo {
                heap_capset: 1,
                generations: 2,
                max_heap_bytes: 0,
                alloc_area_bytes: 4 << 20,
                megablock_bytes: 1 << 20,
                block_bytes: 4096,
            })),
            &EventKind::GcStart,
            &EventKind::GcEnd,
            &EventKind::GcStats(Box::new(GcStats {
                heap_capset: 1,
                generation: 1,
                copied_bytes: 1000,
                slop_bytes: 20,
                frag_bytes: 3000,
                parallel_threads: 2,
                parallel_max_copied_bytes: 600,
                parallel_total_copied_bytes: 1000,
                parallel_balanced_copied_bytes: Some(900),
            })),
            &EventKind::HeapSize {
                heap_capset: 1,
                bytes: 8 << 20
            },
            &EventKind::BlocksSize {
                heap_capset: 1,
                bytes: 5 << 20
            },
            &EventKind::HeapLive {
                heap_capset: 1,
                bytes: 3 << 20
            },
            &EventKind::MemReturn {
                heap_capset: 1,
                current_megablocks: 8,
                needed_megablocks: 6,
                returned_megablocks: 2,
            },
            &EventKind::HeapAllocated {
                heap_capset: 1,
                bytes: 123_456
            },
        ]
    );
    assert_eq!(log.events[0].capability, None, "global buffer");
    assert_eq!(log.events[3].capability, Some(0));
    assert_eq!(log.events[3].time_ns, 100);
    assert!(log.header.declares(fragscope_ghc::tags::BLOCKS_SIZE));
}

#[test]
fn unknown_types_are_skipped_by_their_declared_size() {
    let mut b = LogBuilder::new(GHC_9_2);
    b.begin_block(1)
        .event(1000, 5, &[0xff; 5])
        .event(1001, 6, &[0xff; 300])
        .event(1, 7, &fields![u32: 42])
        .event(51, 8, &fields![u32: 0, u64: 77])
        .end_block();
    let log = Eventlog::parse(&b.finish()).unwrap();
    assert_eq!(
        kinds(&log),
        [
            &EventKind::Other { tag: 1000 },
            &EventKind::Other { tag: 1001 },
            &EventKind::Other { tag: 1 },
            &EventKind::HeapLive {
                heap_capset: 0,
                bytes: 77
            },
        ]
    );
    assert!(log.events.iter().all(|e| e.capability == Some(1)));
}

#[test]
fn older_and_newer_layouts_of_known_events() {
    // GC_STATS_GHC without the balanced-copied field (RTSs before 8.4), and HEAP_LIVE
    // with a field a future RTS might append.
    let mut types = GHC_9_2.to_vec();
    for t in &mut types {
        match t.0 {
            53 => t.1 = Some(50),
            51 => t.1 = Some(20),
            50 => t.1 = Some(4), // too short for the known layout
            _ => {}
        }
    }
    let mut b = LogBuilder::new(&types);
    b.event(
        53,
        1,
        &fields![u32: 0, u16: 0, u64: 1, u64: 2, u64: 3, u32: 1, u64: 1, u64: 1],
    )
    .event(51, 2, &fields![u32: 0, u64: 99, u64: 0xdead])
    .event(50, 3, &fields![u32: 0]);
    let log = Eventlog::parse(&b.finish()).unwrap();
    match &log.events[0].kind {
        EventKind::GcStats(s) => {
            assert_eq!((s.copied_bytes, s.slop_bytes, s.frag_bytes), (1, 2, 3));
            assert_eq!(s.parallel_balanced_copied_bytes, None);
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(
        log.events[1].kind,
        EventKind::HeapLive {
            heap_capset: 0,
            bytes: 99
        }
    );
    assert_eq!(log.events[2].kind, EventKind::Other { tag: 50 });
    assert_eq!(log.events[2].capability, None, "outside any block");
}

#[test]
fn heap_profile_censuses_are_grouped_per_sample() {
    let mut b = LogBuilder::new(GHC_9_2);
    let string_sample =
        |bytes: u64, label: &str| [fields![u8: 0, u64: bytes], nul_terminated(label)].concat();
    let begin = [
        fields![u8: 0, u64: 10_000_000, u32: 7],
        nul_terminated("").repeat(7),
    ]
    .concat();
    b.begin_block(0xffff)
        .event(160, 1, &begin)
        .event(162, 10, &fields![u64: 0])
        .event(164, 11, &string_sample(4096, "ARR_WORDS"))
        .event(164, 11, &string_sample(100, "THUNK"))
        .event(165, 12, &fields![u64: 0])
        .event(162, 20, &fields![u64: 1])
        .event(164, 21, &string_sample(8192, "ARR_WORDS"))
        .event(165, 22, &fields![u64: 1])
        .event(
            161,
            23,
            &[
                fields![u32: 7],
                nul_terminated("f"),
                nul_terminated("Main"),
                nul_terminated("Main.hs:3:1"),
                fields![u8: 0],
            ]
            .concat(),
        )
        .event(162, 30, &fields![u64: 2])
        .event(163, 31, &fields![u8: 0, u64: 64, u8: 2, u32: 7, u32: 9])
        .end_block();
    let log = Eventlog::parse(&b.unterminated()).unwrap();
    assert!(log.is_truncated());
    let profile = log.heap_profile();
    assert_eq!(profile.breakdown, Some(HeapProfBreakdown::ClosureType));
    assert_eq!(profile.sampling_period_ns, Some(10_000_000));
    assert_eq!(profile.samples.len(), 3);
    let arr_words = profile.find_label("ARR_WORDS").unwrap();
    assert_eq!(profile.label(arr_words), "ARR_WORDS");
    let s = &profile.samples;
    assert_eq!((s[0].time_ns, s[0].end_time_ns), (10, Some(12)));
    assert_eq!((s[0].total_bytes(), s[0].bytes_of(arr_words)), (4196, 4096));
    assert_eq!((s[1].era, s[1].bytes_of(arr_words)), (1, 8192));
    assert_eq!(s[2].end_time_ns, None, "the log stops inside the census");
    assert_eq!(profile.label(s[2].entries[0].label), "f/#9");
    assert_eq!(profile.stray_entries, 0);
}

#[test]
fn a_cut_log_keeps_its_whole_events() {
    let mut b = LogBuilder::new(GHC_9_2);
    b.begin_block(0);
    b.event(51, 1, &fields![u32: 0, u64: 1]);
    let whole = b.len();
    b.event(51, 2, &fields![u32: 0, u64: 2]).end_block();
    let bytes = b.finish();
    let log = Eventlog::parse(&bytes[..whole + 7]).unwrap();
    assert_eq!(log.events.len(), 1);
    assert_eq!(
        log.end,
        End::Truncated {
            offset: whole as u64
        }
    );
    // A cut exactly between events is a truncation too: no terminator.
    let log = Eventlog::parse(&bytes[..whole]).unwrap();
    assert_eq!(log.events.len(), 1);
    assert!(log.is_truncated());
}

#[test]
fn the_header_must_be_whole_and_well_formed() {
    let bytes = LogBuilder::new(GHC_9_2).finish();
    assert!(matches!(
        Eventlog::parse(b""),
        Err(Error::TruncatedHeader { offset: 0 })
    ));
    assert!(matches!(
        Eventlog::parse(&bytes[..40]),
        Err(Error::TruncatedHeader { .. })
    ));
    let e = Eventlog::parse(b"\x7fELF\x02\x01\x01\0").unwrap_err();
    assert!(matches!(e, Error::NotAnEventlog { .. }));
    assert!(e.to_string().contains("not a GHC eventlog"), "{e}");
    let mut damaged = bytes.clone();
    damaged[8..12].copy_from_slice(b"xxxx"); // the first "etb\0"
    let e = Eventlog::parse(&damaged).unwrap_err();
    assert_eq!(e.offset(), Some(8));
    assert!(e.to_string().contains("corrupt eventlog at byte 8"), "{e}");
}

#[test]
fn corruption_gives_its_offset_and_keeps_what_came_before() {
    let mut b = LogBuilder::new(GHC_9_2);
    b.event(51, 1, &fields![u32: 0, u64: 1]);
    let bad = b.len();
    let mut bytes = b.event(51, 2, &fields![u32: 0, u64: 2]).finish();
    bytes[bad..bad + 2].copy_from_slice(&777u16.to_be_bytes());

    let e = Eventlog::parse(&bytes).unwrap_err();
    assert_eq!(e.offset(), Some(bad as u64));
    assert!(
        e.to_string().contains("event type 777 is not declared"),
        "{e}"
    );
    let log = Eventlog::parse_intact(&bytes).unwrap();
    assert_eq!(log.events.len(), 1);
    assert_eq!(log.end, End::Truncated { offset: bad as u64 });
    assert!(log.corruption.is_some());
}

#[test]
fn events_must_stay_inside_their_block() {
    let mut b = LogBuilder::new(GHC_9_2);
    let marker = b.len();
    b.begin_block(0)
        .event(51, 1, &fields![u32: 0, u64: 1])
        .end_block();
    let mut bytes = b.event(51, 2, &fields![u32: 0, u64: 2]).finish();
    // Shrink the block so that its event overruns it.
    bytes[marker + 10..marker + 14].copy_from_slice(&30u32.to_be_bytes());
    let e = Eventlog::parse(&bytes).unwrap_err();
    assert!(e.to_string().contains("past the end of the block"), "{e}");

    bytes[marker + 10..marker + 14].copy_from_slice(&3u32.to_be_bytes());
    let e = Eventlog::parse(&bytes).unwrap_err();
    assert_eq!(e.offset(), Some(marker as u64));
}

/// A reader that returns one byte per call, like a slow pipe.
struct Trickle<'a>(&'a [u8]);

impl std::io::Read for Trickle<'_> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        if self.0.is_empty() || buf.is_empty() {
            return Ok(0);
        }
        buf[0] = self.0[0];
        self.0 = &self.0[1..];
        Ok(1)
    }
}

#[test]
fn streaming_from_a_slow_reader_gives_the_same_events() {
    let mut b = LogBuilder::new(GHC_9_2);
    b.begin_block(3);
    for i in 0..50u64 {
        b.event(51, i, &fields![u32: 0, u64: i * 1000])
            .event(1001, i, &vec![7; i as usize]);
    }
    b.end_block();
    let bytes = b.finish();
    let whole = Eventlog::parse(&bytes).unwrap();
    let mut reader = EventReader::new(Trickle(&bytes)).unwrap();
    let streamed: Vec<Event> = reader.by_ref().collect::<Result<_, _>>().unwrap();
    assert_eq!(streamed, whole.events);
    assert_eq!(reader.end(), Some(End::Complete));
    assert_eq!(reader.offset(), bytes.len() as u64);
}
