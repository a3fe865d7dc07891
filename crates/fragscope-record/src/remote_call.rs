//! Making a running process call a function of ours, on one of its threads: what
//! `record -p` (`attach`) and the forked copies of `snapshot` (`fork_copy`) are made of.
//!
//! One thread is borrowed with ptrace (PTRACE_SEIZE, PTRACE_INTERRUPT: no SIGSTOP, so the
//! rest of the process keeps running and no job-control stop is seen): its registers are
//! saved, it is made to call the function with a return address of 0, and the fault at 0
//! ends the call; then its registers are put back, which also restarts the system call it
//! was blocked in, and it is let go. Signals that arrive for the thread meanwhile are held
//! and sent again afterwards. The thread is chosen so that it cannot be holding the
//! allocator's or the loader's locks, which dlopen takes: one blocked in a system call
//! other than those malloc makes with its lock held (mmap, munmap, brk, mprotect,
//! madvise, mremap), or, failing that, one stopped outside libc, the dynamic loader and
//! the allocator.

use std::fs;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};
use fragscope_census::Symbols;

/// How long the borrowed call may take (dlopen of a library that pulls in others, the
/// recorder's first answer).
pub(crate) const CALL_TIMEOUT: Duration = Duration::from_secs(20);
/// How often to look again for a thread that may be borrowed.
const CHOOSE_ATTEMPTS: u32 = 200;

/// System calls malloc makes while it holds an arena's lock.
const ALLOCATOR_SYSCALLS: [i64; 6] = [9, 10, 11, 12, 25, 28];

/// The process's C library, with dlopen, dlerror and syscall placed where it maps them.
pub(crate) fn libc_image(pid: u32) -> Result<Symbols> {
    let (base, path) = mapped_image(pid, |p| {
        p.file_name()
            .and_then(|n| n.to_str())
            .is_some_and(|n| n.starts_with("libc.so") || n.starts_with("libc-"))
    })?
    .ok_or_else(|| {
        anyhow!("process {pid} maps no C library (a static executable cannot load a library)")
    })?;
    // Through the process's root: the library it mapped, even in another mount namespace.
    let elf = fs::read(format!("/proc/{pid}/root{}", path.display()))
        .or_else(|_| fs::read(&path))
        .with_context(|| format!("reading {}", path.display()))?;
    Symbols::resolve_at(
        &elf,
        &["dlopen", "__libc_dlopen_mode", "dlerror", "syscall"],
        base,
    )
    .map_err(|e| anyhow!(e))
}

/// The first mapping at file offset 0 of a file `wanted` accepts: its start and path.
pub(crate) fn mapped_image(
    pid: u32,
    wanted: impl Fn(&Path) -> bool,
) -> Result<Option<(u64, std::path::PathBuf)>> {
    let maps = fs::read_to_string(format!("/proc/{pid}/maps"))
        .map_err(|e| crate::access::access_error(pid, &e))?;
    for line in maps.lines() {
        let f: Vec<&str> = line.split_whitespace().collect();
        if f.len() < 6 || !f[2].trim_start_matches('0').is_empty() {
            continue;
        }
        let path = Path::new(f[5]);
        if path.is_absolute() && wanted(path) {
            let start = f[0].split('-').next().unwrap_or("");
            if let Ok(start) = u64::from_str_radix(start, 16) {
                return Ok(Some((start, path.to_path_buf())));
            }
        }
    }
    Ok(None)
}

/// Reads a C string of at most 4 KiB from `pid`'s memory.
pub(crate) fn read_string(pid: u32, addr: u64) -> Option<String> {
    if addr == 0 {
        return None;
    }
    let mem = fs::File::open(format!("/proc/{pid}/mem")).ok()?;
    let mut buf = vec![0u8; 4096];
    let n = mem.read_at(&mut buf, addr).ok()?;
    buf.truncate(n);
    let end = buf.iter().position(|&b| b == 0)?;
    Some(String::from_utf8_lossy(&buf[..end]).into_owned())
}

/// An argument of a borrowed call: a number, or bytes placed on the thread's stack
/// (passed as their address).
pub(crate) enum Arg {
    Value(u64),
    Data(Vec<u8>),
}

/// A thread held with ptrace; let go (registers as they were) when dropped.
struct Borrowed {
    tid: i32,
    saved: libc::user_regs_struct,
    /// Signals that arrived for the thread while it was ours, to send again.
    held_signals: Vec<i32>,
    restore: bool,
}

impl Drop for Borrowed {
    fn drop(&mut self) {
        // SAFETY: ptrace requests on a thread we seized; the register block is ours.
        unsafe {
            if self.restore {
                libc::ptrace(libc::PTRACE_SETREGS, self.tid, 0, &self.saved);
            }
            libc::ptrace(libc::PTRACE_DETACH, self.tid, 0, 0);
            for &sig in &self.held_signals {
                libc::syscall(libc::SYS_tgkill, tgid_of(self.tid), self.tid, sig);
            }
        }
    }
}

fn tgid_of(tid: i32) -> i32 {
    crate::procfs::status_field(tid, "Tgid")
        .and_then(|v| v.parse().ok())
        .unwrap_or(tid)
}

fn ptrace_error(pid: u32, what: &str) -> anyhow::Error {
    let e = std::io::Error::last_os_error();
    match e.raw_os_error() {
        Some(libc::EPERM) => anyhow!(
            "not allowed to attach to process {pid} ({what}: {e}). fragscope record -p needs \
             ptrace access to it: run it as the process's user with \
             /proc/sys/kernel/yama/ptrace_scope at 0 (it is {}), or as root / with \
             CAP_SYS_PTRACE (e.g. sudo fragscope record -p {pid}); a process already traced \
             by a debugger cannot be attached to",
            fs::read_to_string("/proc/sys/kernel/yama/ptrace_scope")
                .map_or_else(|_| "absent".into(), |s| s.trim().to_string())
        ),
        Some(libc::ESRCH) => anyhow!("process {pid} has exited"),
        _ => anyhow!("cannot attach to process {pid} ({what}): {e}"),
    }
}

/// Waits for `tid` to stop; its wait status. Signals that stop it on their way in are
/// held in `held` and the thread continued, until a stop `accept` takes.
pub(crate) fn wait_stop(
    tid: i32,
    deadline: Instant,
    held: &mut Vec<i32>,
    mut accept: impl FnMut(i32) -> bool,
) -> Result<i32> {
    loop {
        let mut status = 0;
        // SAFETY: waitpid with a valid out pointer.
        let r = unsafe { libc::waitpid(tid, &mut status, libc::__WALL | libc::WNOHANG) };
        if r < 0 {
            bail!("lost the thread {tid}: {}", std::io::Error::last_os_error());
        }
        if r == 0 {
            if Instant::now() >= deadline {
                bail!(
                    "the process did not answer within {} s",
                    CALL_TIMEOUT.as_secs()
                );
            }
            std::thread::sleep(Duration::from_micros(200));
            continue;
        }
        if libc::WIFEXITED(status) || libc::WIFSIGNALED(status) {
            bail!("the process exited");
        }
        if accept(status) {
            return Ok(status);
        }
        let sig = libc::WSTOPSIG(status);
        let event = status >> 16;
        if event == 0 && sig != libc::SIGSTOP && sig != libc::SIGTRAP {
            held.push(sig);
        }
        // SAFETY: continuing a seized thread, its signal held back.
        unsafe { libc::ptrace(libc::PTRACE_CONT, tid, 0, 0) };
    }
}

/// Seizes `tid` and stops it; None when it vanished meanwhile.
fn seize(pid: u32, tid: i32) -> Result<Option<Borrowed>> {
    // SAFETY: ptrace requests with integer arguments.
    if unsafe { libc::ptrace(libc::PTRACE_SEIZE, tid, 0, 0) } != 0 {
        if std::io::Error::last_os_error().raw_os_error() == Some(libc::ESRCH) {
            return Ok(None);
        }
        return Err(ptrace_error(pid, "PTRACE_SEIZE"));
    }
    let mut b = Borrowed {
        tid,
        // SAFETY: a plain register block, all zeros until read.
        saved: unsafe { std::mem::zeroed() },
        held_signals: Vec::new(),
        restore: false,
    };
    // SAFETY: as above.
    if unsafe { libc::ptrace(libc::PTRACE_INTERRUPT, tid, 0, 0) } != 0 {
        return Err(ptrace_error(pid, "PTRACE_INTERRUPT"));
    }
    let deadline = Instant::now() + CALL_TIMEOUT;
    wait_stop(tid, deadline, &mut b.held_signals, |s| {
        s >> 16 == libc::PTRACE_EVENT_STOP
    })?;
    // SAFETY: reading the registers of a thread in a ptrace stop into our block.
    if unsafe { libc::ptrace(libc::PTRACE_GETREGS, tid, 0, &mut b.saved) } != 0 {
        return Err(ptrace_error(pid, "PTRACE_GETREGS"));
    }
    Ok(Some(b))
}

/// The executable ranges of the images a borrowed thread must not be stopped in.
fn lock_holding_code(pid: u32) -> Vec<(u64, u64)> {
    let Ok(maps) = fs::read_to_string(format!("/proc/{pid}/maps")) else {
        return Vec::new();
    };
    maps.lines()
        .filter_map(|line| {
            let f: Vec<&str> = line.split_whitespace().collect();
            let name = Path::new(*f.get(5)?).file_name()?.to_str()?;
            let risky = name.starts_with("libc.so")
                || name.starts_with("libc-")
                || name.starts_with("ld-linux")
                || name.contains("malloc")
                || name.contains("libfragscope");
            if !risky || !f[1].contains('x') {
                return None;
            }
            let (lo, hi) = f[0].split_once('-')?;
            Some((
                u64::from_str_radix(lo, 16).ok()?,
                u64::from_str_radix(hi, 16).ok()?,
            ))
        })
        .collect()
}

/// A thread of `pid` (not one of `refused`) stopped where a call of ours is safe to make:
/// for a call that takes no lock (`lock_free`, a bare system call), any thread is.
fn borrow_thread(pid: u32, refused: &[i32], lock_free: bool) -> Result<Borrowed> {
    for attempt in 0..CHOOSE_ATTEMPTS {
        let risky = lock_holding_code(pid);
        let mut tids: Vec<i32> = fs::read_dir(format!("/proc/{pid}/task"))
            .map_err(|e| crate::access::access_error(pid, &e))?
            .filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
            .collect();
        // The main thread first: a server's is usually asleep in its event loop.
        tids.sort_by_key(|&t| t != pid as i32);
        tids.retain(|t| !refused.contains(t));
        if tids.is_empty() {
            bail!("every thread of process {pid} was busy inside fragscope's interposer");
        }
        for tid in tids {
            let Some(b) = seize(pid, tid)? else { continue };
            let r = &b.saved;
            let in_syscall = r.orig_rax as i64 >= 0;
            let safe = if lock_free {
                true
            } else if in_syscall {
                !ALLOCATOR_SYSCALLS.contains(&(r.orig_rax as i64))
            } else {
                !risky.iter().any(|&(lo, hi)| r.rip >= lo && r.rip < hi)
            };
            if safe {
                return Ok(b);
            }
        }
        if attempt + 1 < CHOOSE_ATTEMPTS {
            std::thread::sleep(Duration::from_millis(10));
        }
    }
    bail!(
        "every thread of process {pid} was busy inside the C library or the allocator each \
         time fragscope looked (for 2 s); try again"
    )
}

/// Makes a thread of `pid` call `func` with `args`; its return value (rax).
pub(crate) fn remote_call(pid: u32, func: u64, args: &[Arg]) -> Result<u64> {
    remote_call_avoiding(pid, func, args, &[]).map(|(v, _)| v)
}

/// Makes a thread of `pid`, any one, call libc's `syscall` (at `syscall`) with `args` (at
/// most six: the number and five arguments); its return value. `on_event` sees each
/// ptrace event stop of the thread meanwhile with its event message (a fork's child).
pub(crate) fn remote_syscall(
    pid: u32,
    syscall: u64,
    args: &[u64],
    on_event: &mut dyn FnMut(i32, u64),
) -> Result<i64> {
    let args: Vec<Arg> = args.iter().map(|&v| Arg::Value(v)).collect();
    let b = borrow_thread(pid, &[], true)?;
    call_on(pid, b, syscall, &args, Some(on_event)).map(|(v, _)| v as i64)
}

/// As [`remote_call`], on a thread not in `refused`; also says which thread made it.
pub(crate) fn remote_call_avoiding(
    pid: u32,
    func: u64,
    args: &[Arg],
    refused: &[i32],
) -> Result<(u64, i32)> {
    let b = borrow_thread(pid, refused, false)?;
    call_on(pid, b, func, args, None)
}

/// Has the borrowed thread `b` call `func` with `args` (up to six, in the System V
/// registers); its rax and tid. With `trace_forks`, the children it forks or clones stop
/// at their start, traced by us, and each event stop is shown to it.
fn call_on(
    pid: u32,
    mut b: Borrowed,
    func: u64,
    args: &[Arg],
    mut trace_forks: Option<&mut dyn FnMut(i32, u64)>,
) -> Result<(u64, i32)> {
    let mem = fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(format!("/proc/{pid}/mem"))
        .map_err(|e| crate::access::access_error(pid, &e))?;
    let mut regs = b.saved;
    // Below the red zone of whatever the thread was running.
    let mut sp = (b.saved.rsp - 512) & !15;
    let mut values = Vec::new();
    for a in args {
        match a {
            Arg::Value(v) => values.push(*v),
            Arg::Data(bytes) => {
                sp = (sp - bytes.len() as u64) & !15;
                mem.write_all_at(bytes, sp)
                    .with_context(|| format!("writing into process {pid}'s stack"))?;
                values.push(sp);
            }
        }
    }
    // As after a call instruction: a 16-byte aligned stack, then the return address.
    sp = (sp - 64) & !15;
    sp -= 8;
    mem.write_all_at(&0u64.to_le_bytes(), sp)
        .with_context(|| format!("writing into process {pid}'s stack"))?;
    let mut params = values.into_iter();
    regs.rdi = params.next().unwrap_or(0);
    regs.rsi = params.next().unwrap_or(0);
    regs.rdx = params.next().unwrap_or(0);
    regs.rcx = params.next().unwrap_or(0);
    regs.r8 = params.next().unwrap_or(0);
    regs.r9 = params.next().unwrap_or(0);
    regs.rip = func;
    regs.rsp = sp;
    regs.rax = 0;
    // Not in a system call any more: the kernel must not restart one at our function.
    regs.orig_rax = u64::MAX;
    b.restore = true;
    if trace_forks.is_some() {
        let options =
            libc::PTRACE_O_TRACEFORK | libc::PTRACE_O_TRACEVFORK | libc::PTRACE_O_TRACECLONE;
        // SAFETY: setting options of a thread we seized.
        if unsafe { libc::ptrace(libc::PTRACE_SETOPTIONS, b.tid, 0, options as libc::c_long) } != 0
        {
            return Err(ptrace_error(pid, "PTRACE_SETOPTIONS"));
        }
    }
    // SAFETY: writing a register block we own to a thread in a ptrace stop, then
    // continuing it.
    unsafe {
        if libc::ptrace(libc::PTRACE_SETREGS, b.tid, 0, &regs) != 0 {
            return Err(ptrace_error(pid, "PTRACE_SETREGS"));
        }
        libc::ptrace(libc::PTRACE_CONT, b.tid, 0, 0);
    }
    let deadline = Instant::now() + CALL_TIMEOUT;
    let tid = b.tid;
    let mut out = regs;
    let mut fault_elsewhere = None;
    wait_stop(tid, deadline, &mut b.held_signals, |status| {
        let event = status >> 16;
        if event != 0 {
            if let Some(seen) = trace_forks.as_mut() {
                let mut message: libc::c_ulong = 0;
                // SAFETY: reading the event message of a thread in an event stop.
                unsafe { libc::ptrace(libc::PTRACE_GETEVENTMSG, tid, 0, &mut message) };
                seen(event, message as u64);
            }
            return false;
        }
        if libc::WSTOPSIG(status) != libc::SIGSEGV {
            return false;
        }
        // SAFETY: reading the registers of the stopped thread into our block.
        unsafe { libc::ptrace(libc::PTRACE_GETREGS, tid, 0, &mut out) };
        if out.rip != 0 {
            fault_elsewhere = Some(out.rip);
        }
        true
    })?;
    if let Some(rip) = fault_elsewhere {
        bail!("the call fragscope made in process {pid} faulted at {rip:#x}");
    }
    Ok((out.rax, tid))
}
