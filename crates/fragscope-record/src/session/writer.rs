//! The writer thread: the chunks every other thread sends, compressed and appended to the
//! trace file.

use std::io::BufWriter;
use std::path::Path;
use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::time::{Duration, Instant};

use anyhow::{anyhow, Result};
use fragscope_trace::{ChunkKind, ChunkWriter};

/// zstd levels of a trace by default: event buffers at the fastest (the recorder competes
/// with the program for CPU; raw ones are stored so when their process makes calls faster
/// than the recorder packs them, and packed ones lose 0-2% to level 3), everything else
/// at 3.
pub(super) const DEFAULT_COMPRESSION_LEVEL: i32 = 3;
pub(super) const EVENTS_COMPRESSION_LEVEL: i32 = 1;

/// A chunk for the writer: its kind, payload and, for one compressed in sections, where
/// the sections end (empty: compressed whole).
pub(super) type Chunk = (ChunkKind, Vec<u8>, Vec<usize>);

/// The writer: chunks in arrival order, compressed; flushed to disk whenever idle, and at
/// least every `WRITER_FLUSH` while busy (a program that never pauses would otherwise keep
/// up to the buffer's megabyte, and the file's header, in memory), so a killed recording
/// loses as little as possible.
pub(super) fn write_chunks(
    w: ChunkWriter<BufWriter<std::fs::File>>,
    rx: Receiver<Chunk>,
    path: &Path,
) -> Result<u64> {
    write_all_chunks(w, &rx).map_err(|e| {
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

pub(super) fn write_all_chunks(
    mut w: ChunkWriter<BufWriter<std::fs::File>>,
    rx: &Receiver<Chunk>,
) -> std::io::Result<u64> {
    const WRITER_FLUSH: Duration = Duration::from_millis(100);
    let mut last_flush = Instant::now();
    loop {
        match rx.recv_timeout(Duration::from_millis(50)) {
            Ok((kind, payload, section_ends)) => {
                if section_ends.is_empty() {
                    w.write_chunk(kind, &payload)?;
                } else {
                    w.write_sections(kind, &payload, &section_ends)?;
                }
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
    w.flush()?;
    Ok(w.bytes_written())
}
