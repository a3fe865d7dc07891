//! `fragscope aggregate`: a trace rewritten as `record --aggregate` would have written it.

use std::io::BufWriter;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{bail, Context, Result};
use clap::Args;
use fragscope_trace::aggregate::aggregate_file;
use fragscope_trace::ChunkWriter;

use crate::units::bytes;

/// Shrink a trace: keep what every snapshot sees, sum the other calls by site.
///
/// Writes the trace as `fragscope record --aggregate` would have: the blocks allocated
/// and freed between two snapshots are left out, and counted per allocation site and
/// size instead; the blocks any snapshot (or a fork) sees are
/// kept with their sizes and stacks. `report`, `export` and `compare` give the same
/// decomposition, occupancy, size classes and pinning sites at every snapshot, and the
/// same allocation counts per site; the live-bytes timeline keeps its 10 ms resolution.
/// `replay` needs every call, and refuses an aggregated trace.
///
/// Examples:
///   fragscope aggregate run.fsc -o run-small.fsc
#[derive(Args)]
#[command(verbatim_doc_comment)]
pub struct AggregateArgs {
    /// The trace (from `fragscope record`).
    trace: PathBuf,
    /// The aggregated trace to write.
    #[arg(short, long)]
    output: PathBuf,
    /// Replace the output even if it is not a fragscope trace.
    #[arg(long)]
    force: bool,
}

pub fn run(a: AggregateArgs) -> Result<ExitCode> {
    let size = std::fs::metadata(&a.trace)
        .with_context(|| format!("cannot open {}", a.trace.display()))?
        .len();
    let same = std::fs::canonicalize(&a.output)
        .is_ok_and(|o| std::fs::canonicalize(&a.trace).is_ok_and(|t| t == o));
    if same {
        bail!(
            "{} is the trace being read; write the aggregated trace to another file",
            a.output.display()
        );
    }
    let file = fragscope_record::create_output(&a.output, a.force)?;
    let mut w = ChunkWriter::new(BufWriter::with_capacity(1 << 20, file), 3)
        .with_context(|| format!("writing {}", a.output.display()))?;
    let bar = crate::progress::bar(2 * size, "aggregating");
    let done = aggregate_file(&a.trace, &mut w, &mut |done, _| bar.set_position(done));
    bar.finish_and_clear();
    let done = done.with_context(|| format!("aggregating {}", a.trace.display()))?;
    if done.damaged {
        eprintln!(
            "fragscope: {} is damaged; what came before the damage was aggregated",
            a.trace.display()
        );
    }
    eprintln!(
        "fragscope: wrote {} ({} from {})",
        a.output.display(),
        bytes(done.bytes_written),
        bytes(done.bytes_read)
    );
    Ok(ExitCode::SUCCESS)
}
