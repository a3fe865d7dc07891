//! An allocator's shared library (or the program an allocator is linked into) as a
//! process maps it: its file, where it is loaded and its writable data (the file-backed
//! writable mapping and the anonymous one after it, .bss), for the censuses that find
//! hidden statics by their shape in that data (`tcmalloc`, `jemalloc`).

use crate::maps;
use crate::ProcessMemory;

/// The library's writable data as read from the process: where it lies and its bytes.
pub(crate) struct StaticData {
    pub base: u64,
    pub bytes: Vec<u8>,
}

impl StaticData {
    /// Reads `len` bytes at `base` from the process.
    pub fn read(
        mem: &mut ProcessMemory,
        (base, len): (u64, usize),
        what: &str,
    ) -> Result<Self, String> {
        let mut bytes = vec![0u8; len];
        mem.read(base, &mut bytes)
            .map_err(|e| format!("{what}'s data could not be read ({e})"))?;
        Ok(Self { base, bytes })
    }
    pub fn contains(&self, addr: u64) -> bool {
        addr >= self.base && addr < self.base + self.bytes.len() as u64
    }
    /// Whether `word` is stored in the data, at an 8-byte boundary.
    pub fn holds_word(&self, word: u64) -> bool {
        (self.bytes.chunks_exact(8)).any(|c| u64::from_le_bytes(c.try_into().unwrap()) == word)
    }
    pub fn at(&self, addr: u64, len: usize) -> Option<&[u8]> {
        let off = usize::try_from(addr.checked_sub(self.base)?).ok()?;
        self.bytes.get(off..off.checked_add(len)?)
    }
}

/// A library mapped in a process.
pub(crate) struct MappedLibrary {
    pub path: String,
    /// Its file name, e.g. "libjemalloc.so.2".
    pub name: String,
    /// Where its first page is mapped (the load bias of its symbols).
    pub base: u64,
    /// Its writable data: address and length.
    pub data: (u64, usize),
    /// One of its mappings, whose /proc/PID/map_files entry opens the very file mapped.
    first: (u64, u64),
}

impl MappedLibrary {
    /// The first library of `pid` whose file name starts with `prefix`; None when it maps
    /// none.
    pub fn find(pid: u32, prefix: &str) -> Result<Option<Self>, String> {
        Self::find_by(pid, |path| {
            path.rsplit('/')
                .next()
                .is_some_and(|file| file.starts_with(prefix))
        })
    }

    /// The image of `pid` mapped from `path` (a program or library that links an
    /// allocator into itself); None when it maps no such file.
    pub fn find_path(pid: u32, path: &str) -> Result<Option<Self>, String> {
        Self::find_by(pid, |p| p == path)
    }

    fn find_by(pid: u32, wanted: impl Fn(&str) -> bool) -> Result<Option<Self>, String> {
        let text = maps::read(pid).map_err(|e| format!("its maps cannot be read ({e})"))?;
        let all: Vec<maps::Mapping> = maps::parse(&text).collect();
        let file = |m: &maps::Mapping| m.path.rsplit('/').next().unwrap_or("").to_string();
        let Some(lib) = all.iter().find(|m| wanted(m.path)) else {
            return Ok(None);
        };
        let name = file(lib);
        let path = lib.path.to_string();
        let base = all
            .iter()
            .filter(|m| m.path == path)
            .map(|m| m.lo - m.offset)
            .min()
            .unwrap_or(lib.lo);
        // The library's writable mappings and the anonymous one right after them.
        let mut ranges: Vec<(u64, u64)> = Vec::new();
        for (i, m) in all.iter().enumerate() {
            if m.path == path && m.perms.starts_with("rw") {
                ranges.push((m.lo, m.hi));
                if let Some(next) = all.get(i + 1).filter(|n| n.lo == m.hi && n.anonymous()) {
                    ranges.push((next.lo, next.hi));
                }
            }
        }
        let (Some(lo), Some(hi)) = (
            ranges.iter().map(|r| r.0).min(),
            ranges.iter().map(|r| r.1).max(),
        ) else {
            return Err(format!("{name} has no writable data mapped"));
        };
        Ok(Some(Self {
            path,
            name,
            base,
            data: (lo, (hi - lo) as usize),
            first: (lib.lo, lib.hi),
        }))
    }

    /// The library's file, as the process maps it (the path may name a newer file).
    pub fn elf(&self, pid: u32) -> Result<Vec<u8>, String> {
        let (lo, hi) = self.first;
        std::fs::read(format!("/proc/{pid}/map_files/{lo:x}-{hi:x}"))
            .or_else(|_| std::fs::read(&self.path))
            .map_err(|e| format!("{} cannot be read ({e})", self.path))
    }
}
