//! A program whose allocator is linked into it, as Rust services link theirs
//! (`--features tikv-jemallocator` or `--features mimalloc`): it makes COUNT boxes of 64 to
//! 200 bytes (every thousandth of 20 to 28 KiB), keeps every KEEP-th, prints the boxes it
//! holds and their usable bytes (the allocator's own sizes), then waits for a line on
//! stdin (WAIT = `stdin`) or SECONDS. With `--features jemalloc-stats` (jemalloc built
//! with its statistics) it also prints jemalloc's own figures, NAME=VALUE, after that
//! line.
//!
//!   linked_alloc COUNT KEEP stdin|SECONDS

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
    let [count, keep, wait] = &args[..] else {
        eprintln!("usage: linked_alloc COUNT KEEP stdin|SECONDS");
        std::process::exit(2);
    };
    let (count, keep): (usize, usize) = match (count.parse(), keep.parse()) {
        (Ok(c), Ok(k)) if k > 0 => (c, k),
        _ => {
            eprintln!("linked_alloc: COUNT and KEEP are positive numbers");
            std::process::exit(2);
        }
    };
    let all: Vec<Box<[u8]>> = (0..count)
        .map(|i| {
            let len = if i % 1000 == 0 {
                20_000 + i % 8191
            } else {
                64 + i % 137
            };
            vec![i as u8; len].into_boxed_slice()
        })
        .collect();
    let kept: Vec<Box<[u8]>> = all
        .into_iter()
        .enumerate()
        .filter_map(|(i, b)| (i % keep == 0).then_some(b))
        .collect();
    // The boxes and the vector that holds them (collected in place: the buffer of all).
    let held: usize = kept.iter().map(|b| usable(b.as_ptr())).sum::<usize>()
        + usable(kept.as_ptr().cast());
    println!("holding {} boxes, {held} usable bytes", kept.len());
    #[cfg(feature = "jemalloc-stats")]
    jemalloc_figures(held);
    if wait == "stdin" {
        let mut line = String::new();
        let _ = std::io::stdin().read_line(&mut line);
    } else {
        let seconds: f64 = wait.parse().unwrap_or(0.0);
        std::thread::sleep(std::time::Duration::from_secs_f64(seconds));
    }
    std::hint::black_box(&kept);
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
    println!("usable={held}");
    println!("kept=1");
}
