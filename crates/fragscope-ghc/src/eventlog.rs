//! A whole eventlog in memory.

use std::io::Read;

use crate::event::{Event, EventKind};
use crate::header::Header;
use crate::heap_profile::HeapProfile;
use crate::reader::{End, EventReader};
use crate::Error;

/// Every event of a log, in file order, and how the log ended.
#[derive(Debug)]
pub struct Eventlog {
    pub header: Header,
    pub events: Vec<Event>,
    pub end: End,
    /// Set only by the `*_intact` constructors, when reading stopped at corrupt bytes;
    /// `end` is then `Truncated` at the corrupt event.
    pub corruption: Option<Error>,
}

impl Eventlog {
    /// Parses a whole log. A log cut short (the program was killed) is read up to its
    /// last whole event and has `end` = [`End::Truncated`]; any corruption is an error.
    pub fn parse(bytes: &[u8]) -> Result<Eventlog, Error> {
        Self::from_reader(bytes)
    }

    /// Like [`parse`](Self::parse), but corruption after the header keeps the events
    /// before it and is reported in `corruption`: the analysis of what is intact.
    pub fn parse_intact(bytes: &[u8]) -> Result<Eventlog, Error> {
        Self::from_reader_intact(bytes)
    }

    pub fn from_reader<R: Read>(reader: R) -> Result<Eventlog, Error> {
        let log = Self::from_reader_intact(reader)?;
        match log.corruption {
            Some(e) => Err(e),
            None => Ok(log),
        }
    }

    pub fn from_reader_intact<R: Read>(reader: R) -> Result<Eventlog, Error> {
        let mut reader = EventReader::new(reader)?;
        let mut events = Vec::new();
        let corruption = loop {
            match reader.next_event() {
                Ok(Some(event)) => events.push(event),
                Ok(None) => break None,
                Err(e) => break Some(e),
            }
        };
        let end = match (&corruption, reader.end()) {
            (None, Some(end)) => end,
            (corruption, _) => End::Truncated {
                offset: corruption
                    .as_ref()
                    .and_then(Error::offset)
                    .unwrap_or(reader.offset()),
            },
        };
        let header = reader.into_header();
        Ok(Eventlog {
            header,
            events,
            end,
            corruption,
        })
    }

    /// True when the log stops before its data-end marker (killed program or damage).
    pub fn is_truncated(&self) -> bool {
        matches!(self.end, End::Truncated { .. })
    }

    /// The RTS's name and version, e.g. "GHC-9.0.2 rts_l". `None` in a log cut short:
    /// the RTS keeps its start-up information (this, the program's arguments) in its
    /// global buffer, which it writes only at exit.
    pub fn rts_identifier(&self) -> Option<&str> {
        self.events.iter().find_map(|e| match &e.kind {
            EventKind::RtsIdentifier { identifier, .. } => Some(identifier.as_str()),
            _ => None,
        })
    }

    /// The GHC version from the RTS identifier, e.g. "9.0.2".
    pub fn ghc_version(&self) -> Option<&str> {
        let identifier = self.rts_identifier()?;
        let version = identifier.strip_prefix("GHC-")?;
        Some(version.split_whitespace().next().unwrap_or(version))
    }

    /// The program's command line, program name first.
    pub fn program_args(&self) -> Option<&[String]> {
        self.events.iter().find_map(|e| match &e.kind {
            EventKind::ProgramArgs { args, .. } => Some(args.as_slice()),
            _ => None,
        })
    }

    /// The heap profile censuses (`+RTS -h<x>`), one per sample.
    pub fn heap_profile(&self) -> HeapProfile {
        let mut profile = HeapProfile::default();
        for event in &self.events {
            profile.push(event);
        }
        profile
    }

    /// Orders the events by time (see [`EventReader`] for why file order is not). The
    /// sort is stable: events with equal timestamps keep their file order.
    pub fn sort_by_time(&mut self) {
        self.events.sort_by_key(|e| e.time_ns);
    }
}
