//! Which resident pages a process shares with another and which it owns: after fork, a
//! worker's pages stay shared with its parent (copy-on-write) until one of them writes
//! to them. pagemap's "exclusively mapped" bit says, page by page, whether another
//! process maps the page too (smaps counts the same pages as Shared_*); the residency a
//! forked child had as it started (`Chunk::ForkResidency`) tells the private pages it
//! copied since from those it made.

use fragscope_trace::records::{Pagemap, Rollup};
use serde::Serialize;

use crate::heap::Residency;
use crate::report::Snapshot;

/// Whom a resident page belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Owner {
    /// Another process maps it too (a parent, a sibling or a child after fork).
    Shared,
    /// Private now, and resident when the process started from its parent's memory:
    /// copied since the fork.
    Copied,
    /// Private, and made by the process itself (or its start is unknown).
    Own,
}

/// Resident bytes by owner: `resident` = `shared` + private, `copied` part of private.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct Owners {
    pub resident: u64,
    pub shared: u64,
    pub copied: u64,
}

impl Owners {
    pub fn add(&mut self, owner: Owner, bytes: u64) {
        self.resident += bytes;
        match owner {
            Owner::Shared => self.shared += bytes,
            Owner::Copied => self.copied += bytes,
            Owner::Own => {}
        }
    }

    /// Adds `other`'s bytes.
    pub fn merge(&mut self, other: &Owners) {
        self.resident += other.resident;
        self.shared += other.shared;
        self.copied += other.copied;
    }

    pub fn private(&self) -> u64 {
        self.resident - self.shared
    }

    /// Takes `less` out (pages counted here that belong elsewhere), never below zero.
    pub fn subtract(&mut self, less: &Owners) {
        self.resident = self.resident.saturating_sub(less.resident);
        self.shared = self.shared.saturating_sub(less.shared).min(self.resident);
        self.copied = self
            .copied
            .saturating_sub(less.copied)
            .min(self.resident - self.shared);
    }
}

/// The malloc heap's parts by owner, page by page as the heap evaluation splits them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct HeapOwners {
    pub live: Owners,
    pub rounding: Owners,
    pub allocator_overhead: Owners,
    pub free_in_used_pages: Owners,
    pub free_resident_pages: Owners,
}

impl HeapOwners {
    /// A used page's bytes, each part to the page's owner.
    pub fn add_page(&mut self, owner: Owner, live: u64, rounding: u64, overhead: u64, free: u64) {
        self.live.add(owner, live);
        self.rounding.add(owner, rounding);
        self.allocator_overhead.add(owner, overhead);
        self.free_in_used_pages.add(owner, free);
    }
}

/// What the page residency can say of sharing: nothing for traces recorded before it
/// was read.
pub fn known(pm: &Pagemap) -> bool {
    pm.ranges.iter().any(|r| !r.shared.is_empty())
}

/// The resident pages of `pm` within `spans` (address ranges, sorted or not), by owner.
pub fn owners_in(
    pm: &Pagemap,
    fork: Option<&Pagemap>,
    spans: impl IntoIterator<Item = (u64, u64)>,
) -> Owners {
    let ps = u64::from(pm.page_size.max(1));
    let mut res = Residency::new(pm).with_fork(fork);
    let mut out = Owners::default();
    for (lo, hi) in spans {
        for page in lo / ps..hi.div_ceil(ps) {
            if let Some(owner) = res.resident_owner(page) {
                out.add(owner, ps);
            }
        }
    }
    out
}

/// Every resident page of `pm` by owner (pages of mappings that can hold heap objects:
/// the heaps and other anonymous memory).
pub fn owners_of(pm: &Pagemap, fork: Option<&Pagemap>) -> Owners {
    let ps = u64::from(pm.page_size.max(1));
    owners_in(
        pm,
        fork,
        pm.ranges
            .iter()
            .map(|r| (r.start, r.start + r.pages * ps))
            .collect::<Vec<_>>(),
    )
}

/// Resident bytes of every range of `pm`.
pub fn resident_bytes(pm: &Pagemap) -> u64 {
    pm.ranges.iter().map(|r| r.resident_pages()).sum::<u64>() * u64::from(pm.page_size)
}

/// smaps_rollup's figures of sharing at a snapshot, in bytes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct RollupSharing {
    pub rss: u64,
    pub pss: u64,
    /// Shared_Clean + Shared_Dirty.
    pub shared: u64,
    /// Private_Clean + Private_Dirty.
    pub private: u64,
    pub private_dirty: u64,
}

impl RollupSharing {
    pub fn of(r: &Rollup) -> Option<Self> {
        let kib = |k: &str| r.get(k).map(|v| v * 1024);
        Some(Self {
            rss: kib("Rss")?,
            pss: kib("Pss")?,
            shared: kib("Shared_Clean")? + kib("Shared_Dirty")?,
            private: kib("Private_Clean")? + kib("Private_Dirty")?,
            private_dirty: kib("Private_Dirty")?,
        })
    }
}

/// One part of a snapshot's memory by owner.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct PartSharing {
    /// As the decomposition names it ("live", "pymalloc_arenas", ...), or "malloc_heap"
    /// for the malloc heap whole when its parts are not split (a `fragscope snapshot`).
    pub part: String,
    #[serde(flatten)]
    pub owners: Owners,
}

/// A snapshot's resident memory split into pages shared with other processes and pages
/// of its own.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Sharing {
    /// The process started as a fork child whose residency at the start was read:
    /// `copied` is known (else it is 0).
    pub forked: bool,
    /// Resident bytes of its heap mappings as it started (the memory it inherited).
    pub inherited: Option<u64>,
    /// Every page of the mappings that can hold heap objects, by owner.
    pub anonymous: Owners,
    /// Each part of the decomposition that pagemap places, by owner.
    pub parts: Vec<PartSharing>,
    /// smaps_rollup's Rss, Pss, Shared_* and Private_* read with the snapshot.
    pub rollup: Option<RollupSharing>,
}

/// The snapshot of a forked process that says most of what it copied from its parent:
/// the one with the most copied bytes (the latest of equals), among those with every
/// census the process has when there are such (the exit's has none: its runtime heap's
/// pages would be "other anonymous" there).
pub fn most_copied(snapshots: &[Snapshot]) -> Option<usize> {
    let forked = |i: &usize| snapshots[*i].sharing.as_ref().is_some_and(|s| s.forked);
    let copied = |i: &usize| {
        snapshots[*i]
            .sharing
            .as_ref()
            .map_or(0, |s| s.anonymous.copied)
    };
    let whole = |i: &usize| snapshots[*i].missing_census.is_empty();
    (0..snapshots.len())
        .filter(|i| forked(i) && whole(i))
        .max_by_key(copied)
        .or_else(|| (0..snapshots.len()).filter(forked).max_by_key(copied))
}

/// The snapshot whose sharing a report shows: of a forked process the one with the most
/// copied since the fork, else the focus when it read sharing, else the last that did.
pub fn shown(snapshots: &[Snapshot], focus: Option<usize>) -> Option<usize> {
    let read = |i: &usize| snapshots[*i].sharing.is_some();
    most_copied(snapshots)
        .or(focus.filter(read))
        .or((0..snapshots.len()).rev().find(read))
}

/// The headline of a forked process whose copies of its parent's memory weigh more than
/// what its heaps waste: (dominant part, sentence), or None.
pub fn headline(
    snapshots: &[Snapshot],
    heaps_waste: u64,
    cpython: bool,
) -> Option<(&'static str, String)> {
    let s = snapshots[most_copied(snapshots)?].sharing.as_ref()?;
    let inherited = s.inherited?;
    let copied = s.anonymous.copied;
    if copied < 1 << 20 || copied < heaps_waste || copied * 4 < inherited {
        return None;
    }
    let remedy = if cpython {
        "In CPython, reading an object writes its reference count and the cyclic collector \
         writes the header of every object it tracks, so a worker that only reads what its \
         parent built copies the pages of every object it touches: gc.freeze() just before \
         forking keeps the collector off them (reference counts still copy the pages of the \
         objects read); data the workers share is better held in few large objects (bytes, \
         array, numpy) than in many small ones, or loaded after the fork by each worker."
    } else {
        "A page is copied when either process writes to it: allocating into the parent's \
         free space, freeing inherited blocks (the allocator writes its lists into them) and \
         writing inherited objects all copy; a parent that builds what workers only read \
         compactly (its own arena or mapping), frees nothing of it in the workers and trims \
         its heap before forking keeps it shared."
    };
    Some((
        "copied_after_fork",
        format!(
            "{} of the {} of heap memory this process inherited from its parent at the fork \
             were copied since ({} are still shared): copy-on-write ended for every page either \
             of them wrote. {remedy}",
            crate::mib(copied),
            crate::mib(inherited),
            crate::mib(s.anonymous.shared),
        ),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use fragscope_trace::records::{ResidentRange, SnapshotReason};

    fn pagemap(resident: u8, shared: u8) -> Pagemap {
        Pagemap {
            stream: 0,
            tick: 1,
            reason: SnapshotReason::Periodic,
            page_size: 4096,
            ranges: vec![ResidentRange {
                start: 0x10000,
                pages: 8,
                resident: vec![resident],
                shared: vec![shared],
            }],
        }
    }

    #[test]
    fn pages_are_shared_copied_or_own_by_the_bits_and_the_start() {
        // Pages 0-5 resident; 0 and 1 shared; at the start 0-3 were resident.
        let now = pagemap(0b0011_1111, 0b0000_0011);
        let start = pagemap(0b0000_1111, 0b0000_1111);
        let o = owners_of(&now, Some(&start));
        assert_eq!(o.resident, 6 * 4096);
        assert_eq!(o.shared, 2 * 4096);
        assert_eq!(o.copied, 2 * 4096, "pages 2 and 3: inherited, now private");
        assert_eq!(o.private(), 4 * 4096);
        // Without the start, nothing is known to be copied.
        assert_eq!(owners_of(&now, None).copied, 0);
        // A span picks its pages only.
        let span = owners_in(
            &now,
            Some(&start),
            [(0x10000 + 3 * 4096, 0x10000 + 5 * 4096)],
        );
        assert_eq!(
            (span.resident, span.shared, span.copied),
            (2 * 4096, 0, 4096)
        );
    }

    #[test]
    fn subtracting_never_goes_below_zero_nor_breaks_the_sum() {
        let mut a = Owners {
            resident: 10,
            shared: 4,
            copied: 3,
        };
        a.subtract(&Owners {
            resident: 5,
            shared: 6,
            copied: 1,
        });
        assert_eq!(a.resident, 5);
        assert!(a.shared + a.copied <= a.resident, "{a:?}");
    }
}
