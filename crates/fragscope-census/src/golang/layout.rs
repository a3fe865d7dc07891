//! Where the fields are that the census reads in the Go runtime's structs, in the
//! program's release: from its own DWARF when it has one, else from the table of releases
//! (`releases.tsv`) made from each release's DWARF by the same code.

use std::collections::HashMap;

use super::dwarf::{dwarf_types, Struct};

/// A field of a runtime struct: where it is and how many bytes it takes.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Field {
    pub offset: usize,
    pub size: usize,
}

/// Where `runtime.mspan`'s fields are, in the program's release.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
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
#[derive(Debug, Default, Clone, PartialEq, Eq)]
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
#[derive(Debug, Default, Clone, PartialEq, Eq)]
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
    pub series: String,
    pub derived_from: String,
    pub layouts: Layouts,
}

/// A number of the table: a size, a field (written `offset+size`) or a constant.
pub(super) enum Cell<'a> {
    Size(&'a mut usize),
    Field(&'a mut Field),
    Constant(&'a mut u64),
}

impl Cell<'_> {
    fn write(&self) -> String {
        match self {
            Cell::Size(n) => n.to_string(),
            Cell::Field(f) => format!("{}+{}", f.offset, f.size),
            Cell::Constant(c) => c.to_string(),
        }
    }

    fn read(&mut self, text: &str) -> Option<()> {
        match self {
            Cell::Size(n) => **n = text.parse().ok()?,
            Cell::Field(f) => {
                let (offset, size) = text.split_once('+')?;
                **f = Field {
                    offset: offset.parse().ok()?,
                    size: size.parse().ok()?,
                };
            }
            Cell::Constant(c) => **c = text.parse().ok()?,
        }
        Some(())
    }
}

impl Layouts {
    /// Layouts of zeros, to read a table's line into.
    fn zero() -> Self {
        Self {
            heap: HeapLayout::default(),
            span: SpanLayout::default(),
            profile: Ok(ProfileStructs::default()),
        }
    }

    /// Every number of the layouts, named as the table's columns are: the one list the
    /// table is read and written by. Without the profile's structs, theirs are left out.
    pub(super) fn cells(&mut self) -> Vec<(&'static str, Cell<'_>)> {
        use Cell::{Constant, Field as F, Size};
        let (h, s) = (&mut self.heap, &mut self.span);
        let mut cells = vec![
            ("heap.read", Size(&mut h.read)),
            ("heap.sweepgen", F(&mut h.sweepgen)),
            ("heap.allspans", F(&mut h.allspans)),
            ("heap.pagesInUse", F(&mut h.pages_in_use)),
            ("heap.pages.inUse.ranges", F(&mut h.in_use_ranges)),
            ("heap.pages.inUse.totalBytes", F(&mut h.in_use_total)),
            ("mspan", Size(&mut s.size)),
            ("mspan.startAddr", F(&mut s.start_addr)),
            ("mspan.npages", F(&mut s.npages)),
            ("mspan.nelems", F(&mut s.nelems)),
            ("mspan.allocCount", F(&mut s.alloc_count)),
            ("mspan.spanclass", F(&mut s.spanclass)),
            ("mspan.state", F(&mut s.state)),
            ("mspan.elemsize", F(&mut s.elemsize)),
            ("mspan.sweepgen", F(&mut s.sweepgen)),
        ];
        if let Ok(p) = &mut self.profile {
            cells.extend([
                ("mspan.specials", F(&mut p.specials)),
                ("bucket", Size(&mut p.bucket_size)),
                ("bucket.allnext", F(&mut p.allnext)),
                ("bucket.typ", F(&mut p.typ)),
                ("bucket.nstk", F(&mut p.nstk)),
                ("bucket.size", F(&mut p.size)),
                ("memRecord", Size(&mut p.record_size)),
                ("memRecord.active", F(&mut p.active)),
                ("memRecord.future", F(&mut p.future)),
                ("memRecordCycle", Size(&mut p.cycle_size)),
                ("memRecordCycle.allocs", F(&mut p.allocs)),
                ("memRecordCycle.frees", F(&mut p.frees)),
                ("special.next", F(&mut p.special_next)),
                ("special.offset", F(&mut p.special_offset)),
                ("special.kind", F(&mut p.special_kind)),
                ("specialprofile.b", F(&mut p.special_bucket)),
                ("_KindSpecialProfile", Constant(&mut p.kind_profile)),
            ]);
        }
        cells
    }
}

impl Release {
    /// The table's header line.
    pub fn header() -> String {
        let mut l = Layouts::zero();
        let names = l.cells().into_iter().map(|(name, _)| name);
        ["release", "from"]
            .into_iter()
            .chain(names)
            .collect::<Vec<_>>()
            .join("\t")
    }

    /// The release as a line of the table: Err when its DWARF lacks the profile's
    /// structs, which every release of the table has.
    pub fn row(&self) -> Result<String, String> {
        let mut l = self.layouts.clone();
        if let Err(why) = &l.profile {
            return Err(why.clone());
        }
        let cells = l.cells().into_iter().map(|(_, c)| c.write());
        let first = [self.series.clone(), self.derived_from.clone()];
        Ok(first
            .into_iter()
            .chain(cells)
            .collect::<Vec<_>>()
            .join("\t"))
    }

    /// The releases of a table (`releases.tsv`): a header naming the columns, then one
    /// line per release; lines starting with `#` are comments.
    pub fn read_table(text: &str) -> Result<Vec<Release>, String> {
        let mut lines = text
            .lines()
            .filter(|l| !l.starts_with('#') && !l.trim().is_empty());
        if lines.next() != Some(Self::header().as_str()) {
            return Err("its header is not the columns fragscope reads".into());
        }
        lines
            .map(|line| {
                let mut words = line.split('\t');
                let (Some(series), Some(from)) = (words.next(), words.next()) else {
                    return Err(format!("a line is cut: {line}"));
                };
                let mut layouts = Layouts::zero();
                let mut cells = layouts.cells();
                let mut words = words.fuse();
                for (name, cell) in &mut cells {
                    let word = words
                        .next()
                        .ok_or_else(|| format!("{series} has no {name}"))?;
                    cell.read(word)
                        .ok_or_else(|| format!("{series}'s {name} is not a number: {word}"))?;
                }
                if words.next().is_some() {
                    return Err(format!("{series} has more columns than the header"));
                }
                drop(cells);
                Ok(Release {
                    series: series.to_string(),
                    derived_from: from.to_string(),
                    layouts,
                })
            })
            .collect()
    }
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
        let releases = super::releases::releases()?;
        let known = || {
            let series: Vec<&str> = releases.iter().map(|r| r.series.as_str()).collect();
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
        releases
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
