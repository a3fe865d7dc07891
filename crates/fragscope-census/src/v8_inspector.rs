//! A running Node.js process's V8 heap, asked through the inspector Node opens on SIGUSR1
//! (what `node inspect -p PID` and Chrome's DevTools use): one `Runtime.evaluate` of
//! `v8.getHeapSpaceStatistics()` and `v8.getHeapStatistics()` in its main isolate, and the
//! inspector closed again when it was not open before (`snapshot PID`); or one session
//! asked at each snapshot of a recording (`record -p PID`).
//!
//! Side effects, said where they are asked for: Node prints "Debugger listening on ..."
//! on its standard error and listens on 127.0.0.1 (port 9229 unless --inspect-port says
//! otherwise) while it is asked; the port it listens on is found among its own sockets,
//! so another process's inspector is never asked; a process whose
//! SIGUSR1 is not caught (`--disable-sigusr1`) would die of it and is never sent one. A
//! worker thread's isolate is not reached (the inspector's main session sees the main
//! thread's).

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use fragscope_trace::v8_heap::{V8Heap, V8Space};
use serde_json::Value;

/// How long Node may take to open its inspector, and to answer.
const WAIT: Duration = Duration::from_secs(3);

/// Whether `pid` runs Node.js: its executable is named node or nodejs.
pub fn is_node(pid: u32) -> bool {
    std::fs::read_link(format!("/proc/{pid}/exe")).is_ok_and(|exe| {
        exe.file_name()
            .is_some_and(|n| n == "node" || n == "nodejs")
    })
}

/// The V8 heap of Node.js process `pid`, asked through its inspector once (closed again
/// unless it was open before).
pub fn heap_of(pid: u32) -> Result<V8Heap, String> {
    V8Inspector::open(pid)?.heap()
}

/// A session with a Node.js process's inspector, kept for as many askings as a recording
/// makes; dropped, it closes the inspector again unless it was open before.
pub struct V8Inspector {
    ws: tungstenite::WebSocket<TcpStream>,
    leave_open: bool,
    next_id: u32,
}

impl V8Inspector {
    /// Opens `pid`'s inspector (SIGUSR1, when it is not open) and a session with it.
    pub fn open(pid: u32) -> Result<Self, String> {
        let already_open = inspector_of(pid)?.is_some();
        if !already_open {
            if !catches_sigusr1(pid) {
                return Err(
                    "Node does not catch SIGUSR1 in this process (--disable-sigusr1 or a \
                     handler of its own): its inspector cannot be opened without ending it"
                        .into(),
                );
            }
            // SAFETY: kill has no memory effects; Node catches the signal (checked above).
            if unsafe { libc::kill(pid as libc::pid_t, libc::SIGUSR1) } != 0 {
                return Err(format!(
                    "cannot signal process {pid}: {}",
                    std::io::Error::last_os_error()
                ));
            }
        }
        let started = Instant::now();
        let url = loop {
            if let Some(url) = inspector_of(pid)? {
                break url;
            }
            if started.elapsed() > WAIT {
                return Err(format!(
                    "Node's inspector did not open within {} s (another process may hold its \
                     port, 9229 unless --inspect-port says otherwise)",
                    WAIT.as_secs()
                ));
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        let host = url
            .strip_prefix("ws://")
            .and_then(|r| r.split('/').next())
            .ok_or_else(|| format!("an inspector address {url:?}"))?;
        let stream = TcpStream::connect(host).map_err(|e| format!("Node's inspector: {e}"))?;
        stream.set_read_timeout(Some(WAIT)).ok();
        let (ws, _) = tungstenite::client(url.as_str(), stream)
            .map_err(|e| format!("Node's inspector refused the session ({e})"))?;
        Ok(Self {
            ws,
            leave_open: already_open,
            next_id: 1,
        })
    }

    /// The heap's figures now: `v8.getHeapSpaceStatistics()` and `v8.getHeapStatistics()`
    /// of the main isolate, evaluated in it (V8 interrupts a busy event loop for it).
    pub fn heap(&mut self) -> Result<V8Heap, String> {
        let value = self.evaluate(
            "JSON.stringify({node: process.version, \
             spaces: require('v8').getHeapSpaceStatistics(), \
             heap: require('v8').getHeapStatistics()})",
        )?;
        let text = value
            .as_str()
            .ok_or_else(|| format!("Node's inspector answered {value}"))?;
        let v = serde_json::from_str(text).map_err(|e| format!("Node answered {text:?} ({e})"))?;
        parse(&v)
    }

    /// What `expression` evaluates to in the main isolate.
    fn evaluate(&mut self, expression: &str) -> Result<Value, String> {
        let id = self.next_id;
        self.next_id += 1;
        let ask = serde_json::json!({
            "id": id,
            "method": "Runtime.evaluate",
            "params": {"expression": expression, "includeCommandLineAPI": true,
                       "returnByValue": true},
        });
        self.ws
            .send(tungstenite::Message::text(ask.to_string()))
            .map_err(|e| format!("Node's inspector: {e}"))?;
        loop {
            let message = self
                .ws
                .read()
                .map_err(|e| format!("Node's inspector did not answer ({e})"))?;
            let Ok(text) = message.to_text() else {
                continue;
            };
            let Ok(v) = serde_json::from_str::<Value>(text) else {
                continue;
            };
            // Events (console messages, ...) may come before the answer.
            if v["id"] == id {
                return Ok(v["result"]["result"]["value"].clone());
            }
        }
    }
}

impl Drop for V8Inspector {
    fn drop(&mut self) {
        if !self.leave_open {
            // Closes the inspector's server and this session with it.
            let _ = self.evaluate("require('inspector').close()");
        }
    }
}

/// SIGUSR1 is caught by the process: Node's own handler, which opens the inspector.
fn catches_sigusr1(pid: u32) -> bool {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("SigCgt:"))
        .and_then(|mask| u64::from_str_radix(mask.trim(), 16).ok())
        .is_some_and(|mask| mask & (1 << (libc::SIGUSR1 - 1)) != 0)
}

/// The TCP ports process `pid` listens on at 127.0.0.1: its sockets (/proc/PID/fd) among
/// the listening ones of its network namespace (/proc/PID/net/tcp).
pub fn listening_ports(pid: u32) -> Vec<u16> {
    let inodes: std::collections::HashSet<String> = std::fs::read_dir(format!("/proc/{pid}/fd"))
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| std::fs::read_link(e.path()).ok())
        .filter_map(|l| {
            let l = l.to_string_lossy().into_owned();
            Some(l.strip_prefix("socket:[")?.strip_suffix(']')?.to_string())
        })
        .collect();
    let table = std::fs::read_to_string(format!("/proc/{pid}/net/tcp")).unwrap_or_default();
    table
        .lines()
        .skip(1)
        .filter_map(|line| {
            let f: Vec<&str> = line.split_whitespace().collect();
            let (local, state, inode) = (f.get(1)?, f.get(3)?, f.get(9)?);
            let (addr, port) = local.split_once(':')?;
            // 0A: listening; 0100007F: 127.0.0.1 as the kernel prints it.
            (*state == "0A" && addr == "0100007F" && inodes.contains(*inode))
                .then(|| u16::from_str_radix(port, 16).ok())
                .flatten()
        })
        .collect()
}

/// The WebSocket address of `pid`'s inspector when it listens: the first of its
/// listening ports that answers as an inspector does.
fn inspector_of(pid: u32) -> Result<Option<String>, String> {
    Ok(listening_ports(pid).into_iter().find_map(inspector_at))
}

/// The WebSocket address of the inspector at 127.0.0.1:`port`, if one answers there.
fn inspector_at(port: u16) -> Option<String> {
    let at = std::net::SocketAddr::from(([127, 0, 0, 1], port));
    let mut s = TcpStream::connect_timeout(&at, WAIT).ok()?;
    s.set_read_timeout(Some(WAIT)).ok();
    let ask = format!("GET /json/list HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n\r\n");
    s.write_all(ask.as_bytes()).ok()?;
    // Node's inspector keeps the connection open: read to the end of the body its
    // Content-Length gives.
    let mut answer = Vec::new();
    let mut buf = [0u8; 4096];
    let body = loop {
        let n = s.read(&mut buf).ok().filter(|&n| n > 0)?;
        answer.extend_from_slice(&buf[..n]);
        let text = String::from_utf8_lossy(&answer);
        let Some((head, body)) = text.split_once("\r\n\r\n") else {
            continue;
        };
        let length = head.lines().find_map(|l| {
            let (k, v) = l.split_once(':')?;
            k.eq_ignore_ascii_case("content-length")
                .then(|| v.trim().parse::<usize>().ok())
                .flatten()
        })?;
        if body.len() >= length {
            break body.to_string();
        }
    };
    let Ok(Value::Array(targets)) = serde_json::from_str::<Value>(&body) else {
        return None;
    };
    // One target per process: its main thread.
    targets
        .iter()
        .find_map(|t| t["webSocketDebuggerUrl"].as_str())
        .map(str::to_string)
}

/// The figures as `v8_heap.js` would have written them for the recorder.
fn parse(v: &Value) -> Result<V8Heap, String> {
    let spaces = v["spaces"]
        .as_array()
        .ok_or_else(|| format!("no heap spaces in {v}"))?;
    let n = |x: &Value, key: &str| x[key].as_u64().unwrap_or(0);
    let mut heap = V8Heap {
        node: v["node"].as_str().unwrap_or("").to_string(),
        isolates: 1,
        age_ms: 0,
        ..V8Heap::default()
    };
    for s in spaces {
        heap.spaces.push(V8Space {
            name: s["space_name"].as_str().unwrap_or("?").to_string(),
            size: n(s, "space_size"),
            used: n(s, "space_used_size"),
            available: n(s, "space_available_size"),
            physical: n(s, "physical_space_size"),
        });
    }
    for key in [
        "total_heap_size",
        "total_physical_size",
        "used_heap_size",
        "heap_size_limit",
        "malloced_memory",
        "external_memory",
        "number_of_native_contexts",
    ] {
        heap.figures.push((key.to_string(), n(&v["heap"], key)));
    }
    Ok(heap)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn figures_are_read_as_node_gives_them() {
        let v: Value = serde_json::from_str(
            r#"{"node":"v20.20.2","spaces":[{"space_name":"old_space","space_size":12812288,
            "space_used_size":9000000,"space_available_size":100,"physical_space_size":12800000}],
            "heap":{"heap_size_limit":4345298944,"external_memory":1234}}"#,
        )
        .unwrap();
        let heap = parse(&v).unwrap();
        assert_eq!(heap.node, "v20.20.2");
        assert_eq!(heap.spaces[0].physical, 12800000);
        assert_eq!(heap.figure("heap_size_limit"), 4345298944);
        assert_eq!(heap.figure("external_memory"), 1234);
        assert!(parse(&serde_json::json!({"node": "v1"})).is_err());
        assert!(!is_node(std::process::id()));
    }
}
