//! The merge's order against what each thread recorded, in memory and spilled.

use super::*;
use crate::format::wire::Writer;

/// A thread buffer of (is_free, address) calls at one tick.
fn chunk(tid: u32, tick: u64, calls: &[(bool, u64)]) -> (EventsHeader, Vec<u8>) {
    buffer(
        tid,
        tick,
        calls.iter().map(|&(is_free, addr)| (is_free, addr, None)),
    )
}

/// A thread buffer of (is_free, address, order counter read) calls at one tick, as
/// the interposer writes them once a process has two threads: an order record before
/// the first call and before each call whose reading is not the one the thread expects.
fn ordered(tid: u32, tick: u64, calls: &[(bool, u64, u64)]) -> (EventsHeader, Vec<u8>) {
    buffer(
        tid,
        tick,
        calls.iter().map(|&(f, a, read)| (f, a, Some(read))),
    )
}

/// A thread buffer at one tick of calls (is_free, address, order counter read if any).
fn buffer(
    tid: u32,
    tick: u64,
    calls: impl IntoIterator<Item = (bool, u64, Option<u64>)>,
) -> (EventsHeader, Vec<u8>) {
    let mut w = Writer::new();
    let (mut prev, mut expected) = (0u64, None);
    for (is_free, addr, read) in calls {
        if let Some(read) = read.filter(|&r| expected != Some(r)) {
            w.u8(10 | 0x20).varint(read - expected.unwrap_or(0));
        }
        expected = read.map(|r| r.saturating_add(u64::from(is_free)));
        w.u8(if is_free { 9 } else { 0 });
        w.svarint((addr.wrapping_sub(prev) as i64) / 16);
        prev = addr;
        if !is_free {
            w.varint(32);
        }
    }
    (
        EventsHeader {
            tid,
            first_tick: tick,
            last_tick: tick,
            ..Default::default()
        },
        w.bytes,
    )
}

fn drain(m: &mut Merger) -> Vec<Call> {
    m.finish();
    let mut out = Vec::new();
    while let Some(x) = m.pop() {
        if let Merged::Call(c) = x {
            out.push(c);
        }
    }
    out
}

/// Merges the chunks, pushed in this order, to the end.
fn merge_all(chunks: impl IntoIterator<Item = (EventsHeader, Vec<u8>)>) -> (Vec<Call>, MergeStats) {
    let mut m = Merger::new();
    for (h, b) in chunks {
        m.push_chunk(&h, &b).unwrap();
    }
    let calls = drain(&mut m);
    (calls, m.stats())
}

/// `records` after a joined record: this thread joined thread `tid`.
fn after_joining(tid: u32, records: Vec<u8>) -> Vec<u8> {
    let mut w = Writer::new();
    w.u8(14 | 0x10).varint(tid.into());
    w.bytes.extend_from_slice(&records);
    w.bytes
}

/// Thread 2 allocates 0x5000 and frees it last; thread 3 then gets 0x5000. All in
/// one tick; thread 3's buffer is read first, and it wins a tie.
fn handed_over_in_one_tick() -> [(EventsHeader, Vec<u8>); 2] {
    let two = chunk(
        2,
        2,
        &[
            (false, 0x7000),
            (false, 0x5000),
            (false, 0x6000),
            (true, 0x5000),
        ],
    );
    let two = (
        EventsHeader {
            thread_exited: true,
            ..two.0
        },
        two.1,
    );
    [chunk(3, 2, &[(false, 0x5000)]), two]
}

fn assert_never_live_twice(calls: &[Call]) {
    let mut live = AddrSet::default();
    for c in calls {
        if let Some(a) = c.releases() {
            assert!(live.remove(&a), "free of {a:#x} not live: {c:?}");
        }
        if let Some(a) = c.allocates() {
            assert!(live.insert(a), "{a:#x} allocated while live: {c:?}");
        }
    }
}

/// Buffers of `THREADS` threads that free each other's blocks, reusing addresses at
/// once, 400 calls a tick for 30 ticks, in the order they arrive (any order within a
/// tick).
fn blocks_handed_between_threads() -> Vec<(EventsHeader, Vec<u8>)> {
    let mut x = 0x9E37_79B9_7F4A_7C15u64;
    let mut rand = move |n: u64| crate::xorshift(&mut x) % n;
    const THREADS: u32 = 40;
    let mut counter = 0u64;
    let mut pool: Vec<u64> = (1..=64).map(|i| i * 0x40).collect();
    let mut live: Vec<u64> = Vec::new();
    let mut pending: Vec<Vec<(bool, u64, u64)>> = vec![Vec::new(); THREADS as usize];
    let mut arrivals = Vec::new();
    for tick in 1..=30u64 {
        for _ in 0..400 {
            // The first tick is the main thread's, before it starts the others (whose
            // buffers the merge could not wait for before it knows them).
            let t = if tick == 1 {
                0
            } else {
                rand(u64::from(THREADS)) as usize
            };
            if live.is_empty() || (!pool.is_empty() && rand(2) == 0) {
                let addr = pool.pop().unwrap();
                live.push(addr);
                pending[t].push((false, addr, counter));
            } else {
                let addr = live.swap_remove(rand(live.len() as u64) as usize);
                pending[t].push((true, addr, counter));
                counter += 1;
                pool.push(addr);
            }
        }
        // Each thread's buffer of this tick goes out now or never; they arrive in
        // any order.
        let mut sent: Vec<_> = (0..THREADS)
            .zip(pending.iter_mut())
            .filter(|(_, calls)| !calls.is_empty())
            .map(|(t, calls)| ordered(t + 1, tick, &std::mem::take(calls)))
            .collect();
        while !sent.is_empty() {
            arrivals.push(sent.swap_remove(rand(sent.len() as u64) as usize));
        }
    }
    arrivals
}

/// Taking a run of one thread's calls without scanning every thread gives the same
/// merge as scanning for every call.
#[test]
fn runs_merge_as_a_scan_for_every_call_would() {
    let arrivals = blocks_handed_between_threads();
    let mut reference = Merger::new();
    reference.scan_every_call = true;
    let mut runs = Merger::new();
    let (mut want, mut got) = (Vec::new(), Vec::new());
    for (h, b) in &arrivals {
        for (m, out) in [(&mut reference, &mut want), (&mut runs, &mut got)] {
            m.push_chunk(h, b).unwrap();
            while let Some(Merged::Call(c)) = m.pop() {
                out.push(c);
            }
        }
        assert_eq!(got, want);
    }
    want.extend(drain(&mut reference));
    got.extend(drain(&mut runs));
    assert_eq!(got.len(), 12_000);
    assert_eq!(got, want);
    assert_eq!(runs.stats(), reference.stats());
    assert_never_live_twice(&got);
}

/// Calls held back past a memory budget of a few calls wait on disk and come back
/// in the same merge as with all of them in memory.
#[test]
fn calls_spilled_past_the_memory_budget_merge_as_in_memory() {
    let arrivals = blocks_handed_between_threads();
    let mut in_memory = Merger::with_memory_budget(usize::MAX);
    let mut spilling = Merger::with_memory_budget(0);
    let (mut want, mut got) = (Vec::new(), Vec::new());
    for (h, b) in &arrivals {
        for (m, out) in [(&mut in_memory, &mut want), (&mut spilling, &mut got)] {
            m.push_chunk(h, b).unwrap();
            while let Some(Merged::Call(c)) = m.pop() {
                out.push(c);
                assert_queue_room_counted(m);
            }
        }
    }
    want.extend(drain(&mut in_memory));
    got.extend(drain(&mut spilling));
    assert_queue_room_counted(&spilling);
    assert_eq!(got.len(), 12_000);
    assert_eq!(got, want);
    assert!(spilling.stats().spilled > 1000, "{:?}", spilling.stats());
    assert_eq!(in_memory.stats().spilled, 0);
    assert_eq!(
        MergeStats {
            spilled: 0,
            ..spilling.stats()
        },
        in_memory.stats()
    );
    assert_never_live_twice(&got);
}

/// The room the merger counts in its threads' queues, which decides when they shrink,
/// is the room they hold, calls read back from disk included.
fn assert_queue_room_counted(m: &Merger) {
    let held: usize = m.threads.iter().map(|t| t.queue.capacity()).sum();
    assert_eq!(m.queue_capacity, held);
}

/// One thread allocates a block and its buffer reaches the trace only after another
/// thread's millions of calls, the last of which frees that block: the merge waits
/// for the slow thread however many calls pile up, and forces nothing.
#[test]
fn a_slow_thread_is_waited_for_however_many_calls_pile_up() {
    const CALLS: u64 = 3_000_000;
    let fast = (0..CALLS / 2).flat_map(|i| {
        let addr = 0x10_0000 + (i % 1000) * 0x40;
        [(false, addr, Some(i + 1)), (true, addr, Some(i + 1))]
    });
    let handed = std::iter::once((true, 0x5000, Some(CALLS / 2 + 1)));
    let mut fast = buffer(2, 5, fast.chain(handed));
    fast.0.last_tick = 900;
    let mut m = Merger::new();
    let mut calls = Vec::new();
    let first = ordered(1, 1, &[(false, 0x4000, 0)]);
    let slow = ordered(1, 1, &[(false, 0x5000, 0)]);
    for (h, b) in [first, fast, slow] {
        m.push_chunk(&h, &b).unwrap();
        while let Some(Merged::Call(c)) = m.pop() {
            calls.push(c);
        }
    }
    calls.extend(drain(&mut m));
    let stats = m.stats();
    assert_eq!(calls.len() as u64, CALLS + 3);
    assert_eq!((calls[0].addr, calls[1].addr), (0x4000, 0x5000));
    assert_eq!(
        stats.forced_allocs + stats.unknown_frees + stats.late,
        0,
        "{stats:?}"
    );
    assert!(stats.spilled > 2_000_000, "{stats:?}");
    assert_never_live_twice(&calls);
}

/// A thread that was idle with nothing buffered when another thread sent an empty
/// chunk for it is not waited for: the other threads' calls go on being merged.
#[test]
fn an_idle_thread_is_not_waited_for() {
    let merged_before_finish = |idle: bool| {
        let mut m = Merger::new();
        let (h, b) = chunk(1, 1, &[(false, 0x1000)]);
        m.push_chunk(&h, &b).unwrap();
        let (h, b) = chunk(1, 2, &[]);
        m.push_chunk(
            &EventsHeader {
                seq: 1,
                thread_idle: idle,
                ..h
            },
            &b,
        )
        .unwrap();
        for tick in 2..6 {
            let (h, b) = chunk(2, tick, &[(false, 0x2000 + tick * 0x100)]);
            m.push_chunk(&h, &b).unwrap();
        }
        let mut merged = 0;
        while m.pop().is_some() {
            merged += 1;
        }
        merged
    };
    // Thread 2's last call may wait for its own next buffer, not for thread 1's.
    assert!(merged_before_finish(true) >= 4);
    assert_eq!(merged_before_finish(false), 1);
}

/// A thread silent for two seconds while the others go on: in a process that flags
/// its idle threads it is inside a call (preempted), and the merge waits for its
/// calls, however late they come; elsewhere it may be idle, and after the wait
/// window the others' calls go without it (its late call then counts as late).
#[test]
fn a_silent_thread_of_a_process_that_flags_idle_threads_is_waited_for() {
    let merge = |marks_idle: bool| {
        let mut m = Merger::new();
        let mark = |(h, b): (EventsHeader, Vec<u8>)| {
            (
                EventsHeader {
                    process_marks_idle: marks_idle,
                    ..h
                },
                b,
            )
        };
        let (h, b) = mark(chunk(1, 1, &[(false, 0x1000)]));
        m.push_chunk(&h, &b).unwrap();
        let mut merged = Vec::new();
        for tick in (2..2_000).step_by(100) {
            let (h, b) = mark(chunk(2, tick, &[(false, 0x2000 + tick * 0x100)]));
            m.push_chunk(&h, &b).unwrap();
            while let Some(Merged::Call(c)) = m.pop() {
                merged.push(c);
            }
        }
        // Thread 1 comes back with the call it was making at tick 50.
        let (h, b) = mark(chunk(1, 50, &[(false, 0x3000)]));
        m.push_chunk(&EventsHeader { seq: 1, ..h }, &b).unwrap();
        merged.extend(drain(&mut m));
        (merged, m.stats())
    };
    let (calls, stats) = merge(true);
    assert_eq!(stats.late, 0, "{stats:?}");
    let ticks: Vec<u64> = calls.iter().map(|c| c.tick).collect();
    assert!(ticks.windows(2).all(|w| w[0] <= w[1]), "{ticks:?}");
    assert_eq!(calls[2].addr, 0x3000, "after thread 2's call of tick 2");
    let (_, stats) = merge(false);
    assert_eq!(stats.late, 1, "{stats:?}");
}

#[test]
fn a_reused_address_waits_for_the_other_threads_free() {
    // Thread 2 frees 0x1000 (allocated by thread 1) and gets it back at once; its buffer
    // is read first, before thread 1's allocation is known.
    let (calls, stats) = merge_all([
        chunk(2, 5, &[(true, 0x1000), (false, 0x1000), (true, 0x1000)]),
        chunk(1, 5, &[(false, 0x1000)]),
    ]);
    assert_eq!(calls.len(), 4);
    assert_eq!((calls[0].tid, calls[0].func), (1, Func::Malloc));
    assert_never_live_twice(&calls);
    assert_eq!(stats, MergeStats::default());
}

/// Thread `tid`'s realloc of 0x1000 to 0x2000 at `tick`, with its reading of the order
/// counter (2) after the call and, when `released`, the value it took before it (0).
fn realloc_moving(tid: u32, tick: u64, released: bool) -> (EventsHeader, Vec<u8>) {
    let mut w = Writer::new();
    w.u8(10 | 0x20).varint(2);
    if released {
        w.u8(10 | 0x50).varint(2 << 8);
    }
    w.u8(2)
        .u8(0)
        .svarint(0x1000 / 16)
        .svarint(0x1000 / 16)
        .varint(32);
    (h_of(tid, tick), w.bytes)
}

#[test]
fn an_allocation_between_a_reallocs_release_and_its_reading_takes_the_block() {
    // Thread 2's realloc moves 0x1000 away: it takes counter value 0 before the call and
    // reads 2 after it. Meanwhile thread 3 was handed 0x1000 (its malloc read 1) and
    // freed it (taking 1).
    let merge = |released| {
        let mut m = Merger::new();
        for (h, b) in [
            chunk(1, 1, &[(false, 0x1000)]),
            realloc_moving(2, 2, released),
            ordered(3, 2, &[(false, 0x1000, 1), (true, 0x1000, 1)]),
        ] {
            m.push_chunk(&h, &b).unwrap();
        }
        let calls = drain(&mut m);
        let live: Vec<u64> = m.live_blocks().iter().map(|(a, _)| a).collect();
        (calls, m.stats(), live)
    };
    let (calls, stats, live) = merge(true);
    let order: Vec<_> = calls.iter().map(|c| (c.tid, c.func)).collect();
    assert_eq!(
        order,
        [
            (1, Func::Malloc),
            (3, Func::Malloc),
            (3, Func::Free),
            (2, Func::Realloc)
        ]
    );
    assert!(calls[3].old_taken && calls[3].releases().is_none());
    assert_eq!(
        calls[3].release_when(),
        Some((2, 1)),
        "released at place 1, read at 4"
    );
    assert_eq!(
        stats,
        MergeStats {
            taken_from_reallocs: 1,
            ..MergeStats::default()
        }
    );
    assert_eq!(live, [0x2000]);
    // Without the value taken before the call (older traces), the realloc is known
    // only by its reading: thread 3's allocation waits for it, out of order.
    let (_, stats, _) = merge(false);
    assert_eq!(stats.taken_from_reallocs, 0);
    assert_ne!(stats, MergeStats::default());
}

/// Pops everything; the heap at each fork mark, by mark.
fn drain_with_forks(m: &mut Merger) -> (Vec<Call>, Vec<(u32, InheritedHeap)>) {
    m.finish();
    let (mut calls, mut forks) = (Vec::new(), Vec::new());
    while let Some(x) = m.pop() {
        match x {
            Merged::Call(c) => calls.push(c),
            Merged::Forked { mark, .. } => forks.push((mark, m.heap_at_fork())),
            Merged::Stats { .. } | Merged::Summary { .. } => {}
        }
    }
    (calls, forks)
}

#[test]
fn a_fork_child_starts_from_the_heap_at_its_mark_and_its_frees_of_it_are_known() {
    // The parent: 0x1000 and, with a stack, 0x2000; the fork; then it frees 0x1000.
    let mut w = Writer::new();
    w.u8(0).svarint(0x100).varint(100);
    w.u8(11).varint(1).varint(2).svarint(0x4000).svarint(-8);
    w.u8(0x10).svarint(0x100).varint(200).varint(1);
    w.u8(14 | 0x20).varint(7);
    w.u8(9).svarint(-0x100);
    w.u8(0).svarint(0x200).varint(300);
    let h = EventsHeader {
        tid: 10,
        first_tick: 5,
        last_tick: 5,
        ..Default::default()
    };
    let mut parent = Merger::new();
    parent.push_chunk(&h, &w.bytes).unwrap();
    let (calls, mut forks) = drain_with_forks(&mut parent);
    assert_eq!(calls.len(), 4);
    assert_eq!(forks.len(), 1);
    let (mark, heap) = forks.pop().unwrap();
    assert_eq!(mark, 7);
    assert_eq!((heap.blocks(), heap.bytes), (2, 300));
    // The child frees the block with the stack and allocates its own.
    let mut child = Merger::new();
    child.seed_inherited(heap);
    let (h, b) = chunk(20, 6, &[(true, 0x2000), (false, 0x4000)]);
    child.push_chunk(&h, &b).unwrap();
    let (calls, _) = drain_with_forks(&mut child);
    assert_eq!(calls.len(), 2);
    assert_eq!(child.stats().unknown_frees, 0);
    let live = child.live_blocks();
    assert_eq!(live.len(), 2);
    let kept = live.get(&0x1000).unwrap();
    assert!(kept.inherited && kept.stack == 0);
    assert!(!live.get(&0x4000).unwrap().inherited);
    // The parent's stack ids mean its own stacks, not the child's.
    let mut parent = Merger::new();
    parent.push_chunk(&h_of(10, 5), &w.bytes).unwrap();
    let (_, forks) = drain_with_forks(&mut parent);
    let heap = &forks[0].1;
    let with_stack = heap.live().get(&0x2000).unwrap();
    assert!(is_inherited_stack(with_stack.stack));
    let mut child = Merger::new();
    child.seed_inherited(heap.clone());
    assert_eq!(child.stack(with_stack.stack), &[0x4000, 0x3ff8]);
    // An inherited block allocated again with no free (freed before the fork, with no
    // record) is replaced, not forced.
    let (h, b) = chunk(20, 6, &[(false, 0x1000)]);
    child.push_chunk(&h, &b).unwrap();
    drain(&mut child);
    assert_eq!(child.stats().forced_allocs, 0);
    assert_eq!(child.stats().inherited_stale, 1);
    assert!(!child.live_blocks().get(&0x1000).unwrap().inherited);
}

fn h_of(tid: u32, tick: u64) -> EventsHeader {
    EventsHeader {
        tid,
        first_tick: tick,
        last_tick: tick,
        ..Default::default()
    }
}

#[test]
fn another_threads_calls_are_ordered_against_a_fork_mark_by_its_place() {
    // Thread 1 allocates A (reading 0) and forks (reading 2); thread 2 allocates B
    // (reading 1) and C (reading 3). The heap at the fork is A and B.
    let mut one = Writer::new();
    one.u8(10 | 0x20).varint(0);
    one.u8(0).svarint(0xa00).varint(16);
    one.u8(10 | 0x20).varint(2);
    one.u8(14 | 0x20).varint(1);
    let two = ordered(2, 3, &[(false, 0xb000, 1), (false, 0xc000, 3)]);
    for two_first in [false, true] {
        let mut m = Merger::new();
        if two_first {
            m.push_chunk(&two.0, &two.1).unwrap();
        }
        m.push_chunk(&h_of(1, 3), &one.bytes).unwrap();
        if !two_first {
            m.push_chunk(&two.0, &two.1).unwrap();
        }
        let (calls, forks) = drain_with_forks(&mut m);
        assert_eq!(calls.len(), 3);
        let heap = &forks[0].1;
        let mut at_fork: Vec<u64> = heap.live().iter().map(|(a, _)| a).collect();
        at_fork.sort();
        assert_eq!(at_fork, [0xa000, 0xb000], "thread 2 first: {two_first}");
    }
}

#[test]
fn calls_after_a_join_wait_for_the_joined_threads_calls() {
    // Thread 3 is the main thread and joined thread 2: only the join record says its
    // allocation came last.
    let [(h3, b3), two] = handed_over_in_one_tick();
    let (calls, stats) = merge_all([(h3, after_joining(2, b3)), two]);
    assert_eq!(calls.len(), 5);
    assert_eq!((calls[4].tid, calls[4].func), (3, Func::Malloc));
    assert_never_live_twice(&calls);
    assert_eq!(stats, MergeStats::default());
    // Without the record, nothing orders the two threads inside the tick (what the
    // record is for).
    let (_, stats) = merge_all(handed_over_in_one_tick());
    assert_ne!(stats, MergeStats::default());
}

#[test]
fn places_order_two_threads_inside_one_tick() {
    // As in the join test, without the join: thread 2's free took counter value 0,
    // thread 3's allocation read 1 after it.
    let (calls, stats) = merge_all([
        ordered(3, 2, &[(false, 0x5000, 1)]),
        ordered(
            2,
            2,
            &[
                (false, 0x7000, 0),
                (false, 0x5000, 0),
                (false, 0x6000, 0),
                (true, 0x5000, 0),
            ],
        ),
    ]);
    assert_eq!(calls.len(), 5);
    assert_eq!((calls[4].tid, calls[4].func), (3, Func::Malloc));
    assert_never_live_twice(&calls);
    assert_eq!(stats, MergeStats::default());
}

#[test]
fn places_order_the_lives_of_one_block_across_threads() {
    // Thread 1's block 0x1000 is freed by thread 2, allocated and freed by thread 3,
    // then allocated by thread 2 again: four calls in one tick, two per thread.
    let lives = |two: &[(bool, u64, u64)], three: &[(bool, u64, u64)]| {
        merge_all([
            chunk(1, 1, &[(false, 0x1000)]),
            ordered(2, 2, two),
            ordered(3, 2, three),
        ])
    };
    let (calls, stats) = lives(
        &[(true, 0x1000, 0), (false, 0x1000, 2)],
        &[(false, 0x1000, 1), (true, 0x1000, 1)],
    );
    let order: Vec<_> = calls.iter().map(|c| (c.tid, c.func)).collect();
    assert_eq!(
        order,
        [
            (1, Func::Malloc),
            (2, Func::Free),
            (3, Func::Malloc),
            (3, Func::Free),
            (2, Func::Malloc)
        ]
    );
    assert_never_live_twice(&calls);
    assert_eq!(stats, MergeStats::default());
    // Without places, thread 2's two calls go first, and thread 3 must force its
    // allocation.
    let (_, stats) = merge_all([
        chunk(1, 1, &[(false, 0x1000)]),
        chunk(2, 2, &[(true, 0x1000), (false, 0x1000)]),
        chunk(3, 2, &[(false, 0x1000), (true, 0x1000)]),
    ]);
    assert_ne!(stats, MergeStats::default());
}

#[test]
fn a_tick_is_merged_once_every_other_thread_has_moved_past_it() {
    let at = |tid, seq, tick, calls: &[(bool, u64)]| {
        let (h, b) = chunk(tid, tick, calls);
        (EventsHeader { seq, ..h }, b)
    };
    let mut m = Merger::new();
    let pops = |m: &mut Merger| std::iter::from_fn(|| m.pop()).count();
    for (h, b) in [
        at(1, 0, 5, &[(false, 0x1000)]),
        at(2, 0, 5, &[(false, 0x2000)]),
    ] {
        m.push_chunk(&h, &b).unwrap();
    }
    // Either thread's next buffer may hold more calls of tick 5.
    assert_eq!(pops(&mut m), 0);
    let (h, b) = at(2, 1, 6, &[(false, 0x3000)]);
    m.push_chunk(&h, &b).unwrap();
    assert_eq!(pops(&mut m), 1, "thread 1's tick 5, not thread 2's");
    let (h, b) = at(1, 1, 7, &[(true, 0x1000)]);
    m.push_chunk(&h, &b).unwrap();
    assert_eq!(pops(&mut m), 2, "thread 2's ticks 5 and 6");
}

#[test]
fn records_after_a_threads_last_buffer_do_not_bring_it_back() {
    let mut m = Merger::new();
    let (h2, b2) = chunk(2, 2, &[(false, 0x5000)]);
    let h2 = EventsHeader {
        thread_exited: true,
        ..h2
    };
    // What glibc frees after the thread is gone, sent later under its tid.
    let (h2_after, b2_after) = chunk(2, 2, &[(false, 0x6000)]);
    let h2_after = EventsHeader { seq: 1, ..h2_after };
    let (h3, b3) = chunk(3, 2, &[(false, 0x7000)]);
    let b3 = after_joining(2, b3);
    let (h3_next, b3_next) = chunk(3, 3, &[(false, 0x8000)]);
    let h3_next = EventsHeader { seq: 1, ..h3_next };
    for (h, b) in [(h2, b2), (h2_after, b2_after), (h3, b3), (h3_next, b3_next)] {
        m.push_chunk(&h, &b).unwrap();
    }
    // Before the end of the trace: the joining thread does not wait for thread 2.
    let tids: Vec<u32> = std::iter::from_fn(|| m.pop())
        .filter_map(|x| match x {
            Merged::Call(c) => Some(c.tid),
            _ => None,
        })
        .collect();
    assert_eq!(tids, [2, 2, 3, 3]);
}

#[test]
fn places_saturate_when_the_counter_jumps_far() {
    // Readings near 2^64: twice the counter would wrap around and reverse the order.
    let far = u64::MAX / 2;
    let (h, b) = ordered(
        1,
        1,
        &[
            (false, 0x1000, 5),
            (true, 0x1000, far),
            (false, 0x2000, u64::MAX),
            (true, 0x2000, u64::MAX),
        ],
    );
    let mut m = Merger::new();
    m.no_lone_run = true;
    m.push_chunk(&h, &b).unwrap();
    let places: Vec<u64> = m.threads[0].queue.iter().map(|q| q.1).collect();
    assert_eq!(places.len(), 4);
    assert!(places.windows(2).all(|p| p[0] <= p[1]), "{places:?}");
}

#[test]
fn a_thread_with_places_holds_back_only_calls_from_its_next_place_on() {
    // Both buffers end inside tick 5; thread 1's next call reads 3 or more (place 6 or
    // more), thread 2's 4 or more.
    let mut m = Merger::new();
    for (h, b) in [
        ordered(1, 5, &[(false, 0x1000, 0), (true, 0x1000, 2)]),
        ordered(2, 5, &[(false, 0x2000, 1), (false, 0x3000, 4)]),
    ] {
        m.push_chunk(&h, &b).unwrap();
    }
    let popped: Vec<(u32, u64)> = std::iter::from_fn(|| m.pop())
        .filter_map(|x| match x {
            Merged::Call(c) => Some((c.tid, c.addr)),
            _ => None,
        })
        .collect();
    assert_eq!(popped, [(1, 0x1000), (2, 0x2000), (1, 0x1000)]);
}

#[test]
fn ping_pong_between_many_threads_never_doubles_an_address() {
    // Eight threads pass four addresses round-robin: each frees what the previous one
    // allocated and re-allocates the same address. Buffers arrive in reverse order.
    let addrs = [0x1000u64, 0x2000, 0x3000, 0x4000];
    let mut chunks = Vec::new();
    for t in 0..8u32 {
        let mut calls = Vec::new();
        for &a in &addrs {
            if t > 0 {
                calls.push((true, a));
            }
            calls.push((false, a));
        }
        chunks.push(chunk(t, u64::from(t), &calls));
    }
    let (calls, stats) = merge_all(chunks.into_iter().rev());
    assert_eq!(calls.len(), 4 + 7 * 8);
    assert_never_live_twice(&calls);
    assert_eq!(stats.forced_allocs + stats.unknown_frees, 0);
    assert!(calls.windows(2).all(|w| w[0].tick <= w[1].tick));
}

#[test]
fn a_free_of_a_block_from_before_tracing_is_merged_and_counted() {
    let (calls, stats) = merge_all([chunk(1, 0, &[(true, 0x5000), (false, 0x6000)])]);
    assert_eq!(calls.len(), 2);
    assert_eq!(stats.unknown_frees, 1);
}

/// Merges `arrivals` with and without the lone run (popping after each chunk when
/// `pop_between`): every item, the stats, the live blocks and the last call's ended
/// blocks must agree.
fn assert_lone_run_merges_as_the_queues(
    arrivals: &[(EventsHeader, Vec<u8>)],
    pop_between: bool,
) -> Vec<Merged> {
    let mut queued = Merger::new();
    queued.no_lone_run = true;
    let mut lone = Merger::new();
    let (mut want, mut got) = (Vec::new(), Vec::new());
    let mut seen = (Vec::new(), Vec::new());
    for (h, b) in arrivals {
        for (m, out, seen) in [
            (&mut queued, &mut want, &mut seen.0),
            (&mut lone, &mut got, &mut seen.1),
        ] {
            m.push_chunk(h, b).unwrap();
            if pop_between {
                pop_all(m, out, seen);
            }
        }
        assert_eq!(got, want);
    }
    for (m, out, seen) in [
        (&mut queued, &mut want, &mut seen.0),
        (&mut lone, &mut got, &mut seen.1),
    ] {
        m.finish();
        pop_all(m, out, seen);
    }
    assert_eq!(got, want);
    assert_eq!(seen.1, seen.0);
    assert_eq!(lone.stats(), queued.stats());
    // The same blocks, read in the same order.
    let blocks = |m: &Merger| m.live_blocks().iter().collect::<Vec<_>>();
    assert_eq!(blocks(&lone), blocks(&queued));
    assert_eq!(lone.own_memory(), queued.own_memory());
    got
}

/// What a reader sees of `m`'s pops, into `out` and `seen`: each item, the blocks it
/// ended, and at every 16th call the live blocks before it, in their order, as a
/// snapshot between two calls reads them.
fn pop_all(m: &mut Merger, out: &mut Vec<Merged>, seen: &mut Vec<Vec<(u64, LiveBlock)>>) {
    while let Some(x) = m.pop() {
        seen.push(m.ended_by_last_pop().copied().collect());
        if let Merged::Call(c) = &x {
            if out.len().is_multiple_of(16) {
                seen.push(m.with_live_before_last_pop(c, |l| l.iter().collect()));
            }
        }
        out.push(x);
    }
}

/// A lone thread's chunk with an answer of the allocator's statistics in it, after
/// `calls` (is_free, address) at tick `tick`.
fn with_stats(tid: u32, seq: u32, tick: u64, calls: &[(bool, u64)]) -> (EventsHeader, Vec<u8>) {
    let (h, mut b) = chunk(tid, tick, calls);
    let mut w = Writer::new();
    w.u8(13).u8(0).u8(1).u8(4);
    w.bytes.extend_from_slice(b"heap");
    w.varint(4096);
    b.extend_from_slice(&w.bytes);
    b.extend_from_slice(&chunk(tid, tick, &[(false, 0x9000)]).1);
    (EventsHeader { seq, ..h }, b)
}

/// A thread alone merged from its run gives what its queue gave: a free of a block
/// from before tracing, a realloc's address used twice, ticks and statistics.
#[test]
fn a_lone_threads_run_merges_as_its_queue() {
    let arrivals = [
        with_stats(1, 0, 1, &[(false, 0x1000), (true, 0x5000), (false, 0x2000)]),
        with_stats(1, 1, 2, &[(true, 0x1000), (true, 0x9000), (false, 0x1000)]),
        with_stats(1, 2, 2, &[]),
        // Twice the same address with no free between: forced.
        with_stats(1, 3, 4, &[(false, 0x1000), (true, 0x2000)]),
    ];
    for pop_between in [true, false] {
        let merged = assert_lone_run_merges_as_the_queues(&arrivals, pop_between);
        assert_eq!(merged.len(), 16);
        assert!(merged.iter().any(|m| matches!(m, Merged::Stats { .. })));
    }
}

/// A lone thread that frees a block and at once allocates it again (a thread cache's
/// last in, first out), between snapshots, statistics and other calls: the free is held
/// for the allocation to take its bucket where it lies, and the merge gives what its
/// queue gave, with the blocks read in the same order before and after every call.
#[test]
fn a_block_freed_and_allocated_again_at_once_merges_as_ever() {
    let mut x = 0x9e37_79b9_7f4a_7c15u64;
    let mut live: Vec<u64> = Vec::new();
    let mut next = 0x10_0000u64;
    let arrivals: Vec<_> = (0..6u32)
        .map(|seq| {
            let mut calls = Vec::new();
            for _ in 0..3000 {
                let r = crate::xorshift(&mut x);
                match r % 6 {
                    0..=2 if !live.is_empty() => {
                        let addr = live[(r >> 8) as usize % live.len()];
                        calls.extend([(true, addr), (false, addr)]);
                    }
                    3 if !live.is_empty() => {
                        calls.push((true, live.swap_remove((r >> 8) as usize % live.len())));
                    }
                    _ => {
                        next += 16 * (1 + (r >> 8) % 4);
                        live.push(next);
                        calls.push((false, next));
                    }
                }
            }
            // A free whose allocation comes in the next chunk, and one before statistics.
            if let Some(&addr) = live.first() {
                calls.push((true, addr));
                live.remove(0);
            }
            let tick = 1 + u64::from(seq) / 2;
            let (h, b) = if seq == 3 {
                with_stats(1, seq, tick, &calls)
            } else {
                chunk(1, tick, &calls)
            };
            (EventsHeader { seq, ..h }, b)
        })
        .collect();
    for pop_between in [true, false] {
        let merged = assert_lone_run_merges_as_the_queues(&arrivals, pop_between);
        assert!(merged.len() > 20_000);
    }
    let mut m = Merger::new();
    for (h, b) in &arrivals {
        m.push_chunk(h, b).unwrap();
        while m.pop().is_some() {}
    }
    assert!(m.frees_held > 5_000, "{} frees held", m.frees_held);
}

/// A second thread whose chunk comes before the first thread's run is popped: the
/// run's rest goes to the queue with its places, and the merge orders the threads as
/// it would have with queues alone.
#[test]
fn a_second_thread_takes_the_lone_run_into_the_general_merge() {
    let arrivals = blocks_handed_between_threads();
    let calls = assert_lone_run_merges_as_the_queues(&arrivals, false);
    assert_eq!(calls.len(), 12_000);
    assert_lone_run_merges_as_the_queues(&arrivals, true);
    // Thread 3 got 0x5000 after thread 2 freed it, by places alone.
    let handed = [
        ordered(
            2,
            2,
            &[(false, 0x7000, 0), (false, 0x5000, 0), (true, 0x5000, 0)],
        ),
        ordered(3, 2, &[(false, 0x5000, 1)]),
    ];
    let calls = assert_lone_run_merges_as_the_queues(&handed, false);
    assert_eq!(calls.len(), 4);
    // The lone thread joined the second: its run's calls after the join wait for it.
    let [(h3, b3), two] = handed_over_in_one_tick();
    let joined = [(h3, after_joining(2, b3)), two];
    for pop_between in [true, false] {
        let calls = assert_lone_run_merges_as_the_queues(&joined, pop_between);
        assert_eq!(calls.len(), 5);
    }
    let (calls, stats) = merge_all(handed);
    assert_never_live_twice(&calls);
    assert_eq!(stats, MergeStats::default());
}

/// The live blocks seen "before the last pop" are those live before it, whatever the
/// call did: a malloc, a free, a free of an unknown block, an address allocated
/// twice (forced), across threads; and the call's effect is back afterwards.
#[test]
fn the_live_blocks_before_the_last_call_are_those_before_it() {
    let sorted = |live: &LiveTable| -> Vec<(u64, LiveBlock)> {
        let mut v: Vec<_> = live.iter().collect();
        v.sort_by_key(|e| e.0);
        v
    };
    let blocks = |m: &Merger| sorted(m.live_blocks());
    for arrivals in [
        vec![
            chunk(1, 1, &[(false, 0x1000), (true, 0x5000), (false, 0x2000)]),
            chunk(1, 2, &[(true, 0x1000), (false, 0x1000), (false, 0x1000)]),
            chunk(1, 3, &[(true, 0x2000), (true, 0x1000)]),
        ],
        blocks_handed_between_threads(),
    ] {
        let mut m = Merger::new();
        for (h, b) in &arrivals {
            m.push_chunk(h, b).unwrap();
        }
        m.finish();
        let mut seen = 0;
        loop {
            let before = blocks(&m);
            let Some(item) = m.pop() else { break };
            let Merged::Call(c) = item else { continue };
            let after = blocks(&m);
            let view = m.with_live_before_last_pop(&c, sorted);
            assert_eq!(view, before, "call {seen}: {c:?}");
            assert_eq!(blocks(&m), after, "call {seen} put back: {c:?}");
            seen += 1;
        }
        assert!(seen >= 8, "{seen} calls");
    }
}

#[test]
fn a_single_thread_is_merged_as_it_arrives() {
    let mut m = Merger::new();
    let (h, b) = chunk(1, 3, &[(false, 0x1000), (true, 0x1000)]);
    m.push_chunk(&h, &b).unwrap();
    assert!(
        m.pop().is_some() && m.pop().is_some(),
        "no waiting for a lone thread"
    );
    assert!(m.pop().is_none());
}

/// The interposer's own memory at a tick is the most it reported up to that tick,
/// whichever order its threads' reports were read in.
#[test]
fn own_memory_at_a_tick_is_what_was_reported_up_to_it() {
    let mut own = super::OwnMemory::default();
    // A later, larger report read first; an earlier, smaller one after it.
    own.said(150, 1000);
    own.said(120, 900);
    own.said(130, 800);
    own.said(200, 1000);
    own.said(90, 950);
    assert_eq!(own.at(80), 0);
    assert_eq!(own.at(90), 950);
    assert_eq!(own.at(125), 950);
    assert_eq!(own.at(149), 950);
    assert_eq!(own.at(150), 1000);
    assert_eq!(own.at(u64::MAX), 1000);
    // Reports no earlier one exceeds are all that is kept.
    assert_eq!(own.reports, [(90, 950), (150, 1000)]);
}

/// A finished merge gives back its live blocks and queues for a reader done with them;
/// its statistics, which a report still asks for, stay.
#[test]
fn a_finished_merge_releases_its_blocks_and_keeps_its_figures() {
    let mut m = Merger::new();
    for (h, b) in blocks_handed_between_threads() {
        m.push_chunk(&h, &b).unwrap();
    }
    let calls = drain(&mut m);
    assert!(calls.len() > 10_000);
    assert!(!m.live_blocks().is_empty());
    let stats = m.stats();
    m.release_blocks();
    assert_eq!(m.live_blocks().len(), 0);
    assert_eq!(m.stats(), stats);
    assert!(m.pop().is_none());
}
