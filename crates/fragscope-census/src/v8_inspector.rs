//! A running Node.js process's V8 heap, asked through the inspector Node opens on SIGUSR1
//! (what `node inspect -p PID` and Chrome's DevTools use): one `Runtime.evaluate` of
//! `v8.getHeapSpaceStatistics()` and `v8.getHeapStatistics()` in its main isolate, and the
//! inspector closed again when it was not open before.
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

/// The V8 heap of Node.js process `pid`, asked through its inspector.
pub fn heap_of(pid: u32) -> Result<V8Heap, String> {
    let already_open = inspector_of(pid)?.is_some();
    if !already_open {
        if !catches_sigusr1(pid) {
            return Err(
                "Node does not catch SIGUSR1 in this process (--disable-sigusr1 or a handler \
                 of its own): its inspector cannot be opened without ending it"
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
    let heap = evaluate(&url, already_open);
    heap.and_then(|v| parse(&v))
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
fn listening_ports(pid: u32) -> Vec<u16> {
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

/// What the inspector session at `url` evaluates the heap's figures to; the inspector is
/// closed after unless it was open before.
fn evaluate(url: &str, leave_open: bool) -> Result<Value, String> {
    let host = url
        .strip_prefix("ws://")
        .and_then(|r| r.split('/').next())
        .ok_or_else(|| format!("an inspector address {url:?}"))?;
    let stream = TcpStream::connect(host).map_err(|e| format!("Node's inspector: {e}"))?;
    stream.set_read_timeout(Some(WAIT)).ok();
    let (mut ws, _) = tungstenite::client(url, stream)
        .map_err(|e| format!("Node's inspector refused the session ({e})"))?;
    let expression = "JSON.stringify({node: process.version, \
                      spaces: require('v8').getHeapSpaceStatistics(), \
                      heap: require('v8').getHeapStatistics()})";
    let ask = |id: u32, expression: &str| {
        serde_json::json!({
            "id": id,
            "method": "Runtime.evaluate",
            "params": {"expression": expression, "includeCommandLineAPI": true,
                       "returnByValue": true},
        })
        .to_string()
    };
    let send = |ws: &mut tungstenite::WebSocket<TcpStream>, text: String| {
        ws.send(tungstenite::Message::text(text))
            .map_err(|e| format!("Node's inspector: {e}"))
    };
    send(&mut ws, ask(1, expression))?;
    let answer = loop {
        let message = ws
            .read()
            .map_err(|e| format!("Node's inspector did not answer ({e})"))?;
        let Ok(text) = message.to_text() else {
            continue;
        };
        let Ok(v) = serde_json::from_str::<Value>(text) else {
            continue;
        };
        // Events (console messages, ...) may come before the answer.
        if v["id"] == 1 {
            break v;
        }
    };
    if !leave_open {
        // Closes the inspector's server and this session with it.
        let _ = send(&mut ws, ask(2, "require('inspector').close()"));
        let _ = ws.read();
    }
    let value = answer["result"]["result"]["value"]
        .as_str()
        .ok_or_else(|| format!("Node's inspector answered {answer}"))?;
    serde_json::from_str(value).map_err(|e| format!("Node answered {value:?} ({e})"))
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
