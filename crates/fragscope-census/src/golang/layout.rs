//! Where the fields are that the census reads in the Go runtime's structs, in the
//! program's release: from its own DWARF when it has one, else from the table of releases
//! (`releases.rs`) made from each release's DWARF by the same code.

use std::collections::HashMap;

use super::dwarf::{dwarf_types, Struct};

/// A field of a runtime struct: where it is and how many bytes it takes.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct Field {
    pub offset: usize,
    pub size: usize,
}

/// A field at `offset` of `size` bytes: the table's shorthand.
pub(super) const fn f(offset: usize, size: usize) -> Field {
    Field { offset, size }
}

/// Written as the table writes it (`f(offset, size)`), so that a layout printed with
/// `{:#?}` is the table's source.
impl std::fmt::Debug for Field {
    fn fmt(&self, out: &mut std::fmt::Formatter) -> std::fmt::Result {
        write!(out, "f({}, {})", self.offset, self.size)
    }
}

/// Where `runtime.mspan`'s fields are, in the program's release.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SpanLayout {
    pub size: usize,
    pub start_addr: Field,
    pub npages: Field,
    pub nelems: Field,
    pub alloc_count: Field,
    pub spanclass: Field,
    pub state: Field,
    pub elemsize: Field,
    pub sweepgen: Field,
}

/// Where `mheap_`'s fields are: the span table, the page allocator's ranges and the
/// runtime's counters the census is checked against.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HeapLayout {
    /// Bytes of `mheap_` the census reads: up to the last field it needs.
    pub read: usize,
    pub sweepgen: Field,
    pub allspans: Field,
    pub pages_in_use: Field,
    /// `pages.inUse.ranges`: a slice of `addrRange{base, limit}`.
    pub in_use_ranges: Field,
    pub in_use_total: Field,
}

/// Where the heap profile's records are: the sampled allocations' buckets
/// (runtime/mprof.go) and the specials that tie each sampled object still live to its
/// bucket (mheap.go's `specialprofile`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProfileStructs {
    pub bucket_size: usize,
    pub allnext: Field,
    pub typ: Field,
    pub nstk: Field,
    pub record_size: usize,
    pub active: Field,
    pub future: Field,
    pub cycle_size: usize,
    pub allocs: Field,
    pub frees: Field,
    /// The bucket's object size: its bytes are its counts times this (Go 1.27 keeps no
    /// byte counts; before, they were the same product).
    pub size: Field,
    /// `mspan.specials`.
    pub specials: Field,
    pub special_next: Field,
    pub special_offset: Field,
    pub special_kind: Field,
    pub special_bucket: Field,
    /// `_KindSpecialProfile`.
    pub kind_profile: u64,
}

/// Every layout the census reads, in one release.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Layouts {
    pub heap: HeapLayout,
    pub span: SpanLayout,
    /// The heap profile's structs, or why they cannot be read.
    pub profile: Result<ProfileStructs, String>,
}

/// One release of the table: its series ("go1.22"), the release whose DWARF gave the
/// layouts ("go1.22.12"), and the layouts.
#[derive(Debug)]
pub struct Release {
    pub series: &'static str,
    pub derived_from: &'static str,
    pub layouts: Layouts,
}

/// The structs the census reads, by their DWARF names.
const STRUCTS: [&str; 10] = [
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
];

impl Layouts {
    /// The layouts the executable's DWARF describes; Err when it has none or lacks a
    /// field the census needs (the heap profile's lack is kept in `profile`).
    pub fn from_dwarf(file: &object::File) -> Result<Self, String> {
        let (structs, constants) = dwarf_types(file, &STRUCTS, &["runtime._KindSpecialProfile"])?;
        Ok(Self {
            heap: heap_layout(&structs)?,
            span: span_layout(&structs)?,
            profile: profile_structs(&structs, &constants)
                .map_err(|why| format!("its heap profile cannot be read: {why}")),
        })
    }

    /// The layouts of Go release `version` ("go1.22.12") from the table, for a program
    /// without DWARF: Err names the release when the table does not hold it.
    pub fn of_release(version: &str) -> Result<Self, String> {
        let known = || {
            let series: Vec<&str> = super::releases::RELEASES.iter().map(|r| r.series).collect();
            series.join(", ")
        };
        let unknown = |what: String| {
            format!(
                "it has no DWARF (built with -ldflags=-w or -s), and {what}: without DWARF \
                 fragscope reads the runtime's layouts from its table of releases checked \
                 against their DWARF ({})",
                known()
            )
        };
        if let Some((_, experiments)) = version.split_once(" X:") {
            return Err(unknown(format!(
                "it was built with GOEXPERIMENT={experiments}, whose layouts the table does \
                 not hold"
            )));
        }
        let series = release_series(version)
            .ok_or_else(|| unknown(format!("{version} is not a release the table holds")))?;
        super::releases::RELEASES
            .iter()
            .find(|r| r.series == series)
            .map(|r| r.layouts.clone())
            .ok_or_else(|| unknown(format!("{version} is not a release the table holds")))
    }
}

/// The series of a Go release ("go1.22" of "go1.22" or "go1.22.12"); None for a
/// pre-release ("go1.26rc1"), a development build or anything else.
pub(super) fn release_series(version: &str) -> Option<&str> {
    let numbers = version.strip_prefix("go")?;
    let parts: Vec<&str> = numbers.split('.').collect();
    let all_digits = |p: &&str| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit());
    if !(2..=3).contains(&parts.len()) || !parts.iter().all(all_digits) {
        return None;
    }
    Some(&version[..2 + parts[0].len() + 1 + parts[1].len()])
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

/// The heap profile's structs and constant from the DWARF; Err says which part is
/// missing.
fn profile_structs(
    structs: &HashMap<String, Struct>,
    constants: &HashMap<String, u64>,
) -> Result<ProfileStructs, String> {
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
    let m = "runtime.mspan";
    let kind_profile = *constants
        .get("runtime._KindSpecialProfile")
        .ok_or("its DWARF has no constant runtime._KindSpecialProfile")?;
    Ok(ProfileStructs {
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
        specials: sized(get(structs, m)?, m, "specials", &[8])?,
        special_next: sized(special, s, "next", &[8])?,
        special_offset: sized(special, s, "offset", &[2, 8])?,
        special_kind: sized(special, s, "kind", &[1])?,
        special_bucket: sized(profile, p, "b", &[8])?,
        kind_profile,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_release_is_named_by_its_series_and_pre_releases_are_not() {
        assert_eq!(release_series("go1.22.12"), Some("go1.22"));
        assert_eq!(release_series("go1.27"), Some("go1.27"));
        assert_eq!(release_series("go1.26rc1"), None);
        assert_eq!(release_series("devel go1.27-abcdef"), None);
        assert_eq!(release_series("go1.22.1.2"), None);
    }

    #[test]
    fn a_release_the_table_lacks_is_named_in_the_note() {
        let err = Layouts::of_release("go1.99.1").unwrap_err();
        assert!(
            err.contains("go1.99.1 is not a release the table holds"),
            "{err}"
        );
        assert!(err.contains("go1.22"), "{err}");
        let err = Layouts::of_release("go1.22.12 X:nocoverageredesign").unwrap_err();
        assert!(err.contains("GOEXPERIMENT=nocoverageredesign"), "{err}");
        assert!(Layouts::of_release("go1.22.3").is_ok());
    }
}
