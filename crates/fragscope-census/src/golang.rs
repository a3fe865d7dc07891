//! Go's heap, read from outside the program: its runtime's span table.
//!
//! Go's allocator hands out objects from *spans* (runs of 8 KiB runtime pages), each of
//! one size class or holding one large object, and keeps goroutine stacks in spans of
//! their own. Every span the runtime ever made is in `mheap_.allspans` with its state,
//! size class, slots (`nelems`) and allocated slots (`allocCount`); the address ranges
//! its page allocator manages are `mheap_.pages.inUse`. Pages of those ranges in no span
//! are free: kept resident, or released to the kernel by the scavenger.
//!
//! The layouts change between releases (fields are added, renamed, moved), so they are
//! read from the executable's own DWARF (which `go build` writes unless `-ldflags=-w` or
//! `-s`): the offsets of `runtime.mspan`'s and `runtime.mheap`'s fields, and their sizes.
//! A field the census needs that the DWARF does not describe refuses the census rather
//! than guess. A program built without DWARF gets the layouts of its release from a table
//! made from each release's DWARF (`releases`), and one without a symbol table has the
//! runtime's variables found in its code (`pclntab`). The figures are checked against the runtime's own count of pages in object
//! spans (`mheap_.pagesInUse`) before they are kept: a stop that lands while the runtime
//! is changing a span finds them apart, and the census is taken again.

use std::collections::HashMap;

use fragscope_trace::go_heap::{GoBucket, GoHeap, GoProfile, GoSpan, GoSpanKind};
use object::{Object, ObjectSection};

use crate::memory::{le_u64, RecordReader};
use crate::{ProcessMemory, Symbols};

mod dwarf;
mod layout;
mod pclntab;
mod releases;

use layout::{Field, HeapLayout, Layouts, ProfileStructs, SpanLayout};

/// The runtime's page (`_PageSize`), the same on every platform and release.
pub const GO_PAGE: u64 = 8192;

/// `mspan.state` values (`mSpanDead`, `mSpanInUse`, `mSpanManual`), unchanged since 1.12.
const SPAN_DEAD: u8 = 0;
const SPAN_IN_USE: u8 = 1;
const SPAN_MANUAL: u8 = 2;

/// A span larger than this many bytes, or more spans than this, are not a heap a census
/// can hold: corrupt pointers rather than a program.
const MAX_SPANS: u64 = 64 << 20;
const MAX_RANGES: u64 = 1 << 20;

/// A Go program's runtime, as far as the census reads it.
#[derive(Debug, Clone)]
pub struct GoRuntime {
    /// "go1.26.8".
    pub version: String,
    /// Where `runtime.mheap_` is in the process.
    mheap: u64,
    heap: HeapLayout,
    span: SpanLayout,
    /// The heap profile's layout, or why it cannot be read.
    profile: Result<ProfileLayout, String>,
}

impl GoRuntime {
    /// Whether process `pid` runs a Go program: `None` for another program, `Some(Err)`
    /// for a Go program whose heap the census cannot read (why, in a sentence).
    pub fn detect(pid: u32) -> Option<Result<Self, String>> {
        let elf = crate::image::map(format!("/proc/{pid}/exe")).ok()?;
        Self::of_executable(&elf, Some(pid))
    }

    /// As [`GoRuntime::detect`], for an executable's bytes (`pid`: where it runs, for
    /// its load bias; None: not placed).
    pub fn of_executable(elf: &[u8], pid: Option<u32>) -> Option<Result<Self, String>> {
        let file = object::File::parse(elf).ok()?;
        let version = go_version(&file)?;
        Some(Self::read(&file, elf, version, pid))
    }

    fn read(
        file: &object::File,
        elf: &[u8],
        version: String,
        pid: Option<u32>,
    ) -> Result<Self, String> {
        let refuse = |why: String| format!("no Go heap census of this {version} program: {why}");
        let layouts = if file.section_by_name(".debug_info").is_some() {
            Layouts::from_dwarf(file)
        } else {
            Layouts::of_release(&version)
        }
        .map_err(refuse)?;
        let mut symbols = Symbols::resolve(elf, &VARIABLES, pid).map_err(refuse)?;
        if symbols.get("runtime.mheap_").is_none() {
            let found = pclntab::runtime_variables(file).map_err(|why| {
                refuse(format!(
                    "it has no symbol table (built with -ldflags=-s), and {why}"
                ))
            })?;
            symbols = Symbols::place(elf, found, pid).map_err(refuse)?;
        }
        let mheap = symbols.need("runtime.mheap_").map_err(refuse)?;
        let profile = layouts.profile.and_then(|structs| {
            let variables = ProfileVariables::new(&symbols)
                .map_err(|why| format!("its heap profile cannot be read: {why}"))?;
            Ok(ProfileLayout { variables, structs })
        });
        Ok(Self {
            version,
            mheap,
            heap: layouts.heap,
            span: layouts.span,
            profile,
        })
    }
}

/// The runtime's variables the census reads, by their names in the symbol table (which
/// `pclntab::runtime_variables` gives too, from the code, for a program without one).
const VARIABLES: [&str; 5] = [
    "runtime.mheap_",
    "runtime.mbuckets",
    "runtime.mProfCycle",
    "runtime.MemProfileRate",
    "runtime.disableMemoryProfiling",
];

/// The table's entry for the release that built an executable, as its own DWARF gives
/// the layouts (a line of `releases.tsv`), and whether the table holds the same.
#[derive(Debug)]
pub struct ReleaseEntry {
    /// "go1.22.12".
    pub version: String,
    /// The entry as a line of `releases.tsv` (its columns: [`release_table_header`]).
    pub line: String,
    /// None: the table has no entry for the release's series; else whether its entry
    /// is the DWARF's, and the release whose DWARF the entry was made from.
    pub agrees: Option<(bool, String)>,
}

/// The header of the release table (`releases.tsv`): its columns' names.
pub fn release_table_header() -> String {
    layout::Release::header()
}

/// The table's entry for the Go release that built `elf` (an executable with DWARF).
pub fn release_entry(elf: &[u8]) -> Result<ReleaseEntry, String> {
    let file = object::File::parse(elf).map_err(|e| format!("not an ELF file ({e})"))?;
    let version = go_version(&file).ok_or("not a Go program")?;
    let series =
        layout::release_series(&version).ok_or_else(|| format!("{version} is not a release"))?;
    let release = layout::Release {
        series: series.to_string(),
        derived_from: version.clone(),
        layouts: Layouts::from_dwarf(&file)?,
    };
    let agrees = (releases::releases().ok())
        .and_then(|table| table.iter().find(|r| r.series == series))
        .map(|r| (r.layouts == release.layouts, r.derived_from.clone()));
    let line = release.row()?;
    Ok(ReleaseEntry {
        version,
        line,
        agrees,
    })
}

/// A runtime variable the census reads, found in the code of a program as it is for one
/// without a symbol table, beside its symbol.
#[derive(Debug)]
pub struct FoundVariable {
    pub name: &'static str,
    /// Its address as linked, found in the code.
    pub in_code: Option<u64>,
    /// Its symbol's address (the linker leaves some out).
    pub symbol: Option<u64>,
}

/// Each runtime variable the census reads, as the search in the code finds it in `elf`
/// (the search a program without a symbol table gets), beside its symbol.
pub fn variables_found_in_code(elf: &[u8]) -> Result<Vec<FoundVariable>, String> {
    let file = object::File::parse(elf).map_err(|e| format!("not an ELF file ({e})"))?;
    let found = pclntab::runtime_variables(&file)?;
    let symbols = Symbols::resolve(elf, &VARIABLES, None)?;
    Ok(VARIABLES
        .iter()
        .map(|&name| FoundVariable {
            name,
            in_code: found.get(name).copied(),
            symbol: symbols.get(name),
        })
        .collect())
}

/// The Go release that built the executable, from its `.go.buildinfo` section: None for
/// an executable Go did not build.
fn go_version(file: &object::File) -> Option<String> {
    let data = file.section_by_name(".go.buildinfo")?.data().ok()?;
    const MAGIC: &[u8] = b"\xff Go buildinf:";
    if !data.starts_with(MAGIC) || data.len() < 33 {
        return None;
    }
    let flags = data[15];
    // Since Go 1.18 the strings follow the header inline, each prefixed by its varint
    // length; before, the header held pointers to them (those releases are not read).
    if flags & 2 == 0 {
        return Some("go1.17 or older".into());
    }
    let (len, used) = uvarint(&data[32..])?;
    let start = 32 + used;
    let bytes = data.get(start..start.checked_add(len as usize)?)?;
    String::from_utf8(bytes.to_vec()).ok()
}

fn uvarint(b: &[u8]) -> Option<(u64, usize)> {
    let mut v = 0u64;
    for (i, &byte) in b.iter().enumerate().take(10) {
        v |= u64::from(byte & 0x7f) << (7 * i);
        if byte & 0x80 == 0 {
            return Some((v, i + 1));
        }
    }
    None
}

fn read_field(b: &[u8], f: Field) -> u64 {
    let mut word = [0u8; 8];
    word[..f.size].copy_from_slice(&b[f.offset..f.offset + f.size]);
    u64::from_le_bytes(word)
}

/// Where the heap profile's variables are in the process.
#[derive(Debug, Clone)]
struct ProfileVariables {
    mbuckets: u64,
    cycle: u64,
    rate: u64,
    /// `disableMemoryProfiling`, which the linker may leave out of the symbol table.
    disabled: Option<u64>,
}

impl ProfileVariables {
    fn new(symbols: &Symbols) -> Result<Self, String> {
        Ok(Self {
            mbuckets: symbols.need("runtime.mbuckets")?,
            cycle: symbols.need("runtime.mProfCycle")?,
            rate: symbols.need("runtime.MemProfileRate")?,
            disabled: symbols.get("runtime.disableMemoryProfiling"),
        })
    }
}

/// The heap profile: where its variables are, and its structs' layouts.
#[derive(Debug, Clone)]
struct ProfileLayout {
    variables: ProfileVariables,
    structs: ProfileStructs,
}

/// `memProfile`'s value of `bucket.typ` (bucketType's first value, 1, since Go 1.1).
const MEM_PROFILE: u64 = 1;
/// Buckets past this many are not a profile a census can hold.
const MAX_BUCKETS: usize = 1 << 20;
/// `maxProfStackDepth`, the deepest stack a bucket holds (1024 since Go 1.23).
const MAX_STACK: u64 = 1024;

/// A bucket's allocations and frees in one profile cycle (`memRecordCycle`).
fn cycle_counts(l: &ProfileStructs, b: &[u8]) -> [u64; 2] {
    [read_field(b, l.allocs), read_field(b, l.frees)]
}

fn add_counts(a: &mut [u64; 2], b: [u64; 2]) {
    for (x, y) in a.iter_mut().zip(b) {
        *x = x.wrapping_add(y);
    }
}

/// The heap profile as `runtime.MemProfile` would return it now: each bucket's published
/// cycle plus the one waiting to be flushed into it (`mProf_FlushLocked`), or, before any
/// collection published one, every cycle.
fn read_profile(
    mem: &mut ProcessMemory,
    reader: &mut RecordReader,
    layout: &ProfileLayout,
    span_specials: &[(u64, u64)],
) -> Result<Result<GoProfile, String>, GoCensusError> {
    use GoCensusError::*;
    let (v, l) = (&layout.variables, &layout.structs);
    let unreadable = |e: std::io::Error| Unreadable(e.to_string());
    if let Some(at) = v.disabled {
        if mem.read_u8(at).map_err(unreadable)? != 0 {
            return Ok(Err(
                "the program keeps no heap profile: it was linked without \
                 the heap profiler (it imports neither runtime/pprof nor net/http/pprof), \
                 and then GODEBUG=memprofilerate cannot turn it on; importing either \
                 (import _ \"runtime/pprof\") makes its runtime keep one"
                    .into(),
            ));
        }
    }
    let rate = mem.read_u64(v.rate).map_err(unreadable)?;
    if rate == 0 {
        return Ok(Err(
            "the program keeps no heap profile: it set runtime.MemProfileRate to 0".into(),
        ));
    }
    let index = ((mem.read_u32(v.cycle).map_err(unreadable)? >> 1) % 3) as usize;
    let mut buckets = Vec::new();
    let mut futures = Vec::new();
    let mut by_address = HashMap::new();
    let mut at = mem.read_u64(v.mbuckets).map_err(unreadable)?;
    let mut header = vec![0u8; l.bucket_size];
    while at != 0 {
        if buckets.len() >= MAX_BUCKETS {
            return Err(Inconsistent(
                "the heap profile's bucket list does not end".into(),
            ));
        }
        reader
            .read_into(mem, at, &mut header, "a profile bucket")
            .map_err(Unreadable)?;
        let nstk = read_field(&header, l.nstk);
        if read_field(&header, l.typ) != MEM_PROFILE || nstk > MAX_STACK {
            return Err(Inconsistent(format!(
                "a heap profile bucket at {at:#x} is not one"
            )));
        }
        let mut rest = vec![0u8; nstk as usize * 8 + l.record_size];
        let rest_at = at + l.bucket_size as u64;
        reader
            .read_into(mem, rest_at, &mut rest, "a profile bucket")
            .map_err(Unreadable)?;
        let (stack, record) = rest.split_at(nstk as usize * 8);
        let cycle = |i: usize| {
            let from = l.future.offset + i * l.cycle_size;
            cycle_counts(l, &record[from..from + l.cycle_size])
        };
        let mut counts = cycle_counts(l, &record[l.active.offset..l.active.offset + l.cycle_size]);
        add_counts(&mut counts, cycle(index));
        futures.push([cycle(0), cycle(1), cycle(2)]);
        by_address.insert(at, buckets.len() as u32);
        let size = read_field(&header, l.size);
        let stack: Vec<u64> = stack.chunks_exact(8).map(|w| le_u64(w, 0)).collect();
        buckets.push((stack, size, counts));
        at = read_field(&header, l.allnext);
    }
    // No collection has published a cycle yet: the runtime then counts every cycle.
    if buckets.iter().all(|(_, _, c)| c[0] == 0 && c[1] == 0) {
        for ((_, _, counts), f) in buckets.iter_mut().zip(&futures) {
            for (i, c) in f.iter().enumerate() {
                if i != index {
                    add_counts(counts, *c);
                }
            }
        }
    }
    let buckets = buckets
        .into_iter()
        .map(|(stack, size, [allocs, frees])| GoBucket {
            stack,
            allocs,
            frees,
            alloc_bytes: allocs.wrapping_mul(size),
            free_bytes: frees.wrapping_mul(size),
        })
        .collect();
    let mut objects = Vec::new();
    let mut special = [0u8; 64];
    let special_bytes = (l.special_bucket.offset + 8).max(l.special_kind.offset + 1);
    for &(span_start, mut at) in span_specials {
        let mut seen = 0;
        while at != 0 {
            seen += 1;
            if seen > 1 << 20 {
                return Err(Inconsistent(format!(
                    "the specials of the span at {span_start:#x} do not end"
                )));
            }
            let s = &mut special[..special_bytes];
            reader
                .read_into(mem, at, s, "a span special")
                .map_err(Unreadable)?;
            if read_field(s, l.special_kind) == l.kind_profile {
                let bucket = read_field(s, l.special_bucket);
                let index = by_address.get(&bucket).copied().ok_or_else(|| {
                    Inconsistent(format!("a profile special at {at:#x} names no bucket"))
                })?;
                objects.push((span_start + read_field(s, l.special_offset), index));
            }
            at = read_field(s, l.special_next);
        }
    }
    objects.sort_unstable();
    Ok(Ok(GoProfile {
        rate,
        buckets,
        objects,
    }))
}

/// Why a census was not taken.
#[derive(Debug)]
pub enum GoCensusError {
    /// The process's memory could not be read (it exited, or access was refused).
    Unreadable(String),
    /// What was read did not hold together: a stop in the middle of the runtime changing
    /// a span, or a layout not the one described; worth another try.
    Inconsistent(String),
}

impl std::fmt::Display for GoCensusError {
    fn fmt(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        match self {
            GoCensusError::Unreadable(e) | GoCensusError::Inconsistent(e) => f.write_str(e),
        }
    }
}

/// The census of a Go program's heap. The caller holds the process stopped.
pub fn census(mem: &mut ProcessMemory, rt: &GoRuntime) -> Result<GoHeap, GoCensusError> {
    use GoCensusError::*;
    let unreadable = |e: std::io::Error| Unreadable(e.to_string());
    let mut heap = vec![0u8; rt.heap.read];
    mem.read(rt.mheap, &mut heap).map_err(unreadable)?;
    let h = &rt.heap;
    let heap_sweepgen = read_field(&heap, h.sweepgen) as u32;
    let pages_in_use = read_field(&heap, h.pages_in_use);

    let (ranges_at, n_ranges) = (
        le_u64(&heap, h.in_use_ranges.offset),
        le_u64(&heap, h.in_use_ranges.offset + 8),
    );
    if n_ranges > MAX_RANGES {
        return Err(Inconsistent(format!(
            "the page allocator has {n_ranges} ranges"
        )));
    }
    let mut raw = vec![0u8; n_ranges as usize * 16];
    mem.read(ranges_at, &mut raw).map_err(unreadable)?;
    let ranges: Vec<(u64, u64)> = raw
        .chunks_exact(16)
        .map(|r| (le_u64(r, 0), le_u64(r, 8)))
        .collect();
    let total: u64 = ranges.iter().map(|(lo, hi)| hi.wrapping_sub(*lo)).sum();
    if ranges.iter().any(|(lo, hi)| lo >= hi) || total != read_field(&heap, h.in_use_total) {
        return Err(Inconsistent(
            "the page allocator's ranges do not add up to its total".into(),
        ));
    }

    let (spans_at, n_spans) = (
        le_u64(&heap, h.allspans.offset),
        le_u64(&heap, h.allspans.offset + 8),
    );
    if n_spans > MAX_SPANS {
        return Err(Inconsistent(format!(
            "mheap_.allspans holds {n_spans} spans"
        )));
    }
    let mut pointers = vec![0u8; n_spans as usize * 8];
    mem.read(spans_at, &mut pointers).map_err(unreadable)?;
    let mut reader = RecordReader::default();
    let mut spans = Vec::new();
    let l = &rt.span;
    let mut bytes = vec![0u8; l.size];
    // (start, first special) of every span of objects with specials.
    let mut span_specials = Vec::new();
    let specials = rt.profile.as_ref().ok().map(|p| p.structs.specials);
    for p in pointers.chunks_exact(8) {
        let at = le_u64(p, 0);
        reader
            .read_into(mem, at, &mut bytes, "a span")
            .map_err(Unreadable)?;
        let field = |f: Field| read_field(&bytes, f);
        let state = field(l.state) as u8;
        let kind = match state {
            SPAN_DEAD => continue,
            SPAN_IN_USE => GoSpanKind::Objects,
            SPAN_MANUAL => GoSpanKind::Stacks,
            s => return Err(Inconsistent(format!("a span at {at:#x} in state {s}"))),
        };
        let span_sweepgen = field(l.sweepgen) as u32;
        let spanclass = field(l.spanclass) as u8;
        let span = GoSpan {
            start: field(l.start_addr),
            pages: field(l.npages),
            kind,
            class: spanclass >> 1,
            noscan: spanclass & 1 != 0,
            slots: field(l.nelems) as u32,
            in_use: field(l.alloc_count) as u32,
            slot_bytes: field(l.elemsize),
            // `sweepgen == h.sweepgen - 2`: needs sweeping; `- 1`: being swept.
            unswept: kind == GoSpanKind::Objects
                && (span_sweepgen == heap_sweepgen.wrapping_sub(2)
                    || span_sweepgen == heap_sweepgen.wrapping_sub(1)),
        };
        check_span(&span, at)?;
        if let Some(f) = specials.filter(|_| kind == GoSpanKind::Objects) {
            let first = field(f);
            if first != 0 {
                span_specials.push((span.start, first));
            }
        }
        spans.push(span);
    }
    spans.sort_by_key(|s| s.start);
    check_spans(&spans, &ranges, pages_in_use)?;
    let profile = match &rt.profile {
        Ok(l) => read_profile(mem, &mut reader, l, &span_specials)?,
        Err(why) => Err(why.clone()),
    };
    Ok(GoHeap {
        go: rt.version.clone(),
        page_size: GO_PAGE as u32,
        ranges,
        spans,
        pages_in_use,
        pause_us: 0,
        profile,
    })
}

/// The census of process `pid`, read while `pause` holds it (the caller's stop, which may
/// cover other readings of the same moment; None: not held, as `--no-stop` asks). A stop
/// that lands while the runtime is changing a span finds its figures apart: the program
/// is let run a few milliseconds and held again, a few times, before the census is
/// refused. `pause_us` is how long the last stop had held it when the census was read.
pub fn census_held(
    pid: u32,
    rt: &GoRuntime,
    mem: &mut ProcessMemory,
    pause: &mut Option<crate::Pause>,
) -> Result<GoHeap, GoCensusError> {
    crate::pause::retrying(
        pid,
        pause,
        || census(mem, rt),
        |e| matches!(e, GoCensusError::Inconsistent(_)),
    )
    .map_err(|e| e.unwrap_or_else(GoCensusError::Unreadable))
    .map(|mut heap| {
        heap.pause_us = pause.as_ref().map_or(0, |p| p.held().as_micros() as u64);
        heap
    })
}

/// A span's own fields agree with each other.
fn check_span(s: &GoSpan, at: u64) -> Result<(), GoCensusError> {
    let bytes = s.pages.checked_mul(GO_PAGE);
    let fits = bytes.is_some_and(|b| u64::from(s.slots).saturating_mul(s.slot_bytes) <= b);
    let ok = s.pages > 0
        && s.start.is_multiple_of(GO_PAGE)
        && match s.kind {
            GoSpanKind::Objects => s.in_use <= s.slots && s.slot_bytes > 0 && fits,
            GoSpanKind::Stacks => true,
        };
    if ok {
        Ok(())
    } else {
        Err(GoCensusError::Inconsistent(format!(
            "the span at {at:#x} ({} pages from {:#x}, {} of {} slots of {} bytes) does not \
             hold together",
            s.pages, s.start, s.in_use, s.slots, s.slot_bytes
        )))
    }
}

/// The spans (in address order) lie within the page allocator's ranges without
/// overlapping, and their object pages are the runtime's own count.
fn check_spans(
    spans: &[GoSpan],
    ranges: &[(u64, u64)],
    pages_in_use: u64,
) -> Result<(), GoCensusError> {
    let inconsistent = GoCensusError::Inconsistent;
    let mut end = 0;
    for s in spans {
        let s_end = s.start + s.pages * GO_PAGE;
        if s.start < end {
            return Err(inconsistent(format!("two spans overlap at {:#x}", s.start)));
        }
        if !ranges.iter().any(|&(lo, hi)| lo <= s.start && s_end <= hi) {
            return Err(inconsistent(format!(
                "a span at {:#x} lies outside the heap's ranges",
                s.start
            )));
        }
        end = s_end;
    }
    let object_pages: u64 = spans
        .iter()
        .filter(|s| s.kind == GoSpanKind::Objects)
        .map(|s| s.pages)
        .sum();
    if object_pages != pages_in_use {
        return Err(inconsistent(format!(
            "the spans hold {object_pages} pages of objects, the runtime counts {pages_in_use}"
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn varints_read_as_go_writes_them() {
        assert_eq!(uvarint(&[0x08]), Some((8, 1)));
        assert_eq!(uvarint(&[0x96, 0x01]), Some((150, 2)));
        assert_eq!(uvarint(&[0x80]), None);
    }

    #[test]
    fn a_program_go_did_not_build_is_not_go() {
        let me = std::fs::read("/proc/self/exe").unwrap();
        assert!(GoRuntime::of_executable(&me, None).is_none());
    }

    fn span(start: u64, pages: u64, kind: GoSpanKind) -> GoSpan {
        GoSpan {
            start,
            pages,
            kind,
            class: 5,
            noscan: false,
            slots: 128,
            in_use: 10,
            slot_bytes: 64,
            unswept: false,
        }
    }

    #[test]
    fn spans_outside_the_ranges_overlapping_or_miscounted_are_refused() {
        let base = 0xc000000000;
        let ranges = [(base, base + 64 * GO_PAGE)];
        let spans = [
            span(base, 1, GoSpanKind::Objects),
            span(base + GO_PAGE, 4, GoSpanKind::Stacks),
            span(base + 8 * GO_PAGE, 1, GoSpanKind::Objects),
        ];
        assert!(check_spans(&spans, &ranges, 2).is_ok());
        let miscounted = check_spans(&spans, &ranges, 3).unwrap_err().to_string();
        assert!(miscounted.contains("runtime counts 3"), "{miscounted}");
        let mut overlapping = spans;
        overlapping[2].start = base + 2 * GO_PAGE;
        assert!(check_spans(&overlapping, &ranges, 2).is_err());
        let mut outside = spans;
        outside[2].start = base + 64 * GO_PAGE;
        assert!(check_spans(&outside, &ranges, 2).is_err());
        let mut too_many = span(base, 1, GoSpanKind::Objects);
        too_many.in_use = 129;
        assert!(check_span(&too_many, 0).is_err());
    }
}
