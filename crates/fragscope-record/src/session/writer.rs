//! The writer thread: the chunks every other thread sends, compressed and appended to the
//! trace file.

use std::io::BufWriter;
use std::path::Path;
use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::time::{Duration, Instant};

use anyhow::{anyhow, Result};
use fragscope_trace::aggregate::{Aggregator, SnapshotsFirst};
use fragscope_trace::ChunkWriter;

/// zstd levels of a trace by default: event buffers at the fastest (the recorder competes
/// with the program for CPU; raw ones are stored so when their process makes calls faster
/// than the recorder packs them, and packed ones lose 0-2% to level 3), everything else
/// at 3.
pub(super) const DEFAULT_COMPRESSION_LEVEL: i32 = 3;
pub(super) const EVENTS_COMPRESSION_LEVEL: i32 = 1;

/// A chunk for the writer: its kind, payload and, for one compressed in sections, where
/// the sections end (empty: compressed whole).
pub(super) type Chunk = fragscope_trace::aggregate::OutChunk;

/// What the writer is sent.
pub(super) enum Message {
    Chunk(Chunk),
    /// A snapshot of `stream` took its time `tick`: the stream's buffers with later calls
    /// wait until its residency is written (`SnapshotsFirst`). Sent before any buffer
    /// with a call after it (`Shared::snapshot_order`).
    SnapshotStarts {
        stream: u32,
        tick: u64,
    },
    /// That snapshot's chunks were sent (or it wrote none).
    SnapshotEnds {
        stream: u32,
        tick: u64,
    },
}

/// The writer: chunks in arrival order, compressed; flushed to disk whenever idle, and at
/// least every `WRITER_FLUSH` while busy (a program that never pauses would otherwise keep
/// up to the buffer's megabyte, and the file's header, in memory), so a killed recording
/// loses as little as possible.
pub(super) fn write_chunks(
    w: ChunkWriter<BufWriter<std::fs::File>>,
    rx: Receiver<Message>,
    path: &Path,
    aggregate: bool,
) -> Result<u64> {
    write_all_chunks(w, &rx, aggregate).map_err(|e| {
        // Said at once: the program runs on, and its calls from here are not recorded.
        let on_disk = std::fs::metadata(path).map_or(0, |m| m.len());
        let message = format!(
            "writing the trace to {} failed after {on_disk} bytes: {e}. The trace up to \
             there is intact and readable (fragscope info and report read it to its last \
             whole chunk); what the program did after that point is not recorded",
            path.display()
        );
        eprintln!("fragscope: error: {message}");
        anyhow!(
            "the trace {} ends where writing failed ({e}); it is readable up to there",
            path.display()
        )
    })
}

/// With `aggregate`, each process's calls are merged here and written aggregated
/// (`fragscope_trace::aggregate`).
pub(super) fn write_all_chunks(
    mut w: ChunkWriter<BufWriter<std::fs::File>>,
    rx: &Receiver<Message>,
    aggregate: bool,
) -> std::io::Result<u64> {
    const WRITER_FLUSH: Duration = Duration::from_millis(100);
    let mut last_flush = Instant::now();
    let mut aggregator = aggregate.then(Aggregator::default);
    let mut order = SnapshotsFirst::default();
    let mut ready = Vec::new();
    loop {
        match rx.recv_timeout(Duration::from_millis(50)) {
            Ok(message) => {
                take(message, aggregator.as_mut(), &mut order, &mut ready);
                write_ready(&mut w, &mut ready)?;
                if last_flush.elapsed() >= WRITER_FLUSH {
                    w.flush()?;
                    last_flush = Instant::now();
                }
            }
            Err(RecvTimeoutError::Timeout) => {
                w.flush()?;
                last_flush = Instant::now();
            }
            Err(RecvTimeoutError::Disconnected) => break,
        }
    }
    if let Some(agg) = aggregator.as_mut() {
        agg.finish();
        for chunk in agg.take_output() {
            order.chunk(chunk, &mut ready);
        }
    }
    order.release_all(&mut ready);
    write_ready(&mut w, &mut ready)?;
    w.flush()?;
    Ok(w.bytes_written())
}

/// One message: its chunks, once the snapshots before them are out, into `ready`.
fn take(
    message: Message,
    aggregator: Option<&mut Aggregator>,
    order: &mut SnapshotsFirst,
    ready: &mut Vec<Chunk>,
) {
    match message {
        Message::Chunk(chunk) => match aggregator {
            Some(agg) => {
                // Every snapshot before these calls was said before them.
                agg.chunk(chunk.0, chunk.1, chunk.2);
                for chunk in agg.take_output() {
                    order.chunk(chunk, ready);
                }
            }
            None => order.chunk(chunk, ready),
        },
        Message::SnapshotStarts { stream, tick } => {
            if let Some(agg) = aggregator {
                agg.snapshot_at(stream, tick);
            }
            order.started(stream, tick);
        }
        Message::SnapshotEnds { stream, tick } => order.ended(stream, tick, ready),
    }
}

fn write_ready(
    w: &mut ChunkWriter<BufWriter<std::fs::File>>,
    ready: &mut Vec<Chunk>,
) -> std::io::Result<()> {
    for (kind, payload, section_ends) in ready.drain(..) {
        w.write(kind, &payload, &section_ends)?;
    }
    Ok(())
}
