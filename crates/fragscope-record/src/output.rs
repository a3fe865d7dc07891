//! The trace file of a recording or a snapshot: created without destroying what is not
//! a trace, and the Meta chunk it starts with.

use std::io::Read;
use std::path::Path;
use std::thread;
use std::time::{SystemTime, UNIX_EPOCH};

use anyhow::{bail, Context, Result};
use fragscope_trace::{Meta, StackMode};

/// Creates the trace file, replacing only what is a trace (or, with `force`, anything):
/// `-o notes.txt` must not destroy notes.txt, and a symbolic link at the path is never
/// written through (it is refused, or with `force` replaced by the trace). An earlier
/// trace is unlinked and let go by a thread of its own: truncating it in place frees its
/// blocks inside the call (25 ms for 37 MiB on ext4), time the recording would otherwise
/// start late by. A device (/dev/null) is written as it is.
pub fn create_output(path: &Path, force: bool) -> Result<std::fs::File> {
    use std::os::unix::fs::OpenOptionsExt;
    let shown = path.display();
    let meta = match std::fs::symlink_metadata(path) {
        Ok(m) => Some(m),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
        Err(e) => return Err(e).with_context(|| format!("looking at {shown}")),
    };
    let is_trace = || {
        let mut magic = [0u8; 8];
        std::fs::File::open(path)
            .and_then(|mut f| f.read_exact(&mut magic))
            .is_ok_and(|()| &magic == fragscope_trace::chunk::FILE_MAGIC)
    };
    match &meta {
        Some(m) if m.file_type().is_symlink() => {
            if !force {
                bail!(
                    "{shown} is a symbolic link; fragscope does not write through it (it would \
                     overwrite the file it points to). Name the file itself with -o, or add \
                     --force to replace the link with the trace."
                );
            }
            std::fs::remove_file(path).with_context(|| format!("removing the link {shown}"))?;
        }
        Some(m) if m.file_type().is_file() && m.len() > 0 => {
            if !force && !is_trace() {
                bail!(
                    "{shown} exists and is not a fragscope trace; it is left as it is. Choose \
                     another name with -o, or add --force to replace it."
                );
            }
            if let Ok(old) = std::fs::File::open(path) {
                if std::fs::remove_file(path).is_ok() {
                    let _ = thread::Builder::new()
                        .name("fragscope-unlink".into())
                        .spawn(move || drop(old));
                }
            }
        }
        _ => {}
    }
    std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .custom_flags(libc::O_NOFOLLOW)
        .open(path)
        .with_context(|| format!("creating {shown}"))
}

/// The Meta chunk of a trace that starts now, on this host (no GHC eventlog).
pub(crate) fn meta_now(
    page_size: u64,
    stacks: StackMode,
    sample_bytes: u64,
    snapshot_ms: u32,
    argv: Vec<String>,
) -> Meta {
    Meta {
        fragscope_version: env!("CARGO_PKG_VERSION").into(),
        start_unix_ns: SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(0),
        tick_ns: 1_000_000,
        page_size: page_size as u32,
        stacks,
        sample_bytes,
        snapshot_ms,
        argv,
        hostname: std::fs::read_to_string("/proc/sys/kernel/hostname")
            .unwrap_or_default()
            .trim()
            .to_string(),
        ghc_eventlog: None,
        aggregated: false,
    }
}
