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
//! than guess. The figures are checked against the runtime's own count of pages in object
//! spans (`mheap_.pagesInUse`) before they are kept: a stop that lands while the runtime
//! is changing a span finds them apart, and the census is taken again.

use std::borrow::Cow;
use std::collections::HashMap;

use fragscope_trace::go_heap::{GoBucket, GoHeap, GoProfile, GoSpan, GoSpanKind};
use object::{Object, ObjectSection};

use crate::memory::{le_u64, RecordReader};
use crate::{ProcessMemory, Symbols};

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

/// A field of a runtime struct: where it is and how many bytes it takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Field {
    offset: usize,
    size: usize,
}

/// Where `runtime.mspan`'s fields are, in the program's release.
#[derive(Debug, Clone, PartialEq, Eq)]
struct SpanLayout {
    size: usize,
    start_addr: Field,
    npages: Field,
    nelems: Field,
    alloc_count: Field,
    spanclass: Field,
    state: Field,
    elemsize: Field,
    sweepgen: Field,
}

/// Where `mheap_`'s fields are: the span table, the page allocator's ranges and the
/// runtime's counters the census is checked against.
#[derive(Debug, Clone, PartialEq, Eq)]
struct HeapLayout {
    /// Bytes of `mheap_` the census reads: up to the last field it needs.
    read: usize,
    sweepgen: Field,
    allspans: Field,
    pages_in_use: Field,
    /// `pages.inUse.ranges`: a slice of `addrRange{base, limit}`.
    in_use_ranges: Field,
    in_use_total: Field,
}

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
        let names = [
            "runtime.mheap_",
            "runtime.mbuckets",
            "runtime.mProfCycle",
            "runtime.MemProfileRate",
            "runtime.disableMemoryProfiling",
        ];
        let symbols = Symbols::resolve(elf, &names, pid).map_err(refuse)?;
        let mheap = symbols.need("runtime.mheap_").map_err(|_| {
            refuse(
                "it has no symbol table (built with -ldflags=-s); fragscope finds the \
                 runtime's heap by its symbol"
                    .into(),
            )
        })?;
        let (structs, constants) = dwarf_types(
            file,
            &[
                "runtime.mspan",
                "runtime.mheap",
                "runtime.pageAlloc",
                "runtime.addrRanges",
                "runtime.addrRange",
                "runtime.bucket",
                "runtime.memRecord",
                "runtime.memRecordCycle",
                "runtime.special",
                "runtime.specialprofile",
            ],
            &["runtime._KindSpecialProfile"],
        )
        .map_err(refuse)?;
        let heap = heap_layout(&structs).map_err(refuse)?;
        let span = span_layout(&structs).map_err(refuse)?;
        let profile = get(&structs, "runtime.mspan")
            .and_then(|s| sized(s, "runtime.mspan", "specials", &[8]))
            .and_then(|specials| ProfileLayout::new(&symbols, &structs, &constants, specials))
            .map_err(|why| format!("its heap profile cannot be read: {why}"));
        Ok(Self {
            version,
            mheap,
            heap,
            span,
            profile,
        })
    }
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

/// A struct as the DWARF describes it: its size and its members by name (a name Go uses
/// twice, such as `_` for padding, keeps its first).
#[derive(Debug, Default)]
struct Struct {
    size: usize,
    members: HashMap<String, Field>,
}

impl Struct {
    fn field(&self, owner: &str, name: &str) -> Result<Field, String> {
        self.members
            .get(name)
            .copied()
            .ok_or_else(|| format!("its DWARF has no field {owner}.{name}"))
    }
}

/// Structs and constants found by name in the executable's DWARF.
type DwarfTypes = (HashMap<String, Struct>, HashMap<String, u64>);

/// The structs named `wanted` and the constants named `constants` in the executable's
/// DWARF.
fn dwarf_types(
    file: &object::File,
    wanted: &[&str],
    constants: &[&str],
) -> Result<DwarfTypes, String> {
    let no_dwarf = || {
        "it has no DWARF (built with -ldflags=-w or -s); fragscope reads the runtime's \
         layouts from it"
            .to_string()
    };
    if file.section_by_name(".debug_info").is_none() {
        return Err(no_dwarf());
    }
    let load = |id: gimli::SectionId| -> Result<Cow<[u8]>, String> {
        Ok(match file.section_by_name(id.name()) {
            Some(s) => s
                .uncompressed_data()
                .map_err(|e| format!("its {} does not decompress ({e})", id.name()))?,
            None => Cow::Borrowed(&[][..]),
        })
    };
    let sections = gimli::DwarfSections::load(load)?;
    let dwarf = sections.borrow(|s| gimli::EndianSlice::new(s, gimli::LittleEndian));
    let bad = |e: gimli::Error| format!("its DWARF does not read ({e})");
    let mut found: HashMap<String, Struct> = HashMap::new();
    let mut values: HashMap<String, u64> = HashMap::new();
    let mut headers = Vec::new();
    let mut iter = dwarf.units();
    while let Some(header) = iter.next().map_err(bad)? {
        headers.push(header);
    }
    for &header in &headers {
        let unit = dwarf.unit(header).map_err(bad)?;
        let mut entries = unit.entries();
        // The struct being read, at which depth its members are.
        let mut current: Option<(String, isize)> = None;
        let mut depth = 0isize;
        while let Some((delta, entry)) = entries.next_dfs().map_err(bad)? {
            depth += delta;
            if current.as_ref().is_some_and(|(_, d)| depth <= *d) {
                current = None;
            }
            match entry.tag() {
                gimli::DW_TAG_structure_type => {
                    let Some(name) = attr_string(&dwarf, &unit, entry) else {
                        continue;
                    };
                    if wanted.contains(&name.as_str()) && !found.contains_key(&name) {
                        let size = udata(entry, gimli::DW_AT_byte_size).unwrap_or(0) as usize;
                        found.insert(
                            name.clone(),
                            Struct {
                                size,
                                members: HashMap::new(),
                            },
                        );
                        current = Some((name, depth));
                    }
                }
                gimli::DW_TAG_constant => {
                    let Some(name) = attr_string(&dwarf, &unit, entry) else {
                        continue;
                    };
                    if constants.contains(&name.as_str()) {
                        let value = entry.attr_value(gimli::DW_AT_const_value).ok().flatten();
                        if let Some(v) = value
                            .and_then(|v| v.udata_value().or(v.sdata_value().map(|s| s as u64)))
                        {
                            values.insert(name, v);
                        }
                    }
                }
                gimli::DW_TAG_member => {
                    let Some((owner, d)) = &current else { continue };
                    if depth != d + 1 {
                        continue;
                    }
                    let (Some(name), Some(offset)) = (
                        attr_string(&dwarf, &unit, entry),
                        udata(entry, gimli::DW_AT_data_member_location),
                    ) else {
                        continue;
                    };
                    let size = member_size(&dwarf, &headers, &unit, entry).unwrap_or(0);
                    found
                        .get_mut(owner)
                        .unwrap()
                        .members
                        .entry(name)
                        .or_insert(Field {
                            offset: offset as usize,
                            size,
                        });
                }
                _ => {}
            }
        }
        if found.len() == wanted.len() && values.len() == constants.len() && current.is_none() {
            break;
        }
    }
    if found.is_empty() {
        return Err(no_dwarf());
    }
    Ok((found, values))
}

type Slice<'a> = gimli::EndianSlice<'a, gimli::LittleEndian>;

fn attr_string(
    dwarf: &gimli::Dwarf<Slice>,
    unit: &gimli::Unit<Slice>,
    entry: &gimli::DebuggingInformationEntry<Slice>,
) -> Option<String> {
    let value = entry.attr_value(gimli::DW_AT_name).ok()??;
    let s = dwarf.attr_string(unit, value).ok()?;
    Some(s.to_string_lossy().into_owned())
}

fn udata(entry: &gimli::DebuggingInformationEntry<Slice>, at: gimli::DwAt) -> Option<u64> {
    entry.attr_value(at).ok()??.udata_value()
}

/// Bytes of a member's type (following typedefs), wherever in the DWARF the type is.
fn member_size(
    dwarf: &gimli::Dwarf<Slice>,
    units: &[gimli::UnitHeader<Slice>],
    unit: &gimli::Unit<Slice>,
    member: &gimli::DebuggingInformationEntry<Slice>,
) -> Option<usize> {
    let mut at = member.attr_value(gimli::DW_AT_type).ok()??;
    let mut here: Option<gimli::Unit<Slice>> = None;
    for _ in 0..8 {
        let (size, next) = {
            let current = here.as_ref().unwrap_or(unit);
            let (entry_unit, offset) = match at {
                gimli::AttributeValue::UnitRef(off) => (None, off),
                gimli::AttributeValue::DebugInfoRef(off) => {
                    let header = units.iter().find(|h| off.to_unit_offset(h).is_some())?;
                    let other = dwarf.unit(*header).ok()?;
                    let off = off.to_unit_offset(header)?;
                    (Some(other), off)
                }
                _ => return None,
            };
            let owner = entry_unit.as_ref().unwrap_or(current);
            let entry = owner.entry(offset).ok()?;
            // A pointer is a word, whatever it points to (Go's pointer types may carry
            // no size of their own).
            let size = match entry.tag() {
                gimli::DW_TAG_pointer_type => Some(8),
                _ => udata(&entry, gimli::DW_AT_byte_size),
            };
            let next = entry.attr_value(gimli::DW_AT_type).ok()?;
            if entry_unit.is_some() {
                here = entry_unit;
            }
            (size, next)
        };
        if let Some(size) = size {
            return Some(size as usize);
        }
        at = next?;
    }
    None
}

fn get<'a>(structs: &'a HashMap<String, Struct>, name: &str) -> Result<&'a Struct, String> {
    structs
        .get(name)
        .ok_or_else(|| format!("its DWARF does not describe {name}"))
}

/// A field that must be `sizes` bytes (one of them) to be read as the census reads it.
fn sized(s: &Struct, owner: &str, name: &str, sizes: &[usize]) -> Result<Field, String> {
    let f = s.field(owner, name)?;
    if !sizes.contains(&f.size) {
        return Err(format!(
            "{owner}.{name} is {} bytes, which fragscope does not read",
            f.size
        ));
    }
    Ok(f)
}

fn span_layout(structs: &HashMap<String, Struct>) -> Result<SpanLayout, String> {
    let o = "runtime.mspan";
    let s = get(structs, o)?;
    let layout = SpanLayout {
        size: s.size,
        start_addr: sized(s, o, "startAddr", &[8])?,
        npages: sized(s, o, "npages", &[8])?,
        nelems: sized(s, o, "nelems", &[2, 8])?,
        alloc_count: sized(s, o, "allocCount", &[2])?,
        spanclass: sized(s, o, "spanclass", &[1])?,
        state: sized(s, o, "state", &[1])?,
        elemsize: sized(s, o, "elemsize", &[8])?,
        sweepgen: sized(s, o, "sweepgen", &[4])?,
    };
    if layout.size == 0 || layout.size > 1024 {
        return Err(format!("{o} is {} bytes", layout.size));
    }
    Ok(layout)
}

fn heap_layout(structs: &HashMap<String, Struct>) -> Result<HeapLayout, String> {
    let o = "runtime.mheap";
    let heap = get(structs, o)?;
    let pages = sized(heap, o, "pages", &[get(structs, "runtime.pageAlloc")?.size])?;
    let page_alloc = get(structs, "runtime.pageAlloc")?;
    let ranges_type = get(structs, "runtime.addrRanges")?;
    let in_use = sized(
        page_alloc,
        "runtime.pageAlloc",
        "inUse",
        &[ranges_type.size],
    )?;
    let ranges = sized(ranges_type, "runtime.addrRanges", "ranges", &[24])?;
    let total = sized(ranges_type, "runtime.addrRanges", "totalBytes", &[8])?;
    let range = get(structs, "runtime.addrRange")?;
    let (base, limit) = (
        range.field("runtime.addrRange", "base")?,
        range.field("runtime.addrRange", "limit")?,
    );
    if range.size != 16 || base.offset != 0 || limit.offset != 8 {
        return Err("runtime.addrRange is not {base, limit} of a word each".into());
    }
    let nested = |f: Field| Field {
        offset: pages.offset + in_use.offset + f.offset,
        size: f.size,
    };
    // `pagesInUse` is an atomic.Uintptr (a struct of one word) since 1.20.
    let layout = HeapLayout {
        read: 0,
        sweepgen: sized(heap, o, "sweepgen", &[4])?,
        allspans: sized(heap, o, "allspans", &[24])?,
        pages_in_use: sized(heap, o, "pagesInUse", &[8])?,
        in_use_ranges: nested(ranges),
        in_use_total: nested(total),
    };
    let read = [
        layout.sweepgen,
        layout.allspans,
        layout.pages_in_use,
        layout.in_use_ranges,
        layout.in_use_total,
    ]
    .iter()
    .map(|f| f.offset + f.size)
    .max()
    .unwrap_or(0);
    Ok(HeapLayout { read, ..layout })
}

fn read_field(b: &[u8], f: Field) -> u64 {
    let mut word = [0u8; 8];
    word[..f.size].copy_from_slice(&b[f.offset..f.offset + f.size]);
    u64::from_le_bytes(word)
}

/// Where the heap profile's records are: the sampled allocations' buckets
/// (runtime/mprof.go) and the specials that tie each sampled object still live to its
/// bucket (mheap.go's `specialprofile`).
#[derive(Debug, Clone)]
struct ProfileLayout {
    mbuckets: u64,
    cycle: u64,
    rate: u64,
    disabled: Option<u64>,
    bucket_size: usize,
    allnext: Field,
    typ: Field,
    nstk: Field,
    record_size: usize,
    active: Field,
    future: Field,
    cycle_size: usize,
    allocs: Field,
    frees: Field,
    /// The bucket's object size: its bytes are its counts times this (Go 1.27 keeps no
    /// byte counts; before, they were the same product).
    size: Field,
    specials: Field,
    special_next: Field,
    special_offset: Field,
    special_kind: Field,
    special_bucket: Field,
    kind_profile: u64,
}

/// `memProfile`'s value of `bucket.typ` (bucketType's first value, 1, since Go 1.1).
const MEM_PROFILE: u64 = 1;
/// Buckets past this many are not a profile a census can hold.
const MAX_BUCKETS: usize = 1 << 20;
/// `maxProfStackDepth`, the deepest stack a bucket holds (1024 since Go 1.23).
const MAX_STACK: u64 = 1024;

impl ProfileLayout {
    /// The heap profile's layout, from the program's symbols, DWARF structs and
    /// constants; Err says which part is missing.
    fn new(
        symbols: &Symbols,
        structs: &HashMap<String, Struct>,
        constants: &HashMap<String, u64>,
        specials: Field,
    ) -> Result<Self, String> {
        let b = "runtime.bucket";
        let bucket = get(structs, b)?;
        let r = "runtime.memRecord";
        let record = get(structs, r)?;
        let c = "runtime.memRecordCycle";
        let cycle = get(structs, c)?;
        let s = "runtime.special";
        let special = get(structs, s)?;
        let p = "runtime.specialprofile";
        let profile = get(structs, p)?;
        let kind_profile = *constants
            .get("runtime._KindSpecialProfile")
            .ok_or("its DWARF has no constant runtime._KindSpecialProfile")?;
        Ok(Self {
            mbuckets: symbols.need("runtime.mbuckets")?,
            cycle: symbols.need("runtime.mProfCycle")?,
            rate: symbols.need("runtime.MemProfileRate")?,
            disabled: symbols.get("runtime.disableMemoryProfiling"),
            bucket_size: bucket.size,
            allnext: sized(bucket, b, "allnext", &[8])?,
            typ: sized(bucket, b, "typ", &[8, 4])?,
            nstk: sized(bucket, b, "nstk", &[8])?,
            record_size: record.size,
            active: sized(record, r, "active", &[cycle.size])?,
            future: sized(record, r, "future", &[3 * cycle.size])?,
            cycle_size: cycle.size,
            allocs: sized(cycle, c, "allocs", &[8])?,
            frees: sized(cycle, c, "frees", &[8])?,
            size: sized(bucket, b, "size", &[8])?,
            specials,
            special_next: sized(special, s, "next", &[8])?,
            special_offset: sized(special, s, "offset", &[2, 8])?,
            special_kind: sized(special, s, "kind", &[1])?,
            special_bucket: sized(profile, p, "b", &[8])?,
            kind_profile,
        })
    }
}

/// A bucket's allocations and frees in one profile cycle (`memRecordCycle`).
fn cycle_counts(l: &ProfileLayout, b: &[u8]) -> [u64; 2] {
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
    l: &ProfileLayout,
    span_specials: &[(u64, u64)],
) -> Result<Result<GoProfile, String>, GoCensusError> {
    use GoCensusError::*;
    let unreadable = |e: std::io::Error| Unreadable(e.to_string());
    if let Some(at) = l.disabled {
        if mem.read_u8(at).map_err(unreadable)? != 0 {
            return Ok(Err(
                "the program keeps no heap profile: it was linked without \
                 the heap profiler (it imports neither runtime/pprof nor net/http/pprof)"
                    .into(),
            ));
        }
    }
    let rate = mem.read_u64(l.rate).map_err(unreadable)?;
    if rate == 0 {
        return Ok(Err(
            "the program keeps no heap profile: it set runtime.MemProfileRate to 0".into(),
        ));
    }
    let index = ((mem.read_u32(l.cycle).map_err(unreadable)? >> 1) % 3) as usize;
    let mut buckets = Vec::new();
    let mut futures = Vec::new();
    let mut by_address = HashMap::new();
    let mut at = mem.read_u64(l.mbuckets).map_err(unreadable)?;
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
    let specials = rt.profile.as_ref().ok().map(|p| p.specials);
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
