//! A trace's vital statistics without modelling the heap: what `fragscope info` prints.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::Path;

use crate::format::event::{ChunkDecoder, Func, Record, StreamTables};
use crate::format::reader::{Chunk, TraceReader};
use crate::format::records::{EventsHeader, Meta, Origin, ProcessEnd, Untraced, WaitStatus};
use crate::format::TraceError;

/// One process image (exec starts another).
#[derive(Debug, Clone, Default)]
pub struct ProcessSummary {
    pub stream: u32,
    pub pid: u32,
    pub ppid: u32,
    pub forked: bool,
    pub parent_stream: Option<u32>,
    pub argv: Vec<String>,
    pub exe: String,
    pub threads: BTreeSet<u32>,
    pub calls: BTreeMap<Func, u64>,
    /// An aggregated recording's calls in all, those it left out included (0: not one).
    pub aggregated_calls: u64,
    /// Blocks an aggregated recording left out (allocated and freed between snapshots).
    pub summed_allocations: u64,
    pub events: u64,
    pub event_bytes: u64,
    /// Thread buffers stored, and how many of them in the packed form.
    pub buffers: u64,
    pub packed_buffers: u64,
    /// Times packing resumed after buffers stored raw (packed buffers that start from
    /// empty tables of blocks).
    pub packing_resumed: u64,
    pub stacks: u64,
    pub rss_samples: u64,
    pub peak_rss_kib: u64,
    pub snapshots: u64,
    /// GHC block censuses taken, and the note of the first that could not be.
    pub ghc_censuses: u64,
    pub ghc_census_note: Option<String>,
    /// pymalloc censuses taken (CPython), and the note of the first that could not be.
    pub pymalloc_censuses: u64,
    pub pymalloc_census_note: Option<String>,
    /// CPython objects sampled with their Python stacks.
    pub python_samples: u64,
    /// SBCL allocation regions sampled (chunk 22).
    pub lisp_samples: u64,
    /// SBCL censuses taken, and the note of the first that could not be.
    pub sbcl_censuses: u64,
    pub sbcl_census_note: Option<String>,
    pub go_censuses: u64,
    pub go_census_note: Option<String>,
    pub jvm_censuses: u64,
    pub jvm_census_note: Option<String>,
    pub v8_censuses: u64,
    pub v8_census_note: Option<String>,
    /// The heap census of `fragscope snapshot`, if this is one.
    pub heap_census: Option<crate::format::heap_census::HeapCensus>,
    /// An allocator linked into its program, whose calls are not traced.
    pub linked_allocator: Option<crate::format::heap_census::LinkedAllocator>,
    /// Attached to by `record -p`: the blocks it held then (blocks, bytes), when read.
    pub attached: bool,
    pub starting_heap: Option<(u64, u64)>,
    pub end: Option<ProcessEnd>,
    pub wait: Option<WaitStatus>,
    /// Buffers missing from a thread's sequence, and events a signal handler dropped.
    pub lost_buffers: u64,
    pub lost_events: u64,
    pub own_memory_bytes: u64,
    pub allocator: Option<&'static str>,
}

impl ProcessSummary {
    /// "exited 0", "killed by signal 9", ...
    pub fn describe_end(&self) -> String {
        if let Some(w) = self.wait {
            if let Some(sig) = w.signal {
                return format!("killed by signal {sig}");
            }
            if let Some(code) = w.exit_code {
                return format!("exited {code}");
            }
        }
        match &self.end {
            Some(end) => end.describe(),
            None => "still running when the trace ends".into(),
        }
    }
}

#[derive(Debug, Clone, Default)]
pub struct TraceSummary {
    pub meta: Option<Meta>,
    pub processes: Vec<ProcessSummary>,
    pub events: u64,
    pub file_bytes: u64,
    pub duration_ticks: u64,
    /// The trace lacks its end marker or has damage: the recording was cut short.
    pub truncated: bool,
    pub damage: Option<String>,
    /// Chunks passed over because they did not decode (the rest was read).
    pub skipped: Option<String>,
    /// Process images the program ran that could not be traced.
    pub untraced: Vec<Untraced>,
}

impl TraceSummary {
    pub fn bytes_per_event(&self) -> f64 {
        if self.events == 0 {
            0.0
        } else {
            self.file_bytes as f64 / self.events as f64
        }
    }
}

/// Reads the whole trace once. `progress` is told the bytes read so far.
pub fn summarize(
    path: &Path,
    mut progress: impl FnMut(u64, u64),
) -> Result<TraceSummary, TraceError> {
    let mut reader = TraceReader::open(path)?;
    let mut s = Summarizer::default();
    s.sum.file_bytes = reader.file_bytes();
    let mut chunks = 0u64;
    while let Some(chunk) = reader.next_chunk() {
        chunks += 1;
        if chunks.is_multiple_of(256) {
            progress(reader.offset(), s.sum.file_bytes);
        }
        s.add(chunk);
    }
    let mut sum = s.sum;
    progress(reader.offset(), sum.file_bytes);
    if let Some(d) = reader.damage() {
        sum.damage = Some(format!("at byte {}: {}", d.offset, d.reason));
    }
    sum.truncated = !s.seen_end || reader.damage().is_some();
    sum.skipped = reader.skipped().note();
    sum.events = sum.processes.iter().map(|p| p.events).sum();
    Ok(sum)
}

/// The summary so far, and what reading the chunks in file order keeps beside it.
#[derive(Default)]
struct Summarizer {
    sum: TraceSummary,
    seen_end: bool,
    /// Each stream's tables of blocks, which its event records need in file order.
    tables: HashMap<u32, StreamTables>,
    /// Each thread's next buffer sequence number: a gap is buffers lost.
    next_seq: HashMap<(u32, u32), u32>,
    /// Where each stream's summary is in `sum.processes`.
    by_stream: HashMap<u32, usize>,
}

impl Summarizer {
    /// The index of `stream`'s summary, added when the stream first appears.
    fn index(&mut self, stream: u32) -> usize {
        let processes = &mut self.sum.processes;
        *self.by_stream.entry(stream).or_insert_with(|| {
            processes.push(ProcessSummary {
                stream,
                ..Default::default()
            });
            processes.len() - 1
        })
    }

    fn process(&mut self, stream: u32) -> &mut ProcessSummary {
        let i = self.index(stream);
        &mut self.sum.processes[i]
    }

    fn add(&mut self, chunk: Chunk) {
        match chunk {
            Chunk::Meta(m) => self.sum.meta = Some(m),
            Chunk::Process(p) => {
                let ps = self.process(p.stream);
                ps.pid = p.pid;
                ps.ppid = p.ppid;
                ps.forked = p.origin == Origin::Forked;
                ps.attached = p.origin == Origin::Attached;
                ps.parent_stream = p.parent_stream;
                ps.argv = p.argv;
                ps.exe = p.exe;
            }
            Chunk::Events(h, records) => self.add_events(&h, &records),
            Chunk::Rss(b) => {
                let ps = self.process(b.stream);
                ps.rss_samples += b.samples.len() as u64;
                for s in &b.samples {
                    ps.peak_rss_kib = ps.peak_rss_kib.max(s.vm_rss_kib);
                }
                let last = b.samples.iter().map(|s| s.tick).max().unwrap_or(0);
                self.sum.duration_ticks = self.sum.duration_ticks.max(last);
            }
            Chunk::Pagemap(p) => self.process(p.stream).snapshots += 1,
            Chunk::ProcessEnd(e) => {
                self.process(e.stream).end = Some(e);
                self.sum.duration_ticks = self.sum.duration_ticks.max(e.tick);
            }
            Chunk::WaitStatus(w) => {
                // The last image of that pid is the one that exited.
                let image = self.sum.processes.iter_mut().rev().find(|p| p.pid == w.pid);
                if let Some(ps) = image {
                    ps.wait = Some(w);
                }
            }
            Chunk::End(e) => {
                self.seen_end = true;
                self.sum.duration_ticks = self.sum.duration_ticks.max(e.tick);
            }
            Chunk::GhcCensus(c) => {
                let ps = self.process(c.stream);
                count_census(c.result, &mut ps.ghc_censuses, &mut ps.ghc_census_note);
            }
            Chunk::PymallocCensus(c) => {
                let ps = self.process(c.stream);
                count_census(
                    c.result,
                    &mut ps.pymalloc_censuses,
                    &mut ps.pymalloc_census_note,
                );
            }
            Chunk::SbclCensus(c) => {
                let ps = self.process(c.stream);
                count_census(c.result, &mut ps.sbcl_censuses, &mut ps.sbcl_census_note);
            }
            Chunk::GoCensus(c) => {
                let ps = self.process(c.stream);
                count_census(c.result, &mut ps.go_censuses, &mut ps.go_census_note);
            }
            Chunk::JvmCensus(c) => {
                let ps = self.process(c.stream);
                count_census(c.result, &mut ps.jvm_censuses, &mut ps.jvm_census_note);
            }
            Chunk::V8Census(c) => {
                let ps = self.process(c.stream);
                count_census(c.result, &mut ps.v8_censuses, &mut ps.v8_census_note);
            }
            Chunk::PythonSamples(c) => self.process(c.stream).python_samples += samples_of(&c),
            Chunk::LispSamples(c) => self.process(c.stream).lisp_samples += samples_of(&c),
            Chunk::HeapCensus(c) => {
                let stream = c.stream;
                self.process(stream).heap_census = Some(c);
            }
            Chunk::LinkedAllocator(l) => {
                let stream = l.stream;
                self.process(stream).linked_allocator = Some(l);
            }
            Chunk::StartingHeap(h) => {
                let bytes = h.blocks.iter().map(|b| b.1).sum();
                self.process(h.stream).starting_heap = Some((h.blocks.len() as u64, bytes));
            }
            Chunk::Untraced(u) => self.sum.untraced.push(u),
            Chunk::Maps(_) | Chunk::Rollup(_) | Chunk::ForkResidency(_) => {}
        }
    }

    /// Counts a thread buffer's calls and what else its records say. A record that does
    /// not decode ends the buffer; the first such is the summary's damage.
    fn add_events(&mut self, h: &EventsHeader, records: &[u8]) {
        let i = self.index(h.stream);
        self.sum.duration_ticks = self.sum.duration_ticks.max(h.last_tick);
        let ps = &mut self.sum.processes[i];
        ps.threads.insert(h.tid);
        ps.event_bytes += records.len() as u64;
        ps.buffers += 1;
        ps.packed_buffers += u64::from(h.packed);
        ps.packing_resumed += u64::from(h.packed && h.tables_reset);
        let expected = self.next_seq.entry((h.stream, h.tid)).or_insert(0);
        ps.lost_buffers += u64::from(h.seq.saturating_sub(*expected));
        *expected = h.seq + 1;
        let table = self.tables.entry(h.stream).or_default();
        let mut d = ChunkDecoder::new(records, h, table);
        loop {
            match d.next_record() {
                Ok(Some(Record::Alloc { func, .. })) => {
                    *ps.calls.entry(func).or_default() += 1;
                    ps.events += 1;
                }
                Ok(Some(Record::Free { .. })) => {
                    *ps.calls.entry(Func::Free).or_default() += 1;
                    ps.events += 1;
                }
                Ok(Some(Record::StackDef { .. })) => ps.stacks += 1,
                Ok(Some(Record::Lost { count })) => ps.lost_events += count,
                Ok(Some(Record::OwnMemory { bytes })) => {
                    ps.own_memory_bytes = ps.own_memory_bytes.max(bytes)
                }
                Ok(Some(Record::Stats { source, .. })) => ps.allocator = Some(source.name()),
                Ok(Some(Record::Summed { allocations, .. })) => {
                    ps.summed_allocations += allocations
                }
                Ok(Some(Record::Live { calls, .. })) => ps.aggregated_calls += calls,
                Ok(Some(
                    Record::Tick { .. }
                    | Record::Usable { .. }
                    | Record::Joined { .. }
                    | Record::Forked { .. }
                    | Record::Order { .. }
                    | Record::Released { .. },
                )) => {}
                Ok(None) => break,
                Err(e) => {
                    let at = format!("thread {} of pid {}: {e}", h.tid, ps.pid);
                    self.sum.damage.get_or_insert(at);
                    break;
                }
            }
        }
    }
}

/// A runtime's census: one more taken, or the note of the first that could not be.
fn count_census<T>(result: Result<T, String>, taken: &mut u64, note: &mut Option<String>) {
    match result {
        Ok(_) => *taken += 1,
        Err(n) => {
            note.get_or_insert(n);
        }
    }
}

/// The samples (not frame or stack definitions) of a runtime's chunk.
fn samples_of(c: &crate::format::runtime_samples::RuntimeSamples) -> u64 {
    use crate::format::runtime_samples::SampleRecord;
    c.records()
        .0
        .iter()
        .filter(|r| {
            matches!(
                r,
                SampleRecord::Alloc { .. } | SampleRecord::LispAlloc { .. }
            )
        })
        .count() as u64
}
