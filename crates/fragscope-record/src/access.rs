//! Reading another process: the words for a refusal, and whether it is still there.
//! Used by `snapshot`, `record -p` and the forked copies alike.

/// Why a snapshot could not be taken, worded for the user.
pub(crate) fn access_error(pid: u32, e: &std::io::Error) -> anyhow::Error {
    match e.kind() {
        std::io::ErrorKind::NotFound => {
            anyhow::anyhow!("no process {pid} (it does not exist or has exited)")
        }
        std::io::ErrorKind::PermissionDenied => anyhow::anyhow!(
            "not allowed to read the memory of process {pid} ({e}). fragscope snapshot needs \
             ptrace access to it: run it as the process's user with \
             /proc/sys/kernel/yama/ptrace_scope at 0 (it is {}), or as root / with \
             CAP_SYS_PTRACE (e.g. sudo fragscope snapshot {pid})",
            std::fs::read_to_string("/proc/sys/kernel/yama/ptrace_scope")
                .map_or_else(|_| "absent".into(), |s| s.trim().to_string())
        ),
        _ => anyhow::anyhow!("cannot read process {pid}: {e}"),
    }
}

pub(crate) fn gone(pid: u32) -> bool {
    !std::path::Path::new(&format!("/proc/{pid}")).exists()
        || std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .map(|s| {
                s.rsplit(')')
                    .next()
                    .unwrap_or("")
                    .trim_start()
                    .starts_with('Z')
            })
            .unwrap_or(true)
}
