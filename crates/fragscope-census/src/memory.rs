//! Reading another process's memory through /proc/PID/mem.

use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;

/// Another process's address space, opened for reading. Needs ptrace access to it (its
/// parent has it; otherwise the same user with `kernel.yama.ptrace_scope` 0, or
/// CAP_SYS_PTRACE).
pub struct ProcessMemory {
    pid: u32,
    mem: File,
    bytes_read: u64,
}

impl ProcessMemory {
    pub fn open(pid: u32) -> io::Result<Self> {
        let mem = File::open(format!("/proc/{pid}/mem"))?;
        Ok(Self {
            pid,
            mem,
            bytes_read: 0,
        })
    }

    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// Bytes read since opening: what a census cost.
    pub fn bytes_read(&self) -> u64 {
        self.bytes_read
    }

    /// Fills `buf` from `addr`; an error when any of it is unmapped or unreadable.
    pub fn read(&mut self, addr: u64, buf: &mut [u8]) -> io::Result<()> {
        self.mem.read_exact_at(buf, addr).map_err(|e| {
            io::Error::new(
                e.kind(),
                format!(
                    "cannot read {} bytes at {addr:#x} of process {}: {e}",
                    buf.len(),
                    self.pid
                ),
            )
        })?;
        self.bytes_read += buf.len() as u64;
        Ok(())
    }

    /// Reads several ranges, one after another into `out` (resized to their total); ranges
    /// that follow each other in memory are read together. An error when any of them is
    /// unreadable.
    ///
    /// Range by range through /proc/PID/mem, never with process_vm_readv: that call pins
    /// the pages it reads, and pinning a page still shared copy-on-write with another
    /// process (a pre-fork server's worker and its parent) makes the kernel give the
    /// process a copy of its own: reading a worker's pool headers copied a quarter of
    /// its arenas. Reads through the mem file leave them shared.
    pub fn read_ranges(&mut self, ranges: &[(u64, usize)], out: &mut Vec<u8>) -> io::Result<()> {
        let total: usize = ranges.iter().map(|r| r.1).sum();
        out.resize(total, 0);
        let mut at = 0usize;
        let mut i = 0;
        while i < ranges.len() {
            // A run of ranges each starting where the one before ends.
            let (start, mut len) = ranges[i];
            let mut j = i + 1;
            while j < ranges.len() && ranges[j].0 == start + len as u64 {
                len += ranges[j].1;
                j += 1;
            }
            self.read(start, &mut out[at..at + len])?;
            at += len;
            i = j;
        }
        Ok(())
    }

    pub fn read_u64(&mut self, addr: u64) -> io::Result<u64> {
        let mut b = [0u8; 8];
        self.read(addr, &mut b)?;
        Ok(u64::from_le_bytes(b))
    }

    pub fn read_u32(&mut self, addr: u64) -> io::Result<u32> {
        let mut b = [0u8; 4];
        self.read(addr, &mut b)?;
        Ok(u32::from_le_bytes(b))
    }

    pub fn read_u8(&mut self, addr: u64) -> io::Result<u8> {
        let mut b = [0u8; 1];
        self.read(addr, &mut b)?;
        Ok(b[0])
    }
}

/// Small records (tcmalloc's spans, jemalloc's extent descriptors, Go's spans) read a
/// window at a time: allocators carve them side by side from chunks of their metadata, so
/// one read of 64 KiB brings over a thousand (one read per span made a census of 100 000
/// spans hold the process 4 times longer). Each window is read once: the process is held.
#[derive(Default)]
pub(crate) struct RecordReader {
    windows: std::collections::HashMap<u64, Vec<u8>>,
}

const RECORD_WINDOW: u64 = 64 << 10;

impl RecordReader {
    /// The bytes read at once around a record, from a multiple of them.
    pub const WINDOW: u64 = RECORD_WINDOW;

    /// The `N` bytes at `at`.
    pub fn read<const N: usize>(
        &mut self,
        mem: &mut ProcessMemory,
        at: u64,
    ) -> Result<[u8; N], String> {
        let mut record = [0u8; N];
        self.read_into(mem, at, &mut record, "a record")?;
        Ok(record)
    }

    /// Fills `out` from `at` (a record whose size is known at run time); `what` names it
    /// in the error.
    pub fn read_into(
        &mut self,
        mem: &mut ProcessMemory,
        at: u64,
        out: &mut [u8],
        what: &str,
    ) -> Result<(), String> {
        let n = out.len();
        let window = at & !(RECORD_WINDOW - 1);
        let off = (at - window) as usize;
        let cached = if off + n > RECORD_WINDOW as usize {
            // Across a window's end: read on its own.
            None
        } else {
            match self.windows.entry(window) {
                std::collections::hash_map::Entry::Occupied(e) => Some(e.into_mut()),
                std::collections::hash_map::Entry::Vacant(v) => {
                    let mut bytes = vec![0u8; RECORD_WINDOW as usize];
                    // A window reaching past a mapping's end: the record alone.
                    mem.read(window, &mut bytes).ok().map(|()| v.insert(bytes))
                }
            }
        };
        match cached {
            Some(bytes) => {
                out.copy_from_slice(&bytes[off..off + n]);
                Ok(())
            }
            None => mem
                .read(at, out)
                .map_err(|e| format!("{what} at {at:#x} could not be read ({e})")),
        }
    }
}

/// The little-endian words of a buffer read from another process, at byte `at`.
pub(crate) fn le_u64(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().unwrap())
}
pub(crate) fn le_u32(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().unwrap())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_our_own_memory_and_refuses_unmapped_addresses() {
        let here: u64 = 0x1234_5678_9abc_def0;
        let addr = std::ptr::addr_of!(here) as u64;
        let mut m = ProcessMemory::open(std::process::id()).unwrap();
        assert_eq!(m.read_u64(addr).unwrap(), here);
        assert_eq!(m.bytes_read(), 8);
        let err = m.read_u64(8).unwrap_err();
        assert!(
            err.to_string().contains("cannot read 8 bytes at 0x8"),
            "{err}"
        );

        let words: Vec<u64> = (0..3000).collect();
        let base = words.as_ptr() as u64;
        // Every other word, in more ranges than one system call takes.
        let ranges: Vec<(u64, usize)> = (0..1500).map(|i| (base + 16 * i, 8)).collect();
        let mut out = Vec::new();
        m.read_ranges(&ranges, &mut out).unwrap();
        assert_eq!(out.len(), 1500 * 8);
        for (i, w) in out.chunks_exact(8).enumerate() {
            assert_eq!(u64::from_le_bytes(w.try_into().unwrap()), 2 * i as u64);
        }
        let mut bad = ranges.clone();
        bad[1200] = (16, 8);
        let err = m.read_ranges(&bad, &mut out).unwrap_err();
        assert!(err.to_string().contains("at 0x10"), "{err}");
    }
}
