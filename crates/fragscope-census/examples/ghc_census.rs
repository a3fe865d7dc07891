//! Prints one block census of a running GHC program: `ghc_census PID`.
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
    let blocks = census(pid, &rts, CensusLimits::default()).map_err(|e| e.to_string())?;
    println!("{blocks:#?}");
    Ok(())
}
