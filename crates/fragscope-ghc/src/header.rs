//! The eventlog header: the event types the RTS declares, each with its payload size.

use std::io::Read;

use crate::source::Source;
use crate::Error;

const HEADER_BEGIN: [u8; 4] = *b"hdrb";
const HEADER_END: [u8; 4] = *b"hdre";
const EVENT_TYPES_BEGIN: [u8; 4] = *b"hetb";
const EVENT_TYPES_END: [u8; 4] = *b"hete";
const EVENT_TYPE_BEGIN: [u8; 4] = *b"etb\0";
const EVENT_TYPE_END: [u8; 4] = *b"ete\0";
const DATA_BEGIN: [u8; 4] = *b"datb";

/// The payload size the header gives for variable-size events; each such event carries
/// its own u16 length.
const VARIABLE_SIZE: u16 = 0xffff;

/// Descriptions are short English phrases; a longer length field means a damaged header,
/// and refusing it keeps a corrupt length from allocating gigabytes.
const MAX_DESCRIPTION_LEN: u32 = 64 * 1024;
/// The per-type "extra info" field is reserved by the format and empty in every RTS.
const MAX_EXTRA_INFO_LEN: u32 = 1024 * 1024;

/// How many payload bytes follow an event's type and timestamp.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PayloadSize {
    Fixed(u16),
    /// A u16 length follows the timestamp.
    Variable,
}

/// One event type declared in the header.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EventType {
    pub tag: u16,
    pub size: PayloadSize,
    /// The RTS's own name for the type, e.g. "Heap live".
    pub description: String,
}

/// The declared event types, in header order, with a lookup by tag.
#[derive(Debug, Clone, Default)]
pub struct Header {
    event_types: Vec<EventType>,
    /// Indexed by tag, up to the largest declared tag: a direct lookup per event.
    size_by_tag: Vec<Option<PayloadSize>>,
}

impl Header {
    pub fn event_types(&self) -> &[EventType] {
        &self.event_types
    }

    /// Whether the RTS that wrote the log knows this event type; e.g. a log without
    /// BLOCKS_SIZE in its header comes from an RTS older than GHC 9.2, while one that
    /// declares it but has no such events simply did not emit any.
    pub fn declares(&self, tag: u16) -> bool {
        self.payload_size(tag).is_some()
    }

    pub fn payload_size(&self, tag: u16) -> Option<PayloadSize> {
        self.size_by_tag.get(tag as usize).copied().flatten()
    }

    /// Builds a header from declarations; a later declaration of a tag replaces an
    /// earlier one.
    pub fn from_event_types(event_types: Vec<EventType>) -> Header {
        let len = event_types
            .iter()
            .map(|t| t.tag as usize + 1)
            .max()
            .unwrap_or(0);
        let mut size_by_tag = vec![None; len];
        for t in &event_types {
            size_by_tag[t.tag as usize] = Some(t.size);
        }
        Header {
            event_types,
            size_by_tag,
        }
    }

    /// Reads everything up to and including the data-begin marker.
    pub(crate) fn read<R: Read>(source: &mut Source<R>) -> Result<Header, Error> {
        let first = marker(source)?;
        if first != HEADER_BEGIN {
            return Err(Error::NotAnEventlog {
                found: first.to_vec(),
            });
        }
        expect(source, EVENT_TYPES_BEGIN, "the event-type list")?;
        let mut event_types = Vec::new();
        loop {
            let at = source.offset();
            match marker(source)? {
                EVENT_TYPE_BEGIN => event_types.push(event_type(source)?),
                EVENT_TYPES_END => break,
                other => {
                    return Err(Error::corrupt(
                        at,
                        format!(
                            "expected an event type (\"etb\\0\") or the end of the list \
                             (\"hete\"), found {other:02x?}"
                        ),
                    ))
                }
            }
        }
        expect(source, HEADER_END, "the end of the header")?;
        expect(source, DATA_BEGIN, "the start of the events")?;
        Ok(Header::from_event_types(event_types))
    }
}

fn marker<R: Read>(source: &mut Source<R>) -> Result<[u8; 4], Error> {
    source.array::<4>()?.ok_or(Error::TruncatedHeader {
        offset: source.offset(),
    })
}

fn expect<R: Read>(source: &mut Source<R>, wanted: [u8; 4], what: &str) -> Result<(), Error> {
    let at = source.offset();
    let found = marker(source)?;
    if found == wanted {
        Ok(())
    } else {
        Err(Error::corrupt(
            at,
            format!(
                "expected the marker {:?} of {what}, found {found:02x?}",
                String::from_utf8_lossy(&wanted)
            ),
        ))
    }
}

fn event_type<R: Read>(source: &mut Source<R>) -> Result<EventType, Error> {
    let truncated = |s: &Source<R>| Error::TruncatedHeader { offset: s.offset() };
    let fixed = source.array::<8>()?.ok_or_else(|| truncated(source))?;
    let tag = u16::from_be_bytes([fixed[0], fixed[1]]);
    let size = match u16::from_be_bytes([fixed[2], fixed[3]]) {
        VARIABLE_SIZE => PayloadSize::Variable,
        n => PayloadSize::Fixed(n),
    };
    let description_len = u32::from_be_bytes([fixed[4], fixed[5], fixed[6], fixed[7]]);
    if description_len > MAX_DESCRIPTION_LEN {
        return Err(Error::corrupt(
            source.offset() - 4,
            format!("event type {tag} has a {description_len}-byte description"),
        ));
    }
    let mut description = vec![0u8; description_len as usize];
    if let crate::source::Fill::Short = source.fill(&mut description)? {
        return Err(truncated(source));
    }
    let extra_len = u32::from_be_bytes(source.array::<4>()?.ok_or_else(|| truncated(source))?);
    if extra_len > MAX_EXTRA_INFO_LEN {
        return Err(Error::corrupt(
            source.offset() - 4,
            format!("event type {tag} has {extra_len} bytes of extra information"),
        ));
    }
    if !source.skip(extra_len as u64)? {
        return Err(truncated(source));
    }
    expect(source, EVENT_TYPE_END, "the end of an event type")?;
    Ok(EventType {
        tag,
        size,
        description: String::from_utf8_lossy(&description).into_owned(),
    })
}
