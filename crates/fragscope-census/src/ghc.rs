//! The GHC RTS's block census, read from outside the program.
//!
//! GHC's storage manager takes 1 MiB *megablocks* from the OS and splits each into 4 KiB
//! *blocks*, described by 64-byte *block descriptors* (`bdescr`, rts/storage/Block.h) at
//! the start of the megablock; a group of adjacent blocks has its figures in the first
//! block's descriptor. On 64-bit Linux the RTS reserves one large address range and hands
//! out megablocks from its start (rts/sm/MBlock.c, the two-step allocator): those below
//! `mblock_high_watermark` are the RTS's, except the ranges on its `free_list_head` list.
//! The census walks every held megablock's descriptors, counts blocks by kind (nursery,
//! generations, pinned, large, compact), free blocks, how full each megablock is, and
//! how much of each small pinned block is still referenced from the rest of the heap.
//!
//! The layout facts here hold for the GHC series in [`RELEASES`] on 64-bit targets (each
//! checked against its release's RTS headers — `bdescr` in rts/storage/Block.h, the
//! `nursery` of rts/storage/GC.h, `RTSStats` in RtsAPI.h — and its compiled RTS): they
//! have not changed from 9.0 to 9.10. Each census checks itself against the RTS's own
//! counters (`mblocks_allocated`, `n_alloc_blocks`) and is refused when they disagree;
//! an RTS of another series gets a note instead of a census.

use std::collections::{HashMap, HashSet};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use fragscope_trace::records::{
    GhcBlockKind, GhcBlocks, GhcKindFigures, GhcPinnedLiveness, MEGABLOCK_FILL_BOUNDS,
    SPARSE_MEGABLOCK_BLOCKS,
};

use crate::maps::Mapping;
use crate::memory::le_u64;
use crate::{Pause, ProcessMemory, Symbols};

pub const MBLOCK_SIZE: u64 = 1 << 20;
pub const BLOCK_SIZE: u64 = 1 << 12;
const BDESCR_SIZE: u64 = 64;
/// The first block starts after the descriptors of all 256 block-sized slots.
const FIRST_BLOCK_OFF: u64 = BDESCR_SIZE * (MBLOCK_SIZE / BLOCK_SIZE);
/// FIRST_BDESCR(m): the descriptor of the first real block.
const FIRST_BDESCR_OFF: u64 = FIRST_BLOCK_OFF / (BLOCK_SIZE / BDESCR_SIZE);
pub const BLOCKS_PER_MBLOCK: u64 = (MBLOCK_SIZE - FIRST_BLOCK_OFF) / BLOCK_SIZE;

// bdescr fields (Block.h, 64-bit).
const BD_START: usize = 0;
const BD_FREE: usize = 8;
const BD_LINK: u64 = 16;
const BD_GEN: usize = 32;
const BD_GEN_NO: usize = 40;
const BD_FLAGS: usize = 46;
const BD_BLOCKS: usize = 48;

const BF_LARGE: u16 = 2;
const BF_PINNED: u16 = 4;
const BF_COMPACT: u16 = 512;
const BF_NONMOVING: u16 = 1024;

/// A free group's head has `free == (P_)-1` (rts/sm/BlockAlloc.c).
const FREE_GROUP: u64 = u64::MAX;

// struct free_list { prev, next, address, size } in MBlock.c (sizes in bytes).
const FL_NEXT: u64 = 8;
const FL_ADDRESS: u64 = 16;
const FL_SIZE: u64 = 24;

/// Limits on the walk, so that a corrupt or misread structure cannot loop.
const MAX_MEGABLOCKS: u64 = 1 << 20;
const MAX_LIST_NODES: u64 = 1 << 24;

/// The symbols the census reads.
const SYMBOLS: [&str; 9] = [
    "stats",
    "mblock_address_space",
    "mblock_high_watermark",
    "free_list_head",
    "mblocks_allocated",
    "n_alloc_blocks",
    "nurseries",
    "n_nurseries",
    "stg_ARR_WORDS_info",
];

/// A GHC series whose RTS layout the census has verified, on the release named.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Release {
    /// "9.6": every release of the series (patch releases keep the RTS's structures).
    pub series: &'static str,
    /// The release it was verified on, and who ships it.
    pub verified_on: &'static str,
    pub shipped_by: &'static str,
}

/// The series the block census reads. Adding one: compare its RTS headers' `bdescr`,
/// `nursery`, `RTSStats` (its first field) and MBlock.c's `free_list` with these, then
/// run the GHC tests on it (scripts/version-matrix.sh runs them in each Debian suite's
/// chroot); a layout that differs is a field of this table, not a branch in the code.
pub const RELEASES: [Release; 3] = [
    Release {
        series: "9.0",
        verified_on: "9.0.2",
        shipped_by: "Debian 12",
    },
    Release {
        series: "9.6",
        verified_on: "9.6.6",
        shipped_by: "Debian 13",
    },
    Release {
        series: "9.10",
        verified_on: "9.10.3",
        shipped_by: "Debian unstable",
    },
];

/// The verified series, for sentences: "9.0 (9.0.2, Debian 12), 9.6 (...), ...".
pub fn verified_releases() -> String {
    RELEASES
        .iter()
        .map(|r| format!("{} ({}, {})", r.series, r.verified_on, r.shipped_by))
        .collect::<Vec<_>>()
        .join(", ")
}

/// The entry of [`RELEASES`] of GHC `version` ("9.6.6"), if its series is one.
pub fn release_of(version: &str) -> Option<&'static Release> {
    let mut parts = version.split('.');
    let series = format!("{}.{}", parts.next()?, parts.next()?);
    RELEASES.iter().find(|r| r.series == series)
}

/// What `+RTS --info` says about a program's RTS.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RtsInfo {
    pub version: String,
    /// e.g. `rts_l`, `rts_thr_l`, `rts_thr_debug`, `rts_p`.
    pub way: String,
}

impl RtsInfo {
    /// Reads the `("GHC version", "9.0.2")` and `("RTS way", "rts_l")` pairs.
    pub fn parse(info: &str) -> Option<Self> {
        let field = |name: &str| {
            info.lines().find_map(|line| {
                let rest = line.split_once(&format!("(\"{name}\", \""))?.1;
                Some(rest.split('"').next()?.to_string())
            })
        };
        Some(Self {
            version: field("GHC version")?,
            way: field("RTS way").unwrap_or_default(),
        })
    }

    /// Asks `program +RTS --info` (allowed even without -rtsopts). `ghcrts`: the GHCRTS
    /// the program will run with, so that the RTS sees the same flags.
    pub fn query(program: &Path, ghcrts: Option<&std::ffi::OsStr>) -> Result<Self, String> {
        let mut cmd = Command::new(program);
        cmd.args(["+RTS", "--info", "-RTS"])
            .env_remove("LD_PRELOAD")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        match ghcrts {
            Some(v) => cmd.env("GHCRTS", v),
            None => cmd.env_remove("GHCRTS"),
        };
        let out = run_with_timeout(cmd, Duration::from_secs(5))?;
        let text = String::from_utf8_lossy(&out.stdout);
        Self::parse(&text).ok_or_else(|| {
            let err = String::from_utf8_lossy(&out.stderr);
            let first = err.lines().next().unwrap_or("").trim();
            if first.is_empty() {
                "its RTS did not describe itself (`+RTS --info` printed no GHC version)".into()
            } else {
                format!("its RTS refused `+RTS --info`: {first}")
            }
        })
    }

    fn profiling(&self) -> bool {
        self.way.split('_').any(|w| w == "p")
    }
}

fn run_with_timeout(mut cmd: Command, limit: Duration) -> Result<std::process::Output, String> {
    let child = cmd.spawn().map_err(|e| format!("cannot start it: {e}"))?;
    let pid = child.id();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(child.wait_with_output());
    });
    match rx.recv_timeout(limit) {
        Ok(Ok(out)) => Ok(out),
        Ok(Err(e)) => Err(format!("cannot run it: {e}")),
        Err(_) => {
            // SAFETY: kill has no memory effects; the child is ours and not yet reaped.
            unsafe { libc::kill(pid as libc::pid_t, libc::SIGKILL) };
            Err("it did not answer `+RTS --info` in time".into())
        }
    }
}

/// A GHC RTS whose block census fragscope can read.
#[derive(Debug, Clone)]
pub struct GhcRts {
    pub info: RtsInfo,
    /// Where its variables are; None for a stripped executable, whose census finds the
    /// heap from /proc/PID/maps and checks the descriptors against themselves alone.
    vars: Option<RtsVars>,
    /// ARR_WORDS's info pointer when the dynamic symbol table exports it (a stripped
    /// program linked with -rdynamic, as Debian's pandoc is): no need to infer it.
    exported_arr_words_info: Option<u64>,
}

/// The RTS's variables the census reads, from the executable's symbol table.
#[derive(Debug, Clone)]
struct RtsVars {
    address_space: u64,
    high_watermark: u64,
    free_list_head: u64,
    mblocks_allocated: u64,
    n_alloc_blocks: u64,
    nurseries: u64,
    n_nurseries: u64,
    arr_words_info: u64,
    /// Stats.c's RTSStats; its first field counts the collections done.
    stats: u64,
}

impl GhcRts {
    /// Checks that the census knows this RTS and finds its variables in `elf` (the
    /// executable's bytes; `pid` places them when it is position-independent). Err: a
    /// sentence saying why there is no census, for the report.
    pub fn new(elf: &[u8], info: RtsInfo, pid: Option<u32>) -> Result<Self, String> {
        if release_of(&info.version).is_none() {
            return Err(format!(
                "the block census reads the RTS layouts of GHC {}, and this program's RTS is \
                 GHC {}, whose layout fragscope has not verified; the figures come from the \
                 eventlog alone",
                verified_releases(),
                info.version
            ));
        }
        if info.profiling() {
            return Err(format!(
                "the program runs a profiling RTS ({}), whose objects carry a larger header \
                 than the block census reads; the figures come from the eventlog alone",
                info.way
            ));
        }
        let file = object::File::parse(elf).map_err(|e| format!("not an ELF file ({e})"))?;
        use object::Object;
        if !file.is_64() || !file.is_little_endian() {
            return Err(
                "the block census reads 64-bit little-endian RTSs only; the figures come \
                        from the eventlog alone"
                    .into(),
            );
        }
        let symbols = Symbols::resolve(elf, &SYMBOLS, pid)?;
        // Stripped: the census reads the descriptors alone. A stripped program that
        // exports its public symbols (-rdynamic) still lacks the RTS's private variables
        // (the megablock map, the free list): the same, with what it exports.
        if SYMBOLS.iter().any(|n| symbols.get(n).is_none()) {
            return Ok(Self {
                info,
                vars: None,
                exported_arr_words_info: symbols.get("stg_ARR_WORDS_info"),
            });
        }
        let need = |n: &str| {
            symbols.need(n).map_err(|e| {
                format!(
                    "{e}, which the block census needs; the figures come from the eventlog alone"
                )
            })
        };
        Ok(Self {
            exported_arr_words_info: None,
            vars: Some(RtsVars {
                address_space: need("mblock_address_space")?,
                high_watermark: need("mblock_high_watermark")?,
                free_list_head: need("free_list_head")?,
                mblocks_allocated: need("mblocks_allocated")?,
                n_alloc_blocks: need("n_alloc_blocks")?,
                nurseries: need("nurseries")?,
                n_nurseries: need("n_nurseries")?,
                arr_words_info: need("stg_ARR_WORDS_info")?,
                stats: need("stats")?,
            }),
            info,
        })
    }

    /// Whether the census reads the RTS's own variables (else the executable is
    /// stripped: see [`GhcBlocks::without_symbols`]).
    pub fn has_symbols(&self) -> bool {
        self.vars.is_some()
    }
}

/// Why a census was not taken.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CensusError {
    /// The RTS has not set up its heap yet, or has released it (it is shutting down).
    NoHeap,
    /// The process is gone or cannot be read.
    Unreadable(String),
    /// What was read does not hold together (not the layout expected, or a moment the
    /// RTS's own counters disagree with its lists): no figures rather than wrong ones.
    Inconsistent(String),
}

impl std::fmt::Display for CensusError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            CensusError::NoHeap => write!(f, "the RTS holds no heap (not started or shut down)"),
            CensusError::Unreadable(e) => write!(f, "{e}"),
            CensusError::Inconsistent(e) => write!(f, "{e}"),
        }
    }
}

impl From<std::io::Error> for CensusError {
    fn from(e: std::io::Error) -> Self {
        CensusError::Unreadable(e.to_string())
    }
}

/// Bounds on a census's cost.
#[derive(Debug, Clone, Copy)]
pub struct CensusLimits {
    /// The reference scan that finds pinned blocks' live bytes reads the pinned blocks
    /// and the heap's used bytes. Up to this many it is made while the program is
    /// stopped (a few milliseconds)...
    pub stopped_scan_bytes: u64,
    /// ... up to this many after the program is let go again, and kept only when no
    /// collection ran meanwhile (nothing moved); above it, not made.
    pub scan_bytes: u64,
    /// `Some(m)`: when a collection spoilt the scan made while the program ran and the
    /// heap holds at most `m` megablocks, take the census again with the program stopped
    /// for the whole scan (tens of milliseconds per 100 MiB). The recorder allows it now
    /// and then, once the heap has stopped growing.
    pub stop_when_spoilt: Option<u64>,
}

impl Default for CensusLimits {
    fn default() -> Self {
        Self {
            stopped_scan_bytes: 16 << 20,
            scan_bytes: 256 << 20,
            stop_when_spoilt: None,
        }
    }
}

/// Takes a census of process `pid`: the block descriptors while it is held stopped, and
/// the pinned blocks' live bytes then or just after (see [`CensusLimits`]).
pub fn census(pid: u32, rts: &GhcRts, limits: CensusLimits) -> Result<GhcBlocks, CensusError> {
    let mut mem = ProcessMemory::open(pid)?;
    let pause = Pause::stop(pid).map_err(CensusError::Unreadable)?;
    let (mut census, groups) = match &rts.vars {
        Some(vars) => read_census(&mut mem, vars)?,
        None => read_census_without_symbols(&mut mem)?,
    };
    let work = liveness_work(&groups);
    let arr_words_info = match &rts.vars {
        Some(vars) => Some(vars.arr_words_info),
        None if rts.exported_arr_words_info.is_some() => rts.exported_arr_words_info,
        // Only for a scan that will be made: stopped, and small enough.
        None if work > 0 && work <= limits.stopped_scan_bytes => {
            infer_arr_words_info(&mut mem, &groups)?
        }
        None => None,
    };
    let Some(arr_words_info) = arr_words_info.filter(|_| work > 0) else {
        census.pause_us = pause.held().as_micros() as u64;
        return Ok(census);
    };
    let stopped = |mem: &mut ProcessMemory| {
        pinned_liveness(mem, arr_words_info, None, &groups)
            .ok()
            .flatten()
    };
    // Without the RTS's collection count a scan is only sound with the program stopped.
    let Some(stats) = rts.vars.as_ref().map(|v| v.stats) else {
        if work <= limits.stopped_scan_bytes {
            census.pinned_liveness = stopped(&mut mem);
        }
        census.pause_us = pause.held().as_micros() as u64;
        return Ok(census);
    };
    let collections = mem.read_u32(stats)?;
    if work <= limits.stopped_scan_bytes {
        census.pinned_liveness = stopped(&mut mem);
        census.pause_us = pause.held().as_micros() as u64;
        return Ok(census);
    }
    census.pause_us = pause.held().as_micros() as u64;
    drop(pause);
    if work > limits.scan_bytes {
        return Ok(census);
    }
    let liveness = pinned_liveness(
        &mut mem,
        arr_words_info,
        Some((stats, collections)),
        &groups,
    )
    .ok()
    .flatten();
    if mem.read_u32(stats).ok() == Some(collections) {
        census.pinned_liveness = liveness;
    } else if limits
        .stop_when_spoilt
        .is_some_and(|m| census.megablocks <= m)
    {
        return self::census(
            pid,
            rts,
            CensusLimits {
                stopped_scan_bytes: limits.scan_bytes,
                stop_when_spoilt: None,
                ..limits
            },
        );
    }
    Ok(census)
}

/// A block group's head descriptor, as the census needs it.
#[derive(Debug, Clone, Copy)]
struct Group {
    start: u64,
    free: u64,
    blocks: u64,
    kind: GhcBlockKind,
    /// Inside a sparse megablock.
    sparse: bool,
}

impl Group {
    fn held_bytes(&self) -> u64 {
        self.blocks * BLOCK_SIZE
    }
    fn used_bytes(&self) -> u64 {
        self.free.saturating_sub(self.start).min(self.held_bytes())
    }
}

fn blocks_to_mblocks(blocks: u64) -> u64 {
    1 + (blocks - BLOCKS_PER_MBLOCK).div_ceil(MBLOCK_SIZE / BLOCK_SIZE)
}

/// The block figures, and the groups in use for the liveness scan.
fn read_census(
    mem: &mut ProcessMemory,
    rts: &RtsVars,
) -> Result<(GhcBlocks, Vec<Group>), CensusError> {
    let begin = mem.read_u64(rts.address_space)?;
    let end = mem.read_u64(rts.address_space + 8)?;
    let high = mem.read_u64(rts.high_watermark)?;
    if begin == 0 || begin == u64::MAX || high == u64::MAX {
        return Err(CensusError::NoHeap);
    }
    if begin % MBLOCK_SIZE != 0
        || high < begin
        || high > end
        || (high - begin) / MBLOCK_SIZE > MAX_MEGABLOCKS
    {
        return Err(CensusError::Inconsistent(format!(
            "the RTS's address range does not hold together (begin {begin:#x}, end {end:#x}, \
             high watermark {high:#x})"
        )));
    }
    // Megablocks returned to the MBlock layer.
    let mut free_ranges = Vec::new();
    let mut node = mem.read_u64(rts.free_list_head)?;
    while node != 0 {
        if free_ranges.len() as u64 > MAX_LIST_NODES {
            return Err(CensusError::Inconsistent(
                "the RTS's free megablock list does not end".into(),
            ));
        }
        let address = mem.read_u64(node + FL_ADDRESS)?;
        let size = mem.read_u64(node + FL_SIZE)?;
        free_ranges.push((address, address.saturating_add(size)));
        node = mem.read_u64(node + FL_NEXT)?;
    }
    free_ranges.sort_unstable();
    let mut held = Vec::new();
    let mut ranges = free_ranges.iter().peekable();
    let mut mb = begin;
    while mb < high {
        while ranges.peek().is_some_and(|r| r.1 <= mb) {
            ranges.next();
        }
        match ranges.peek() {
            Some(&&(lo, hi)) if lo <= mb && mb < hi => mb = hi,
            _ => {
                held.push(mb);
                mb += MBLOCK_SIZE;
            }
        }
    }
    let rts_mblocks = mem.read_u64(rts.mblocks_allocated)?;
    if held.len() as u64 != rts_mblocks {
        return Err(CensusError::Inconsistent(format!(
            "{} megablocks found in use, the RTS counts {rts_mblocks}",
            held.len()
        )));
    }

    // The nursery: chains of descriptors from each nursery's first block.
    let mut nursery = HashSet::new();
    let n_nurseries = u64::from(mem.read_u32(rts.n_nurseries)?);
    let nurseries = mem.read_u64(rts.nurseries)?;
    for i in 0..n_nurseries.min(4096) {
        let mut bd = mem.read_u64(nurseries + 16 * i)?;
        while bd != 0 {
            if !nursery.insert(bd) || nursery.len() as u64 > MAX_LIST_NODES {
                break;
            }
            bd = mem.read_u64(bd + BD_LINK)?;
        }
    }

    let (census, groups) = walk_megablocks(mem, &held, &nursery, false)?;
    let rts_blocks = mem.read_u64(rts.n_alloc_blocks)?;
    if census.blocks_in_use() != rts_blocks {
        return Err(CensusError::Inconsistent(format!(
            "{} blocks found in use, the RTS counts {rts_blocks}",
            census.blocks_in_use()
        )));
    }
    Ok((census, groups))
}

/// Walks the descriptors of the megablocks `held` (in address order). `stripped`: they
/// are every megablock below the high watermark, returned ones included, so a megablock
/// whose descriptors the kernel zeroed or that is one free group is not counted (see
/// [`GhcBlocks::without_symbols`]).
fn walk_megablocks(
    mem: &mut ProcessMemory,
    held: &[u64],
    nursery: &HashSet<u64>,
    stripped: bool,
) -> Result<(GhcBlocks, Vec<Group>), CensusError> {
    let mut census = GhcBlocks {
        megablocks: held.len() as u64,
        kinds: vec![GhcKindFigures::default(); GhcBlockKind::ALL.len()],
        megablock_fill: vec![0; MEGABLOCK_FILL_BOUNDS.len() + 1],
        sparse_blocks: vec![0; GhcBlockKind::ALL.len()],
        without_symbols: stripped,
        ..Default::default()
    };
    let mut groups = Vec::new();
    let mut covered_until = 0u64;
    let area = (FIRST_BLOCK_OFF - FIRST_BDESCR_OFF) as usize;
    let mut areas = Vec::new();
    // Descriptor areas of up to 1024 megablocks per read (16 MiB).
    for batch in held.chunks(1024) {
        let ranges: Vec<(u64, usize)> = batch
            .iter()
            .map(|&mb| (mb + FIRST_BDESCR_OFF, area))
            .collect();
        mem.read_ranges(&ranges, &mut areas)?;
        for (k, &mb) in batch.iter().enumerate() {
            if mb < covered_until {
                continue; // inside a group spanning several megablocks
            }
            let descriptors = &areas[k * area..(k + 1) * area];
            if stripped {
                let head = &descriptors[..BDESCR_SIZE as usize];
                let blocks = u64::from(u32::from_le_bytes(
                    head[BD_BLOCKS..BD_BLOCKS + 4].try_into().unwrap(),
                ));
                let empty = if head.iter().all(|&b| b == 0) {
                    Some(1) // returned, and its pages reclaimed
                } else if le_u64(head, BD_FREE) == FREE_GROUP && blocks >= BLOCKS_PER_MBLOCK {
                    Some(blocks_to_mblocks(blocks.max(BLOCKS_PER_MBLOCK)))
                } else {
                    None
                };
                if let Some(n) = empty {
                    census.megablocks -= n.min(census.megablocks);
                    census.empty_megablocks_uncounted += n;
                    covered_until = mb + n * MBLOCK_SIZE;
                    continue;
                }
            }
            covered_until = walk_megablock(mb, descriptors, nursery, &mut census, &mut groups)?
                .unwrap_or(covered_until);
        }
    }
    for g in &groups {
        let k = &mut census.kinds[g.kind as usize];
        k.groups += 1;
        k.blocks += g.blocks;
        k.used_bytes += g.used_bytes();
    }
    Ok((census, groups))
}

/// The census of a stripped executable's RTS: its heap found in /proc/PID/maps as the
/// 64-bit RTS lays it out (one reservation, MBLOCK-aligned, whose committed start is
/// read-write up to the high watermark and the rest inaccessible), every megablock
/// below the watermark walked, and the descriptors checked against themselves (each
/// group head at its own block, groups inside their megablock): anything else refuses the
/// census. Without the RTS's lists, the nursery is counted in generation 0, and empty
/// megablocks are not counted (the RTS's and those it returned look alike).
fn read_census_without_symbols(
    mem: &mut ProcessMemory,
) -> Result<(GhcBlocks, Vec<Group>), CensusError> {
    let maps = crate::maps::read(mem.pid())?;
    let (begin, high) = heap_reservation(&maps).ok_or(CensusError::NoHeap)?;
    if (high - begin) / MBLOCK_SIZE > MAX_MEGABLOCKS {
        return Err(CensusError::Inconsistent(format!(
            "the RTS's heap at {begin:#x} is {} megablocks: more than a census reads",
            (high - begin) / MBLOCK_SIZE
        )));
    }
    let held: Vec<u64> = (begin..high).step_by(MBLOCK_SIZE as usize).collect();
    walk_megablocks(mem, &held, &HashSet::new(), true)
}

/// The 64-bit RTS's heap in /proc/PID/maps: (begin, high watermark) of the read-write
/// anonymous mapping that starts on a megablock and is followed at once by the rest of
/// the reservation, an inaccessible anonymous mapping, together at least 1 GiB (the RTS
/// reserves a terabyte by default). None when no mapping, or more than one, fits.
fn heap_reservation(maps: &str) -> Option<(u64, u64)> {
    let maps: Vec<Mapping> = crate::maps::parse(maps).collect();
    let mut found = None;
    for pair in maps.windows(2) {
        let (rw, rest) = (&pair[0], &pair[1]);
        if rw.anonymous()
            && rw.perms == "rw-p"
            && rw.lo % MBLOCK_SIZE == 0
            && rw.hi % MBLOCK_SIZE == 0
            && rest.anonymous()
            && rest.perms == "---p"
            && rest.lo == rw.hi
            && rest.hi - rw.lo >= 1 << 30
        {
            if found.is_some() {
                return None;
            }
            found = Some((rw.lo, rw.hi));
        }
    }
    found
}

/// The ARR_WORDS info pointer of a stripped RTS: the first word of nearly every small
/// pinned group (they hold byte arrays, one after another), which must point into the
/// executable's code. None when no such word stands out.
fn infer_arr_words_info(
    mem: &mut ProcessMemory,
    groups: &[Group],
) -> Result<Option<u64>, CensusError> {
    // A few thousand groups tell as well as all of them, in a few milliseconds.
    let pinned: Vec<&Group> = groups
        .iter()
        .filter(|g| g.kind == GhcBlockKind::Pinned && g.used_bytes() >= 16)
        .collect();
    let step = (pinned.len() / 4096).max(1);
    let heads: Vec<(u64, usize)> = pinned.iter().step_by(step).map(|g| (g.start, 8)).collect();
    if heads.is_empty() {
        return Ok(None);
    }
    let mut words = Vec::new();
    mem.read_ranges(&heads, &mut words)?;
    let mut counts: HashMap<u64, usize> = HashMap::new();
    for w in words.chunks_exact(8) {
        *counts
            .entry(u64::from_le_bytes(w.try_into().unwrap()))
            .or_default() += 1;
    }
    let Some((&word, &n)) = counts.iter().max_by_key(|c| *c.1) else {
        return Ok(None);
    };
    if n * 10 < heads.len() * 9 {
        return Ok(None);
    }
    let maps = crate::maps::read(mem.pid())?;
    let exe = std::fs::read_link(format!("/proc/{}/exe", mem.pid()))?;
    let in_code = crate::maps::parse(&maps)
        .any(|m| m.perms.contains('x') && Path::new(m.path) == exe && m.lo <= word && word < m.hi);
    Ok(in_code.then_some(word))
}

/// Walks one megablock's descriptors, adding its groups to `groups` and its figures to
/// `census`; returns the end of a group that spans several megablocks, if it starts here.
fn walk_megablock(
    mb: u64,
    descriptors: &[u8],
    nursery: &HashSet<u64>,
    census: &mut GhcBlocks,
    groups: &mut Vec<Group>,
) -> Result<Option<u64>, CensusError> {
    let mut i = 0u64;
    let mut in_use_here = 0u64;
    let first_group = groups.len();
    while i < BLOCKS_PER_MBLOCK {
        let d = &descriptors[(i * BDESCR_SIZE) as usize..][..BDESCR_SIZE as usize];
        let start = le_u64(d, BD_START);
        let expected = mb + FIRST_BLOCK_OFF + i * BLOCK_SIZE;
        let blocks = u64::from(u32::from_le_bytes(
            d[BD_BLOCKS..BD_BLOCKS + 4].try_into().unwrap(),
        ));
        if start != expected || blocks == 0 {
            return Err(CensusError::Inconsistent(format!(
                "the descriptor of block {i} of the megablock at {mb:#x} is not a group's \
                 head (start {start:#x}, {blocks} blocks): not the block layout the census reads"
            )));
        }
        let free = le_u64(d, BD_FREE);
        let descriptor = mb + FIRST_BDESCR_OFF + i * BDESCR_SIZE;
        if i == 0 && blocks > BLOCKS_PER_MBLOCK {
            // A group of several megablocks: counted as the RTS counts it, whole
            // megablocks of BLOCKS_PER_MBLOCK blocks each.
            let mblocks = blocks_to_mblocks(blocks);
            if free == FREE_GROUP {
                census.free_blocks += mblocks * BLOCKS_PER_MBLOCK;
                census.megablock_fill[0] += mblocks;
            } else {
                groups.push(Group {
                    start,
                    free,
                    blocks: mblocks * BLOCKS_PER_MBLOCK,
                    kind: classify(d, nursery, descriptor),
                    sparse: false,
                });
                *census.megablock_fill.last_mut().unwrap() += mblocks;
            }
            return Ok(Some(mb + mblocks * MBLOCK_SIZE));
        }
        if blocks > BLOCKS_PER_MBLOCK - i {
            return Err(CensusError::Inconsistent(format!(
                "a group of {blocks} blocks at block {i} of the megablock at {mb:#x} runs \
                 past its end"
            )));
        }
        if free == FREE_GROUP {
            census.free_blocks += blocks;
        } else {
            groups.push(Group {
                start,
                free,
                blocks,
                kind: classify(d, nursery, descriptor),
                sparse: false,
            });
            in_use_here += blocks;
        }
        i += blocks;
    }
    let bucket = if in_use_here == 0 {
        0
    } else {
        1 + MEGABLOCK_FILL_BOUNDS
            .iter()
            .position(|&b| in_use_here <= u64::from(b))
            .unwrap_or(MEGABLOCK_FILL_BOUNDS.len() - 1)
    };
    census.megablock_fill[bucket] += 1;
    if in_use_here > 0 && in_use_here <= u64::from(SPARSE_MEGABLOCK_BLOCKS) {
        census.sparse_megablocks += 1;
        for g in &mut groups[first_group..] {
            g.sparse = true;
            census.sparse_blocks[g.kind as usize] += g.blocks;
        }
    }
    Ok(None)
}

fn classify(d: &[u8], nursery: &HashSet<u64>, descriptor: u64) -> GhcBlockKind {
    let flags = u16::from_le_bytes(d[BD_FLAGS..BD_FLAGS + 2].try_into().unwrap());
    let gen_no = u16::from_le_bytes(d[BD_GEN_NO..BD_GEN_NO + 2].try_into().unwrap());
    let gen = le_u64(d, BD_GEN);
    if flags & BF_COMPACT != 0 {
        GhcBlockKind::Compact
    } else if flags & BF_NONMOVING != 0 {
        GhcBlockKind::Nonmoving
    } else if flags & BF_PINNED != 0 {
        // Blocks of small pinned objects carry BF_LARGE too (the GC moves them whole, as
        // large objects); a large pinned object is a pinned group with one object.
        GhcBlockKind::Pinned
    } else if flags & BF_LARGE != 0 {
        GhcBlockKind::Large
    } else if nursery.contains(&descriptor) {
        GhcBlockKind::Nursery
    } else if gen == 0 {
        GhcBlockKind::Other
    } else if gen_no == 0 {
        GhcBlockKind::Gen0
    } else {
        GhcBlockKind::OldGenerations
    }
}

/// A byte array in a pinned block (16 bytes: a heap may hold millions).
#[derive(Debug, Clone, Copy)]
struct PinnedObject {
    start: u64,
    bytes: u32,
    /// Its group's index; the top bit marks it live.
    group: u32,
}

const LIVE: u32 = 1 << 31;

impl PinnedObject {
    fn end(&self) -> u64 {
        self.start + u64::from(self.bytes)
    }
    fn group(&self) -> usize {
        (self.group & !LIVE) as usize
    }
    fn live(&self) -> bool {
        self.group & LIVE != 0
    }
}

/// More pinned objects than this and the liveness scan is not made (its tables would
/// cost the recorder too much memory).
const MAX_PINNED_OBJECTS: usize = 8 << 20;

/// Block kinds whose objects may refer to pinned objects: not byte arrays (pinned), not
/// compact regions (which refuse pinned data), not the RTS's own lists.
fn refers(kind: GhcBlockKind) -> bool {
    !matches!(
        kind,
        GhcBlockKind::Pinned | GhcBlockKind::Compact | GhcBlockKind::Other
    )
}

/// Bytes the liveness scan reads: the pinned blocks and the blocks that may refer to them.
/// Bytes the reference scan reads at a time (and, while the program runs, between two
/// looks at its collection count).
const SCAN_BATCH: usize = 16 << 20;

fn liveness_work(groups: &[Group]) -> u64 {
    let pinned: u64 = groups
        .iter()
        .filter(|g| g.kind == GhcBlockKind::Pinned)
        .map(Group::used_bytes)
        .sum();
    if pinned == 0 {
        return 0;
    }
    pinned
        + groups
            .iter()
            .filter(|g| refers(g.kind))
            .map(Group::used_bytes)
            .sum::<u64>()
}

/// The pinned blocks, indexed over the address range they span: the scan asks about
/// every word of the heap, and must find the objects of a block without a search of all.
#[derive(Default)]
struct BlockSet {
    blocks: Vec<u64>,
    first: u64,
    /// By block of the range: the index of the first object at or after its start; one
    /// more entry (the object count) ends the last block.
    first_object: Vec<u32>,
    /// By block of the range: pinned or not.
    pinned: Vec<u64>,
}

impl BlockSet {
    fn insert(&mut self, block: u64) {
        self.blocks.push(block / BLOCK_SIZE);
    }

    fn freeze(&mut self, lowest: u64, highest: u64, objects: &[PinnedObject]) {
        self.first = lowest / BLOCK_SIZE;
        let n = (highest.div_ceil(BLOCK_SIZE)).saturating_sub(self.first) as usize;
        // Objects are in address order: one pass gives each block its first object.
        let mut i = 0usize;
        self.first_object = (0..=n)
            .map(|b| {
                let block_start = (self.first + b as u64) * BLOCK_SIZE;
                while i < objects.len() && objects[i].start < block_start {
                    i += 1;
                }
                i as u32
            })
            .collect();
        self.pinned = vec![0; n.div_ceil(64)];
        for &b in &self.blocks {
            if let Some(i) = b.checked_sub(self.first).map(|i| i as usize) {
                if i < n {
                    self.pinned[i / 64] |= 1 << (i % 64);
                }
            }
        }
        self.blocks = Vec::new();
    }

    /// The objects that may hold `addr` (within the frozen range): those starting in its
    /// block, and the one before them (it may run into the block); `None` when `addr`
    /// is not in a pinned block.
    fn objects_around(&self, addr: u64) -> Option<std::ops::Range<usize>> {
        let b = (addr / BLOCK_SIZE - self.first) as usize;
        if self.pinned.get(b / 64)? >> (b % 64) & 1 == 0 {
            return None;
        }
        let from = self.first_object[b] as usize;
        let to = self.first_object[b + 1] as usize;
        Some(from.saturating_sub(1)..to)
    }
}

/// The byte arrays laid one after another in a pinned group's used bytes `data` (at
/// `start`): each begins with the ARR_WORDS info pointer and its payload size. A word
/// that is not a header is stepped over: the padding newAlignedPinnedByteArray# leaves
/// before an aligned array, or an array being written when the program was stopped.
fn parse_byte_arrays(
    data: &[u8],
    start: u64,
    group: usize,
    arr_words_info: u64,
    objects: &mut Vec<PinnedObject>,
) {
    let mut at = 0usize;
    while at + 16 <= data.len() {
        if le_u64(data, at) != arr_words_info {
            at += 8;
            continue;
        }
        let payload = le_u64(data, at + 8);
        let size = 16 + payload.div_ceil(8) * 8;
        if size > (data.len() - at) as u64 || size >= u64::from(LIVE) {
            break;
        }
        objects.push(PinnedObject {
            start: start + at as u64,
            bytes: size as u32,
            group: group as u32,
        });
        at += size as usize;
    }
}

/// Which small pinned objects the rest of the heap refers to: every word of the used
/// part of the nursery, generation, large-object and RTS blocks is compared with the
/// pinned objects' ranges (byte arrays hold no pointers, so pinned blocks and large byte
/// arrays are not read for references). A word that looks like a pointer is taken as one,
/// so a dead object not yet collected, or a number that happens to fall inside a pinned
/// object, makes it count as live: live bytes are an upper bound.
/// `collections`: the program runs meanwhile, and had made this many collections when
/// its descriptors were read; the scan stops (`None`) as soon as it sees another, which
/// moved what it reads.
fn pinned_liveness(
    mem: &mut ProcessMemory,
    arr_words_info: u64,
    collections: Option<(u64, u32)>,
    groups: &[Group],
) -> Result<Option<GhcPinnedLiveness>, CensusError> {
    let spoilt = |mem: &mut ProcessMemory| {
        collections.is_some_and(|(stats, n)| mem.read_u32(stats).ok() != Some(n))
    };
    let pinned: Vec<usize> = (0..groups.len())
        .filter(|&i| groups[i].kind == GhcBlockKind::Pinned)
        .collect();
    if pinned.is_empty() {
        return Ok(None);
    }
    let scanned: Vec<&Group> = groups.iter().filter(|g| refers(g.kind)).collect();
    // The objects of each pinned group, in address order.
    let mut objects: Vec<PinnedObject> = Vec::new();
    let mut pinned_blocks = BlockSet::default();
    let mut buf = Vec::new();
    for batch in pinned.chunks(1024) {
        let ranges: Vec<(u64, usize)> = batch
            .iter()
            .map(|&gi| (groups[gi].start, groups[gi].used_bytes() as usize))
            .collect();
        mem.read_ranges(&ranges, &mut buf)?;
        let mut from = 0usize;
        for &gi in batch {
            let g = &groups[gi];
            for b in 0..g.blocks {
                pinned_blocks.insert(g.start + b * BLOCK_SIZE);
            }
            let used = g.used_bytes() as usize;
            parse_byte_arrays(
                &buf[from..from + used],
                g.start,
                gi,
                arr_words_info,
                &mut objects,
            );
            from += used;
            if objects.len() > MAX_PINNED_OBJECTS {
                return Ok(None);
            }
        }
    }
    objects.sort_unstable_by_key(|o| o.start);
    let lowest = objects.first().map_or(0, |o| o.start);
    let highest = objects.last().map_or(0, |o| o.end());
    pinned_blocks.freeze(lowest, highest, &objects);
    // The ranges to read for references, cut into pieces of at most 1 MiB, read 16 MiB
    // at a time.
    // Large byte arrays hold bytes, not pointers: their first words say which they are.
    let large: Vec<(u64, usize)> = scanned
        .iter()
        .filter(|g| g.kind == GhcBlockKind::Large && g.used_bytes() >= 8)
        .map(|g| (g.start, 8))
        .collect();
    mem.read_ranges(&large, &mut buf)?;
    let byte_arrays: HashSet<u64> = large
        .iter()
        .zip(buf.chunks_exact(8))
        .filter(|(_, w)| u64::from_le_bytes((*w).try_into().unwrap()) == arr_words_info)
        .map(|(r, _)| r.0)
        .collect();
    let mut pieces: Vec<(u64, usize)> = Vec::new();
    for g in scanned {
        let used = g.used_bytes();
        if byte_arrays.contains(&g.start) {
            continue;
        }
        let mut off = 0;
        while off < used {
            let n = (used - off).min(1 << 20);
            pieces.push((g.start + off, n as usize));
            off += n;
        }
    }
    let mut scanned_bytes = 0u64;
    let mut batch = Vec::new();
    let mut pieces = pieces.into_iter().peekable();
    while pieces.peek().is_some() {
        batch.clear();
        let mut batch_bytes = 0usize;
        while let Some(&p) = pieces.peek() {
            if batch_bytes > 0 && batch_bytes + p.1 > SCAN_BATCH {
                break;
            }
            batch.push(p);
            batch_bytes += p.1;
            pieces.next();
        }
        if spoilt(mem) {
            return Ok(None);
        }
        mem.read_ranges(&batch, &mut buf)?;
        scanned_bytes += batch_bytes as u64;
        for word in buf.chunks_exact(8) {
            let w = u64::from_le_bytes(word.try_into().unwrap());
            if w < lowest || w >= highest {
                continue;
            }
            let Some(candidates) = pinned_blocks.objects_around(w) else {
                continue;
            };
            // The last object starting at or before `w`, among those of its block (and the
            // one before them, which may run into it).
            let i = candidates.start + objects[candidates].partition_point(|o| o.start <= w);
            if i > 0 && w < objects[i - 1].end() {
                objects[i - 1].group |= LIVE;
            }
        }
    }
    let mut live_by_group: HashMap<usize, u64> = HashMap::new();
    let mut result = GhcPinnedLiveness {
        objects: objects.len() as u64,
        scanned_bytes,
        ..Default::default()
    };
    for o in objects.iter().filter(|o| o.live()) {
        *live_by_group.entry(o.group()).or_default() += u64::from(o.bytes);
        result.live_objects += 1;
        result.live_bytes += u64::from(o.bytes);
    }
    for &gi in &pinned {
        let g = &groups[gi];
        let live = live_by_group.get(&gi).copied().unwrap_or(0);
        let decile = (live * 10 / g.held_bytes()).min(9) as usize;
        result.occupancy[decile] += 1;
        if g.sparse {
            result.sparse_live_bytes += live;
        }
    }
    Ok(Some(result))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_block_geometry_is_ghcs() {
        assert_eq!(BLOCKS_PER_MBLOCK, 252);
        assert_eq!(FIRST_BLOCK_OFF, 16384);
        assert_eq!(FIRST_BDESCR_OFF, 256);
        // MBLOCK_GROUP_BLOCKS(n) = 252 + (n-1)*256, and back.
        assert_eq!(blocks_to_mblocks(252 + 256), 2);
        assert_eq!(blocks_to_mblocks(252 + 1), 2);
        assert_eq!(blocks_to_mblocks(252 + 3 * 256), 4);
    }

    #[test]
    fn rts_info_is_read_from_its_own_words() {
        let text = " [(\"GHC RTS\", \"YES\")\n ,(\"GHC version\", \"9.0.2\")\n ,(\"RTS way\", \"rts_thr_l\")\n ]";
        let info = RtsInfo::parse(text).unwrap();
        assert_eq!(info.version, "9.0.2");
        assert_eq!(info.way, "rts_thr_l");
        assert!(!info.profiling());
        assert!(RtsInfo::parse("hello").is_none());
        let prof = RtsInfo {
            version: "9.0.2".into(),
            way: "rts_p".into(),
        };
        assert!(prof.profiling());
    }

    #[test]
    fn an_unverified_rts_gets_a_note_not_a_census() {
        let me = std::fs::read("/proc/self/exe").unwrap();
        let later = RtsInfo {
            version: "9.8.1".into(),
            way: "rts_l".into(),
        };
        let note = GhcRts::new(&me, later, None).unwrap_err();
        assert!(note.contains("GHC 9.8.1"), "{note}");
        assert!(note.contains("9.6 (9.6.6, Debian 13)"), "{note}");
        assert!(note.contains("eventlog alone"), "{note}");
        assert_eq!(release_of("9.10.3").unwrap().series, "9.10");
        assert_eq!(release_of("9.1.0"), None);
        assert_eq!(release_of("9"), None);
        let ours = RtsInfo {
            version: "9.0.2".into(),
            way: "rts_l".into(),
        };
        // No RTS symbol at all: a stripped executable, read from its descriptors alone.
        assert!(!GhcRts::new(&me, ours, None).unwrap().has_symbols());
    }

    /// /proc/PID/maps of a stripped GHC 9.0.2 server (tests/ghc/Conns.hs): its heap is
    /// the read-write start of the RTS's reservation, the rest inaccessible.
    #[test]
    fn a_stripped_rts_heap_is_found_in_its_mappings() {
        let maps = "\
00400000-004d7000 r-xp 00000000 fe:00 9978862                            /tmp/ghcx/conns-stripped
004d9000-004e7000 rw-p 000d8000 fe:00 9978862                            /tmp/ghcx/conns-stripped
004e7000-004ec000 rw-p 00000000 00:00 0
2754f000-27570000 rw-p 00000000 00:00 0                                  [heap]
4200000000-4235600000 rw-p 00000000 00:00 0
4235600000-14200100000 ---p 00000000 00:00 0
7f06704bf000-7f0670516000 r--p 00000000 fe:00 316526                     /usr/lib/locale/C.utf8/LC_CTYPE
7f0670516000-7f0670518000 rw-p 00000000 00:00 0
";
        assert_eq!(
            heap_reservation(maps),
            Some((0x42_0000_0000, 0x42_3560_0000))
        );
        // No reservation after it (a program that is not a 64-bit GHC one): none.
        let cut: String = maps
            .lines()
            .filter(|l| !l.contains("---p"))
            .map(|l| format!("{l}\n"))
            .collect();
        assert_eq!(heap_reservation(&cut), None);
        // Two candidates: cannot tell, so none.
        let twice = format!("{maps}7f1000000000-7f1000100000 rw-p 00000000 00:00 0\n7f1000100000-7f1080000000 ---p 00000000 00:00 0\n");
        assert_eq!(heap_reservation(&twice), None);
    }
}
