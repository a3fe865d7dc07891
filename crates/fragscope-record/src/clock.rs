//! The shared clock page: the recorder writes the tick, every traced process reads it.
//! Layout (little-endian u64s): now, stats_request, flush_request; as
//! `struct shared_clock` in preload/fragscope_preload.c. `now` holds the tick above bit
//! [`TICK_SHIFT`] and below it the order counter, which threads add to on every free
//! (docs/trace-format.md, "Order"); setting a tick starts the counter again at 0.

use std::fs::{File, OpenOptions};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd};
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};

use anyhow::{bail, Result};

/// Where the tick starts in the shared word.
pub const TICK_SHIFT: u32 = 32;

pub struct ClockPage {
    ptr: *mut AtomicU64,
    /// Kept open for processes that cannot open the file themselves (another user's):
    /// the recorder hands them this descriptor.
    file: File,
}

// The page is only touched through atomics.
unsafe impl Send for ClockPage {}
unsafe impl Sync for ClockPage {}

impl ClockPage {
    pub fn create(path: &Path) -> Result<Self> {
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(path)?;
        file.set_len(4096)?;
        // SAFETY: a fresh 4 KiB shared mapping of a file we own; unmapped in Drop.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                4096,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                file.as_raw_fd(),
                0,
            )
        };
        if ptr == libc::MAP_FAILED {
            bail!(
                "cannot map the clock page: {}",
                std::io::Error::last_os_error()
            );
        }
        Ok(Self {
            ptr: ptr.cast(),
            file,
        })
    }

    pub fn descriptor(&self) -> BorrowedFd<'_> {
        self.file.as_fd()
    }

    fn slot(&self, i: usize) -> &AtomicU64 {
        // SAFETY: three u64 slots inside the mapped page, alive as long as self.
        unsafe { &*self.ptr.add(i) }
    }

    /// Moves the tick on to `tick` (not back, nor to the same tick: that would start the
    /// order counter again inside a tick, and threads' readings would go backwards).
    pub fn advance_tick(&self, tick: u64) {
        if tick > self.tick() {
            self.slot(0).store(tick << TICK_SHIFT, Ordering::Release);
        }
    }
    pub fn tick(&self) -> u64 {
        self.slot(0).load(Ordering::Acquire) >> TICK_SHIFT
    }
    /// Asks every traced process for allocator statistics and a buffer flush; each thread
    /// answers at its next allocator call.
    pub fn request_stats_and_flush(&self) {
        self.slot(1).fetch_add(1, Ordering::AcqRel);
        self.slot(2).fetch_add(1, Ordering::AcqRel);
    }
}

impl Drop for ClockPage {
    fn drop(&mut self) {
        // SAFETY: mapped in create with this size.
        unsafe { libc::munmap(self.ptr.cast(), 4096) };
    }
}
