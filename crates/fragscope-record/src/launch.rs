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

/// Checks that `program` is a dynamically linked ELF executable (or a script, whose
/// interpreter is): LD_PRELOAD does nothing to a statically linked program.
pub fn check_traceable(program: &OsStr) -> Result<PathBuf, NotTraceable> {
    let not = |reason: String| NotTraceable {
        program: PathBuf::from(program),
        reason,
    };
    let path = resolve_program(program)
        .ok_or_else(|| not("no such program (not a file, and not found in PATH)".into()))?;
    let data = std::fs::read(&path).map_err(|e| not(format!("cannot read it: {e}")))?;
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
            check_traceable(OsStr::new(&interp)).map(|_| path)
        };
    }
    use object::read::elf::{ElfFile64, ProgramHeader};
    use object::Endianness;
    let Ok(elf) = ElfFile64::<Endianness>::parse(&*data) else {
        return Err(not("it is not a 64-bit ELF executable or a script".into()));
    };
    let endian = elf.endian();
    let has_interp = elf
        .elf_program_headers()
        .iter()
        .any(|ph| ph.p_type(endian) == object::elf::PT_INTERP);
    if !has_interp {
        return Err(not(
            "it is statically linked, so the dynamic loader never runs and LD_PRELOAD cannot \
             interpose its malloc. Rebuild it dynamically linked (e.g. without -static; for Go, \
             with cgo and -linkmode=external), or link fragscope's interposer into it."
                .into(),
        ));
    }
    Ok(path)
}

/// Whether `exe` is a program built by Go's toolchain (its build information section, or
/// its runtime's entry point in the symbol table).
pub fn is_go_program(exe: &Path) -> bool {
    use object::{Object, ObjectSymbol};
    let Ok(data) = std::fs::read(exe) else {
        return false;
    };
    let Ok(obj) = object::File::parse(&*data) else {
        return false;
    };
    obj.section_by_name(".go.buildinfo").is_some()
        || obj.symbols().any(|s| s.name() == Ok("runtime.main"))
}
