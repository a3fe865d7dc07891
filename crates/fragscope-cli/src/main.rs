//! The `fragscope` command line.

mod compare;
mod export;
mod ghc_report;
mod html;
mod info;
mod progress;
mod record;
mod replay;
mod report;
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
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Record(a) => record::run(a),
        Command::Info(a) => info::run(a),
        Command::Report(a) => report::run(a),
        Command::Compare(a) => compare::run(a),
        Command::Export(a) => export::run(a),
        Command::Replay(a) => replay::run(a),
    };
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("fragscope: error: {e:#}");
            ExitCode::from(2)
        }
    }
}
