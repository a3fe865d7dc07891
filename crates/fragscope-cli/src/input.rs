//! What a command was given, read once before any analysis: a GHC eventlog, a GHC
//! program's recording, or any other trace (malloc's calls and the other runtimes'
//! censuses). `report`, `compare`, `export` and `replay` dispatch on it.

use std::fs::File;
use std::io::Read;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use fragscope_model::ghc;
use fragscope_trace::{ChunkKind, TraceContents};

pub enum Input {
    /// A GHC eventlog on its own: the RTS's figures, without RSS.
    Eventlog,
    /// A recorded GHC program: its eventlog beside the trace, or none (its block
    /// censuses only), and what the trace holds.
    GhcRecording {
        eventlog: Option<PathBuf>,
        contents: TraceContents,
    },
    /// Any other trace, and what it holds.
    Trace(TraceContents),
}

impl Input {
    /// Reads what `path` is. `doing` names the command's work in its errors
    /// ("analysing", "replaying").
    pub fn read(path: &Path, doing: &str) -> Result<Self> {
        let mut file =
            File::open(path).with_context(|| format!("cannot open {}", path.display()))?;
        let mut magic = [0u8; 4];
        if file.read_exact(&mut magic).is_ok() && ghc::is_eventlog(&magic) {
            return Ok(Self::Eventlog);
        }
        let contents =
            TraceContents::read(path).with_context(|| format!("{doing} {}", path.display()))?;
        match contents.ghc_eventlog(path) {
            Some(eventlog) if eventlog.exists() => {
                return Ok(Self::GhcRecording {
                    eventlog: Some(eventlog),
                    contents,
                })
            }
            Some(eventlog) => eprintln!(
                "fragscope: warning: {} references the GHC eventlog {}, which is missing \
                 (keep it beside the trace); showing the malloc report",
                path.display(),
                eventlog.display()
            ),
            // A GHC program recorded without an eventlog: its RSS and block censuses.
            None if contents.first_process_has(ChunkKind::GhcCensus) => {
                return Ok(Self::GhcRecording {
                    eventlog: None,
                    contents,
                })
            }
            None => {}
        }
        Ok(Self::Trace(contents))
    }
}
