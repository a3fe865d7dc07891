//! `fragscope record`

use std::ffi::OsString;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Result;
use clap::{Args, ValueEnum};
use fragscope_record::{record, AttachOptions, PackMode, RecordOptions};
use fragscope_trace::StackMode;

use crate::units;

#[derive(Clone, Copy, ValueEnum)]
enum Stacks {
    /// Stacks of allocations sampled by bytes (a Poisson process, as jemalloc samples).
    Sampled,
    /// A stack for every allocation (slower; exact per-site counts).
    All,
    /// No stacks (fastest).
    None,
}

#[derive(Clone, Copy, ValueEnum)]
enum Pack {
    /// Packed while fragscope keeps up with the program; while a process's calls come
    /// faster than they are packed, they are stored as they come, and packing resumes
    /// once it keeps up again.
    Auto,
    /// Always packed, even if the program has to wait.
    Always,
    /// Never packed.
    Never,
}

/// Run a program and record its allocations, RSS and page residency into a trace.
///
/// The program runs with fragscope's interposer preloaded (LD_PRELOAD); its stdin, stdout
/// and stderr are its own, and fragscope exits with its exit status (128+N if signal N
/// ended it). Children (fork, exec, posix_spawn) are recorded too.
///
/// A GHC-compiled program is also asked for its RTS eventlog (GHCRTS gains
/// `-l -ol<trace>.eventlog`, after your own flags), written beside the trace; if its RTS
/// would refuse the flags, fragscope says which to rebuild with. At each snapshot
/// fragscope also reads the RTS's block descriptors (megablocks, blocks by kind, pinned
/// blocks and how full they are) from outside the program.
///
/// With -p PID, fragscope records a process that is already running instead: it loads
/// the interposer into it (through ptrace, as a debugger calls a function), rebinds its
/// allocation calls to it, and at Ctrl-C, after --duration, or when the process exits,
/// puts them back and leaves the process running as before. The recording starts with
/// the heap as it is: a free of a block allocated before it is counted apart.
///
/// Examples: fragscope record -o run.fsc -- ./server --port 8080
///           fragscope record -p $(pidof server) --duration 60 -o live.fsc
#[derive(Args)]
pub struct RecordArgs {
    /// Where to write the trace.
    #[arg(short, long, default_value = "fragscope.fsc")]
    output: PathBuf,
    /// Which allocations get a call stack.
    #[arg(long, value_enum, default_value_t = Stacks::Sampled)]
    stacks: Stacks,
    /// Mean bytes allocated between two sampled stacks (with --stacks sampled).
    #[arg(long, default_value_t = 512 * 1024, value_name = "BYTES")]
    sample_bytes: u64,
    /// Milliseconds between page-residency snapshots (also taken near RSS peaks and at exit).
    #[arg(long, default_value_t = 1000, value_name = "MS")]
    snapshot_ms: u32,
    /// A thread that allocates sends its buffered events at least this often; a killed
    /// program loses at most this much.
    #[arg(long, default_value_t = 200, value_name = "MS")]
    flush_ms: u32,
    /// zstd compression level of the whole trace (1 = fastest, 19 = smallest). By default
    /// 3, and 1 for event buffers (level 3 makes those stored as they came about 4%
    /// smaller and packed ones 0-2%, for three times the CPU the program competes with).
    #[arg(long, value_name = "LEVEL", value_parser = clap::value_parser!(i32).range(1..=19))]
    compression: Option<i32>,
    /// When to store events in the packed form (a freed block named by its place among the
    /// live ones, a block handed back from a thread cache costing no address, each kind of
    /// value compressed on its own): traces about half the size, for more of fragscope's
    /// own CPU. `--pack` alone means always.
    #[arg(long, value_enum, value_name = "WHEN", default_value_t = Pack::Auto,
          num_args = 0..=1, require_equals = true, default_missing_value = "always")]
    pack: Pack,
    /// For long runs: write the blocks each snapshot sees, not every call. A block
    /// allocated and freed between two snapshots is counted by allocation site and size
    /// instead of written, so the trace grows with the snapshots and the blocks that
    /// outlive one, not with the calls; every snapshot's decomposition, occupancy, size
    /// classes and pinning sites are as a full recording's, and so are the allocation
    /// counts per site and the live-bytes timeline. `replay` needs a full recording.
    /// (`fragscope aggregate` does the same to a trace already recorded.)
    #[arg(long)]
    aggregate: bool,
    /// Replace the output even if it is not a fragscope trace (an existing file of
    /// another kind, or a symbolic link, which is replaced, never written through).
    #[arg(long)]
    force: bool,
    /// GHC programs: also ask the RTS for a heap profile by closure type (`-hT -i0.1`).
    /// Each of its censuses is a major collection, so the program collects and copies
    /// more than it would on its own.
    #[arg(long)]
    ghc_heap_profile: bool,
    /// Do not read runtime heaps at snapshots: a GHC RTS's block descriptors (each read
    /// stops the program for about a millisecond per 20 MiB of heap) and CPython's
    /// pymalloc pools (about 5 ms per 100 MiB of arenas).
    #[arg(long, visible_alias = "no-census")]
    no_ghc_census: bool,
    /// Record the running process PID from now on instead of starting a program (needs
    /// ptrace permission over it, as a debugger does).
    #[arg(
        short = 'p',
        long = "pid",
        value_name = "PID",
        conflicts_with = "command"
    )]
    pid: Option<u32>,
    /// With -p: stop recording after this many seconds (else at Ctrl-C or when the
    /// process exits).
    #[arg(long, value_name = "SECONDS")]
    duration: Option<f64>,
    /// The program to record, and its arguments.
    #[arg(required_unless_present = "pid", last = true, value_name = "COMMAND")]
    command: Vec<OsString>,
}

pub fn run(a: RecordArgs) -> Result<ExitCode> {
    if a.sample_bytes == 0 {
        anyhow::bail!("--sample-bytes must be at least 1 (use --stacks all for every allocation)");
    }
    let attach = match (a.pid, a.duration) {
        (Some(_), Some(d)) if !(d > 0.0 && d.is_finite()) => {
            anyhow::bail!("--duration must be a positive number of seconds")
        }
        (Some(pid), d) => Some(AttachOptions {
            pid,
            duration: d.map(std::time::Duration::from_secs_f64),
        }),
        (None, Some(_)) => anyhow::bail!(
            "--duration applies to a recording of a running process: add --pid PID (-p)"
        ),
        (None, None) => None,
    };
    let opts = RecordOptions {
        output: a.output.clone(),
        stacks: match a.stacks {
            Stacks::Sampled => StackMode::Sampled,
            Stacks::All => StackMode::All,
            Stacks::None => StackMode::None,
        },
        sample_bytes: a.sample_bytes,
        snapshot_ms: a.snapshot_ms,
        flush_ms: a.flush_ms.max(1),
        compression_level: a.compression,
        // An aggregated recording decodes each buffer as it comes: packing it first
        // would only cost the recorder's CPU.
        pack: match a.pack {
            _ if a.aggregate => PackMode::Never,
            Pack::Auto => PackMode::Auto,
            Pack::Always => PackMode::Always,
            Pack::Never => PackMode::Never,
        },
        aggregate: a.aggregate,
        command: a.command,
        force: a.force,
        ghc_census: !a.no_ghc_census,
        ghc_heap_profile: a.ghc_heap_profile,
        attach,
    };
    let out = record(&opts)?;
    eprintln!(
        "fragscope: trace written to {} ({}, {} process{}, {:.1} s)",
        a.output.display(),
        units::bytes(out.file_bytes),
        out.processes,
        if out.processes == 1 { "" } else { "es" },
        out.duration.as_secs_f64()
    );
    if let Some(eventlog) = &out.ghc_eventlog {
        if eventlog.exists() {
            eprintln!(
                "fragscope: GHC eventlog written to {} (keep it beside the trace)",
                eventlog.display()
            );
        } else {
            eprintln!(
                "fragscope: warning: the GHC program wrote no eventlog to {}; the report \
                 will show its RSS only",
                eventlog.display()
            );
        }
    }
    if let Some(advice) = &out.ghc_advice {
        eprintln!("fragscope: note: {advice}");
    }
    for u in &out.untraced {
        eprintln!(
            "fragscope: warning: {} was not traced: {}",
            u.label(),
            u.reason
        );
    }
    if out.refused_connections > 0 {
        eprintln!(
            "fragscope: note: refused {} connection{} from processes outside the recorded \
             program (or without its token); nothing of them is in the trace",
            out.refused_connections,
            if out.refused_connections == 1 {
                ""
            } else {
                "s"
            }
        );
    }
    // A program the user named, or one big enough to hide a heap, gets the warning; small
    // tools it ran that need no malloc (true, sleep) one line together.
    const SMALL_RSS_KIB: u64 = 32 << 10;
    let (warned, small): (Vec<_>, Vec<_>) = out
        .silent_processes
        .iter()
        .partition(|p| p.main || p.go || p.peak_rss_kib >= SMALL_RSS_KIB);
    if !small.is_empty() {
        let shown: Vec<&str> = small.iter().take(3).map(|p| p.label.as_str()).collect();
        eprintln!(
            "fragscope: note: {} small process{} made no malloc-family call (under {} MiB of \
             RSS: a tool that needs no heap, most likely): {}{}",
            small.len(),
            if small.len() == 1 { "" } else { "es" },
            SMALL_RSS_KIB >> 10,
            shown.join(", "),
            if small.len() > shown.len() {
                ", ..."
            } else {
                ""
            }
        );
    }
    for p in warned {
        if p.go_heap_read {
            // Its heap was read by census: the report has it.
        } else if p.go {
            eprintln!(
                "fragscope: warning: {} made no malloc-family call: it is a Go program, whose \
                 runtime takes its heap from the kernel without malloc, and no census of its \
                 heap was taken (see the report's note); its RSS was still recorded.",
                p.label
            );
        } else {
            eprintln!(
                "fragscope: warning: no malloc-family call was seen from {}; its RSS was still \
                 recorded. Likely causes, most likely first: the compiler removed the calls (a \
                 block that is allocated and freed unused, as in free(malloc(64)), is optimized \
                 away at -O1 and above); an allocator linked into the program statically, whose \
                 malloc the dynamic loader never sees; a runtime that does not use malloc.",
                p.label
            );
        }
    }
    Ok(ExitCode::from(out.exit_code.clamp(0, 255) as u8))
}
