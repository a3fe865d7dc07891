//! Replay: the recorded call sequence of one process, played against allocator models.
//!
//! The recorded addresses only identify blocks: the merge's calls become a compact
//! sequence of [`Op`]s on dense block ids (an allocation, a free, the trace time moving
//! on), and each model places the blocks itself and says how many bytes it keeps
//! resident. The driver reads the trace once, feeds the ops in batches to every model,
//! samples each model's RSS every [`Options::sample_ms`] of trace time (at the same
//! moments for all models), and returns plain data ([`Replay`]). A forked process starts
//! from its parent's heap at the fork, as the report's analysis starts it: its inherited
//! blocks are allocated first, in the order the parent allocated them ([`Lineage`]).
//!
//! Models (one file each): [`ideal`] (the lower bound), [`sizeclass`] (segregated size
//! classes in spans), [`glibc`] (ptmalloc2-like bins, coalescing and top trimming),
//! [`compacting`] (size classes plus periodic packing) and [`mesh`] (size classes with
//! randomized placement and meshing).

pub mod compacting;
pub mod glibc;
pub mod ideal;
pub mod measured;
pub mod mesh;
pub mod sizeclass;

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Instant;

use fragscope_trace::ahead::{AheadChunk, EventsOf, ReadAhead};
use fragscope_trace::hash::AddrMap;
use fragscope_trace::merge::{LiveTable, Merged, Merger};
use fragscope_trace::reader::Chunk;
use fragscope_trace::records::Process;
use fragscope_trace::{TraceContents, TraceError};

use crate::forks::{Inherited, Lineage};
use serde::Serialize;

/// One step of a replay. Block ids are dense (a freed id is reused).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    Alloc {
        id: u32,
        tid: u32,
        size: u64,
    },
    Free {
        id: u32,
        tid: u32,
        size: u64,
    },
    /// The trace's time reached this millisecond: the ops that follow happen in it.
    Time {
        ms: u64,
    },
}

/// Where a model samples its RSS, and its peak.
#[derive(Debug, Clone, Default)]
pub struct Sampler {
    pub interval_ms: u64,
    pub next_ms: u64,
    pub now_ms: u64,
    /// RSS at each sample moment (every `interval_ms`, from 0).
    pub rss: Vec<u64>,
    pub peak: u64,
    pub peak_ms: u64,
}

impl Sampler {
    pub fn new(interval_ms: u64) -> Self {
        Self {
            interval_ms: interval_ms.max(1),
            ..Default::default()
        }
    }
}

/// An allocator model: places blocks by id and keeps its resident bytes.
pub trait Model {
    /// A block of `size` requested bytes is allocated by thread `tid`.
    fn alloc(&mut self, id: u32, size: u64, tid: u32);
    /// The block is freed by thread `tid` (`size`: its requested bytes).
    fn free(&mut self, id: u32, size: u64, tid: u32);
    /// Trace time moved on to `ms`: periodic work due by then (purging, packing, meshing).
    fn advance(&mut self, ms: u64);
    /// Resident heap bytes now.
    fn rss(&self) -> u64;
    /// What the model paid (bytes moved, meshes, ...), so far.
    fn costs(&self) -> Costs;
    /// The settings in use, by name.
    fn config(&self) -> BTreeMap<String, String>;

    /// A hint that `op` comes soon: a model may prefetch what it will touch. Called for
    /// each op at [`PREFETCH_AHEAD`] ops ahead with `stage` 0, then nearer with stages 1
    /// and 2 (by which time what stage 0 fetched is in cache, so the next level of
    /// pointers can be followed).
    #[inline]
    fn prefetch(&self, _op: &Op, _stage: u8) {}

    /// Plays `ops`, sampling RSS at every sample moment and following the peak.
    fn run(&mut self, ops: &[Op], s: &mut Sampler) {
        for (i, op) in ops.iter().enumerate() {
            for (stage, ahead) in PREFETCH_AHEAD.iter().enumerate() {
                if let Some(next) = ops.get(i + ahead) {
                    self.prefetch(next, stage as u8);
                }
            }
            match *op {
                Op::Alloc { id, tid, size } => {
                    self.alloc(id, size, tid);
                    let r = self.rss();
                    if r > s.peak {
                        s.peak = r;
                        s.peak_ms = s.now_ms;
                    }
                }
                Op::Free { id, tid, size } => self.free(id, size, tid),
                Op::Time { ms } => {
                    while s.next_ms <= ms {
                        self.advance(s.next_ms);
                        s.rss.push(self.rss());
                        s.next_ms += s.interval_ms;
                    }
                    self.advance(ms);
                    s.now_ms = ms;
                }
            }
        }
    }
}

/// How far ahead [`Model::prefetch`] is told of ops, per stage: replayed frees land at
/// random places of a large heap, and fetching their model state a few ops early hides
/// most of the cache misses.
pub const PREFETCH_AHEAD: [usize; 3] = [24, 12, 4];

/// Asks the CPU to bring the cache line at `p` in, without waiting for it.
#[inline(always)]
pub(crate) fn prefetch_line<T>(p: *const T) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: a prefetch never faults and reads nothing the program sees.
    #[allow(unused_unsafe)]
    unsafe {
        std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(p.cast::<i8>());
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = p;
}

/// One moment at which a model moved objects.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct MoveEvent {
    pub t_ms: f64,
    pub bytes: u64,
    pub objects: u64,
    /// Spans (or pages) that became free and were returned.
    pub spans_freed: u64,
}

/// What a model paid for its placement.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Costs {
    /// Bytes of live objects copied to another place (packing, meshing).
    pub bytes_moved: u64,
    pub objects_moved: u64,
    /// Pairs of spans meshed into one physical span.
    pub meshes: u64,
    /// Passes of periodic work (packing or meshing) that ran.
    pub passes: u64,
    /// The passes that moved something (the first [`MAX_EVENTS`]).
    pub events: Vec<MoveEvent>,
    /// Model-specific counts (spans created, pages purged, trims, mmaps, ...).
    pub counters: BTreeMap<String, u64>,
}

/// Move events kept per model.
pub const MAX_EVENTS: usize = 1000;

/// A model's name and settings, as given on the command line: `name` or
/// `name[key=value;key=value]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ModelSpec {
    pub label: String,
    pub kind: String,
    pub settings: Vec<(String, String)>,
}

pub const MODEL_NAMES: [&str; 5] = ["ideal", "sizeclass", "glibc", "compacting", "mesh"];

/// Splits `ideal,sizeclass[purge=decay:1000],mesh` into model specs (commas inside
/// brackets belong to the settings).
pub fn parse_models(spec: &str) -> Result<Vec<ModelSpec>, ReplayError> {
    let mut parts = Vec::new();
    let mut depth = 0i32;
    let mut cur = String::new();
    for ch in spec.chars() {
        match ch {
            '[' => depth += 1,
            ']' => depth -= 1,
            ',' if depth == 0 => {
                parts.push(std::mem::take(&mut cur));
                continue;
            }
            _ => {}
        }
        cur.push(ch);
    }
    parts.push(cur);
    let mut out = Vec::new();
    for p in parts {
        let p = p.trim();
        if p.is_empty() {
            continue;
        }
        let (kind, settings) = match p.split_once('[') {
            Some((k, rest)) => {
                let Some(inner) = rest.strip_suffix(']') else {
                    return Err(ReplayError::Config(format!(
                        "{p:?}: settings go in brackets, e.g. sizeclass[purge=decay:1000]"
                    )));
                };
                let mut kv = Vec::new();
                for s in inner.split([';', ',']).filter(|s| !s.trim().is_empty()) {
                    let Some((k, v)) = s.split_once('=') else {
                        return Err(ReplayError::Config(format!(
                            "{p:?}: {s:?} is not key=value"
                        )));
                    };
                    kv.push((k.trim().to_string(), v.trim().to_string()));
                }
                (k.trim(), kv)
            }
            None => (p, Vec::new()),
        };
        if !MODEL_NAMES.contains(&kind) {
            return Err(ReplayError::UnknownModel(kind.to_string()));
        }
        out.push(ModelSpec {
            label: p.to_string(),
            kind: kind.to_string(),
            settings,
        });
    }
    if out.is_empty() {
        return Err(ReplayError::Config(format!(
            "no model given: choose from {}",
            MODEL_NAMES.join(", ")
        )));
    }
    Ok(out)
}

/// Builds a model from its spec (`page`: the recorded machine's page size).
pub fn build(spec: &ModelSpec, page: u64) -> Result<Box<dyn Model>, ReplayError> {
    let bad = |e: String| ReplayError::Config(format!("{}: {e}", spec.label));
    Ok(match spec.kind.as_str() {
        "ideal" => Box::new(ideal::Ideal::new(
            ideal::IdealConfig::from_settings(&spec.settings, page).map_err(bad)?,
        )),
        "sizeclass" => Box::new(sizeclass::SizeClass::new(
            sizeclass::SizeClassConfig::from_settings(&spec.settings, page).map_err(bad)?,
        )),
        "glibc" => Box::new(glibc::Glibc::new(
            glibc::GlibcConfig::from_settings(&spec.settings, page).map_err(bad)?,
        )),
        "compacting" => Box::new(compacting::Compacting::new(
            compacting::CompactingConfig::from_settings(&spec.settings, page).map_err(bad)?,
        )),
        "mesh" => Box::new(mesh::Mesh::new(
            mesh::MeshConfig::from_settings(&spec.settings, page).map_err(bad)?,
        )),
        other => return Err(ReplayError::UnknownModel(other.to_string())),
    })
}

/// Parses a number setting, with a message naming the key.
pub(crate) fn parse_u64(key: &str, v: &str) -> Result<u64, String> {
    let v = v.replace('_', "");
    let (num, mul) = match v.to_ascii_lowercase() {
        s if s.ends_with("kib") || s.ends_with('k') => (
            s.trim_end_matches("kib").trim_end_matches('k').to_string(),
            1u64 << 10,
        ),
        s if s.ends_with("mib") || s.ends_with('m') => (
            s.trim_end_matches("mib").trim_end_matches('m').to_string(),
            1 << 20,
        ),
        s => (s, 1),
    };
    num.parse::<u64>()
        .ok()
        .and_then(|n| n.checked_mul(mul))
        .ok_or_else(|| format!("{key}={v}: expected a whole number (k/KiB, m/MiB allowed)"))
}

pub(crate) fn unknown_key(key: &str, known: &[&str]) -> String {
    format!("unknown setting {key:?}: known are {}", known.join(", "))
}

#[derive(Debug, Clone)]
pub struct Options {
    /// Replay this pid (its last image) instead of the process with the most calls.
    pub pid: Option<u32>,
    pub models: Vec<ModelSpec>,
    /// Trace time between RSS samples.
    pub sample_ms: u64,
}

impl Default for Options {
    fn default() -> Self {
        Self {
            pid: None,
            models: parse_models("ideal,sizeclass,glibc,compacting,mesh").unwrap_or_default(),
            sample_ms: 10,
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ReplayError {
    #[error(transparent)]
    Trace(#[from] TraceError),
    #[error("no process with pid {0} in this trace (see `fragscope info`)")]
    NoSuchPid(u32),
    #[error("the trace holds no allocation calls to replay")]
    Empty,
    #[error("unknown model {0:?}: choose from ideal, sizeclass, glibc, compacting, mesh")]
    UnknownModel(String),
    #[error("{0}")]
    Config(String),
}

/// The process's own RSS as recorded (VmRSS samples), beside the models.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Recorded {
    /// The allocator the program ran on, when it answered statistics.
    pub allocator: Option<String>,
    pub peak_rss: u64,
    pub peak_t_ms: f64,
    /// The first sample: the program before its heap grew (code, libraries, stacks).
    pub first_rss: u64,
    pub end_rss: u64,
}

/// One model's replay.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ModelResult {
    /// As given (`sizeclass[purge=decay:1000]`).
    pub label: String,
    pub model: String,
    pub config: BTreeMap<String, String>,
    pub peak_rss: u64,
    pub peak_t_ms: f64,
    /// After the last call.
    pub end_rss: u64,
    /// At [`Replay::held_t_ms`]: the last sample before the program let go of its data.
    pub held_rss: u64,
    /// RSS at each point of [`Replay::timeline`].
    pub rss: Vec<u64>,
    pub costs: Costs,
    /// Time this model took over all calls (one core), and calls per second.
    pub seconds: f64,
    pub calls_per_s: f64,
}

/// Sample moments (shared by all models): the largest value within each bucket when the
/// full series is longer than [`TIMELINE_POINTS`].
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Timeline {
    pub t_ms: Vec<f64>,
    /// Live (requested) bytes.
    pub live: Vec<u64>,
}

pub const TIMELINE_POINTS: usize = 600;

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Replay {
    pub trace: String,
    pub truncated: bool,
    pub damage: Option<String>,
    /// Chunks passed over because they did not decode (the rest was read).
    pub skipped: Option<String>,
    pub stream: u32,
    pub pid: u32,
    pub argv: Vec<String>,
    pub calls: u64,
    /// A forked process started from its parent's heap at the fork: its blocks and their
    /// requested bytes, allocated before its first call (null otherwise).
    pub inherited_blocks: Option<u64>,
    pub inherited_bytes: Option<u64>,
    pub duration_ms: f64,
    pub page_size: u64,
    pub sample_ms: u64,
    pub peak_live: u64,
    /// The sample just before the program's teardown (its last plateau, or the end if it
    /// exits holding its data): its resident state before it frees everything.
    pub held_t_ms: f64,
    pub held_live: u64,
    pub recorded: Recorded,
    pub timeline: Timeline,
    pub models: Vec<ModelResult>,
    /// Reading, decompressing and merging the trace, without the models.
    pub read_seconds: f64,
}

/// Ops per batch handed to each model.
const BATCH: usize = 1 << 16;

struct Track {
    spec: ModelSpec,
    model: Box<dyn Model>,
    sampler: Sampler,
    seconds: f64,
}

/// Turns merged calls into ops on dense ids.
#[derive(Default)]
struct Ids {
    ids: AddrMap<u32>,
    free: Vec<u32>,
    next: u32,
}

impl Ids {
    fn take(&mut self, addr: u64) -> u32 {
        let id = self.free.pop().unwrap_or_else(|| {
            self.next += 1;
            self.next - 1
        });
        self.ids.insert(addr, id);
        id
    }
    fn release(&mut self, addr: u64) -> Option<u32> {
        let id = self.ids.remove(&addr)?;
        self.free.push(id);
        Some(id)
    }
}

/// The models to replay against, built at the first events with the trace's page size.
fn build_tracks(opts: &Options, page: u64, sample_ms: u64) -> Result<Vec<Track>, ReplayError> {
    opts.models
        .iter()
        .map(|spec| {
            Ok(Track {
                spec: spec.clone(),
                model: build(spec, page)?,
                sampler: Sampler::new(sample_ms),
                seconds: 0.0,
            })
        })
        .collect()
}

/// Picks the stream to replay: the given pid's last image, or the most event data; with
/// the trace's processes.
fn choose_stream(
    contents: &TraceContents,
    pid: Option<u32>,
) -> Result<(u32, Vec<Process>), ReplayError> {
    let processes = contents.processes.clone();
    let stream = match pid {
        Some(pid) => processes
            .iter()
            .rev()
            .find(|p| p.pid == pid)
            .map(|p| p.stream)
            .ok_or(ReplayError::NoSuchPid(pid)),
        // The process with the most calls (bytes of records).
        None => (contents.streams.iter())
            .filter(|(_, s)| s.event_bytes > 0)
            .max_by_key(|(s, c)| (c.event_bytes, std::cmp::Reverse(**s)))
            .map(|(s, _)| *s)
            .ok_or(ReplayError::Empty),
    }?;
    Ok((stream, processes))
}

/// The merged calls of the replayed process, turned into ops and live-bytes samples.
struct Feed {
    /// The process's thread that a fork left: the inherited blocks are its.
    pid: u32,
    /// Its merge started (from its parent's heap, when it was forked).
    started: bool,
    ids: Ids,
    ops: Vec<Op>,
    tick_ms: f64,
    sample_ms: u64,
    live: u64,
    peak_live: u64,
    live_samples: Vec<u64>,
    next_sample: u64,
    now_ms: u64,
    calls: u64,
    /// Blocks allocated for a forked process before its first call: those it inherited.
    inherited_allocs: u64,
}

impl Feed {
    /// Moves the clock to `ms`, taking the live-bytes samples due before it.
    fn time(&mut self, ms: u64) {
        while self.next_sample <= ms {
            self.live_samples.push(self.live);
            self.next_sample += self.sample_ms;
        }
        self.now_ms = ms;
        self.ops.push(Op::Time { ms });
    }

    /// Takes the calls the process's merge can order now, once it has its parent's
    /// heap.
    fn take(&mut self, lineage: &mut Lineage, tracks: &mut [Track]) {
        let inherited = lineage.inherited();
        let Some(merger) = lineage.merger() else {
            return;
        };
        if !self.started {
            self.started = true;
            if let Some(inherited) = inherited {
                self.start_from(inherited, merger.live_blocks());
            }
        }
        self.drain(merger, tracks);
    }

    /// Allocates the blocks the process inherited at its fork, in the order its parent
    /// allocated them (by tick, then address), by the thread the fork left it.
    fn start_from(&mut self, inherited: Inherited, live: &LiveTable) {
        self.time((inherited.tick as f64 * self.tick_ms) as u64);
        let mut blocks: Vec<(u32, u64, u64)> =
            live.iter().map(|(a, b)| (b.born_tick, a, b.size)).collect();
        blocks.sort_unstable();
        for (_, addr, size) in blocks {
            let id = self.ids.take(addr);
            self.live += size;
            self.inherited_allocs += 1;
            self.ops.push(Op::Alloc {
                id,
                tid: self.pid,
                size,
            });
        }
        self.peak_live = self.peak_live.max(self.live);
    }

    fn drain(&mut self, merger: &mut Merger, tracks: &mut [Track]) {
        while let Some(m) = merger.pop() {
            let Merged::Call(c) = m else { continue };
            self.calls += 1;
            let ms = (c.tick as f64 * self.tick_ms) as u64;
            if ms > self.now_ms || self.calls == 1 {
                self.time(ms);
            }
            for &(addr, b) in merger.ended_by_last_pop() {
                if let Some(id) = self.ids.release(addr) {
                    self.live -= b.size;
                    self.ops.push(Op::Free {
                        id,
                        tid: c.tid,
                        size: b.size,
                    });
                }
            }
            if let Some(addr) = c.allocates() {
                let id = self.ids.take(addr);
                self.live += c.size;
                self.peak_live = self.peak_live.max(self.live);
                self.ops.push(Op::Alloc {
                    id,
                    tid: c.tid,
                    size: c.size,
                });
            }
            if self.ops.len() >= BATCH {
                self.flush(tracks);
            }
        }
    }

    /// Plays the ops so far through every model, timing each.
    fn flush(&mut self, tracks: &mut [Track]) {
        for t in tracks.iter_mut() {
            let clock = Instant::now();
            t.model.run(&self.ops, &mut t.sampler);
            t.seconds += clock.elapsed().as_secs_f64();
        }
        self.ops.clear();
    }
}

/// Replays the trace at `path` against the models of `opts`.
pub fn replay(path: &Path, opts: &Options) -> Result<Replay, ReplayError> {
    replay_with_progress(path, &TraceContents::read(path)?, opts, |_, _| {})
}

/// [`replay`] of the trace whose `contents` were read, telling `progress` the bytes read
/// so far and the file's size.
pub fn replay_with_progress(
    path: &Path,
    contents: &TraceContents,
    opts: &Options,
    mut progress: impl FnMut(u64, u64),
) -> Result<Replay, ReplayError> {
    let started = Instant::now();
    let (stream, processes) = choose_stream(contents, opts.pid)?;
    let mut lineage = Lineage::new(&processes, stream);
    let mut reader = ReadAhead::open(path, EventsOf::Streams(lineage.streams()))?;
    let sample_ms = opts.sample_ms.max(1);
    let mut tracks: Vec<Track> = Vec::new();
    let mut page = 4096u64;
    let mut feed = Feed {
        pid: (processes.iter().rev())
            .find(|p| p.stream == stream)
            .map_or(0, |p| p.pid),
        started: false,
        ids: Ids::default(),
        ops: Vec::with_capacity(BATCH + 8),
        tick_ms: 1.0,
        sample_ms,
        live: 0,
        peak_live: 0,
        live_samples: Vec::new(),
        next_sample: 0,
        now_ms: 0,
        calls: 0,
        inherited_allocs: 0,
    };
    let mut end_ms = 0u64;
    let mut pid = 0;
    let mut argv = Vec::new();
    let mut rss_samples: Vec<(u64, u64)> = Vec::new();
    let mut seen_end = false;
    let mut damage: Option<String> = None;
    // Models are built at the first events, with the page size of the Meta chunk (which
    // comes first); a trace without one gets 4 KiB pages.
    let mut built = false;
    let mut chunks = 0u64;

    while let Some(chunk) = reader.next_chunk() {
        chunks += 1;
        if chunks.is_multiple_of(16) {
            progress(reader.offset(), reader.file_bytes());
        }
        let chunk = match chunk {
            AheadChunk::Events(h, events) => {
                if !built {
                    tracks = build_tracks(opts, page, sample_ms)?;
                    built = true;
                }
                end_ms = end_ms.max((h.last_tick as f64 * feed.tick_ms) as u64);
                if let Err(e) = lineage.push_events(&reader, &h, events) {
                    damage.get_or_insert(format!("thread {}: {e}", h.tid));
                }
                feed.take(&mut lineage, &mut tracks);
                continue;
            }
            AheadChunk::Other(chunk) => chunk,
        };
        match chunk {
            Chunk::Meta(m) => {
                page = u64::from(m.page_size).max(512);
                feed.tick_ms = m.tick_ns as f64 / 1e6;
            }
            Chunk::Process(p) if p.stream == stream => {
                pid = p.pid;
                argv = p.argv;
            }
            Chunk::Rss(b) if b.stream == stream => {
                rss_samples.extend(b.samples.iter().map(|s| (s.tick, s.vm_rss_kib << 10)));
            }
            Chunk::ProcessEnd(e) if e.stream == stream => {
                end_ms = end_ms.max((e.tick as f64 * feed.tick_ms) as u64);
            }
            Chunk::End(_) => seen_end = true,
            _ => {}
        }
    }
    if let Some(d) = reader.damage() {
        damage = Some(format!("at byte {}: {}", d.offset, d.reason));
    }
    if !built {
        return Err(ReplayError::Empty);
    }
    lineage.finish();
    feed.take(&mut lineage, &mut tracks);
    if feed.calls == 0 {
        return Err(ReplayError::Empty);
    }
    // Time runs on to the end of the process (a program may sleep after its last call).
    let end_ms = end_ms.max(feed.now_ms);
    feed.time(end_ms);
    feed.flush(&mut tracks);

    // A final point at the end, after the last call.
    let mut t_full: Vec<f64> = (0..feed.live_samples.len())
        .map(|i| (i as u64 * sample_ms) as f64)
        .collect();
    let mut live_full = std::mem::take(&mut feed.live_samples);
    if t_full.last().is_none_or(|&t| t < end_ms as f64) {
        t_full.push(end_ms as f64);
        live_full.push(feed.live);
        for t in &mut tracks {
            let r = t.model.rss();
            t.sampler.rss.push(r);
        }
    }
    let peak_live = feed.peak_live;
    let held = held_sample(&live_full, peak_live);

    let recorded = recorded_rss(rss_samples, feed.tick_ms);

    let (buckets, t_ms, live_tl) = downsample(&t_full, &live_full);
    let model_seconds: f64 = tracks.iter().map(|t| t.seconds).sum();
    let calls = feed.calls;
    // What the models' time was spent on: the inherited blocks are placed as allocations.
    let ops = calls + feed.inherited_allocs;
    let models = model_results(tracks, &buckets, held, ops);
    Ok(Replay {
        trace: path.display().to_string(),
        truncated: !seen_end || damage.is_some(),
        damage,
        skipped: reader.skipped().note(),
        stream,
        pid,
        argv,
        calls,
        inherited_blocks: lineage.inherited().map(|h| h.blocks),
        inherited_bytes: lineage.inherited().map(|h| h.bytes),
        duration_ms: end_ms as f64,
        page_size: page,
        sample_ms,
        peak_live,
        held_t_ms: t_full[held],
        held_live: live_full[held],
        recorded,
        timeline: Timeline {
            t_ms,
            live: live_tl,
        },
        models,
        read_seconds: (started.elapsed().as_secs_f64() - model_seconds).max(0.0),
    })
}

/// What the recording measured of RSS, from its samples (tick, bytes).
fn recorded_rss(mut rss_samples: Vec<(u64, u64)>, tick_ms: f64) -> Recorded {
    let mut recorded = Recorded::default();
    rss_samples.sort_by_key(|s| s.0);
    if let Some(first) = rss_samples.first() {
        recorded.first_rss = first.1;
    }
    if let Some(last) = rss_samples.last() {
        recorded.end_rss = last.1;
    }
    if let Some(p) = rss_samples
        .iter()
        .max_by_key(|s| (s.1, std::cmp::Reverse(s.0)))
    {
        recorded.peak_rss = p.1;
        recorded.peak_t_ms = p.0 as f64 * tick_ms;
    }
    recorded
}

/// Each model's result: its peak, plateau (at sample `held`) and end, its resident heap
/// in `buckets` of samples, its costs; `ops` the operations it replayed.
fn model_results(
    tracks: Vec<Track>,
    buckets: &[std::ops::Range<usize>],
    held: usize,
    ops: u64,
) -> Vec<ModelResult> {
    tracks
        .into_iter()
        .map(|t| {
            let rss_full = &t.sampler.rss;
            ModelResult {
                label: t.spec.label.clone(),
                model: t.spec.kind.clone(),
                config: t.model.config(),
                peak_rss: t
                    .sampler
                    .peak
                    .max(rss_full.iter().copied().max().unwrap_or(0)),
                peak_t_ms: t.sampler.peak_ms as f64,
                end_rss: t.model.rss(),
                held_rss: rss_full.get(held).copied().unwrap_or(0),
                rss: buckets
                    .iter()
                    .map(|r| rss_full[r.clone()].iter().copied().max().unwrap_or(0))
                    .collect(),
                costs: t.model.costs(),
                seconds: t.seconds,
                calls_per_s: ops as f64 / t.seconds.max(1e-9),
            }
        })
        .collect()
}

/// The sample before teardown: from the last sample still holding at least 1% of the
/// peak live bytes, back over every sample where live bytes kept falling (a teardown
/// that frees survivors over several samples) to the last that was not above the next.
fn held_sample(live: &[u64], peak_live: u64) -> usize {
    let Some(mut i) = (0..live.len())
        .rev()
        .find(|&i| live[i] > 0 && live[i] * 100 >= peak_live)
    else {
        return live.len().saturating_sub(1);
    };
    // A program that exits holding its data has no teardown.
    if i + 1 == live.len() {
        return i;
    }
    while i > 0 && live[i - 1] > live[i] {
        i -= 1;
    }
    i
}

/// Buckets of at most [`TIMELINE_POINTS`] ranges over the full series; each point is the
/// bucket's first time and its largest value.
fn downsample(t: &[f64], v: &[u64]) -> (Vec<std::ops::Range<usize>>, Vec<f64>, Vec<u64>) {
    let n = t.len();
    let per = n.div_ceil(TIMELINE_POINTS).max(1);
    let buckets: Vec<std::ops::Range<usize>> =
        (0..n).step_by(per).map(|s| s..(s + per).min(n)).collect();
    let ts = buckets.iter().map(|r| t[r.start]).collect();
    let vs = buckets
        .iter()
        .map(|r| v[r.clone()].iter().copied().max().unwrap_or(0))
        .collect();
    (buckets, ts, vs)
}

#[cfg(test)]
pub(crate) mod testing {
    use super::*;

    /// Plays (tick ms, alloc size or free of an earlier op's id) through a model; returns
    /// the sampler.
    pub fn play(model: &mut dyn Model, ops: &[Op]) -> Sampler {
        let mut s = Sampler::new(10);
        model.run(ops, &mut s);
        s
    }

    /// n allocations of `size` at time 0, ids 0..n.
    pub fn allocs(n: u32, size: u64) -> Vec<Op> {
        let mut v = vec![Op::Time { ms: 0 }];
        v.extend((0..n).map(|id| Op::Alloc { id, tid: 1, size }));
        v
    }

    pub fn free(id: u32, size: u64) -> Op {
        Op::Free { id, tid: 1, size }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn model_specs_parse_with_settings() {
        let m = parse_models("ideal, sizeclass[purge=decay:1000;classes=tcmalloc],mesh").unwrap();
        assert_eq!(m.len(), 3);
        assert_eq!(m[1].kind, "sizeclass");
        assert_eq!(
            m[1].settings,
            vec![
                ("purge".to_string(), "decay:1000".to_string()),
                ("classes".to_string(), "tcmalloc".to_string())
            ]
        );
        assert!(matches!(
            parse_models("ideal,jemalloc"),
            Err(ReplayError::UnknownModel(n)) if n == "jemalloc"
        ));
        assert!(parse_models("sizeclass[purge]").is_err());
        assert!(parse_models("sizeclass[purge=x").is_err());
        assert!(parse_models("").is_err());
        let bad = parse_models("sizeclass[colour=red]").unwrap();
        let err = build(&bad[0], 4096).err().unwrap().to_string();
        assert!(err.contains("colour"), "{err}");
    }

    #[test]
    fn held_is_the_plateau_before_teardown() {
        // Plateau at 50 after a peak of 100, torn down over three samples.
        assert_eq!(held_sample(&[0, 100, 50, 50, 50, 30, 10, 0], 100), 4);
        // Exits holding data: the last sample.
        assert_eq!(held_sample(&[0, 100, 50, 20], 100), 3);
        // Freed gradually from the peak: the peak.
        assert_eq!(held_sample(&[0, 60, 100, 70, 40, 0], 100), 2);
        assert_eq!(held_sample(&[0, 0], 0), 1);
    }

    #[test]
    fn numbers_take_binary_suffixes() {
        assert_eq!(parse_u64("k", "128k").unwrap(), 128 << 10);
        assert_eq!(parse_u64("k", "2MiB").unwrap(), 2 << 20);
        assert_eq!(parse_u64("k", "1_000").unwrap(), 1000);
        assert!(parse_u64("k", "lots").is_err());
    }
}
