//! The interposer travels inside the fragscope binary and is written out once per build,
//! content-addressed, so concurrent recordings and different versions never collide.
//!
//! The copy must load in every process the program becomes, whatever its user: a server
//! started through setpriv, su or gosu, or a daemon that calls setuid and forks, runs as
//! another user than fragscope. So it lives where every user can read it (mode 0644, in
//! directories of mode 0755 owned by the recording user), on a file system that allows
//! executable mappings (/dev/shm may be mounted noexec).

use std::fs;
use std::io::Write;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};

static PRELOAD: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/libfragscope_preload.so"));

/// The module Node.js processes load to hand the recorder their V8 heap's figures.
static V8_MODULE: &[u8] = include_bytes!("../runtime/v8_heap.js");

/// FNV-1a of `bytes` from `h`, for the hash below.
const fn fnv1a(mut h: u64, bytes: &[u8]) -> u64 {
    let mut i = 0;
    while i < bytes.len() {
        h = (h ^ bytes[i] as u64).wrapping_mul(0x100000001b3);
        i += 1;
    }
    h
}

/// FNV-1a of the interposer and the Node module, computed when fragscope is built (not
/// at every run): the name of the directory that holds this build's copies.
const PRELOAD_HASH: u64 = fnv1a(fnv1a(0xcbf29ce484222325, PRELOAD), V8_MODULE);

const LIBRARY_NAME: &str = "libfragscope_preload.so";
const V8_MODULE_NAME: &str = "fragscope_v8_heap.js";

/// The Node module written beside the interposer at `preload`, when it is there (an
/// interposer given by FRAGSCOPE_PRELOAD may have none beside it).
pub fn v8_module(preload: &Path) -> Option<PathBuf> {
    Some(preload.with_file_name(V8_MODULE_NAME)).filter(|p| p.is_file())
}

/// The path of the interposer on disk, writing it out if this build's copy is missing.
/// `FRAGSCOPE_PRELOAD` overrides it (for testing another build of the interposer).
pub fn preload_library() -> Result<PathBuf> {
    if let Some(p) = std::env::var_os("FRAGSCOPE_PRELOAD") {
        return Ok(PathBuf::from(p));
    }
    // SAFETY: geteuid cannot fail.
    let uid = unsafe { libc::geteuid() };
    let user_cache = std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))
        .filter(|p| p.is_absolute())
        .map(|p| p.join("fragscope"));
    // The user's cache when every user can reach it (often not: ~ or ~/.cache of mode
    // 0700, /root), else a directory of the user's own in a shared temporary directory.
    let candidates = user_cache
        .filter(|p| reachable_by_all(p))
        .into_iter()
        .chain(
            ["/var/tmp", "/tmp", "/dev/shm"]
                .iter()
                .map(|t| Path::new(t).join(format!("fragscope.{uid}"))),
        );
    let mut tried = Vec::new();
    for base in candidates {
        match write_into(&base, uid) {
            Ok(path) => return Ok(path),
            Err(e) => tried.push(format!("{}: {e:#}", base.display())),
        }
    }
    bail!(
        "found no directory every user can read and execute from to hold fragscope's \
         interposer (tried {}); set FRAGSCOPE_PRELOAD to a copy of it",
        tried.join("; ")
    )
}

/// Writes this build's interposer under `base` (made if missing), readable by all.
fn write_into(base: &Path, uid: u32) -> Result<PathBuf> {
    let dir = base.join(format!("{PRELOAD_HASH:016x}"));
    let path = dir.join(LIBRARY_NAME);
    if !base.exists() {
        fs::DirBuilder::new()
            .recursive(true)
            .mode(0o755)
            .create(base)
            .with_context(|| format!("creating {}", base.display()))?;
    }
    owned_and_not_writable_by_others(base, uid)?;
    if fs::symlink_metadata(&dir).is_err() {
        fs::DirBuilder::new()
            .mode(0o755)
            .create(&dir)
            .or_else(|e| if dir.is_dir() { Ok(()) } else { Err(e) })
            .with_context(|| format!("creating {}", dir.display()))?;
    }
    owned_and_not_writable_by_others(&dir, uid)?;
    // The umask may have taken bits from what we asked for.
    for d in [base, dir.as_path()] {
        if fs::metadata(d)?.mode() & 0o755 != 0o755 {
            fs::set_permissions(d, fs::Permissions::from_mode(0o755))
                .with_context(|| format!("making {} readable by all", d.display()))?;
        }
    }
    if no_executable_mappings(&dir) {
        bail!("mounted noexec");
    }
    write_whole(&path, PRELOAD)?;
    write_whole(&dir.join(V8_MODULE_NAME), V8_MODULE)?;
    Ok(path)
}

/// Writes `bytes` to `path`, readable by all, unless it holds them already.
fn write_whole(path: &Path, bytes: &[u8]) -> Result<()> {
    // The directory is named by the files' hash and each file is renamed into place
    // whole, so a file of the right length is the right file (no need to read it).
    // Copies by older versions were readable by their user only.
    if fs::symlink_metadata(path)
        .is_ok_and(|m| m.is_file() && m.len() == bytes.len() as u64 && m.mode() & 0o444 == 0o444)
    {
        return Ok(());
    }
    // Written under a temporary name and renamed, so a concurrent run never loads half a file.
    let dir = path.parent().unwrap_or(Path::new("."));
    let mut tmp = tempfile::NamedTempFile::new_in(dir)?;
    tmp.write_all(bytes)?;
    tmp.as_file()
        .set_permissions(fs::Permissions::from_mode(0o644))?;
    tmp.persist(path)
        .with_context(|| format!("writing {}", path.display()))?;
    Ok(())
}

/// Refuses a directory another user could change (or a symlink to one): what is in it
/// runs in every traced process.
fn owned_and_not_writable_by_others(dir: &Path, uid: u32) -> Result<()> {
    let m = fs::symlink_metadata(dir)?;
    if !m.is_dir() || m.uid() != uid || m.mode() & 0o022 != 0 {
        bail!("not a directory of ours that only we can write to");
    }
    Ok(())
}

/// Every user can read `file`: it is readable by others and every directory above it can
/// be searched by others.
pub(crate) fn readable_by_all(file: &Path) -> bool {
    fs::metadata(file).is_ok_and(|m| m.mode() & 0o004 != 0)
        && file.parent().is_none_or(reachable_by_all)
}

/// Every directory from the root to `dir` (as far as it exists) can be searched by all.
fn reachable_by_all(dir: &Path) -> bool {
    dir.ancestors()
        .filter_map(|d| fs::metadata(d).ok())
        .all(|m| m.mode() & 0o001 != 0)
}

fn no_executable_mappings(dir: &Path) -> bool {
    crate::mounts::mount_flags(dir).is_some_and(|f| f & libc::ST_NOEXEC != 0)
}

#[cfg(test)]
mod tests {
    /// The interposer's sampler (preload/sbcl.h, `lisp_releases`) reads the SBCL releases
    /// the census reads, with the same `struct thread` offsets.
    #[test]
    fn the_lisp_sampler_knows_the_releases_the_census_reads() {
        let header = include_str!("../preload/sbcl.h");
        let table = &header[header.find("} lisp_releases[] = {").expect("lisp_releases")..];
        let table = &table[..table.find("};").unwrap()];
        // {"2.5.2", start, end, this, cons, mixed, sys mixed, sys cons, "counter", name}
        let rows: Vec<(String, Vec<u64>)> = table
            .lines()
            .filter_map(|l| l.trim().strip_prefix("{\""))
            .map(|l| {
                let (version, rest) = l.split_once('"').unwrap();
                let numbers = rest
                    .split(',')
                    .filter_map(|w| w.trim().parse().ok())
                    .collect();
                (version.to_string(), numbers)
            })
            .collect();
        let census = fragscope_census::sbcl::RELEASES;
        assert_eq!(
            rows.iter().map(|r| r.0.as_str()).collect::<Vec<_>>(),
            census.iter().map(|r| r.version).collect::<Vec<_>>()
        );
        for ((version, n), r) in rows.iter().zip(census.iter()) {
            // this, then the cons, mixed, system mixed and system cons regions.
            let expected = [
                r.thread_this,
                r.thread_tlabs[1],
                r.thread_tlabs[2],
                r.thread_tlabs[4],
                r.thread_tlabs[5],
            ];
            assert_eq!(n[2..7], expected, "SBCL {version}");
        }
    }
}
