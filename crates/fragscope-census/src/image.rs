//! An executable or library read for its symbols, sections or strings: mapped, not
//! copied. The recorder looks at each program it runs several times (is it a GHC, Go or
//! SBCL program, which allocator does it link), and Node's executable is 98 MB: read
//! whole, five looks cost 0.6 s of the recording's system time; mapped, its pages are
//! the page cache's.

use std::path::Path;

/// The bytes of the file at `path`, mapped read-only. A file that is being run cannot be
/// written to (ETXTBSY), so its mapping does not change under the reader.
pub fn map(path: impl AsRef<Path>) -> std::io::Result<memmap2::Mmap> {
    let file = std::fs::File::open(path)?;
    // SAFETY: read-only and private to this process; see above for why the file stays.
    unsafe { memmap2::Mmap::map(&file) }
}
