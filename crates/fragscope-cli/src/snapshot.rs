//! `fragscope snapshot`

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Result;
use clap::Args;
use fragscope_record::{snapshot, ForkCopy, SnapshotOptions};

use crate::units;

/// Take a census of a process that is already running: no preload, no restart.
///
/// fragscope holds the process stopped (SIGSTOP) while it reads its heap from outside
/// (/proc/PID/mem, maps, pagemap), continues it, and writes a trace of that one moment,
/// which `report` (also --json, --html), `compare` and `export` read like a recording.
/// A glibc heap of 32 MiB or more is read from a copy of the process instead: fragscope
/// makes it fork (with ptrace, as a debugger would) while it is stopped, lets it run on at
/// once, reads the copy, then kills the copy and has the process reap it (see
/// --fork-copy). The stop then lasts as long as the fork, a few ms per GiB.
/// glibc malloc: every arena, chunk, thread cache and fastbin, the mmapped chunks, and
/// what malloc_trim would return (predicted; nothing is done to the process). A GHC 9.0
/// program: the RTS's block census. Debian's tcmalloc (gperftools 2.10): its size
/// classes, spans, free lists and page heap. Debian's jemalloc (5.3.0): its arenas, bins
/// and slabs, large extents, dirty and muzzy pages and threads' caches, also linked into
/// the program (tikv-jemallocator 0.6 and 0.7). mimalloc linked into a Rust program (the
/// mimalloc crate: 3.3.2, its default, or 2.3.2, its `v2`): its arenas or segments, pages
/// by block size and free lists; Debian 13's libmimalloc3 (3.0.1) too. Other allocators
/// and builds (Debian 12's libmimalloc): the page-level picture, with a note naming them.
/// A snapshot has no history, so no allocation sites.
///
/// Needs ptrace access to the process: its user with /proc/sys/kernel/yama/ptrace_scope
/// at 0, or root / CAP_SYS_PTRACE.
///
/// Example: fragscope snapshot $(pidof server) -o snap.fsc
#[derive(Args)]
pub struct SnapshotArgs {
    /// The process to read.
    pid: u32,
    /// Where to write the trace.
    #[arg(short, long, default_value = "snapshot.fsc")]
    output: PathBuf,
    /// Read without stopping the process: it is never paused, but the figures may not
    /// hold together (the heap changes while it is read), and the census may be refused.
    #[arg(long)]
    no_stop: bool,
    /// Replace the output even if it is not a fragscope trace.
    #[arg(long)]
    force: bool,
    /// Read a glibc heap from a forked copy of the process (the stop lasts only for the
    /// fork): auto from 32 MiB of resident heap, always, or never (read the process
    /// itself while it is stopped, about 0.3 ms per MiB). A process under a seccomp filter
    /// is never forked. The copy shares the process's pages copy-on-write: while it is
    /// read, pages the process writes are copied, at most its heap's size.
    #[arg(long, value_enum, default_value_t = ForkCopyArg::Auto, value_name = "WHEN")]
    fork_copy: ForkCopyArg,
}

#[derive(Clone, Copy, clap::ValueEnum)]
enum ForkCopyArg {
    Auto,
    Always,
    Never,
}

pub fn run(a: SnapshotArgs) -> Result<ExitCode> {
    let out = snapshot(&SnapshotOptions {
        pid: a.pid,
        output: a.output.clone(),
        force: a.force,
        stop: !a.no_stop,
        fork_copy: match a.fork_copy {
            ForkCopyArg::Auto => ForkCopy::Auto,
            ForkCopyArg::Always => ForkCopy::Always,
            ForkCopyArg::Never => ForkCopy::Never,
        },
        compression_level: 3,
    })?;
    match out.stopped_for {
        Some(d) => {
            let ms = d.as_secs_f64() * 1e3;
            // Below 64 MiB the fixed cost of stopping the threads dominates: a rate per
            // GiB would read as thousands of milliseconds.
            let per_gib = if out.heap_bytes >= 64 << 20 {
                format!(
                    ", {:.0} ms per GiB of its {} heap",
                    ms / (out.heap_bytes as f64 / (1u64 << 30) as f64),
                    units::bytes(out.heap_bytes)
                )
            } else {
                format!(" (its heap: {})", units::bytes(out.heap_bytes))
            };
            let how = if out.read_from_copy {
                "; its heap was read from a copy made by fork"
            } else {
                ""
            };
            eprintln!(
                "fragscope: process {} ({}) was stopped for {ms:.1} ms{per_gib}{how}",
                a.pid, out.allocator
            );
        }
        None if a.no_stop => eprintln!(
            "fragscope: process {} ({}) was read without stopping it (--no-stop): the figures \
             may not hold together",
            a.pid, out.allocator
        ),
        // Stopped, but its runtime's census was refused: the note below says why.
        None => eprintln!(
            "fragscope: process {} ({}) was read, without a census of its heap",
            a.pid, out.allocator
        ),
    }
    if let Some(note) = &out.note {
        eprintln!("fragscope: note: {note}");
    }
    eprintln!(
        "fragscope: snapshot written to {} ({}); see it with `fragscope report {}`",
        a.output.display(),
        units::bytes(out.file_bytes),
        a.output.display()
    );
    Ok(ExitCode::SUCCESS)
}
