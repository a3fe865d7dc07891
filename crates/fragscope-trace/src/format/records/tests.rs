//! Round trips of the process and memory payloads, whole and cut.

use super::*;

#[test]
fn every_payload_round_trips() {
    let meta = Meta {
        fragscope_version: "0.1.0".into(),
        start_unix_ns: 1_700_000_000_000_000_000,
        tick_ns: 1_000_000,
        page_size: 4096,
        stacks: StackMode::All,
        sample_bytes: 524288,
        snapshot_ms: 1000,
        argv: vec!["./a".into(), "b c".into()],
        hostname: "h".into(),
        ghc_eventlog: None,
        aggregated: false,
    };
    assert_eq!(Meta::decode(&meta.encode()).unwrap(), meta);
    let untraced = Untraced {
        pid: 42,
        parent_stream: Some(3),
        tick: 17,
        path: "/usr/bin/passwd".into(),
        argv: vec!["passwd".into(), "-S".into()],
        reason: "it is set-user-ID".into(),
    };
    assert_eq!(Untraced::decode(&untraced.encode()).unwrap(), untraced);
    let ghc = Meta {
        ghc_eventlog: Some("run.eventlog".into()),
        ..meta.clone()
    };
    assert_eq!(Meta::decode(&ghc.encode()).unwrap(), ghc);
    let aggregated = Meta {
        aggregated: true,
        ..meta.clone()
    };
    assert_eq!(Meta::decode(&aggregated.encode()).unwrap(), aggregated);
    // A Meta written before `aggregated` existed ends at the eventlog, and one written
    // before that at the hostname.
    let mut old = aggregated.encode();
    old.pop();
    assert_eq!(Meta::decode(&old).unwrap(), meta);
    old.pop();
    assert_eq!(Meta::decode(&old).unwrap(), meta);
    let p = Process {
        stream: 3,
        pid: 42,
        ppid: 1,
        origin: Origin::Forked,
        parent_stream: Some(0),
        start_tick: 9,
        argv: vec!["x".into()],
        exe: "/bin/x".into(),
        fork_mark: Some(7),
    };
    assert_eq!(Process::decode(&p.encode()).unwrap(), p);
    // A Process written before the fork mark existed ends at the exe.
    let mut old = p.encode();
    old.pop();
    let unmarked = Process {
        fork_mark: None,
        ..p.clone()
    };
    assert_eq!(Process::decode(&old).unwrap(), unmarked);
    assert_eq!(Process::decode(&unmarked.encode()).unwrap(), unmarked);
    let maps = Maps {
        stream: 1,
        tick: 5,
        mappings: vec![Mapping {
            start: 0x1000,
            end: 0x3000,
            perms: "r-xp".into(),
            offset: 0,
            inode: 77,
            path: "/lib/x.so".into(),
            build_id: vec![1, 2, 3],
        }],
    };
    assert_eq!(Maps::decode(&maps.encode()).unwrap(), maps);
    let rss = RssBatch {
        stream: 0,
        samples: vec![
            RssSample {
                tick: 10,
                vm_rss_kib: 100,
                rss_anon_kib: 50,
                rss_file_kib: 50,
                rss_shmem_kib: 0,
            },
            RssSample {
                tick: 20,
                vm_rss_kib: 200,
                rss_anon_kib: 150,
                rss_file_kib: 50,
                rss_shmem_kib: 0,
            },
        ],
    };
    assert_eq!(RssBatch::decode(&rss.encode()).unwrap(), rss);
    let pm = Pagemap {
        stream: 0,
        tick: 3,
        reason: SnapshotReason::Exit,
        page_size: 4096,
        ranges: vec![ResidentRange {
            start: 0x10000,
            pages: 10,
            resident: vec![0b101, 0b10],
            shared: Vec::new(),
        }],
    };
    let back = Pagemap::decode(&pm.encode()).unwrap();
    assert_eq!(back, pm);
    assert_eq!(back.ranges[0].is_shared(0), None);
    // With the shared pages: page 2 shared; page 1's bit is ignored (not resident).
    let mut with_shared = pm.clone();
    with_shared.ranges[0].shared = vec![0b110, 0];
    let back_shared = Pagemap::decode(&with_shared.encode()).unwrap();
    assert_eq!(back_shared, with_shared);
    assert_eq!(back_shared.ranges[0].is_shared(2), Some(true));
    assert_eq!(back_shared.ranges[0].is_shared(1), Some(false));
    assert_eq!(back_shared.ranges[0].is_shared(0), Some(false));
    assert_eq!(back_shared.ranges[0].shared_pages(), 1);
    // A reader that stops before the tail (an older one) reads the ranges alone.
    let bytes = with_shared.encode();
    assert_eq!(bytes[..pm.encode().len()], pm.encode()[..]);
    assert!(
        back.ranges[0].is_resident(0)
            && !back.ranges[0].is_resident(1)
            && back.ranges[0].is_resident(9)
    );
    assert_eq!(back.ranges[0].resident_pages(), 3);
    let end = ProcessEnd {
        stream: 2,
        tick: 4,
        how: EndHow::QuickExit,
        status: -3,
    };
    assert_eq!(ProcessEnd::decode(&end.encode()).unwrap(), end);
    let ws = WaitStatus {
        pid: 5,
        tick: 6,
        exit_code: None,
        signal: Some(9),
    };
    assert_eq!(WaitStatus::decode(&ws.encode()).unwrap(), ws);
}

#[test]
fn truncated_payloads_are_errors_not_panics() {
    let p = Process {
        stream: 3,
        pid: 42,
        ppid: 1,
        origin: Origin::Started,
        parent_stream: None,
        start_tick: 9,
        argv: vec!["abc".into()],
        exe: "/bin/x".into(),
        fork_mark: None,
    };
    let bytes = p.encode();
    // Cut at the last byte, it reads as a Process from before the fork mark.
    for cut in 0..bytes.len() - 1 {
        assert!(Process::decode(&bytes[..cut]).is_err(), "cut at {cut}");
    }
}
