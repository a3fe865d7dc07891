//! One recording: launch, serve the interposer's connections, sample /proc, write.
//!
//! Its files, by job, each using only those listed before it: `options` (what is asked,
//! what comes of it), `packing` (when buffers are stored packed), `writer` (the writer
//! thread), `shared` (the state every thread shares: streams, snapshots), `events`
//! (storing a connection's buffers), `connection` (serving one), `server` (the socket,
//! who may connect), `sampler` (the ticker, /proc, the census thread), `launched` and
//! `attached` (the program started, or the process `record -p` joins), `ending` (what the
//! trace says at its end). This file puts them together.

mod attached;
mod connection;
mod ending;
mod events;
mod launched;
mod options;
mod packing;
mod sampler;
mod server;
mod shared;
mod writer;

use std::collections::HashMap;
use std::ffi::OsString;
use std::io::BufWriter;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::sync_channel;
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::Instant;

use anyhow::{anyhow, Result};
use fragscope_trace::{ChunkKind, ChunkWriter, Meta};

pub use options::{AttachOptions, PackMode, RecordOptions, RecordOutcome, SilentProcess};

use crate::clock::ClockPage;
use crate::ghc::{GhcBinary, GhcSetup};
use crate::output::{create_output, meta_now};
use sampler::Stop;
use server::{Acceptor, Rendezvous};
use shared::{Procs, Shared};
use writer::{write_chunks, Message, DEFAULT_COMPRESSION_LEVEL, EVENTS_COMPRESSION_LEVEL};

/// Records `opts.command` into `opts.output`.
pub fn record(opts: &RecordOptions) -> Result<RecordOutcome> {
    let attach_pid = opts.attach.as_ref().map(|a| a.pid);
    let command = match attach_pid {
        Some(pid) => attached::attach_command(pid)?,
        None => opts.command.clone(),
    };
    let program = command
        .first()
        .ok_or_else(|| anyhow!("no program to record"))?;
    let (program_path, unconnected) = program_to_record(program, attach_pid)?;
    // A file size limit (ulimit -f) then fails the trace's write with EFBIG, which is
    // reported, instead of killing the recorder mid-recording.
    // SAFETY: ignoring a signal.
    unsafe { libc::signal(libc::SIGXFSZ, libc::SIG_IGN) };
    let (ghc_program, ghc) = ghc_setup(opts, &program_path, &command, attach_pid);
    let censuses = crate::census::Censuses::new(opts.ghc_census);
    if let Some((path, ..)) = &ghc_program {
        censuses.learn(path);
    }
    if attach_pid.is_some() {
        censuses.learn(&program_path);
    }
    let preload = crate::preload::preload_library()?;
    let started = Instant::now();
    let (rendezvous, listener) = Rendezvous::open()?;
    let mut censuses = censuses;
    censuses.watch_v8(rendezvous.v8_dir.clone(), v8_interval_ms(opts.snapshot_ms));
    let clock = ClockPage::create(&rendezvous.clock_path)?;
    let token = server::recording_token()?;

    // SAFETY: sysconf has no preconditions.
    let page_size = unsafe { libc::sysconf(libc::_SC_PAGESIZE) }.max(4096) as u64;
    let writer = open_trace(opts, &command, ghc.as_ref(), page_size)?;
    // Room for 256 chunks (up to 32 MiB of event buffers) between the connections and
    // the writer; a writer further behind holds the program back rather than our memory
    // growing. (The channel's slots are written out when it is made.)
    let (tx, rx) = sync_channel::<Message>(256);
    let output = opts.output.clone();
    let aggregate = opts.aggregate;
    let writer_thread = thread::Builder::new()
        .name("fragscope-writer".into())
        .spawn(move || write_chunks(writer, rx, &output, aggregate))?;
    let shared = Arc::new(Shared {
        out: tx,
        snapshot_order: Mutex::new(()),
        clock,
        procs: Mutex::new(Procs::default()),
        build_ids: Mutex::new(HashMap::new()),
        page_size,
        event_bytes: AtomicU64::new(0),
        arrivals: Mutex::new(Vec::new()),
        pack: opts.pack,
        censuses,
        token: token.clone(),
        refused_connections: AtomicU64::new(0),
        announced_images: Mutex::new(Vec::new()),
    });

    let stop = Arc::new(Stop::default());
    let ticker = sampler::spawn_ticker(&shared, &stop)?;
    let acceptor = Acceptor::spawn(listener, &shared, attach_pid)?;
    let sampler = sampler::spawn_sampler(&shared, &stop, opts.snapshot_ms)?;

    let (exit_code, child_pid) = match &opts.attach {
        Some(a) => {
            let (sock, clock) = (&rendezvous.sock_path, &rendezvous.clock_path);
            let attached = attached::run_attached(&shared, a, &preload, sock, clock, opts, &token);
            if attached.is_err() {
                // Nothing was recorded: no trace is left behind.
                let _ = std::fs::remove_file(&opts.output);
            }
            (Some(attached?), a.pid)
        }
        None => {
            let launch = launched::Launch {
                preload: &preload,
                rendezvous: &rendezvous,
                token: &token,
                ghcrts: ghc.as_ref().and_then(|g| g.ghcrts.as_ref()),
                unconnected,
            };
            launched::run_program(&shared, &command, &launch, opts)?
        }
    };

    // Wind down: stop sampling, close the listener, let connections drain.
    stop.stop();
    let _ = sampler.join();
    acceptor.finish(&rendezvous.sock_path);
    let _ = ticker.join();
    let (stream_count, silent, untraced) = end_streams(
        &shared,
        attach_pid.is_none().then_some((
            child_pid,
            program_path.as_path(),
            &command[..],
            preload.as_path(),
        )),
    );
    let refused_connections = shared.refused_connections.load(Ordering::Relaxed);
    let event_bytes = shared.event_bytes.load(Ordering::Relaxed);
    shared.send(
        ChunkKind::End,
        fragscope_trace::End {
            tick: shared.tick(),
            event_bytes,
        }
        .encode(),
    );
    drop(shared);
    let file_bytes = writer_thread
        .join()
        .map_err(|_| anyhow!("the trace writer panicked"))??;
    Ok(RecordOutcome {
        exit_code: exit_code.unwrap_or(1),
        file_bytes,
        event_bytes,
        processes: stream_count,
        duration: started.elapsed(),
        silent_processes: silent,
        ghc_eventlog: ghc.as_ref().and_then(|g| g.eventlog.clone()),
        ghc_advice: ghc.and_then(|g| g.advice),
        untraced,
        refused_connections,
    })
}

/// The program's file, and whether it is a Go program without cgo, which never connects
/// (its stream is opened as it starts); warns of an allocator linked into it, whose
/// calls the trace will miss.
fn program_to_record(program: &OsString, attach_pid: Option<u32>) -> Result<(PathBuf, bool)> {
    let (program_path, unconnected) = match attach_pid {
        Some(pid) => (
            std::fs::read_link(format!("/proc/{pid}/exe"))
                .map_err(|e| crate::access::access_error(pid, &e))?,
            false,
        ),
        None => match crate::launch::check_traceable(program) {
            Ok(path) => (path, false),
            Err(e) => match crate::launch::static_go_program(program) {
                Some(path) => {
                    eprintln!(
                        "fragscope: {} is a Go program without cgo: it makes no malloc call \
                         to trace. Its Go heap is read from outside at every snapshot \
                         (spans, size classes, free pages kept and released) and its RSS \
                         sampled; build it with cgo to trace its C allocations too.",
                        path.display()
                    );
                    (path, true)
                }
                None => return Err(e.into()),
            },
        },
    };
    // Said before the program runs: what the trace will miss.
    if let Some(l) = fragscope_census::allocators::linked_allocator(&program_path) {
        eprintln!(
            "fragscope: warning: {}. The report will show RSS over time, its phases and \
             where the process's memory lies, not that allocator's objects.",
            l.consequence()
        );
    }
    Ok((program_path, unconnected))
}

/// Ends every stream and sends what the recording learnt of them at the end: the
/// allocators linked into their programs and, for a program the recorder launched
/// (`launched`: its pid, path, command line and the interposer), the images that never
/// connected. The streams, the silent processes and the untraced images.
fn end_streams(
    shared: &Shared,
    launched: Option<(u32, &Path, &[OsString], &Path)>,
) -> (u32, Vec<SilentProcess>, Vec<fragscope_trace::Untraced>) {
    let (stream_count, silent) = ending::silent_processes(shared);
    for s in 0..stream_count {
        shared.end_stream(s);
    }
    for chunk in ending::linked_allocators_of_streams(shared) {
        shared.send(ChunkKind::LinkedAllocator, chunk.encode());
    }
    let untraced = match launched {
        Some((child_pid, program_path, command, preload)) => {
            ending::untraced_images(shared, child_pid, program_path, command, preload)
        }
        None => Vec::new(),
    };
    for u in &untraced {
        shared.send(ChunkKind::Untraced, u.encode());
    }
    (stream_count, silent, untraced)
}

/// The GHC program: its path, what its binary says, whether a wrapper runs it.
type GhcProgram = (PathBuf, GhcBinary, bool);

/// The GHC program: the one recorded, or the one a wrapper (a shell, a script, stack
/// exec) runs, whose RTS reads the same GHCRTS from the environment it inherits.
/// A running GHC program keeps the RTS flags it started with: no eventlog can be asked
/// for, but its block census is taken all the same.
fn ghc_setup(
    opts: &RecordOptions,
    program_path: &Path,
    command: &[OsString],
    attach_pid: Option<u32>,
) -> (Option<GhcProgram>, Option<GhcSetup>) {
    let ghc_program = match fragscope_census::image::map(program_path)
        .ok()
        .filter(|_| attach_pid.is_none())
        .and_then(|data| crate::ghc::inspect(&data))
    {
        Some(binary) => Some((program_path.to_path_buf(), binary, false)),
        None if attach_pid.is_none() => crate::ghc::wrapped_program(program_path, &command[1..])
            .map(|(path, binary)| (path, binary, true)),
        None => None,
    };
    let ghc = ghc_program.as_ref().map(|(path, binary, wrapped)| {
        let mut setup = crate::ghc::prepare(
            path,
            *binary,
            &opts.output,
            opts.ghc_heap_profile,
            &command[1..],
        );
        if *wrapped {
            let said = format!(
                "{} runs the GHC program {}{}",
                program_path.display(),
                path.display(),
                if setup.ghcrts.is_some() {
                    ": its RTS is asked for an eventlog through GHCRTS, which it inherits"
                } else {
                    ""
                }
            );
            setup.advice = Some(match setup.advice {
                Some(a) => format!("{said}. {a}"),
                None => said,
            });
        }
        setup
    });
    (ghc_program, ghc)
}

/// Creates the trace file and writes its Meta chunk.
fn open_trace(
    opts: &RecordOptions,
    command: &[OsString],
    ghc: Option<&GhcSetup>,
    page_size: u64,
) -> Result<ChunkWriter<BufWriter<std::fs::File>>> {
    let file = create_output(&opts.output, opts.force)?;
    let mut writer = match opts.compression_level {
        Some(level) => ChunkWriter::new(BufWriter::with_capacity(1 << 20, file), level)?,
        None => ChunkWriter::new(
            BufWriter::with_capacity(1 << 20, file),
            DEFAULT_COMPRESSION_LEVEL,
        )?
        .with_events_level(EVENTS_COMPRESSION_LEVEL),
    };
    let meta = Meta {
        aggregated: opts.aggregate,
        ghc_eventlog: ghc.and_then(|g| g.eventlog.as_ref()).map(|e| {
            // Relative to the trace's directory, so the two can move together.
            e.file_name()
                .map_or_else(|| e.clone(), PathBuf::from)
                .to_string_lossy()
                .into_owned()
        }),
        ..meta_now(
            page_size,
            opts.stacks,
            opts.sample_bytes,
            opts.snapshot_ms,
            command
                .iter()
                .map(|a| a.to_string_lossy().into_owned())
                .collect(),
        )
    };
    writer.write_chunk(ChunkKind::Meta, &meta.encode())?;
    Ok(writer)
}

/// How often a Node.js process writes its V8 heap's figures: twice a snapshot interval,
/// at most 10 times a second.
fn v8_interval_ms(snapshot_ms: u32) -> u64 {
    u64::from(snapshot_ms / 2).clamp(20, 100)
}
