//! Every merged call and every RSS sample of one process, in order, for exports that keep
//! the raw rows (`fragscope export --format parquet`). A second streaming pass over the
//! trace: memory is bounded by the live blocks held in the merge, as in [`crate::analyze`].
//! A forked process's merge starts from its parent's heap at the fork, as the report's
//! does ([`Lineage`]), so its frees of its parent's blocks are known.

use std::path::Path;

use fragscope_trace::ahead::{AheadChunk, EventsOf, ReadAhead};
use fragscope_trace::merge::{Merged, Merger};

use crate::forks::Lineage;
use fragscope_trace::reader::Chunk;
use fragscope_trace::records::RssSample;

use crate::analyze::AnalysisError;

/// One malloc-family call, in merged order.
#[derive(Debug, Clone, PartialEq)]
pub struct CallRow {
    /// Milliseconds since the recording started.
    pub t_ms: f64,
    pub tid: u32,
    /// `malloc`, `calloc`, `realloc`, ..., `free`.
    pub func: &'static str,
    /// The block returned (allocating calls) or freed (`free`); 0 for a failed call.
    pub address: u64,
    /// realloc's old block.
    pub old_address: u64,
    /// Requested bytes (allocating calls).
    pub size: u64,
    /// Usable bytes when the allocator told them, else 0.
    pub usable: u64,
    /// Requested bytes of the block(s) this call ended (free, a moving realloc).
    pub freed: u64,
    /// The trace's stack id (0: no stack recorded for this call).
    pub stack: u32,
}

/// One RSS sample, in bytes.
#[derive(Debug, Clone, PartialEq)]
pub struct RssRow {
    pub t_ms: f64,
    pub rss: u64,
    pub rss_anon: u64,
    pub rss_file: u64,
    pub rss_shmem: u64,
}

/// What [`for_each`] hands on.
#[derive(Debug, Clone, PartialEq)]
pub enum Row {
    Call(CallRow),
    Rss(RssRow),
}

/// Reads the trace at `path` and hands every merged call (unless `with_calls` is false)
/// and RSS sample of process image `stream` (a report's `stream`) to `visit`, calls in
/// merged order, RSS samples in the order they were recorded. `progress` is told the
/// bytes read so far and the file's size.
pub fn for_each(
    path: &Path,
    stream: u32,
    with_calls: bool,
    mut visit: impl FnMut(Row),
    mut progress: impl FnMut(u64, u64),
) -> Result<(), AnalysisError> {
    let mut lineage = if with_calls {
        Some(Lineage::of(path, stream)?)
    } else {
        None
    };
    let events_of = match &lineage {
        Some(l) => EventsOf::Streams(l.streams()),
        None => EventsOf::None,
    };
    let mut reader = ReadAhead::open(path, events_of)?;
    let mut tick_ms = 1.0;
    let mut chunks = 0u64;
    let drain = |merger: &mut Merger, tick_ms: f64, visit: &mut dyn FnMut(Row)| {
        while let Some(m) = merger.pop() {
            if let Merged::Call(c) = m {
                let freed = merger.ended_by_last_pop().map(|(_, b)| b.size).sum();
                visit(Row::Call(CallRow {
                    t_ms: c.tick as f64 * tick_ms,
                    tid: c.tid,
                    func: c.func.name(),
                    address: c.addr,
                    old_address: c.old_addr,
                    size: if c.allocates().is_some() { c.size } else { 0 },
                    usable: c.usable,
                    freed,
                    stack: c.stack,
                }));
            }
        }
    };
    while let Some(chunk) = reader.next_chunk() {
        chunks += 1;
        if chunks.is_multiple_of(64) {
            progress(reader.offset(), reader.file_bytes());
        }
        let chunk = match chunk {
            AheadChunk::Events(h, events) => {
                if let Some(l) = lineage.as_mut() {
                    // A damaged chunk is skipped, as the report does.
                    let _ = l.push_events(&reader, &h, events);
                    if let Some(merger) = l.merger() {
                        drain(merger, tick_ms, &mut visit);
                    }
                }
                continue;
            }
            AheadChunk::Other(chunk) => chunk,
        };
        match chunk {
            Chunk::Meta(m) => tick_ms = m.tick_ns as f64 / 1e6,
            Chunk::Rss(b) if b.stream == stream => {
                for s in &b.samples {
                    visit(Row::Rss(rss_row(s, tick_ms)));
                }
            }
            _ => {}
        }
    }
    if let Some(l) = lineage.as_mut() {
        l.finish();
        if let Some(merger) = l.merger() {
            drain(merger, tick_ms, &mut visit);
        }
    }
    progress(reader.offset(), reader.file_bytes());
    Ok(())
}

fn rss_row(s: &RssSample, tick_ms: f64) -> RssRow {
    RssRow {
        t_ms: s.tick as f64 * tick_ms,
        rss: s.vm_rss_kib * 1024,
        rss_anon: s.rss_anon_kib * 1024,
        rss_file: s.rss_file_kib * 1024,
        rss_shmem: s.rss_shmem_kib * 1024,
    }
}
