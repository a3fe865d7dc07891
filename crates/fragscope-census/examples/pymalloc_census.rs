//! Prints one pymalloc census of a running CPython process: `pymalloc_census PID`

use fragscope_census::pymalloc::{census, Pymalloc};

fn main() {
    if let Err(e) = run() {
        eprintln!("pymalloc_census: {e}");
        std::process::exit(1);
    }
}

fn run() -> Result<(), String> {
    let pid: u32 = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .ok_or("usage: pymalloc_census PID")?;
    let layout = Pymalloc::detect(pid).ok_or("not a CPython process")??;
    let pools = census(pid, &layout).map_err(|e| e.to_string())?;
    let used: Vec<_> = pools.pools.iter().filter(|p| p.blocks_in_use > 0).collect();
    let in_use: u64 = used
        .iter()
        .map(|p| u64::from(p.blocks_in_use) * u64::from(p.block_size))
        .sum();
    let mut arenas: Vec<u32> = pools.pools.iter().map(|p| p.arena).collect();
    arenas.sort_unstable();
    arenas.dedup();
    println!(
        "CPython {}: {} arenas, {} pools ({} in use), {} bytes in used blocks, paused {} us",
        pools.python,
        arenas.len(),
        pools.pools.len(),
        used.len(),
        in_use,
        pools.pause_us
    );
    Ok(())
}
