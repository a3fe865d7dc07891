//! What `fragscope record` is asked to do, and what it tells of the recording.

use std::ffi::OsString;
use std::path::PathBuf;
use std::time::Duration;

use fragscope_trace::StackMode;

/// What `fragscope record` was asked to do.
#[derive(Debug, Clone)]
pub struct RecordOptions {
    pub output: PathBuf,
    pub stacks: StackMode,
    /// Mean bytes between stack samples (sampled mode).
    pub sample_bytes: u64,
    /// Interval of page-residency snapshots.
    pub snapshot_ms: u32,
    /// A thread sends its buffer at least this often while it allocates.
    pub flush_ms: u32,
    /// zstd level of the trace chunks; None: level 3, and level 1 for event buffers
    /// (`ChunkWriter::with_events_level`).
    pub compression_level: Option<i32>,
    /// When to rewrite event buffers into the packed form (fragscope_trace::pack).
    pub pack: PackMode,
    /// Write the calls aggregated (`fragscope_trace::aggregate`): the blocks allocated
    /// and freed between two snapshots summed by stack and size instead of written.
    pub aggregate: bool,
    /// The program and its arguments.
    pub command: Vec<OsString>,
    /// Replace whatever is at `output` (a file that is not a trace, a symbolic link).
    pub force: bool,
    /// Take a block census of a GHC program's heap at each snapshot.
    pub ghc_census: bool,
    /// Ask a GHC program for a -hT heap profile too (it changes the program's collections).
    pub ghc_heap_profile: bool,
    /// Record a process that is already running instead of starting `command`.
    pub attach: Option<AttachOptions>,
}

/// `record -p`: the process, and when to let it go (else at Ctrl-C, SIGTERM or its exit).
#[derive(Debug, Clone)]
pub struct AttachOptions {
    pub pid: u32,
    pub duration: Option<Duration>,
}

/// When event buffers are stored in the packed form.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PackMode {
    /// While the recorder keeps up: a process whose buffers queue up behind the packing
    /// is stored raw from then on (the program would otherwise wait for fragscope).
    Auto,
    /// Every buffer, even if the program must wait.
    Always,
    Never,
}

/// A process that made no malloc-family call.
#[derive(Debug, Clone)]
pub struct SilentProcess {
    /// Its command line and pid.
    pub label: String,
    /// Its executable is a Go program (whose runtime does not allocate through malloc).
    pub go: bool,
    /// Its Go heap was read by census at the snapshots: nothing was missed.
    pub go_heap_read: bool,
    /// The program fragscope started (its first image), rather than one it ran.
    pub main: bool,
    /// Its highest VmRSS at a snapshot, in KiB: a small tool that needs no malloc (true,
    /// sleep) is told apart from a program whose heap fragscope cannot see.
    pub peak_rss_kib: u64,
}

/// How a recording ended.
#[derive(Debug, Clone)]
pub struct RecordOutcome {
    /// The program's exit code, or 128 + the signal that ended it.
    pub exit_code: i32,
    pub file_bytes: u64,
    pub event_bytes: u64,
    pub processes: u32,
    pub duration: Duration,
    /// Process images that made no malloc-family call at all.
    pub silent_processes: Vec<SilentProcess>,
    /// The GHC RTS eventlog written beside the trace, when one was asked for.
    pub ghc_eventlog: Option<PathBuf>,
    /// Why a GHC program was recorded without an eventlog, and how to rebuild it.
    pub ghc_advice: Option<String>,
    /// Process images the program ran that could not be traced (also in the trace).
    pub untraced: Vec<fragscope_trace::Untraced>,
    /// Connections refused: from processes outside the recorded program, or without the
    /// recording's token.
    pub refused_connections: u64,
}
