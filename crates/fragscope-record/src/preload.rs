//! The interposer travels inside the fragscope binary and is written out once per build,
//! content-addressed, so concurrent recordings and different versions never collide.

use std::fs;
use std::io::Write;
use std::path::PathBuf;

use anyhow::{Context, Result};

static PRELOAD: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/libfragscope_preload.so"));

/// FNV-1a of the interposer, computed when fragscope is built (not at every run).
const PRELOAD_HASH: u64 = {
    let mut h = 0xcbf29ce484222325u64;
    let mut i = 0;
    while i < PRELOAD.len() {
        h = (h ^ PRELOAD[i] as u64).wrapping_mul(0x100000001b3);
        i += 1;
    }
    h
};

/// The path of the interposer on disk, writing it out if this build's copy is missing.
/// `FRAGSCOPE_PRELOAD` overrides it (for testing another build of the interposer).
pub fn preload_library() -> Result<PathBuf> {
    if let Some(p) = std::env::var_os("FRAGSCOPE_PRELOAD") {
        return Ok(PathBuf::from(p));
    }
    let base = std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))
        .filter(|p| p.is_absolute())
        .unwrap_or_else(std::env::temp_dir);
    let dir = base.join("fragscope").join(format!("{PRELOAD_HASH:016x}"));
    let path = dir.join("libfragscope_preload.so");
    // The directory is named by the library's hash and the file is renamed into place
    // whole, so a file of the right length is the right file (no need to read it).
    if fs::metadata(&path).is_ok_and(|m| m.len() == PRELOAD.len() as u64) {
        return Ok(path);
    }
    fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    // Written under a temporary name and renamed, so a concurrent run never loads half a file.
    let mut tmp = tempfile::NamedTempFile::new_in(&dir)?;
    tmp.write_all(PRELOAD)?;
    tmp.persist(&path)
        .with_context(|| format!("writing {}", path.display()))?;
    Ok(path)
}
