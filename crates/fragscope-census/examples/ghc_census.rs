//! Prints one block census of a running GHC program: `ghc_census PID [STOPPED_SCAN_MIB]`
//! (the liveness scan is made with the program stopped up to that many MiB).
use std::process::ExitCode;

use fragscope_census::ghc::{census, CensusLimits, GhcRts, RtsInfo};

fn main() -> ExitCode {
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("ghc_census: {e}");
            ExitCode::FAILURE
        }
    }
}

fn run() -> Result<(), String> {
    let pid: u32 = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .ok_or("usage: ghc_census PID")?;
    let exe = std::fs::read_link(format!("/proc/{pid}/exe"))
        .map_err(|e| format!("no process {pid} to read ({e})"))?;
    let info = RtsInfo::query(&exe, None)?;
    let elf = std::fs::read(&exe).map_err(|e| format!("cannot read {}: {e}", exe.display()))?;
    let rts = GhcRts::new(&elf, info, Some(pid))?;
    let mut limits = CensusLimits::default();
    if let Some(mib) = std::env::args().nth(2) {
        let mib: u64 = mib
            .parse()
            .map_err(|_| "STOPPED_SCAN_MIB is a number of MiB")?;
        limits.stopped_scan_bytes = mib << 20;
    }
    let blocks = census(pid, &rts, limits).map_err(|e| e.to_string())?;
    println!("{blocks:#?}");
    Ok(())
}
