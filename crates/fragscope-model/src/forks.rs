//! A forked process starts from its parent's live blocks at the fork (ARCHITECTURE.md,
//! "Time and order"): which heap each child waits for, and the hand-over once the
//! parent's merge reaches the fork or ends. The one place for it, for every reading that
//! follows processes through their merged calls: the report's analysis (every process,
//! [`crate::analyze`]) and one process's calls with its ancestors' ([`Lineage`]: export,
//! replay).

use std::path::Path;

use fragscope_trace::ahead::{Events, ReadAhead};
use fragscope_trace::merge::{InheritedHeap, Merged, Merger};
use fragscope_trace::reader::Chunk;
use fragscope_trace::records::{EventsHeader, Origin, Process};
use fragscope_trace::{TraceError, TraceReader};

/// A process's place among the forks of a trace, beside its merge.
#[derive(Debug, Default)]
pub struct ForkLink {
    pub stream: u32,
    /// Forked from this stream: its parent's blocks were never seen allocated in it.
    pub parent_stream: Option<u32>,
    /// The mark of its fork in the parent's calls, where its heap is the parent's.
    pub fork_mark: Option<u32>,
    pub start_tick: u64,
    /// Its merge waits for the parent's heap at the fork: nothing is popped before.
    pub awaiting_parent_heap: bool,
    /// Only the child forked at this mark is followed (a [`Lineage`]): the heaps at its
    /// other forks are not kept.
    follows_only: Option<u32>,
    /// The heaps at this process's forks (mark, tick, heap) that no child took yet: the
    /// chunks of two connections reach the file in either order.
    heaps: Vec<(u32, u64, InheritedHeap)>,
}

impl ForkLink {
    pub fn new(stream: u32) -> Self {
        Self {
            stream,
            ..Self::default()
        }
    }

    /// Takes what its Process chunk says of its fork.
    pub fn read(&mut self, p: &Process) {
        self.start_tick = p.start_tick;
        if p.origin == Origin::Forked {
            self.parent_stream = p.parent_stream;
            self.fork_mark = p.fork_mark;
        }
    }

    /// The process forked at `mark` (its merge just handed on [`Merged::Forked`]): its
    /// heap there waits for the child.
    pub fn forked(&mut self, merger: &mut Merger, mark: u32, tick: u64) {
        if self.follows_only.is_none_or(|m| m == mark) {
            self.heaps.push((mark, tick, merger.heap_at_fork()));
        }
    }
}

/// What a process started from: its parent's heap, now in its merge.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Inherited {
    /// The fork's tick.
    pub tick: u64,
    pub blocks: u64,
    /// Requested and usable bytes.
    pub bytes: u64,
    pub usable_bytes: u64,
    /// The parent's calls in the trace end before the fork's mark (a cut trace): the
    /// heap is the parent's at their end, the nearest one known.
    pub at_parent_end: bool,
}

/// A process followed through its merged calls.
pub trait Forked {
    fn link(&mut self) -> &mut ForkLink;
    fn merger(&mut self) -> &mut Merger;
}

/// Seeds the merge of `child` with `heap`; `start` then takes what it can order.
fn seed<P: Forked>(
    child: &mut P,
    heap: InheritedHeap,
    tick: u64,
    at_parent_end: bool,
    start: &mut impl FnMut(&mut P, Inherited),
) {
    let inherited = Inherited {
        tick,
        blocks: heap.blocks() as u64,
        bytes: heap.bytes,
        usable_bytes: heap.usable_bytes,
        at_parent_end,
    };
    child.merger().seed_inherited(heap);
    child.link().awaiting_parent_heap = false;
    start(child, inherited);
}

/// Child `child`'s Process chunk came: its merge waits for the heap at its fork, which
/// `parent`'s merge may have reached already.
pub fn child_came<P: Forked>(
    procs: &mut [P],
    child: usize,
    parent: Option<usize>,
    start: &mut impl FnMut(&mut P, Inherited),
) {
    if let (Some(parent), Some(_)) = (parent, procs[child].link().fork_mark) {
        procs[child].link().awaiting_parent_heap = true;
        hand_over(procs, parent, start);
    }
}

/// Seeds the children waiting for the heaps at `parent`'s forks, and theirs in turn as
/// `start` takes their calls (which may reach forks of their own).
pub fn hand_over<P: Forked>(
    procs: &mut [P],
    parent: usize,
    start: &mut impl FnMut(&mut P, Inherited),
) {
    let mut work = vec![parent];
    while let Some(p) = work.pop() {
        let mut k = 0;
        while k < procs[p].link().heaps.len() {
            let parent_stream = procs[p].link().stream;
            let mark = procs[p].link().heaps[k].0;
            let child = procs.iter_mut().position(|c| {
                let c = c.link();
                c.awaiting_parent_heap
                    && c.parent_stream == Some(parent_stream)
                    && c.fork_mark == Some(mark)
            });
            let Some(c) = child else {
                k += 1;
                continue;
            };
            let (_, tick, heap) = procs[p].link().heaps.swap_remove(k);
            seed(&mut procs[c], heap, tick, false, start);
            work.push(c);
        }
    }
}

/// Every call of `parent` is merged (and `start` took them): children still waiting,
/// whose fork's mark its calls never reached (the trace is cut before it), start from
/// its last heap; the heaps no child took go.
pub fn parent_ended<P: Forked>(
    procs: &mut [P],
    parent: usize,
    start: &mut impl FnMut(&mut P, Inherited),
) {
    hand_over(procs, parent, start);
    let parent_stream = Some(procs[parent].link().stream);
    for c in 0..procs.len() {
        let link = procs[c].link();
        if link.awaiting_parent_heap && link.parent_stream == parent_stream {
            let tick = link.start_tick;
            let heap = procs[parent].merger().heap_at_fork();
            seed(&mut procs[c], heap, tick, true, start);
        }
    }
    procs[parent].link().heaps = Vec::new();
}

/// The merges of one process and of its ancestors back to the first traced one, each
/// forked child's started from its parent's heap at the fork as the report's analysis
/// starts it: what the calls of one forked process need, so that its frees of its
/// parent's blocks are known (export, replay).
pub struct Lineage {
    /// Ancestors first, the process followed last.
    members: Vec<Member>,
}

struct Member {
    link: ForkLink,
    merger: Merger,
    inherited: Option<Inherited>,
}

impl Forked for Member {
    fn link(&mut self) -> &mut ForkLink {
        &mut self.link
    }
    fn merger(&mut self) -> &mut Merger {
        &mut self.merger
    }
}

impl Lineage {
    /// `stream` and its ancestors among `processes` (a trace's Process chunks): a child
    /// whose fork was not marked, or whose parent is not traced, starts a lineage.
    pub fn new(processes: &[Process], stream: u32) -> Self {
        let link = |s: u32| {
            let mut link = ForkLink::new(s);
            if let Some(p) = processes.iter().find(|p| p.stream == s) {
                link.read(p);
            }
            link
        };
        let mut links = vec![link(stream)];
        while links.len() <= processes.len() {
            let child = &links[links.len() - 1];
            let parent = match (child.parent_stream, child.fork_mark) {
                (Some(p), Some(_)) if processes.iter().any(|x| x.stream == p) => p,
                _ => break,
            };
            links.push(link(parent));
        }
        links.reverse();
        let members = (0..links.len()).map(|i| {
            let mut link = std::mem::take(&mut links[i]);
            link.awaiting_parent_heap = i > 0;
            link.follows_only = links.get(i + 1).and_then(|c| c.fork_mark);
            Member {
                link,
                merger: Merger::new(),
                inherited: None,
            }
        });
        Self {
            members: members.collect(),
        }
    }

    /// [`Lineage::new`] from the Process chunks of the trace at `path` (a pass over it).
    pub fn of(path: &Path, stream: u32) -> Result<Self, TraceError> {
        let mut reader = TraceReader::open(path)?;
        let mut processes = Vec::new();
        while let Some(chunk) = reader.next_chunk() {
            if let Chunk::Process(p) = chunk {
                processes.push(p);
            }
        }
        Ok(Self::new(&processes, stream))
    }

    /// The streams whose events it merges.
    pub fn streams(&self) -> Vec<u32> {
        self.members.iter().map(|m| m.link.stream).collect()
    }

    /// Adds a chunk of events (of any stream; those of others are left out), and takes
    /// the ancestors' calls as far as their merges can order them.
    pub fn push_events(
        &mut self,
        reader: &ReadAhead,
        h: &EventsHeader,
        events: Events,
    ) -> Result<(), TraceError> {
        let Some(i) = self.members.iter().position(|m| m.link.stream == h.stream) else {
            return Ok(());
        };
        let pushed = reader.push_events(&mut self.members[i].merger, h, events);
        if !self.members[i].link.awaiting_parent_heap {
            take_ancestors_calls(&mut self.members[i]);
            hand_over(&mut self.members, i, &mut start_member);
        }
        pushed
    }

    /// Every chunk was pushed: the merges finish, each child seeded as its parent's
    /// calls end if it was not yet.
    pub fn finish(&mut self) {
        for i in 0..self.members.len() {
            let m = &mut self.members[i];
            // Not seeded by its parent, which comes before it: it goes on without.
            m.link.awaiting_parent_heap = false;
            m.merger.finish();
            take_ancestors_calls(m);
            parent_ended(&mut self.members, i, &mut start_member);
        }
    }

    /// The merge of the process followed, once it may hand on calls (its parent's heap
    /// is in it); `None` while it waits.
    pub fn merger(&mut self) -> Option<&mut Merger> {
        let m = self.members.last_mut()?;
        (!m.link.awaiting_parent_heap).then_some(&mut m.merger)
    }

    /// The heap the process followed started from, once its merge has it.
    pub fn inherited(&self) -> Option<Inherited> {
        self.members.last()?.inherited
    }
}

fn start_member(m: &mut Member, inherited: Inherited) {
    m.inherited = Some(inherited);
    take_ancestors_calls(m);
}

/// Pops an ancestor's merged calls, keeping its heap at the fork of the next one; the
/// process followed is popped by its reader.
fn take_ancestors_calls(m: &mut Member) {
    if m.link.follows_only.is_none() {
        return;
    }
    while let Some(item) = m.merger.pop() {
        if let Merged::Forked { tick, mark } = item {
            m.link.forked(&mut m.merger, mark, tick);
        }
    }
}
