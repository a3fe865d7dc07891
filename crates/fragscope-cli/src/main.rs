//! The `fragscope` command line.
// info's JSON of a process has more fields than serde_json's json! macro expands by default.
#![recursion_limit = "256"]

mod aggregate;
mod compare;
mod export;
mod ghc_report;
mod html;
mod info;
mod input;
mod progress;
mod record;
mod replay;
mod report;
mod snapshot;
mod units;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// fragscope: where does a program's resident memory go?
///
/// Record a program (C, C++, Rust, anything on malloc), then ask what its RSS is made of:
/// live data, size-class rounding, free space inside pages that live objects pin, free
/// pages the allocator keeps, and memory outside the heap.
#[derive(Parser)]
#[command(
    name = "fragscope",
    version,
    propagate_version = true,
    arg_required_else_help = true
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    Record(record::RecordArgs),
    Info(info::InfoArgs),
    Report(report::ReportArgs),
    Compare(compare::CompareArgs),
    Export(export::ExportArgs),
    Replay(replay::ReplayArgs),
    Snapshot(snapshot::SnapshotArgs),
    Aggregate(aggregate::AggregateArgs),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    if !matches!(cli.command, Command::Record(_)) {
        // A reader that stops early (`fragscope info t.fsc | head -1`) ends the command
        // quietly, by SIGPIPE, as it ends coreutils; Rust's default (ignored, so every
        // print to a closed pipe panics) stays for `record`, whose trace must not be cut
        // because a pipe on its stderr closed.
        // SAFETY: setting a signal's disposition to its default.
        unsafe { libc::signal(libc::SIGPIPE, libc::SIG_DFL) };
        // Readers of traces hold big tables for a while and let them go: freed memory
        // goes back to the system instead of piling up in glibc's arenas.
        fragscope_trace::live::fix_malloc_thresholds();
    }
    let result = match cli.command {
        Command::Record(a) => record::run(a),
        Command::Info(a) => info::run(a),
        Command::Report(a) => report::run(a),
        Command::Compare(a) => compare::run(a),
        Command::Export(a) => export::run(a),
        Command::Replay(a) => replay::run(a),
        Command::Snapshot(a) => snapshot::run(a),
        Command::Aggregate(a) => aggregate::run(a),
    };
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("fragscope: error: {e:#}");
            ExitCode::from(2)
        }
    }
}
