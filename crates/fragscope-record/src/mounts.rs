//! The file system a path lies on: whether it lets set-user-ID programs run (`launch`)
//! and code be mapped from it (`preload`).

use std::path::Path;

/// The flags (ST_NOSUID, ST_NOEXEC, ...) of the file system holding `path`.
pub(crate) fn mount_flags(path: &Path) -> Option<u64> {
    use std::os::unix::ffi::OsStrExt;
    let c = std::ffi::CString::new(path.as_os_str().as_bytes()).ok()?;
    // SAFETY: statvfs writes one struct into `st`.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: a valid C string and out pointer.
    (unsafe { libc::statvfs(c.as_ptr(), &mut st) } == 0).then_some(st.f_flag)
}
