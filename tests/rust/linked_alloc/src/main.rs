//! A program whose allocator is linked into it, as Rust services link theirs
//! (`--features tikv-jemallocator` or `--features mimalloc`): it makes COUNT boxes of 64 to
//! 200 bytes (every thousandth of 20 to 28 KiB), shared among THREADS threads (1), keeps
//! every KEEP-th, frees one block of 4 MiB, prints the boxes it holds and their usable
//! bytes (the allocator's own sizes), then waits for a line on stdin (WAIT = `stdin`) or
//! SECONDS. With `--features jemalloc-stats` (jemalloc built with its statistics) it also
//! prints jemalloc's own figures, NAME=VALUE, after that line; with `--features
//! mimalloc-v2` (mimalloc 2.x), mimalloc's own account of its heap's pages the same way.
//!
//!   linked_alloc COUNT KEEP stdin|SECONDS [THREADS]

#[cfg(feature = "tikv-jemallocator")]
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

#[cfg(feature = "mimalloc")]
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// What the allocator lends for the block at `p` (0 on the system allocator).
fn usable(p: *const u8) -> usize {
    #[cfg(feature = "tikv-jemallocator")]
    return unsafe { tikv_jemallocator::usable_size(p) };
    #[cfg(feature = "mimalloc")]
    return unsafe { libmimalloc_sys::mi_usable_size(p.cast()) };
    #[allow(unreachable_code)]
    {
        let _ = p;
        0
    }
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (count, keep, wait, threads) = match &args[..] {
        [c, k, w] => (c, k, w, "1"),
        [c, k, w, t] => (c, k, w, t.as_str()),
        _ => {
            eprintln!("usage: linked_alloc COUNT KEEP stdin|SECONDS [THREADS]");
            std::process::exit(2);
        }
    };
    let (count, keep, threads): (usize, usize, usize) =
        match (count.parse(), keep.parse(), threads.parse()) {
            (Ok(c), Ok(k), Ok(t)) if k > 0 && t > 0 => (c, k, t),
            _ => {
                eprintln!("linked_alloc: COUNT, KEEP and THREADS are positive numbers");
                std::process::exit(2);
            }
        };
    // Each thread makes its share of the boxes (in its own arena, with several) and hands
    // the ones it keeps to the main thread. None frees any before all have made theirs: a
    // thread still making boxes would otherwise fill the pages another has just left (as
    // mimalloc 3.x reclaims them), and how sparse the survivors' pages are would depend on
    // how the threads happened to run.
    let all_made = std::sync::Arc::new(std::sync::Barrier::new(threads));
    let others: Vec<_> = (1..threads)
        .map(|t| {
            let all_made = all_made.clone();
            std::thread::spawn(move || make(count / threads, keep, t, &all_made))
        })
        .collect();
    let mut kept = vec![make(
        count - count / threads * (threads - 1),
        keep,
        0,
        &all_made,
    )];
    kept.extend(others.into_iter().map(|h| h.join().unwrap()));
    // What waiting on stdin allocates (its buffer, the line), allocated before jemalloc's
    // figures are read: a first allocation of a size fills the thread's cache with more.
    let stdin = std::io::stdin();
    let mut line = String::with_capacity(64);
    // A block freed whole: its pages wait dirty until jemalloc's decay returns them.
    drop(std::hint::black_box(vec![1u8; 4 << 20]));
    // The boxes and the vectors that hold them.
    let held: usize = kept
        .iter()
        .map(|v| v.iter().map(|b| usable(b.as_ptr())).sum::<usize>() + usable(v.as_ptr().cast()))
        .sum::<usize>()
        + usable(kept.as_ptr().cast());
    let boxes: usize = kept.iter().map(Vec::len).sum();
    println!("holding {boxes} boxes, {held} usable bytes");
    #[cfg(feature = "jemalloc-stats")]
    jemalloc_figures(held);
    #[cfg(feature = "mimalloc")]
    mimalloc_figures(held);
    if wait == "stdin" {
        let _ = stdin.read_line(&mut line);
    } else {
        let seconds: f64 = wait.parse().unwrap_or(0.0);
        std::thread::sleep(std::time::Duration::from_secs_f64(seconds));
    }
    std::hint::black_box(&kept);
}

/// COUNT boxes, every KEEP-th kept (the vector of them collected in place: the buffer of
/// all), the others freed once every thread has made its boxes (`all_made`); `seed`
/// varies the sizes between threads.
fn make(count: usize, keep: usize, seed: usize, all_made: &std::sync::Barrier) -> Vec<Box<[u8]>> {
    let all: Vec<Box<[u8]>> = (0..count)
        .map(|i| {
            let len = if i % 1000 == 0 {
                20_000 + (i + seed) % 8191
            } else {
                64 + (i + seed) % 137
            };
            vec![i as u8; len].into_boxed_slice()
        })
        .collect();
    all_made.wait();
    all.into_iter()
        .enumerate()
        .filter_map(|(i, b)| (i % keep == 0).then_some(b))
        .collect()
}

/// jemalloc's own figures as its statistics give them (refreshed by a new epoch), and
/// the bytes the program holds, NAME=VALUE, ending with `kept=`.
#[cfg(feature = "jemalloc-stats")]
fn jemalloc_figures(held: usize) {
    use tikv_jemalloc_ctl::{epoch, stats};
    epoch::advance().unwrap();
    for (name, value) in [
        ("stats.allocated", stats::allocated::read().unwrap()),
        ("stats.active", stats::active::read().unwrap()),
        ("stats.resident", stats::resident::read().unwrap()),
        ("stats.mapped", stats::mapped::read().unwrap()),
        ("stats.metadata", stats::metadata::read().unwrap()),
    ] {
        println!("{name}={value}");
    }
    // Over every arena (MALLCTL_ARENAS_ALL); names spelt out, so that reading them
    // allocates nothing (a freed string would change the threads' caches).
    for key in [
        &b"stats.arenas.4096.pdirty\0"[..],
        b"stats.arenas.4096.pmuzzy\0",
        b"stats.arenas.4096.tcache_bytes\0",
        b"stats.arenas.4096.large.allocated\0",
    ] {
        let value: usize = unsafe { tikv_jemalloc_ctl::raw::read(key) }.unwrap();
        let name = std::str::from_utf8(&key[..key.len() - 1]).unwrap();
        println!("{name}={value}");
    }
    println!("usable={held}");
    println!("kept=1");
}

/// mimalloc's own account of its heap, from its area visitor without the blocks (which
/// would collect the pages' free lists first): pages, blocks in use (those other threads
/// freed and the owner has not collected included, as mimalloc counts them), their bytes at
/// the block size, and the pages' committed and reserved bytes, NAME=VALUE, ending with
/// `kept=`. 2.x visits the main thread's heap (the program's only one with THREADS 1);
/// 3.x the main heap, every thread's pages and the abandoned ones.
#[cfg(feature = "mimalloc")]
fn mimalloc_figures(held: usize) {
    use libmimalloc_sys::{mi_heap_area_t, mi_heap_t, mi_heap_visit_blocks};
    #[derive(Default)]
    struct Areas {
        pages: usize,
        blocks: usize,
        used_bytes: usize,
        committed: usize,
        reserved: usize,
    }
    unsafe extern "C" fn count(
        _heap: *const mi_heap_t,
        area: *const mi_heap_area_t,
        block: *mut std::ffi::c_void,
        _size: usize,
        arg: *mut std::ffi::c_void,
    ) -> bool {
        if block.is_null() {
            let (area, sums) = unsafe { (&*area, &mut *arg.cast::<Areas>()) };
            sums.pages += 1;
            sums.blocks += area.used;
            sums.used_bytes += area.used * area.full_block_size;
            sums.committed += area.committed;
            sums.reserved += area.reserved;
        }
        true
    }
    // 3.x: null is the main heap.
    #[cfg(feature = "mimalloc-v2")]
    let heap = unsafe { libmimalloc_sys::mi_heap_get_default() };
    #[cfg(not(feature = "mimalloc-v2"))]
    let heap = std::ptr::null_mut();
    let mut sums = Areas::default();
    unsafe {
        mi_heap_visit_blocks(heap, false, Some(count), (&mut sums as *mut Areas).cast());
    }
    println!("mi.pages={}", sums.pages);
    println!("mi.blocks={}", sums.blocks);
    println!("mi.used_bytes={}", sums.used_bytes);
    println!("mi.committed={}", sums.committed);
    println!("mi.reserved={}", sums.reserved);
    println!("usable={held}");
    println!("kept=1");
}
