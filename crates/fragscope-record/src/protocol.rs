//! Messages from the interposer (docs/trace-format.md, "Recorder protocol"); the C side
//! is `struct msg_header` and the MSG_* values in preload/fragscope_preload.c.

use std::io::{self, Read};

pub const HEADER_BYTES: usize = 32;
pub const MAX_PAYLOAD: u32 = 16 << 20;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MsgType {
    Hello,
    Events,
    MapsChanged,
    Exit,
    Exec,
    ExecFailed,
    /// CPython's sampled objects (chunk 18, as they come).
    Python,
    /// SBCL's sampled allocation regions (chunk 22, as they come).
    Lisp,
    Unknown(u32),
}

#[derive(Debug, Clone, Copy)]
pub struct MsgHeader {
    pub kind: MsgType,
    pub len: u32,
    pub tid: u32,
    pub seq: u32,
    pub first_tick: u64,
    pub last_tick: u64,
}

pub const HELLO_RESUMED: u32 = 1;
pub const HELLO_FORKED: u32 = 2;
/// The process could not open the clock page (it runs as another user): the recorder
/// answers the HELLO with one byte carrying the page's descriptor (SCM_RIGHTS).
pub const HELLO_WANTS_CLOCK: u32 = 4;
/// The process's threads get an idle buffer sent for them when they make no call for a
/// while (the interposer registered membarrier).
pub const HELLO_MARKS_IDLE: u32 = 8;
/// The interposer was loaded into the running process by `record -p` (preload/attach.h).
pub const HELLO_ATTACHED: u32 = 16;

/// The HELLO payload.
#[derive(Debug, Clone)]
pub struct Hello {
    pub pid: u32,
    pub ppid: u32,
    pub flags: u32,
    pub tick: u64,
    pub argv: Vec<String>,
    pub exe: String,
    /// The recording's secret (FRAGSCOPE_TOKEN), as the process knows it.
    pub token: Vec<u8>,
    /// A forked process: the mark its parent recorded at the fork (0: none).
    pub fork_mark: u32,
}

/// The EXEC payload: who is about to run what.
#[derive(Debug, Clone)]
pub struct ExecTarget {
    /// The exec'ing process: the connection's, or a vfork child sharing it.
    pub pid: u32,
    pub uid: u32,
    pub gid: u32,
    pub path: String,
    pub argv: Vec<String>,
}

fn le32(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().unwrap())
}
fn le64(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().unwrap())
}

/// Reads one message header; `Ok(None)` at a clean end of the connection.
pub fn read_header(r: &mut impl Read) -> io::Result<Option<MsgHeader>> {
    let mut b = [0u8; HEADER_BYTES];
    let mut got = 0;
    while got < b.len() {
        match r.read(&mut b[got..]) {
            Ok(0) if got == 0 => return Ok(None),
            Ok(0) => return Err(io::ErrorKind::UnexpectedEof.into()),
            Ok(n) => got += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    let kind = match le32(&b, 0) {
        1 => MsgType::Hello,
        2 => MsgType::Events,
        3 => MsgType::MapsChanged,
        4 => MsgType::Exit,
        5 => MsgType::Exec,
        6 => MsgType::ExecFailed,
        7 => MsgType::Python,
        8 => MsgType::Lisp,
        other => MsgType::Unknown(other),
    };
    Ok(Some(MsgHeader {
        kind,
        len: le32(&b, 4),
        tid: le32(&b, 8),
        seq: le32(&b, 12),
        first_tick: le64(&b, 16),
        last_tick: le64(&b, 24),
    }))
}

pub fn parse_hello(p: &[u8]) -> Option<Hello> {
    if p.len() < 32 {
        return None;
    }
    let token_len = le32(p, 12) as usize;
    let cmd_len = le32(p, 24) as usize;
    let exe_len = le32(p, 28) as usize;
    let cmd = p.get(32..32 + cmd_len)?;
    let exe = p.get(32 + cmd_len..32 + cmd_len + exe_len)?;
    let token_at = 32 + cmd_len + exe_len;
    let token = p.get(token_at..token_at + token_len)?;
    let fork_mark = p
        .get(token_at + token_len..token_at + token_len + 4)
        .map_or(0, |_| le32(p, token_at + token_len));
    let argv = split_strings(cmd);
    Some(Hello {
        pid: le32(p, 0),
        ppid: le32(p, 4),
        flags: le32(p, 8),
        tick: le64(p, 16),
        argv,
        exe: String::from_utf8_lossy(exe).into_owned(),
        token: token.to_vec(),
        fork_mark,
    })
}

/// NUL-separated strings, as /proc/PID/cmdline holds them.
fn split_strings(b: &[u8]) -> Vec<String> {
    b.split(|&b| b == 0)
        .filter(|a| !a.is_empty())
        .map(|a| String::from_utf8_lossy(a).into_owned())
        .collect()
}

/// The EXEC payload: `pid:u32le uid:u32le gid:u32le path_len:u32le path argv` (argv
/// NUL-separated).
pub fn parse_exec(p: &[u8]) -> Option<ExecTarget> {
    if p.len() < 16 {
        return None;
    }
    let path_len = le32(p, 12) as usize;
    let path = p.get(16..16 + path_len)?;
    Some(ExecTarget {
        pid: le32(p, 0),
        uid: le32(p, 4),
        gid: le32(p, 8),
        path: String::from_utf8_lossy(path).into_owned(),
        argv: split_strings(&p[16 + path_len..]),
    })
}

/// The EXEC_FAILED payload: the pid whose exec returned.
pub fn parse_exec_failed(p: &[u8]) -> Option<u32> {
    (p.len() >= 4).then(|| le32(p, 0))
}

/// The EXIT payload: status and how the process left (0 exit, 1 _exit, 2 status unknown).
pub fn parse_exit(p: &[u8]) -> Option<(i32, u32)> {
    (p.len() >= 8).then(|| (le32(p, 0) as i32, le32(p, 4)))
}
