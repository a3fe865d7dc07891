//! Prints one census of a running glibc program's heap: `glibc_census PID [--no-stop]`.
use std::process::ExitCode;

use fragscope_census::glibc::{census, locate, mallinfo_view};
use fragscope_census::{Pause, ProcessMemory};
use fragscope_trace::{Mapping, ResidentRange};

fn main() -> ExitCode {
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("glibc_census: {e}");
            ExitCode::FAILURE
        }
    }
}

fn maps(pid: u32) -> Result<Vec<Mapping>, String> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/maps")).map_err(|e| e.to_string())?;
    Ok(text
        .lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            let (lo, hi) = f.first()?.split_once('-')?;
            Some(Mapping {
                start: u64::from_str_radix(lo, 16).ok()?,
                end: u64::from_str_radix(hi, 16).ok()?,
                perms: f.get(1)?.to_string(),
                offset: u64::from_str_radix(f.get(2)?, 16).ok()?,
                inode: f.get(4)?.parse().ok()?,
                path: f.get(5).unwrap_or(&"").to_string(),
                build_id: Vec::new(),
            })
        })
        .collect())
}

fn run() -> Result<(), String> {
    let pid: u32 = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .ok_or("usage: glibc_census PID [--no-stop]")?;
    let stop = std::env::args().nth(2).as_deref() != Some("--no-stop");
    let mut mem = ProcessMemory::open(pid).map_err(|e| e.to_string())?;
    let maps0 = maps(pid)?;
    let layout = locate(pid, &maps0, &mut mem)?;
    let pause = if stop { Some(Pause::stop(pid)?) } else { None };
    let t0 = std::time::Instant::now();
    let maps = maps(pid)?;
    // Every page counted resident: this example does not read pagemap.
    let residency: Vec<ResidentRange> = maps
        .iter()
        .map(|m| {
            let pages = (m.end - m.start) / 4096;
            ResidentRange {
                start: m.start,
                pages,
                resident: vec![0xff; pages.div_ceil(8) as usize],
                ..Default::default()
            }
        })
        .collect();
    let heap = census(&mut mem, &layout, &maps, &residency, 4096).map_err(|e| e.to_string())?;
    let held = pause.as_ref().map(|p| p.held());
    eprintln!("census {:?}", t0.elapsed());
    drop(pause);
    let (in_use, free) = mallinfo_view(&heap);
    println!("{heap:#?}");
    println!("in use (uordblks + hblkhd) {in_use}, free (fordblks) {free}, held {held:?}");
    Ok(())
}
