//! The first stage: the trace read once, each process's threads merged into its calls
//! and live blocks, and its snapshots evaluated as the calls reach their moment.

use std::collections::HashMap;
use std::path::Path;

use fragscope_trace::ahead::{AheadChunk, EventsOf, ReadAhead};
use fragscope_trace::reader::Chunk;
use fragscope_trace::records::{Meta, Rollup, StackMode};
use fragscope_trace::Untraced;

use crate::forks;
use crate::heap::SiteWeighting;
use crate::sharing::{self, RollupSharing};

use super::stream::{Ctx, Stream};
use super::{AnalysisError, Options};

/// Everything the trace said, per process and about the whole recording.
pub(super) struct TraceRead {
    pub(super) meta: Option<Meta>,
    pub(super) streams: Vec<Stream>,
    pub(super) ctx: Ctx,
    pub(super) seen_end: bool,
    pub(super) last_tick: u64,
    pub(super) damage: Option<String>,
    pub(super) skipped: Option<String>,
    pub(super) untraced: Vec<Untraced>,
}

/// The trace as it is being read.
struct Reading<'a> {
    opts: &'a Options,
    read: TraceRead,
    by_stream: HashMap<u32, usize>,
}

/// Reads the whole trace at `path`; `progress` is told the bytes read so far.
pub(super) fn read_trace(
    path: &Path,
    opts: &Options,
    progress: &mut impl FnMut(u64, u64),
) -> Result<TraceRead, AnalysisError> {
    let mut reader = ReadAhead::open(path, EventsOf::All)?;
    let mut reading = Reading {
        opts,
        read: TraceRead {
            meta: None,
            streams: Vec::new(),
            ctx: Ctx {
                weighting: SiteWeighting::None,
                sparse_pct: opts.sparse_pct,
                evaluation: opts.evaluation,
                aggregated: false,
            },
            seen_end: false,
            last_tick: 0,
            damage: None,
            skipped: None,
            untraced: Vec::new(),
        },
        by_stream: HashMap::new(),
    };
    let mut chunks = 0u64;
    while let Some(chunk) = reader.next_chunk() {
        chunks += 1;
        if chunks.is_multiple_of(64) {
            progress(reader.offset(), reader.file_bytes());
        }
        match chunk {
            AheadChunk::Events(h, events) => {
                let i = reading.index(h.stream);
                let read = &mut reading.read;
                read.last_tick = read.last_tick.max(h.last_tick);
                let s = &mut read.streams[i];
                if let Err(e) = reader.push_events(&mut s.merger, &h, events) {
                    (read.damage).get_or_insert(format!("thread {} of pid {}: {e}", h.tid, s.pid));
                }
                if !s.fork.awaiting_parent_heap {
                    reading.drain(i);
                }
            }
            AheadChunk::Other(chunk) => reading.take(chunk),
        }
    }
    progress(reader.offset(), reader.file_bytes());
    let mut read = reading.read;
    if let Some(d) = reader.damage() {
        read.damage = Some(format!("at byte {}: {}", d.offset, d.reason));
    }
    read.skipped = reader.skipped().note();
    read.finish_streams();
    Ok(read)
}

impl Reading<'_> {
    /// The index of `stream`'s process, added when it is new.
    fn index(&mut self, stream: u32) -> usize {
        let streams = &mut self.read.streams;
        let weighting = self.read.ctx.weighting;
        *self.by_stream.entry(stream).or_insert_with(|| {
            streams.push(Stream::new(stream, weighting));
            streams.len() - 1
        })
    }

    /// Takes process `i`'s merged calls so far, and hands its heap to the children
    /// waiting for it.
    fn drain(&mut self, i: usize) {
        let TraceRead { streams, ctx, .. } = &mut self.read;
        streams[i].drain(ctx);
        forks::hand_over(streams, i, &mut |s, inh| s.start_from(ctx, inh));
    }

    /// Takes one chunk other than a thread's events.
    fn take(&mut self, chunk: Chunk) {
        match chunk {
            Chunk::Meta(m) => self.take_meta(m),
            Chunk::Process(p) => self.take_process(p),
            // Handed on as `AheadChunk::Events`.
            Chunk::Events(..) => {}
            Chunk::Maps(m) => {
                let s = self.stream(m.stream);
                for mapping in m.mappings {
                    if mapping.perms.contains('x')
                        && !mapping.path.is_empty()
                        && !s.code_maps.contains(&mapping)
                    {
                        s.code_maps.push(mapping);
                    }
                }
            }
            Chunk::Rss(b) => {
                let i = self.index(b.stream);
                for smp in &b.samples {
                    self.read.last_tick = self.read.last_tick.max(smp.tick);
                }
                self.read.streams[i].rss.extend(b.samples);
            }
            Chunk::Rollup(r) => {
                (self.stream(r.stream).rollups).push((
                    r.tick,
                    lazy_free_bytes(&r),
                    RollupSharing::of(&r),
                ));
            }
            Chunk::Pagemap(p) => {
                let s = self.stream(p.stream);
                if sharing::known(&p) {
                    let owners = sharing::owners_of(&p, s.fork_residency.as_ref());
                    s.anonymous_sharing.push((p.tick, p.reason, owners));
                }
                // Snapshots are evaluated when the merged calls reach their tick.
                s.pending.push_back(p);
            }
            Chunk::ForkResidency(p) => {
                let i = self.index(p.stream);
                self.read.streams[i].fork_residency = Some(p);
            }
            Chunk::ProcessEnd(e) => {
                self.read.last_tick = self.read.last_tick.max(e.tick);
                self.stream(e.stream).end = Some(e);
            }
            Chunk::WaitStatus(w) => {
                if let Some(s) = self.read.streams.iter_mut().rev().find(|s| s.pid == w.pid) {
                    s.wait = Some(w);
                }
            }
            Chunk::Untraced(u) => {
                self.read.last_tick = self.read.last_tick.max(u.tick);
                self.read.untraced.push(u);
            }
            Chunk::End(e) => {
                self.read.seen_end = true;
                self.read.last_tick = self.read.last_tick.max(e.tick);
            }
            // Read by the GHC model (`ghc`).
            Chunk::GhcCensus(_) => {}
            Chunk::PymallocCensus(c) => {
                let s = self.stream(c.stream);
                match c.result {
                    Ok(pools) => s.pymalloc_pending.push_back((c.tick, pools)),
                    Err(note) => {
                        s.pymalloc_note.get_or_insert(note);
                    }
                }
            }
            Chunk::HeapCensus(c) => {
                let i = self.index(c.stream);
                let s = &mut self.read.streams[i];
                // Until its snapshot is evaluated, the first says whether the heap was read;
                // the first that read it, once one has (an early one may have been refused).
                if s.census
                    .as_ref()
                    .is_none_or(|k| k.result.is_err() && c.result.is_ok())
                {
                    s.census = Some(c.clone());
                }
                s.census_pending.push_back((c.tick, c));
            }
            Chunk::LinkedAllocator(l) => {
                let i = self.index(l.stream);
                self.read.streams[i].linked_allocator = Some(l);
            }
            Chunk::StartingHeap(h) => {
                let s = self.stream(h.stream);
                let bytes = s.merger.seed_starting_heap(h.tick, &h.blocks);
                s.heap_pages = None; // its blocks changed without a call
                s.live_bytes += bytes;
                s.usable_bytes += bytes;
                s.starting_heap = Some((h.blocks.len() as u64, h.blocks.iter().map(|b| b.1).sum()));
            }
            Chunk::SbclCensus(c) => {
                let s = self.stream(c.stream);
                match c.result {
                    Ok(heap) => s.sbcl_pending.push_back((c.tick, heap)),
                    Err(note) => {
                        s.sbcl_note.get_or_insert(note);
                    }
                }
            }
            Chunk::GoCensus(c) => {
                let s = self.stream(c.stream);
                match c.result {
                    Ok(heap) => s.go_pending.push_back((c.tick, heap)),
                    Err(note) => {
                        s.go_note.get_or_insert(note);
                    }
                }
            }
            Chunk::JvmCensus(c) => {
                let s = self.stream(c.stream);
                match c.result {
                    Ok(heap) => s.jvm_pending.push_back((c.tick, heap)),
                    Err(note) => {
                        s.jvm_note.get_or_insert(note);
                    }
                }
            }
            Chunk::V8Census(c) => {
                let s = self.stream(c.stream);
                match c.result {
                    Ok(heap) => s.v8_pending.push_back((c.tick, heap)),
                    Err(note) => {
                        s.v8_note.get_or_insert(note);
                    }
                }
            }
            Chunk::PythonSamples(c) => self.stream(c.stream).python.add(&c),
            Chunk::LispSamples(c) => self.stream(c.stream).lisp.add(&c),
        }
    }

    /// `stream`'s process, added when it is new.
    fn stream(&mut self, stream: u32) -> &mut Stream {
        let i = self.index(stream);
        &mut self.read.streams[i]
    }

    fn take_meta(&mut self, m: Meta) {
        self.read.ctx.aggregated = m.aggregated;
        self.read.ctx.weighting = match m.stacks {
            StackMode::All => SiteWeighting::Every,
            StackMode::Sampled => SiteWeighting::Sampled {
                mean_bytes: m.sample_bytes.max(1) as f64,
            },
            StackMode::None => SiteWeighting::None,
        };
        self.read.meta = Some(m);
    }

    fn take_process(&mut self, p: fragscope_trace::records::Process) {
        let i = self.index(p.stream);
        let s = &mut self.read.streams[i];
        s.fork.read(&p);
        s.pid = p.pid;
        s.ppid = p.ppid;
        s.argv = p.argv;
        s.attached = p.origin == fragscope_trace::Origin::Attached;
        if s.attached {
            s.merger.set_attached();
        }
        s.listed_only = self.opts.pid.is_some_and(|pid| pid != s.pid);
        let parent = (s.fork.parent_stream).and_then(|p| self.by_stream.get(&p).copied());
        let TraceRead { streams, ctx, .. } = &mut self.read;
        forks::child_came(streams, i, parent, &mut |s, inh| s.start_from(ctx, inh));
    }
}

impl TraceRead {
    /// Ends every process's merge and evaluates the snapshots its last calls reach.
    fn finish_streams(&mut self) {
        let Self { streams, ctx, .. } = self;
        // Parents before their children, which their last calls may seed.
        for i in 0..streams.len() {
            let s = &mut streams[i];
            // Not seeded by its parent, which comes before it: it goes on without.
            s.fork.awaiting_parent_heap = false;
            s.merger.finish();
            s.drain(ctx);
            forks::parent_ended(streams, i, &mut |s, inh| s.start_from(ctx, inh));
            let s = &mut streams[i];
            while !s.pending.is_empty() {
                s.evaluate_next(ctx, None);
            }
            s.rss.sort_by_key(|r| r.tick);
            s.rollups.sort_by_key(|r| r.0);
        }
    }

    /// The report's choice of process: the one asked for, or the largest heap.
    pub(super) fn chosen(&self, opts: &Options) -> Result<usize, AnalysisError> {
        let streams = &self.streams;
        Ok(match opts.pid {
            Some(pid) => streams
                .iter()
                .rposition(|s| s.pid == pid)
                .ok_or(AnalysisError::NoSuchPid(pid))?,
            // The largest heap: a command run through wrappers (sh -c, make, pyenv shims)
            // records them too, and they are not what the user asks about.
            None => (0..streams.len())
                .max_by_key(|&i| {
                    let s = &streams[i];
                    (
                        s.calls > 0,
                        s.peak_live.0,
                        s.rss.iter().map(|r| r.vm_rss_kib).max().unwrap_or(0),
                    )
                })
                .unwrap_or(0),
        })
    }

    /// Milliseconds per tick of the trace's clock.
    pub(super) fn tick_ms(&self) -> f64 {
        self.meta.as_ref().map_or(1.0, |m| m.tick_ns as f64 / 1e6)
    }

    /// The name of how the trace recorded stacks.
    pub(super) fn stacks(&self) -> &'static str {
        match self.ctx.weighting {
            SiteWeighting::Every => "every",
            SiteWeighting::Sampled { .. } => "sampled",
            SiteWeighting::None => "none",
        }
    }
}

fn lazy_free_bytes(r: &Rollup) -> u64 {
    r.get("LazyFree").unwrap_or(0) * 1024
}
