//! A Node.js process's V8 heap, as its isolates last wrote it: every process the recorder
//! starts loads `runtime/v8_heap.js`, which writes each isolate's figures into the
//! recording's directory ([`Censuses::watch_v8`]); nothing is read from the process. A
//! process `record -p` attached to cannot load it: its inspector is asked instead
//! ([`Censuses::ask_v8_by_inspector`]).

use fragscope_trace::v8_heap::{V8Census, V8Heap, V8Space};
use fragscope_trace::ChunkKind;

use super::{At, Censuses, SnapshotCensus};

/// The V8 heap of a process as its isolates last wrote it, when it is a Node.js process
/// that loaded the recording's module, their figures summed; or as its inspector gives it
/// now, when it is asked so.
pub(super) struct V8;

impl SnapshotCensus for V8 {
    fn take(&self, censuses: &Censuses, at: At, pid: u32) -> Option<(ChunkKind, Vec<u8>)> {
        // At exit the isolate's heap is being torn down: its last figures are no moment
        // of the run.
        if at.ending || !censuses.enabled {
            return None;
        }
        let result = match censuses.v8_inspectors.lock().unwrap().get_mut(&at.stream) {
            Some(session) => {
                let asked = session.as_mut()?.heap();
                if asked.is_err() {
                    // Said once: the session is not asked again.
                    *session = None;
                }
                asked.map_err(|e| format!("no V8 heap figures: {e}"))
            }
            None => Ok(written_by_the_module(censuses, pid)?),
        };
        let census = V8Census {
            stream: at.stream,
            tick: at.tick,
            reason: at.reason,
            result,
        };
        Some((ChunkKind::V8Census, census.encode()))
    }
}

/// The figures `runtime/v8_heap.js` last wrote for process `pid`'s isolates, summed; none
/// when it wrote none, or too long ago to be this moment's.
fn written_by_the_module(censuses: &Censuses, pid: u32) -> Option<V8Heap> {
    let dir = censuses.v8_dir.as_ref()?;
    let prefix = format!("{pid}-");
    let now_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64);
    let mut heap = V8Heap::default();
    for entry in std::fs::read_dir(dir).ok()?.flatten() {
        let name = entry.file_name();
        let name = name.to_string_lossy();
        if !name.starts_with(&prefix) || name.ends_with(".tmp") {
            continue;
        }
        let Ok(text) = std::fs::read_to_string(entry.path()) else {
            continue;
        };
        if let Some(written_ms) = add_isolate(&mut heap, &text) {
            heap.isolates += 1;
            heap.age_ms = heap.age_ms.max(now_ms.saturating_sub(written_ms));
        }
    }
    // An isolate whose event loop was busy (a long synchronous stretch) wrote its
    // figures too long ago to be this moment's: the snapshot has none, rather than
    // stale ones.
    let fresh = heap.age_ms <= 2 * censuses.v8_every_ms + 50;
    (heap.isolates > 0 && fresh).then_some(heap)
}

/// Adds one isolate's figures, as `runtime/v8_heap.js` writes them, to `heap`; the time
/// they were written (ms since the epoch), or None when the text is not such figures.
fn add_isolate(heap: &mut V8Heap, text: &str) -> Option<u64> {
    let mut written = None;
    for line in text.lines() {
        let mut f = line.split_whitespace();
        match (f.next(), f.next()) {
            (Some("time_ms"), Some(t)) => written = t.parse().ok(),
            (Some("node"), Some(v)) => heap.node = v.to_string(),
            (Some("space"), Some(name)) => {
                let n: Vec<u64> = f.filter_map(|x| x.parse().ok()).collect();
                let [size, used, available, physical] = n[..] else {
                    continue;
                };
                let space = match heap.spaces.iter_mut().find(|s| s.name == name) {
                    Some(s) => s,
                    None => {
                        heap.spaces.push(V8Space {
                            name: name.to_string(),
                            ..V8Space::default()
                        });
                        heap.spaces.last_mut().unwrap()
                    }
                };
                space.size += size;
                space.used += used;
                space.available += available;
                space.physical += physical;
            }
            (Some("heap"), Some(name)) => {
                let Some(v) = f.next().and_then(|x| x.parse::<u64>().ok()) else {
                    continue;
                };
                match heap.figures.iter_mut().find(|(n, _)| n == name) {
                    Some(x) => x.1 += v,
                    None => heap.figures.push((name.to_string(), v)),
                }
            }
            _ => {}
        }
    }
    written
}

#[cfg(test)]
mod v8_tests {
    use super::*;

    #[test]
    fn isolates_figures_are_summed() {
        let mut heap = V8Heap::default();
        let main = "time_ms 1000\nnode v20.20.2\nspace old_space 100 60 30 90\n\
                    heap external_memory 7\n";
        let worker = "time_ms 900\nnode v20.20.2\nspace old_space 10 6 3 9\n\
                      space new_space 8 1 3 8\nheap external_memory 5\nspace bad 1 2\n";
        assert_eq!(add_isolate(&mut heap, main), Some(1000));
        assert_eq!(add_isolate(&mut heap, worker), Some(900));
        assert_eq!(add_isolate(&mut heap, "not figures"), None);
        assert_eq!(heap.node, "v20.20.2");
        let old = &heap.spaces[0];
        assert_eq!(
            (old.size, old.used, old.available, old.physical),
            (110, 66, 33, 99)
        );
        assert_eq!(heap.spaces.len(), 2);
        assert_eq!(heap.figure("external_memory"), 12);
    }
}
