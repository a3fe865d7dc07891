//! Before starting a program: can the interposer reach it at all?

use std::ffi::OsStr;
use std::fmt;
use std::path::{Path, PathBuf};

/// A program fragscope cannot trace, with the reason and what to do instead.
#[derive(Debug)]
pub struct NotTraceable {
    pub program: PathBuf,
    pub reason: String,
}

impl fmt::Display for NotTraceable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "cannot trace {}: {}",
            self.program.display(),
            self.reason
        )
    }
}

impl std::error::Error for NotTraceable {}

/// Finds `program` as the shell would (PATH lookup when it has no slash).
pub fn resolve_program(program: &OsStr) -> Option<PathBuf> {
    let p = Path::new(program);
    if p.components().count() > 1 || program.to_string_lossy().contains('/') {
        return p.is_file().then(|| p.to_path_buf());
    }
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|dir| dir.join(program))
        .find(|c| is_executable(c))
}

fn is_executable(p: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    p.metadata()
        .map(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
        .unwrap_or(false)
}

/// Who runs a program: what secure execution depends on.
struct Identity {
    uid: u32,
    gid: u32,
    /// Permitted capabilities.
    capabilities: u64,
}

impl Identity {
    fn own() -> Self {
        // SAFETY: getuid and getgid cannot fail.
        let (uid, gid) = unsafe { (libc::getuid(), libc::getgid()) };
        Self {
            uid,
            gid,
            capabilities: own_permitted_capabilities(),
        }
    }

    /// Another process, known by its ids only: root is taken to hold every capability.
    fn of(uid: u32, gid: u32) -> Self {
        let capabilities = if uid == 0 { u64::MAX } else { 0 };
        Self {
            uid,
            gid,
            capabilities,
        }
    }
}

/// Checks that `program` is a dynamically linked ELF executable (or a script, whose
/// interpreter is): LD_PRELOAD does nothing to a statically linked program, nor to one
/// that gains privileges when exec'd (set-user-ID, set-group-ID, file capabilities).
pub fn check_traceable(program: &OsStr) -> Result<PathBuf, NotTraceable> {
    check_traceable_as(program, &Identity::own())
}

/// Why a process image that uid `uid` and gid `gid` exec'd never connected, and what to
/// do about it.
pub fn why_untraced(program: &OsStr, uid: u32, gid: u32, preload: &Path) -> String {
    if let Err(e) = check_traceable_as(program, &Identity::of(uid, gid)) {
        return e.reason;
    }
    if !preload.is_file() {
        return format!(
            "fragscope's interposer {} does not exist (is FRAGSCOPE_PRELOAD set to it?)",
            preload.display()
        );
    }
    if uid != 0 && !crate::preload::readable_by_all(preload) {
        return format!(
            "it ran as uid {uid}, which cannot read fragscope's interposer ({}); make it \
             readable by all (mode 0644, directories 0755) or set FRAGSCOPE_PRELOAD to a \
             copy that is",
            preload.display()
        );
    }
    "it never connected to fragscope: the dynamic loader did not load the interposer (its \
     LD_PRELOAD was changed or cleared before the exec, or the loader refused it: see the \
     program's stderr), so it ran untraced. Keep fragscope's interposer in its LD_PRELOAD."
        .into()
}

fn check_traceable_as(program: &OsStr, who: &Identity) -> Result<PathBuf, NotTraceable> {
    let not = |reason: String| NotTraceable {
        program: PathBuf::from(program),
        reason,
    };
    let path = resolve_program(program)
        .ok_or_else(|| not("no such program (not a file, and not found in PATH)".into()))?;
    // Before reading it: a set-user-ID program may be executable and not readable.
    if let Some(reason) = secure_execution(&path, who) {
        return Err(not(reason));
    }
    let data =
        fragscope_census::image::map(&path).map_err(|e| not(format!("cannot read it: {e}")))?;
    if data.starts_with(b"#!") {
        let line = data.split(|&b| b == b'\n').next().unwrap_or(&[]);
        let interp = String::from_utf8_lossy(&line[2..])
            .split_whitespace()
            .next()
            .unwrap_or("")
            .to_string();
        // `#!/usr/bin/env python3`: the real program is env's argument; env itself is
        // dynamic on every distribution we know, and it execs the interpreter traced.
        return if interp.is_empty() {
            Err(not("a script without an interpreter".into()))
        } else {
            check_traceable_as(OsStr::new(&interp), who).map(|_| path)
        };
    }
    let Some(dynamic) = dynamically_linked(&data) else {
        return Err(not("it is not a 64-bit ELF executable or a script".into()));
    };
    if !dynamic {
        return Err(not(
            "it is statically linked, so the dynamic loader never runs and LD_PRELOAD cannot \
             interpose its malloc. Rebuild it dynamically linked (e.g. without -static; for Go, \
             with cgo and -linkmode=external), or link fragscope's interposer into it."
                .into(),
        ));
    }
    Ok(path)
}

/// Whether an ELF executable names a dynamic loader (None: not a 64-bit ELF file).
fn dynamically_linked(data: &[u8]) -> Option<bool> {
    use object::read::elf::{ElfFile64, ProgramHeader};
    use object::Endianness;
    let elf = ElfFile64::<Endianness>::parse(data).ok()?;
    let endian = elf.endian();
    Some(
        elf.elf_program_headers()
            .iter()
            .any(|ph| ph.p_type(endian) == object::elf::PT_INTERP),
    )
}

/// `program`'s path when it is a statically linked Go program (built without cgo): it
/// makes no malloc call to interpose, and its heap is the Go runtime's, which the census
/// reads from outside at every snapshot.
pub fn static_go_program(program: &OsStr) -> Option<PathBuf> {
    let path = resolve_program(program)?;
    let data = fragscope_census::image::map(&path).ok()?;
    (dynamically_linked(&data) == Some(false) && is_go_image(&data)).then_some(path)
}

/// Why `who` exec'ing `path` would run it in secure-execution mode (it gains a user, group
/// or capabilities), in which the dynamic loader ignores LD_PRELOAD; None when it would
/// not.
fn secure_execution(path: &Path, who: &Identity) -> Option<String> {
    use std::os::unix::fs::MetadataExt;
    let meta = std::fs::metadata(path).ok()?;
    let gains_nothing = || -> bool {
        // A nosuid mount, or no_new_privs on us, makes the kernel ignore the bits and
        // file capabilities alike.
        // SAFETY: prctl with integer arguments.
        let no_new_privs = unsafe { libc::prctl(libc::PR_GET_NO_NEW_PRIVS, 0, 0, 0, 0) } == 1;
        no_new_privs || mounted_nosuid(path)
    };
    const WAY_OUT: &str = "Record a copy without the bit (`cp` does not copy it), or start \
        fragscope as the user the program would become; a program that changes its user \
        itself (setpriv, su, gosu, a daemon calling setuid) is followed.";
    let why_secure = "the kernel runs it in secure-execution mode, where the dynamic loader \
        ignores LD_PRELOAD, so its calls cannot be recorded";
    let (uid, gid) = (who.uid, who.gid);
    let mode = meta.mode();
    if mode & libc::S_ISUID != 0 && meta.uid() != uid && !gains_nothing() {
        return Some(format!(
            "it is set-user-ID (it runs as uid {}, started by uid {uid}): {why_secure}. {WAY_OUT}",
            meta.uid()
        ));
    }
    // Set-group-ID without group execute is mandatory locking, not a change of group.
    let setgid = mode & libc::S_ISGID != 0 && mode & libc::S_IXGRP != 0;
    if setgid && meta.gid() != gid && !gains_nothing() {
        return Some(format!(
            "it is set-group-ID (it runs as gid {}, started by gid {gid}): {why_secure}. {WAY_OUT}",
            meta.gid()
        ));
    }
    let file_caps = file_capabilities(path)?;
    let gained = file_caps & !who.capabilities;
    (gained != 0 && !gains_nothing()).then(|| {
        format!(
            "it has file capabilities (setcap; {gained:#x} beyond those of its starter): {why_secure}. \
             Record a copy without them (`cp` does not copy them), or run fragscope with \
             those capabilities (e.g. as root)."
        )
    })
}

fn mounted_nosuid(path: &Path) -> bool {
    crate::mounts::mount_flags(path).is_some_and(|f| f & libc::ST_NOSUID != 0)
}

/// The permitted capabilities a file grants (its `security.capability` attribute, as
/// `struct vfs_cap_data`: magic, then permitted and inheritable words, low then high);
/// None when it has none.
fn file_capabilities(path: &Path) -> Option<u64> {
    use std::os::unix::ffi::OsStrExt;
    let c = std::ffi::CString::new(path.as_os_str().as_bytes()).ok()?;
    let mut data = [0u8; 24];
    // SAFETY: getxattr writes at most data.len() bytes.
    let n = unsafe {
        libc::getxattr(
            c.as_ptr(),
            c"security.capability".as_ptr(),
            data.as_mut_ptr().cast(),
            data.len(),
        )
    };
    if n < 12 {
        return None;
    }
    let word = |at: usize| u64::from(u32::from_le_bytes(data[at..at + 4].try_into().unwrap()));
    let high = if n >= 20 { word(12) } else { 0 };
    Some(word(4) | high << 32)
}

/// This process's permitted capabilities (CapPrm in /proc/self/status).
fn own_permitted_capabilities() -> u64 {
    crate::procfs::status_field("self", "CapPrm")
        .and_then(|v| u64::from_str_radix(&v, 16).ok())
        .unwrap_or(0)
}

/// Whether `exe` is a program built by Go's toolchain (its build information section, or
/// its runtime's entry point in the symbol table).
pub fn is_go_program(exe: &Path) -> bool {
    fragscope_census::image::map(exe).is_ok_and(|data| is_go_image(&data))
}

/// Whether an executable's bytes are a program Go's toolchain built.
fn is_go_image(data: &[u8]) -> bool {
    use object::{Object, ObjectSymbol};
    let Ok(obj) = object::File::parse(data) else {
        return false;
    };
    obj.section_by_name(".go.buildinfo").is_some()
        || obj.symbols().any(|s| s.name() == Ok("runtime.main"))
}
