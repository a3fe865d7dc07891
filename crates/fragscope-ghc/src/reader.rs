//! The streaming reader: one event at a time, in file order, from any `Read`.

use std::io::Read;

use crate::event::{decode, tags, Event, EventKind};
use crate::header::{Header, PayloadSize};
use crate::source::{Fill, Source};
use crate::Error;

/// How the events of a log ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum End {
    /// The data-end marker was read: the RTS shut down its eventlog normally.
    Complete,
    /// The file stops before the data-end marker (e.g. the program was killed): the
    /// events before `offset` are whole, the bytes from `offset` on form no whole event.
    Truncated { offset: u64 },
}

/// The event buffer of one capability, as flushed: GHC writes each buffer as a block whose
/// marker gives its length and the capability it belongs to.
#[derive(Debug, Clone, Copy)]
struct Block {
    start: u64,
    end: u64,
    capability: Option<u16>,
}

/// Reads an eventlog's events in file order.
///
/// Events come in file order, which is not time order: each capability's buffer is
/// written as a block when it fills or at exit (GHC 9.0 writes the heap profile samples of
/// a whole run in one late block of the global buffer), and some events carry a time taken
/// before they were posted (GC_END follows the GC_STATS_GHC stamped after it). A timeline
/// should order events by `time_ns`.
pub struct EventReader<R: Read> {
    source: Source<R>,
    header: Header,
    block: Option<Block>,
    payload: Vec<u8>,
    end: Option<End>,
    failed: bool,
}

impl<R: Read> EventReader<R> {
    /// Reads the header. Large inputs need no buffering by the caller.
    pub fn new(reader: R) -> Result<Self, Error> {
        let mut source = Source::new(reader);
        let header = Header::read(&mut source)?;
        Ok(EventReader {
            source,
            header,
            block: None,
            payload: Vec::new(),
            end: None,
            failed: false,
        })
    }

    pub fn header(&self) -> &Header {
        &self.header
    }

    pub fn into_header(self) -> Header {
        self.header
    }

    /// How the log ended, once [`next_event`](Self::next_event) has returned `Ok(None)`.
    pub fn end(&self) -> Option<End> {
        self.end
    }

    /// Bytes consumed so far.
    pub fn offset(&self) -> u64 {
        self.source.offset()
    }

    /// The next event, `Ok(None)` at the end of the data (see [`end`](Self::end)), or
    /// the reason the bytes cannot be read further. After an error, returns `Ok(None)`.
    pub fn next_event(&mut self) -> Result<Option<Event>, Error> {
        if self.end.is_some() || self.failed {
            return Ok(None);
        }
        match self.read_event() {
            Ok(Some(event)) => Ok(Some(event)),
            Ok(None) => Ok(None),
            Err(e) => {
                self.failed = true;
                Err(e)
            }
        }
    }

    fn read_event(&mut self) -> Result<Option<Event>, Error> {
        loop {
            let start = self.source.offset();
            if self.block.is_some_and(|b| start >= b.end) {
                self.block = None;
            }
            let Some(tag) = self.source.array::<2>()? else {
                return Ok(self.truncated(start));
            };
            let tag = u16::from_be_bytes(tag);
            if tag == tags::DATA_END {
                self.end = Some(End::Complete);
                return Ok(None);
            }
            let Some(size) = self.header.payload_size(tag) else {
                return Err(Error::corrupt(
                    start,
                    format!("event type {tag} is not declared in the header"),
                ));
            };
            let Some(time) = self.source.array::<8>()? else {
                return Ok(self.truncated(start));
            };
            let time_ns = u64::from_be_bytes(time);
            let payload_len = match size {
                PayloadSize::Fixed(n) => n,
                PayloadSize::Variable => match self.source.array::<2>()? {
                    Some(len) => u16::from_be_bytes(len),
                    None => return Ok(self.truncated(start)),
                },
            };
            let end = self.source.offset() + payload_len as u64;
            if let Some(block) = self.block {
                if end > block.end {
                    return Err(Error::corrupt(
                        start,
                        format!(
                            "an event of type {tag} runs to byte {end}, past the end of \
                             the block that starts at byte {} and ends at byte {}",
                            block.start, block.end
                        ),
                    ));
                }
            }
            self.payload.resize(payload_len as usize, 0);
            if let Fill::Short = self.source.fill(&mut self.payload)? {
                return Ok(self.truncated(start));
            }
            if tag == tags::BLOCK_MARKER {
                self.enter_block(start, end)?;
                continue;
            }
            let kind = decode(tag, &self.payload).unwrap_or(EventKind::Other { tag });
            return Ok(Some(Event {
                time_ns,
                capability: self.block.and_then(|b| b.capability),
                kind,
            }));
        }
    }

    /// `start..marker_end` is the block marker; its payload is in `self.payload`.
    fn enter_block(&mut self, start: u64, marker_end: u64) -> Result<(), Error> {
        if let Some(outer) = self.block {
            return Err(Error::corrupt(
                start,
                format!(
                    "a block starts inside the block that starts at byte {} and ends at \
                     byte {}",
                    outer.start, outer.end
                ),
            ));
        }
        let p = &self.payload;
        if p.len() < 14 {
            return Err(Error::corrupt(
                start,
                format!("a block marker has a {}-byte payload, not 14", p.len()),
            ));
        }
        let size = u32::from_be_bytes([p[0], p[1], p[2], p[3]]) as u64;
        // p[4..12] is the time of the block's last event; each event has its own.
        let capability = match u16::from_be_bytes([p[12], p[13]]) {
            // The RTS's global buffer, which no capability owns.
            0xffff => None,
            cap => Some(cap),
        };
        if size < marker_end - start {
            return Err(Error::corrupt(
                start,
                format!(
                    "a block marker gives the block a length of {size} bytes, less than \
                     the marker itself"
                ),
            ));
        }
        self.block = Some(Block {
            start,
            end: start + size,
            capability,
        });
        Ok(())
    }

    fn truncated(&mut self, offset: u64) -> Option<Event> {
        self.end = Some(End::Truncated { offset });
        None
    }
}

impl<R: Read> Iterator for EventReader<R> {
    type Item = Result<Event, Error>;

    fn next(&mut self) -> Option<Self::Item> {
        self.next_event().transpose()
    }
}
