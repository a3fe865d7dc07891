//! What a trace says at its end: the processes that made no malloc-family call, the
//! allocators linked into the programs, the images that never connected.

use std::collections::HashMap;
use std::ffi::OsString;
use std::path::Path;

use fragscope_trace::EndHow;

use super::options::SilentProcess;
use super::shared::Shared;

/// The number of streams, and those that made no malloc-family call.
pub(super) fn silent_processes(shared: &Shared) -> (u32, Vec<SilentProcess>) {
    let procs = shared.procs.lock().unwrap();
    let silent = procs
        .streams
        .iter()
        // A child that exec'd before its first call (as fork+exec usually does) is
        // not a program without malloc.
        .enumerate()
        .filter(|(_, s)| s.event_bytes == 0 && !matches!(s.end, Some((EndHow::Exec, _))))
        .map(|(i, s)| SilentProcess {
            label: s.label.clone(),
            go: crate::launch::is_go_program(Path::new(&s.exe)),
            go_heap_read: shared.censuses.reads_go_heap(i as u32),
            main: i == 0,
            peak_rss_kib: s.peak_rss_at_snapshot,
        })
        .collect();
    (procs.streams.len() as u32, silent)
}

/// The allocators linked into the programs the streams ran (each file read once).
pub(super) fn linked_allocators_of_streams(
    shared: &Shared,
) -> Vec<fragscope_trace::heap_census::LinkedAllocator> {
    let procs = shared.procs.lock().unwrap();
    let mut by_exe = HashMap::new();
    let mut found = Vec::new();
    for (stream, s) in procs.streams.iter().enumerate() {
        let linked = by_exe
            .entry(s.exe.clone())
            .or_insert_with(|| fragscope_census::allocators::linked_allocator(Path::new(&s.exe)));
        if let Some(l) = linked {
            found.push(l.record(stream as u32));
        }
    }
    found
}

/// The images the program ran that never connected: the program itself, or what a traced
/// image exec'd (an image that loads the interposer connects before its first call).
pub(super) fn untraced_images(
    shared: &Shared,
    child_pid: u32,
    program_path: &Path,
    command: &[OsString],
    preload: &Path,
) -> Vec<fragscope_trace::Untraced> {
    let procs = shared.procs.lock().unwrap();
    let streams = &procs.streams;
    let mut untraced = Vec::new();
    if !streams.iter().any(|s| s.pid == child_pid) {
        // SAFETY: getuid and getgid cannot fail.
        let (uid, gid) = unsafe { (libc::getuid(), libc::getgid()) };
        untraced.push(fragscope_trace::Untraced {
            pid: child_pid,
            parent_stream: None,
            tick: 0,
            path: program_path.display().to_string(),
            argv: command
                .iter()
                .map(|a| a.to_string_lossy().into_owned())
                .collect(),
            reason: crate::launch::why_untraced(program_path.as_os_str(), uid, gid, preload),
        });
    }
    for a in shared.announced_images.lock().unwrap().iter() {
        let connected = streams
            .get(a.parent_stream as usize + 1..)
            .is_some_and(|after| after.iter().any(|t| t.pid == a.target.pid));
        if !connected {
            untraced.push(fragscope_trace::Untraced {
                pid: a.target.pid,
                parent_stream: Some(a.parent_stream),
                tick: a.tick,
                path: a.target.path.clone(),
                argv: a.target.argv.clone(),
                reason: crate::launch::why_untraced(
                    a.target.path.as_ref(),
                    a.target.uid,
                    a.target.gid,
                    preload,
                ),
            });
        }
    }
    untraced
}
