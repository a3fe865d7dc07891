use std::io;

/// Why an eventlog could not be read (or read further). Every variant that concerns the
/// content names the byte offset, from the start of the file, where reading stopped.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The first four bytes are not the header-begin marker.
    #[error(
        "not a GHC eventlog: it starts with {found:02x?} instead of \"hdrb\" \
         (eventlogs come from a program linked with -eventlog and run with +RTS -l)"
    )]
    NotAnEventlog { found: Vec<u8> },

    /// The file ends before the header (the list of event types) is complete, so no event
    /// can be decoded.
    #[error(
        "the eventlog ends at byte {offset}, inside its header: the program stopped \
         before the RTS wrote its first events"
    )]
    TruncatedHeader { offset: u64 },

    /// The bytes contradict the format; `offset` is where the offending item starts.
    #[error("corrupt eventlog at byte {offset}: {message}")]
    Corrupt { offset: u64, message: String },

    /// Reading the underlying file or stream failed.
    #[error("reading the eventlog at byte {offset}: {source}")]
    Io {
        offset: u64,
        #[source]
        source: io::Error,
    },
}

impl Error {
    /// The byte offset where reading stopped, when the error concerns the content.
    pub fn offset(&self) -> Option<u64> {
        match self {
            Error::NotAnEventlog { .. } => Some(0),
            Error::TruncatedHeader { offset }
            | Error::Corrupt { offset, .. }
            | Error::Io { offset, .. } => Some(*offset),
        }
    }

    pub(crate) fn corrupt(offset: u64, message: impl Into<String>) -> Error {
        Error::Corrupt {
            offset,
            message: message.into(),
        }
    }
}
