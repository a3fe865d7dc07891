//! `record -p`'s calls into the running process: dlopen of the interposer when it starts,
//! `fragscope_rebind` once its heap was read (`glibc_live_blocks`), `fragscope_detach`
//! when it ends (preload/attach.h says what the library does once loaded). Each is made
//! on a borrowed thread (`remote_call`).

use std::collections::HashMap;
use std::fs;
use std::path::Path;
use std::time::Duration;

use anyhow::{anyhow, bail, Context, Result};
use fragscope_census::allocators::allocator_of;
use fragscope_census::ghc::CensusError;
use fragscope_census::{glibc, ProcessMemory, Symbols};

use crate::access::access_error;
use crate::procfs;
use crate::remote_call::{
    libc_image, mapped_image, read_string, remote_call, remote_call_avoiding, Arg,
};

/// What `fragscope_rebind` and `fragscope_detach` answer when the borrowed thread was
/// stopped inside the interposer holding a lock they need: another thread is borrowed.
const BORROWED_THREAD_BUSY: i64 = -2;

/// Loads `library` into `pid` (dlopen, RTLD_NOW). Err with dlerror's words when the
/// process refuses it.
pub fn load_library(pid: u32, library: &Path) -> Result<()> {
    let libc = libc_image(pid)?;
    let (dlopen, flags) = match (libc.get("dlopen"), libc.get("__libc_dlopen_mode")) {
        (Some(f), _) => (f, libc::RTLD_NOW as u64),
        // glibc before 2.34 keeps dlopen in libdl; its own loader entry takes the flag
        // that says the call comes from dlopen.
        (None, Some(f)) => (f, libc::RTLD_NOW as u64 | 0x8000_0000),
        (None, None) => bail!("process {pid}'s C library has no dlopen fragscope can call"),
    };
    let mut path = library.as_os_str().as_encoded_bytes().to_vec();
    path.push(0);
    let handle = remote_call(pid, dlopen, &[Arg::Data(path), Arg::Value(flags)])?;
    if handle != 0 {
        return Ok(());
    }
    let why = match libc.get("dlerror") {
        Some(dlerror) => {
            let p = remote_call(pid, dlerror, &[])?;
            read_string(pid, p).unwrap_or_else(|| "no reason given".into())
        }
        None => "no reason given".into(),
    };
    bail!("process {pid} could not load fragscope's interposer: {why}")
}

/// Where the function `name` of `library`, loaded in `pid`, is.
fn library_function(pid: u32, library: &Path, name: &str) -> Result<u64> {
    let (base, path) = mapped_image(pid, |p| {
        p.file_name() == library.file_name() && p.parent() == library.parent()
    })?
    .ok_or_else(|| anyhow!("fragscope's interposer is not loaded in process {pid}"))?;
    let elf = fs::read(&path).with_context(|| format!("reading {}", path.display()))?;
    let symbols = Symbols::resolve_at(&elf, &[name], base).map_err(|e| anyhow!(e))?;
    symbols.need(name).map_err(|e| anyhow!(e))
}

/// With `pid` held stopped: runs `census` (which reads its heap), then has the loaded
/// `library` rebind the process's calls to its hooks (`fragscope_rebind`), and only then
/// lets the process go, so that no call falls between the heap read and the first
/// recorded one. Returns what `census` returned, the call slots rebound and how long the
/// process was held.
pub fn rebind_library<T>(
    pid: u32,
    library: &Path,
    census: impl FnOnce() -> T,
) -> Result<(T, u64, Duration)> {
    let rebind = library_function(pid, library, "fragscope_rebind")?;
    let pause = fragscope_census::Pause::stop(pid).map_err(|e| anyhow!(e))?;
    let read = census();
    // The borrowed thread runs alone: ptrace resumes it out of the group stop, and the
    // detach puts it back in it until the pause ends.
    let slots = call_interposer(pid, rebind)?;
    let held = pause.held();
    drop(pause);
    if slots as i64 == -1 {
        bail!("the interposer in process {pid} is not recording (its connection failed)");
    }
    Ok((read, slots, held))
}

/// Calls `fragscope_detach` of `library`, loaded in `pid`: the calls go back to the
/// allocator and the recording of the process ends. Returns how many call slots were put
/// back.
pub fn detach_library(pid: u32, library: &Path) -> Result<u64> {
    let detach = library_function(pid, library, "fragscope_detach")?;
    let restored = call_interposer(pid, detach)?;
    if restored as i64 == -1 {
        bail!("the interposer in process {pid} was not recording");
    }
    Ok(restored)
}

/// Calls a function of the interposer on a borrowed thread, another one each time it
/// answers that the thread was stopped inside the interposer.
fn call_interposer(pid: u32, func: u64) -> Result<u64> {
    let mut refused = Vec::new();
    loop {
        let (value, tid) = remote_call_avoiding(pid, func, &[], &refused)?;
        // The interposer's functions return an int: the low half of rax.
        let value = i64::from(value as u32 as i32);
        if value != BORROWED_THREAD_BUSY {
            return Ok(value as u64);
        }
        refused.push(tid);
    }
}

/// The blocks glibc's heap of `pid` holds, (address, usable bytes): the heap `record -p`
/// starts from. The caller holds the process stopped. Err says why they could not be
/// read (another allocator, a layout not verified, ...).
pub(crate) fn glibc_live_blocks(pid: u32) -> Result<Vec<(u64, u64)>, String> {
    let mut mem = ProcessMemory::open(pid).map_err(|e| format!("{:#}", access_error(pid, &e)))?;
    let mut build_ids = HashMap::new();
    let maps = procfs::read_maps(pid, &mut build_ids).ok_or("the process exited")?;
    match allocator_of(&maps) {
        "glibc" => {}
        other => {
            return Err(format!(
                "it runs on {other}, whose blocks fragscope does not read"
            ))
        }
    }
    let layout = glibc::locate(pid, &maps, &mut mem)?;
    // SAFETY: sysconf has no preconditions.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) }.max(4096) as u64;
    // Which pages are resident, so that only those are read: a page never touched that
    // is read gets the kernel's zero page mapped, present from then on in pagemap.
    let heap: Vec<&fragscope_trace::Mapping> =
        maps.iter().filter(|m| procfs::may_hold_heap(m)).collect();
    let residency = procfs::read_residency(pid, &heap, page).unwrap_or_default();
    match glibc::live_blocks(&mut mem, &layout, &maps, &residency, page) {
        Ok(b) => Ok(b),
        Err(CensusError::NoHeap) => Ok(Vec::new()),
        Err(e) => Err(format!("glibc's heap did not hold together: {e}")),
    }
}
