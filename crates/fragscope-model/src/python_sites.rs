//! Who pins pymalloc's arenas: the Python lines whose sampled objects survive in them.
//!
//! The interposer samples CPython's object allocations (chunk 18) with their Python
//! stacks, and records the frees of the sampled objects. At the pymalloc census that
//! wastes the most, the samples still live are placed in their pools and arenas; each
//! arena's free space (what its survivors keep from being returned) is shared among the
//! sites of the samples in it by their estimated bytes. Arenas with no sample in them
//! are counted apart: a site that pins many arenas with one object each is found only as
//! often as sampling meets it.

use std::collections::{BTreeMap, HashMap};

use fragscope_trace::records::PymallocPools;
use fragscope_trace::runtime_samples::{Definitions, RuntimeSamples, SampleRecord};
use serde::Serialize;

use crate::heap::SiteWeighting;
use crate::pymalloc::ArenaAcc;

/// Sites listed in the report.
const SITES_LISTED: usize = 10;
/// Callers shown under a site's line.
const CALLERS_SHOWN: usize = 4;

/// One process's samples, in the order of its calls.
#[derive(Default, Clone)]
pub struct PythonLog {
    mean_bytes: u64,
    defined: Definitions,
    events: Vec<Event>,
    /// Why some records could not be read.
    pub problem: Option<String>,
    /// Why the interposer sampled none of this process's objects, as it said.
    pub unsampled: Option<String>,
}

#[derive(Clone, Copy)]
enum Event {
    Alloc {
        tick: u64,
        address: u64,
        size: u64,
        stack: u32,
    },
    Free {
        tick: u64,
        address: u64,
    },
}

impl PythonLog {
    pub fn add(&mut self, chunk: &RuntimeSamples) {
        // A buffer that only says why nothing is sampled carries no mean.
        if chunk.mean_bytes > 0 || self.mean_bytes == 0 {
            self.mean_bytes = chunk.mean_bytes.max(1);
        }
        let (records, problem) = chunk.records();
        if let Some(p) = problem {
            self.problem
                .get_or_insert(format!("CPython samples cut short: {p}"));
        }
        for r in records.into_iter().filter_map(|r| self.defined.take(r)) {
            match r {
                SampleRecord::Alloc {
                    tick,
                    address,
                    size,
                    stack,
                } => self.events.push(Event::Alloc {
                    tick,
                    address,
                    size,
                    stack,
                }),
                SampleRecord::Free { tick, address } => {
                    self.events.push(Event::Free { tick, address })
                }
                SampleRecord::Unsampled { reason } => {
                    self.unsampled.get_or_insert(reason);
                }
                _ => {}
            }
        }
    }

    pub fn is_empty(&self) -> bool {
        self.events.is_empty()
    }

    /// The log of a process forked from the one of `parent` at `tick`: its parent's
    /// samples up to the fork (the objects it inherited, whose lines its own records
    /// name only by their ids), then its own.
    pub fn forked_from(&self, parent: &PythonLog, tick: u64) -> PythonLog {
        let mut defined = parent.defined.clone();
        defined.frames.extend(self.defined.frames.clone());
        defined.stacks.extend(self.defined.stacks.clone());
        let inherited = parent.events.iter().filter(|e| e.tick() <= tick);
        PythonLog {
            mean_bytes: if self.mean_bytes > 0 {
                self.mean_bytes
            } else {
                parent.mean_bytes
            },
            defined,
            events: inherited.chain(&self.events).copied().collect(),
            problem: self.problem.clone().or_else(|| parent.problem.clone()),
            unsampled: self.unsampled.clone(),
        }
    }

    /// "file:line (function)" of a frame id.
    fn frame_name(&self, id: u32) -> String {
        match self.defined.frames.get(&id) {
            Some(f) => format!("{}:{} ({})", f.file, f.line, f.function),
            None => "?".into(),
        }
    }

    /// The estimated number of objects one sample of `size` bytes stands for (the
    /// native sites' weighting, with this process's Python mean).
    fn weight(&self, size: u64) -> f64 {
        SiteWeighting::Sampled {
            mean_bytes: self.mean_bytes as f64,
        }
        .weight(size)
    }
}

impl Event {
    fn tick(&self) -> u64 {
        match *self {
            Event::Alloc { tick, .. } | Event::Free { tick, .. } => tick,
        }
    }
}

/// Where the pools of the census the report explains are, and what each arena holds.
pub struct PoolIndex {
    pub tick: u64,
    pub waste: u64,
    /// A forked process: bytes of arena pages copied since the fork.
    pub copied: u64,
    pool_size: u64,
    pool_arena: HashMap<u64, u32>,
    arenas: BTreeMap<u32, ArenaAcc>,
}

impl PoolIndex {
    pub fn new(
        tick: u64,
        waste: u64,
        pools: &PymallocPools,
        arenas: BTreeMap<u32, ArenaAcc>,
    ) -> Self {
        Self {
            tick,
            waste,
            copied: arenas.values().map(|a| a.copied).sum(),
            pool_size: u64::from(pools.pool_size.max(1)),
            pool_arena: pools.pools.iter().map(|p| (p.address, p.arena)).collect(),
            arenas,
        }
    }
}

/// A Python line whose objects were sampled.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PythonSite {
    /// "file:line (function)" of the frame that allocated.
    pub location: String,
    /// Its callers, innermost first (of the stack sampled most often at this line).
    pub callers: Vec<String>,
    /// Estimated bytes allocated here over the run (objects of 512 bytes or less).
    pub allocated_bytes: f64,
    /// Estimated bytes of its objects live at the census.
    pub live_bytes: f64,
    /// Arenas in use holding a sampled object of it.
    pub arenas: u64,
    /// Its share of those arenas' free space (by its estimated bytes among theirs).
    pub held_bytes: f64,
    /// A forked process: its share, the same way, of the arenas' pages it inherited
    /// shared with its parent and has copied since.
    pub copied_bytes: f64,
}

/// Python call sites of a CPython process (see the module's comment).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PythonSites {
    /// Mean bytes between samples.
    pub mean_bytes: u64,
    /// Objects sampled over the run, and those live at the census.
    pub samples: u64,
    pub live_samples: u64,
    /// Arenas in use at the census, and those with a sampled object in them.
    pub arenas_in_use: u64,
    pub arenas_sampled: u64,
    /// Free space of arenas in use with no sampled object in them.
    pub held_unattributed: u64,
    /// A forked process: copied pages of arenas in use with no sampled object in them.
    pub copied_unattributed: u64,
    /// By bytes held, then by bytes allocated.
    pub sites: Vec<PythonSite>,
    pub problem: Option<String>,
    /// Every sampled stack, for views that draw whole stacks (flame graphs, pprof); left
    /// out of the JSON, whose size it would make grow with the program's call paths.
    #[serde(skip)]
    pub stacks: Vec<PythonStack>,
}

/// One Python frame of a sampled stack.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
pub struct PythonFrame {
    pub file: String,
    pub line: u32,
    pub function: String,
}

impl PythonFrame {
    /// "file:line (function)", as sites name their lines.
    pub fn name(&self) -> String {
        format!("{}:{} ({})", self.file, self.line, self.function)
    }
}

/// A sampled Python stack (stacks whose frames read alike are one) and the estimated
/// figures of its objects, as [`PythonSite`]'s: a site's figures are the sums of the
/// stacks whose innermost frame is its line.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PythonStack {
    /// Innermost first; empty when no Python frame ran.
    pub frames: Vec<PythonFrame>,
    /// Estimated objects and bytes allocated over the run.
    pub allocations: f64,
    pub allocated_bytes: f64,
    /// Estimated objects and bytes live at the census, in its pools.
    pub live_objects: f64,
    pub live_bytes: f64,
    /// Its share of the free space of the arenas its live objects are in.
    pub held_bytes: f64,
}

#[derive(Default)]
struct StackAcc {
    allocations: f64,
    allocated: f64,
    live_objects: f64,
    live: f64,
    held: f64,
}

#[derive(Default)]
struct SiteAcc {
    allocated: f64,
    live: f64,
    held: f64,
    copied: f64,
    arenas: u64,
    stacks: HashMap<u32, u64>,
}

/// The samples of `log` live at `until`: address -> (size, stack).
fn live_at(log: &PythonLog, until: u64) -> BTreeMap<u64, (u64, u32)> {
    let mut live = BTreeMap::new();
    for e in log.events.iter().filter(|e| e.tick() <= until) {
        match *e {
            Event::Alloc {
                address,
                size,
                stack,
                ..
            } => {
                live.insert(address, (size, stack));
            }
            Event::Free { address, .. } => {
                live.remove(&address);
            }
        }
    }
    live
}

/// The sites of `log`, placed in the census `index` describes; a forked process's copies
/// shared among the sites of the census `copies` describes (the one with the most).
pub fn sites(
    log: &PythonLog,
    index: Option<&PoolIndex>,
    copies: Option<&PoolIndex>,
) -> PythonSites {
    // By the allocating line's name: one line has a frame id per instruction.
    let mut by_line: HashMap<String, SiteAcc> = HashMap::new();
    let mut names: HashMap<u32, String> = HashMap::new();
    let mut site_of = |stack: u32| -> String {
        let frame = log
            .defined
            .stacks
            .get(&stack)
            .and_then(|f| f.first().copied());
        names
            .entry(frame.unwrap_or(0))
            .or_insert_with(|| match frame {
                Some(id) => log.frame_name(id),
                None => "(no Python frame)".into(),
            })
            .clone()
    };
    let live = live_at(log, index.map_or(u64::MAX, |i| i.tick));
    let mut samples = 0;
    // In order of id: the stacks of one line are summed into one, in this order.
    let mut by_stack: BTreeMap<u32, StackAcc> = BTreeMap::new();
    for e in &log.events {
        match *e {
            Event::Alloc { size, stack, .. } => {
                samples += 1;
                let acc = by_line.entry(site_of(stack)).or_default();
                acc.allocated += log.weight(size) * size as f64;
                *acc.stacks.entry(stack).or_default() += 1;
                let st = by_stack.entry(stack).or_default();
                st.allocations += log.weight(size);
                st.allocated += log.weight(size) * size as f64;
            }
            Event::Free { .. } => {}
        }
    }
    let mut result = PythonSites {
        mean_bytes: log.mean_bytes,
        samples,
        live_samples: live.len() as u64,
        arenas_in_use: 0,
        arenas_sampled: 0,
        held_unattributed: 0,
        copied_unattributed: 0,
        sites: Vec::new(),
        problem: log.problem.clone(),
        stacks: Vec::new(),
    };
    if let Some(index) = index {
        // Each arena's sampled bytes by site.
        let mut in_arena: BTreeMap<u32, BTreeMap<String, f64>> = BTreeMap::new();
        let mut stacks_in_arena: BTreeMap<u32, BTreeMap<u32, f64>> = BTreeMap::new();
        for (&address, &(size, stack)) in &live {
            let pool = address - address % index.pool_size;
            let Some(&arena) = index.pool_arena.get(&pool) else {
                continue;
            };
            let bytes = log.weight(size) * size as f64;
            let site = site_of(stack);
            by_line.entry(site.clone()).or_default().live += bytes;
            *in_arena.entry(arena).or_default().entry(site).or_default() += bytes;
            let st = by_stack.entry(stack).or_default();
            st.live_objects += log.weight(size);
            st.live += bytes;
            *stacks_in_arena
                .entry(arena)
                .or_default()
                .entry(stack)
                .or_default() += bytes;
        }
        for (arena, acc) in &index.arenas {
            if acc.pools_in_use == 0 {
                continue;
            }
            result.arenas_in_use += 1;
            let Some(sites) = in_arena.get(arena) else {
                result.held_unattributed += acc.held();
                continue;
            };
            result.arenas_sampled += 1;
            let total: f64 = sites.values().sum();
            for (site, &bytes) in sites {
                let s = by_line.entry(site.clone()).or_default();
                s.arenas += 1;
                s.held += acc.held() as f64 * bytes / total.max(1.0);
            }
            for (stack, &bytes) in stacks_in_arena.get(arena).into_iter().flatten() {
                by_stack.entry(*stack).or_default().held +=
                    acc.held() as f64 * bytes / total.max(1.0);
            }
        }
    }
    if let Some(copies) = copies {
        charge_copied(log, copies, &mut site_of, &mut by_line, &mut result);
    }
    result.sites = listed_sites(log, by_line);
    result.stacks = stacks_of(log, by_stack);
    result
}

/// Shares each copied arena's pages (a forked process's copies, by the census `copies`
/// describes) among the sites of the samples in it then.
fn charge_copied(
    log: &PythonLog,
    copies: &PoolIndex,
    site_of: &mut impl FnMut(u32) -> String,
    by_line: &mut HashMap<String, SiteAcc>,
    result: &mut PythonSites,
) {
    // Each copied arena's pages go to the sites of the samples in it then.
    let mut in_arena: BTreeMap<u32, BTreeMap<String, f64>> = BTreeMap::new();
    for (&address, &(size, stack)) in &live_at(log, copies.tick) {
        let pool = address - address % copies.pool_size;
        if let Some(&arena) = copies.pool_arena.get(&pool) {
            let bytes = log.weight(size) * size as f64;
            *in_arena
                .entry(arena)
                .or_default()
                .entry(site_of(stack))
                .or_default() += bytes;
        }
    }
    for (arena, acc) in copies.arenas.iter().filter(|(_, a)| a.copied > 0) {
        let Some(sites) = in_arena.get(arena) else {
            result.copied_unattributed += acc.copied;
            continue;
        };
        let total: f64 = sites.values().sum();
        for (site, &bytes) in sites {
            by_line.entry(site.clone()).or_default().copied +=
                acc.copied as f64 * bytes / total.max(1.0);
        }
    }
}

/// The sites listed: the most held first, and the lines whose arenas a forked process
/// copied most.
fn listed_sites(log: &PythonLog, by_line: HashMap<String, SiteAcc>) -> Vec<PythonSite> {
    let mut sites: Vec<PythonSite> = by_line
        .into_iter()
        .map(|(location, acc)| {
            let stack = acc
                .stacks
                .iter()
                .max_by_key(|&(id, n)| (*n, std::cmp::Reverse(*id)))
                .map(|(id, _)| *id);
            let callers = stack
                .and_then(|s| log.defined.stacks.get(&s))
                .map(|f| {
                    f.iter()
                        .skip(1)
                        .take(CALLERS_SHOWN)
                        .map(|&id| log.frame_name(id))
                        .collect()
                })
                .unwrap_or_default();
            PythonSite {
                location,
                callers,
                allocated_bytes: acc.allocated,
                live_bytes: acc.live,
                arenas: acc.arenas,
                held_bytes: acc.held,
                copied_bytes: acc.copied,
            }
        })
        .collect();
    sites.sort_by(|a, b| {
        b.held_bytes
            .total_cmp(&a.held_bytes)
            .then(b.allocated_bytes.total_cmp(&a.allocated_bytes))
            .then(a.location.cmp(&b.location))
    });
    // The lines whose arenas a forked process copied most make the list too.
    let mut by_copied: Vec<usize> = (0..sites.len())
        .filter(|&i| sites[i].copied_bytes >= 1.0)
        .collect();
    by_copied.sort_by(|&a, &b| sites[b].copied_bytes.total_cmp(&sites[a].copied_bytes));
    let keep: std::collections::HashSet<usize> = (0..SITES_LISTED.min(sites.len()))
        .chain(by_copied.into_iter().take(SITES_LISTED / 2))
        .collect();
    (sites.into_iter().enumerate())
        .filter(|(i, _)| keep.contains(i))
        .map(|(_, s)| s)
        .collect()
}

/// The stacks of `by_stack` by their frames (one line has a frame id per instruction, so
/// several ids can read alike), most bytes allocated first.
fn stacks_of(log: &PythonLog, by_stack: BTreeMap<u32, StackAcc>) -> Vec<PythonStack> {
    let frame = |id: &u32| match log.defined.frames.get(id) {
        Some(f) => PythonFrame {
            file: f.file.clone(),
            line: f.line,
            function: f.function.clone(),
        },
        None => PythonFrame {
            file: "?".into(),
            line: 0,
            function: "?".into(),
        },
    };
    let mut merged: HashMap<Vec<PythonFrame>, StackAcc> = HashMap::new();
    for (id, acc) in by_stack {
        let frames = log
            .defined
            .stacks
            .get(&id)
            .map(|f| f.iter().map(frame).collect())
            .unwrap_or_default();
        let m = merged.entry(frames).or_default();
        m.allocations += acc.allocations;
        m.allocated += acc.allocated;
        m.live_objects += acc.live_objects;
        m.live += acc.live;
        m.held += acc.held;
    }
    let mut stacks: Vec<PythonStack> = merged
        .into_iter()
        .map(|(frames, a)| PythonStack {
            frames,
            allocations: a.allocations,
            allocated_bytes: a.allocated,
            live_objects: a.live_objects,
            live_bytes: a.live,
            held_bytes: a.held,
        })
        .collect();
    stacks.sort_by(|a, b| {
        b.allocated_bytes
            .total_cmp(&a.allocated_bytes)
            .then_with(|| a.frames.cmp(&b.frames))
    });
    stacks
}

/// Why a CPython process's report names no Python line, when it names none: what the
/// interposer said, else what the recording shows (`stacks` as the report has it,
/// `cpython`: the process has a pymalloc census). None when lines were sampled, or when
/// the process is not CPython.
pub fn unsampled_note(log: &PythonLog, cpython: bool, stacks: &str) -> Option<String> {
    if !log.is_empty() {
        return None;
    }
    if let Some(reason) = &log.unsampled {
        return Some(format!("Python lines are not sampled: {reason}."));
    }
    if !cpython {
        return None;
    }
    Some(if stacks == "none" {
        "Python lines are not sampled: recorded with --stacks none.".into()
    } else {
        "Python lines are not sampled: no CPython object was sampled in this process (the \
         interposer wraps CPython's allocators when it finds CPython's functions as the \
         process starts, not in a libpython loaded later with dlopen)."
            .into()
    })
}

/// "objects allocated at app.py:12 (load) are in 310 of the arenas copied (52 MiB of
/// them)": the site with the most copied bytes, when it has a fifth of what the sampled
/// arenas had copied.
pub fn copied_clause(s: &PythonSites) -> Option<String> {
    let top = (s.sites.iter())
        .filter(|t| t.copied_bytes >= 1.0)
        .max_by(|a, b| a.copied_bytes.total_cmp(&b.copied_bytes))?;
    let copied: f64 = s.sites.iter().map(|t| t.copied_bytes).sum();
    if top.copied_bytes * 5.0 < copied {
        return None;
    }
    Some(format!(
        "most of the copied arenas hold objects allocated at {} ({} of the copies fall to \
         them)",
        top.location,
        crate::mib(top.copied_bytes as u64)
    ))
}

/// "objects from handlers.py:88 (handle) survive in 1 790 of the 1 850 arenas in use":
/// the site that holds the most, when it holds a fifth of what the sampled arenas hold.
pub fn headline_clause(s: &PythonSites) -> Option<String> {
    let top = s.sites.first().filter(|t| t.arenas > 0)?;
    let held: f64 = s.sites.iter().map(|t| t.held_bytes).sum();
    if top.held_bytes * 5.0 < held {
        return None;
    }
    Some(format!(
        "objects allocated at {} survive in {} of the {} arenas in use and hold {} of \
         their free space",
        top.location,
        top.arenas,
        s.arenas_in_use,
        crate::mib(top.held_bytes as u64)
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use fragscope_trace::records::PymallocPool;
    use fragscope_trace::wire::Writer;

    fn log_of(records: impl Fn(&mut Writer)) -> PythonLog {
        let mut w = Writer::new();
        records(&mut w);
        let mut log = PythonLog::default();
        log.add(&RuntimeSamples {
            stream: 0,
            mean_bytes: 64,
            first_tick: 0,
            records: w.bytes,
        });
        log
    }

    /// No line without a sentence: the interposer's reason first, else what the
    /// recording shows; nothing for a process that is not CPython or has lines.
    #[test]
    fn a_cpython_process_without_lines_gets_a_sentence() {
        let told = log_of(|w| {
            w.varint(0).u8(6).str(
                "CPython 3.14.0 is a debug build (Py_DEBUG), whose objects fragscope does not read",
            );
        });
        assert!(told.is_empty());
        assert_eq!(
            unsampled_note(&told, false, "sampled").as_deref(),
            Some(
                "Python lines are not sampled: CPython 3.14.0 is a debug build (Py_DEBUG), \
                 whose objects fragscope does not read."
            )
        );
        let silent = PythonLog::default();
        assert!(unsampled_note(&silent, true, "sampled")
            .unwrap()
            .contains("no CPython object was sampled"));
        assert!(unsampled_note(&silent, true, "none")
            .unwrap()
            .contains("--stacks none"));
        assert_eq!(unsampled_note(&silent, false, "sampled"), None);
        let sampled = log_of(|w| {
            w.varint(0).u8(1).varint(0x10_0000).varint(64).varint(0);
        });
        assert_eq!(unsampled_note(&sampled, true, "sampled"), None);
    }

    /// Stacks of one line (a frame id per instruction) are summed into one in the same
    /// order every time: the exports of one trace are the same file on every run.
    #[test]
    fn the_stacks_of_one_line_sum_to_the_same_figures_every_time() {
        let log = log_of(|w| {
            w.varint(0).u8(3).varint(1).varint(7).str("a.py").str("f");
            for stack in 1..=60u64 {
                w.varint(0).u8(4).varint(stack).varint(1).varint(1);
            }
            for i in 0..600u64 {
                let size = 24 + (i * 37) % 500;
                w.varint(0)
                    .u8(1)
                    .varint(0x10_0000 + i * 0x400)
                    .varint(size)
                    .varint(1 + i % 60);
            }
        });
        let figures = |s: &PythonSites| -> Vec<[u64; 3]> {
            (s.stacks.iter())
                .map(|t| {
                    [
                        t.allocations.to_bits(),
                        t.allocated_bytes.to_bits(),
                        t.live_bytes.to_bits(),
                    ]
                })
                .collect()
        };
        let first = figures(&sites(&log, None, None));
        assert_eq!(first.len(), 1);
        for _ in 0..20 {
            assert_eq!(figures(&sites(&log, None, None)), first);
        }
    }

    /// Two lines: a.py:1 keeps one object in each of two arenas, b.py:2 fills a third and
    /// frees everything it allocated in the first two.
    #[test]
    fn an_arenas_free_space_goes_to_the_lines_whose_objects_survive_in_it() {
        let pool = 16 << 10;
        let log = log_of(|w| {
            w.varint(0)
                .u8(3)
                .varint(1)
                .varint(1)
                .str("a.py")
                .str("keep");
            w.varint(0)
                .u8(3)
                .varint(2)
                .varint(2)
                .str("b.py")
                .str("churn");
            w.varint(0).u8(4).varint(1).varint(1).varint(1);
            w.varint(0).u8(4).varint(2).varint(1).varint(2);
            // a.py survives in arenas 0 and 1.
            w.varint(1).u8(1).varint(0x10_0000).varint(64).varint(1);
            w.varint(0).u8(1).varint(0x20_0000).varint(64).varint(1);
            // b.py: one freed in arena 0, one kept in arena 2.
            w.varint(0).u8(1).varint(0x10_0040).varint(64).varint(2);
            w.varint(0).u8(2).varint(0x10_0040);
            w.varint(0).u8(1).varint(0x30_0000).varint(64).varint(2);
            // After the census: not counted.
            w.varint(10).u8(2).varint(0x20_0000);
        });
        let pools = PymallocPools {
            python: "3.11".into(),
            pool_size: pool as u32,
            arena_size: 1 << 20,
            pool_header: 48,
            pause_us: 0,
            pools: [0x10_0000u64, 0x20_0000, 0x30_0000]
                .iter()
                .enumerate()
                .map(|(i, &address)| PymallocPool {
                    address,
                    arena: i as u32,
                    block_size: 64,
                    blocks_in_use: 1,
                    blocks_carved: 1,
                })
                .collect(),
        };
        let arena = |held: u64| ArenaAcc {
            pools_in_use: 1,
            in_use: 64,
            empty_resident: held,
            free_in_used_pools: 0,
            copied: 0,
        };
        let arenas = BTreeMap::from([(0, arena(1000)), (1, arena(2000)), (2, arena(500))]);
        let index = PoolIndex::new(5, 3500, &pools, arenas);
        let s = sites(&log, Some(&index), None);
        assert_eq!((s.samples, s.live_samples), (4, 3));
        assert_eq!((s.arenas_in_use, s.arenas_sampled), (3, 3));
        let a = &s.sites[0];
        assert_eq!(a.location, "a.py:1 (keep)");
        assert_eq!((a.arenas, a.held_bytes.round()), (2, 3000.0));
        let b = &s.sites[1];
        assert_eq!((b.arenas, b.held_bytes.round()), (1, 500.0));
        assert!(headline_clause(&s)
            .unwrap()
            .contains("a.py:1 (keep) survive in 2 of the 3"));
        // Each stack carries its line's figures: here one stack per line.
        assert_eq!(s.stacks.len(), 2);
        let a_stack = s
            .stacks
            .iter()
            .find(|t| t.frames[0].file == "a.py")
            .unwrap();
        assert_eq!(a_stack.frames[0].line, 1);
        assert_eq!(a_stack.held_bytes.round(), 3000.0);
        assert_eq!(a_stack.live_bytes, a.live_bytes);
        assert_eq!(a_stack.allocated_bytes, a.allocated_bytes);
        let held: f64 = s.stacks.iter().map(|t| t.held_bytes).sum();
        assert_eq!(held.round(), 3500.0);

        // A process forked at tick 1 from this one starts from the samples up to then
        // (every one but the free after the census), frees a.py's object in arena 1 and
        // has copied arena 0 (where a.py's object lives) and arena 1 (where no sample
        // lives any more: unattributed).
        let child_own = log_of(|w| {
            w.varint(4).u8(2).varint(0x20_0000);
        });
        let child = child_own.forked_from(&log, 1);
        assert_eq!(child.events.len(), 6, "its parent's five and its own free");
        let copies = |copied: u64| ArenaAcc { copied, ..arena(0) };
        let arenas = BTreeMap::from([(0, copies(8192)), (1, copies(4096)), (2, copies(0))]);
        let copy_index = PoolIndex::new(6, 0, &pools, arenas);
        let c = sites(&child, None, Some(&copy_index));
        let a = c
            .sites
            .iter()
            .find(|t| t.location == "a.py:1 (keep)")
            .unwrap();
        assert_eq!(a.copied_bytes.round(), 8192.0);
        assert_eq!(c.copied_unattributed, 4096);
        assert!(copied_clause(&c).unwrap().contains("a.py:1 (keep)"));
        // The parent's frame definitions name the child's inherited samples.
        assert_eq!(child.frame_name(1), "a.py:1 (keep)");
    }
}
