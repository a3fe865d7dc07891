//! Finding a process's jemalloc: its statics by their symbols, or, stripped, by their
//! shape in the image's data (the bin table by its region sizes, the bins' offsets
//! against the layout, the arenas by index and base), each checked against the others.

use super::*;

/// Finds the jemalloc `pid` runs on and its statics: its shared library, or, when
/// `linked` names a copy linked into the program (or into a library), that image. Err:
/// why this process's jemalloc cannot be read (none, another build, its statics not
/// found).
pub fn locate(
    pid: u32,
    mem: &mut ProcessMemory,
    linked: Option<&LinkedAllocator>,
) -> Result<JemallocLayout, String> {
    let lib = match linked {
        Some(l) => MappedLibrary::find_path(pid, &l.image)?
            .ok_or_else(|| format!("{} is not mapped (the process exited?)", l.image))?,
        None => MappedLibrary::find(pid, "libjemalloc")?
            .ok_or_else(|| "no jemalloc library is mapped".to_string())?,
    };
    let elf = lib.elf(pid)?;
    let Some(build) = RELEASES
        .iter()
        .find(|r| memchr::memmem::find(&elf, r.version.as_bytes()).is_some())
    else {
        let read: Vec<&str> = RELEASES.iter().map(|r| r.name).collect();
        return Err(format!(
            "the process runs on {}, a jemalloc build whose layout fragscope has not \
             verified (it reads {})",
            lib.path,
            read.join(" and ")
        ));
    };
    let statics = match by_symbols(mem, &elf, &lib, build)? {
        Some(found) => found,
        // Stripped (a shared library keeps only its API): the statics by their shape.
        None => {
            let data = StaticData::read(mem, lib.data, "jemalloc")?;
            let bins = find_bin_infos(&data)?;
            let bin_offsets = find_bin_offsets(&data, &bins, build)?;
            let arenas = find_arenas(mem, &data, build)?;
            let emap = first_base(mem, arenas, build)
                .and_then(|base0| emap::by_shape(&data, build.emap_root, base0));
            Statics {
                bins,
                bin_offsets,
                arenas,
                emap,
                large_pad: None,
                tsds: None,
            }
        }
    };
    Ok(JemallocLayout {
        library: lib.path,
        release: build.name,
        build,
        bins: statics.bins,
        bin_offsets: statics.bin_offsets,
        arenas: statics.arenas,
        emap: statics.emap,
        large_pad: statics.large_pad,
        tsds: statics.tsds,
    })
}

/// The small classes, each bin's offset in an arena, where `arenas[]` lies, the extent
/// map's root (or why it was not found) and the large extents' offset page.
struct Statics {
    bins: Vec<BinInfo>,
    bin_offsets: Vec<u64>,
    arenas: u64,
    emap: Result<u64, String>,
    large_pad: Option<u64>,
    tsds: Option<u64>,
}

/// The base of arena 0 (`b0`), which the extent map's nodes are carved from.
fn first_base(mem: &mut ProcessMemory, arenas: u64, build: &Release) -> Result<u64, String> {
    let unread = |e: std::io::Error| format!("jemalloc's first arena could not be read ({e})");
    let first = mem.read_u64(arenas).map_err(unread)?;
    if first == 0 {
        return Err("jemalloc has no first arena yet".into());
    }
    mem.read_u64(first + build.arena_base as u64)
        .map_err(unread)
}

/// The statics by their names, in an image that keeps its symbol table (a copy linked
/// into a Rust program: `_rjem_je_arenas`, ...), each checked as the shape search checks
/// it. None when the image does not name them.
fn by_symbols(
    mem: &mut ProcessMemory,
    elf: &[u8],
    lib: &MappedLibrary,
    build: &'static Release,
) -> Result<Option<Statics>, String> {
    // jemalloc's private names carry the prefix it was configured with (`je_`,
    // `_rjem_je_`): the one its bin offsets are defined under.
    let Some(prefix) = private_prefix(elf) else {
        return Ok(None);
    };
    let names = [
        "bin_infos",
        "arena_bin_offsets",
        "arenas",
        "arena_emap_global",
        "sz_large_pad",
    ]
    .map(|n| format!("{prefix}{n}"));
    // A file-local static: not under the prefix.
    let tsds_name = "tsd_nominal_tsds";
    let mut wanted: Vec<&str> = names.iter().map(String::as_str).collect();
    wanted.push(tsds_name);
    let symbols = Symbols::resolve_at(elf, &wanted, lib.base)?;
    let (Some(infos), Some(offsets), Some(arenas)) = (
        symbols.get(&names[0]),
        symbols.get(&names[1]),
        symbols.get(&names[2]),
    ) else {
        return Ok(None);
    };
    let mut table = vec![0u8; BINS * BIN_INFO_SIZE];
    mem.read(infos, &mut table)
        .map_err(|e| format!("jemalloc's bin_infos could not be read ({e})"))?;
    let bins = bin_table(&table, 0)
        .ok_or_else(|| format!("{} does not hold jemalloc's size classes", names[0]))?;
    let expected = bin_offsets(&bins, build);
    let mut found = vec![0u8; 4 * BINS];
    mem.read(offsets, &mut found)
        .map_err(|e| format!("jemalloc's arena_bin_offsets could not be read ({e})"))?;
    if found != offsets_pattern(&expected) {
        return Err(format!(
            "jemalloc's bins are not where its {} layout puts them",
            build.name
        ));
    }
    let first = mem
        .read_u64(arenas)
        .map_err(|e| format!("jemalloc's arenas could not be read ({e})"))?;
    if first != 0 && names_itself(mem, first, 0, build).is_none() {
        return Err(format!("{}[0] is not jemalloc's first arena", names[2]));
    }
    let emap = symbols
        .get(&names[3])
        .ok_or_else(|| format!("{} is not named", names[3]))
        .and_then(|at| {
            let base0 = first_base(mem, arenas, build)?;
            emap::by_symbol(mem, at, build.emap_root, base0)
        });
    let large_pad = symbols
        .get(&names[4])
        .and_then(|at| mem.read_u64(at).ok())
        .filter(|&p| p == 0 || p == PAGE);
    Ok(Some(Statics {
        bins,
        bin_offsets: expected,
        arenas,
        emap,
        large_pad,
        tsds: symbols.get(tsds_name),
    }))
}

/// The prefix of jemalloc's private names in `elf`'s symbol table, by the name its bin
/// offsets are defined under.
fn private_prefix(elf: &[u8]) -> Option<String> {
    use object::{Object, ObjectSymbol};
    let file = object::File::parse(elf).ok()?;
    let found = file.symbols().find_map(|s| {
        let name = s.name().ok()?;
        (s.is_definition() && name.ends_with("je_arena_bin_offsets"))
            .then(|| name.trim_end_matches("arena_bin_offsets").to_string())
    });
    found
}

/// The 36 entries of `bin_infos` at `at` in `bytes`, when their region sizes are
/// jemalloc's small classes, each slab whole pages carved into as many regions as fit.
fn bin_table(bytes: &[u8], at: usize) -> Option<Vec<BinInfo>> {
    if at + BINS * BIN_INFO_SIZE > bytes.len() {
        return None;
    }
    let entry = |i: usize| {
        let e = at + i * BIN_INFO_SIZE;
        BinInfo {
            size: le_u64(bytes, e),
            slab_bytes: le_u64(bytes, e + BIN_INFO_SLAB_SIZE),
            regions: u64::from(le_u32(bytes, e + BIN_INFO_NREGS)),
            shards: u64::from(le_u32(bytes, e + BIN_INFO_SHARDS)),
        }
    };
    let table: Vec<BinInfo> = (0..BINS).map(entry).collect();
    let holds = table.iter().zip(&size_classes()).all(|(b, &size)| {
        b.size == size
            && b.slab_bytes > 0
            && b.slab_bytes.is_multiple_of(PAGE)
            && b.regions == b.slab_bytes / size
            && (1..=64).contains(&b.shards)
    });
    holds.then_some(table)
}

/// `bin_infos` found by its shape in the image's data.
fn find_bin_infos(s: &StaticData) -> Result<Vec<BinInfo>, String> {
    let first: Vec<u8> = 8u64.to_le_bytes().to_vec();
    let mut found = None;
    for at in memchr::memmem::find_iter(&s.bytes, &first) {
        if !at.is_multiple_of(8) {
            continue;
        }
        if let Some(table) = bin_table(&s.bytes, at) {
            if found.replace(table).is_some() {
                return Err("two tables look like jemalloc's bins".into());
            }
        }
    }
    found.ok_or_else(|| "jemalloc's size classes were not found in its data".into())
}

/// The bins' offsets in an arena, as `arena_bin_offsets` must hold them:
/// `sizeof(arena_t)`, then one `bin_t` per shard.
fn bin_offsets(bins: &[BinInfo], build: &Release) -> Vec<u64> {
    let mut offsets = Vec::with_capacity(bins.len());
    let mut at = build.arena_bins as u64;
    for b in bins {
        offsets.push(at);
        at += b.shards * BIN_SIZE as u64;
    }
    offsets
}

fn offsets_pattern(offsets: &[u64]) -> Vec<u8> {
    offsets
        .iter()
        .flat_map(|&o| (o as u32).to_le_bytes())
        .collect()
}

/// `arena_bin_offsets` found in the image's data: only when the build's arena and bin
/// sizes are those read.
fn find_bin_offsets(s: &StaticData, bins: &[BinInfo], build: &Release) -> Result<Vec<u64>, String> {
    let offsets = bin_offsets(bins, build);
    match memchr::memmem::find_iter(&s.bytes, &offsets_pattern(&offsets)).count() {
        1 => Ok(offsets),
        0 => Err(format!(
            "jemalloc's bins are not where its {} layout puts them (another build?)",
            build.name
        )),
        _ => Err("two tables look like jemalloc's bin offsets".into()),
    }
}

/// `arenas[]`: 4095 pointers, the first set, each either null or an arena (allocated on
/// a cache line, outside the image's data) that names itself: its `ind` and its page
/// allocator's are its index, and both name the same base.
fn find_arenas(mem: &mut ProcessMemory, s: &StaticData, build: &Release) -> Result<u64, String> {
    let len = MAX_ARENAS * 8;
    let pointer = |w: u64| w.is_multiple_of(64) && w > 0xffff && !s.contains(w) && w < 1 << 47;
    let mut found = None;
    let mut off = 0usize;
    while off + len <= s.bytes.len() {
        let first = le_u64(&s.bytes, off);
        if !pointer(first) {
            off += 8;
            continue;
        }
        let words = (0..MAX_ARENAS).map(|i| le_u64(&s.bytes, off + 8 * i));
        if words.clone().all(|w| w == 0 || pointer(w)) {
            // Arena 0's fields checked against its index are zeros, which any zeroed
            // memory has: its base must also be the one jemalloc keeps in a static of its
            // own (`b0`). Seen without that check: a window of the page map's leaves,
            // where the pages of one extent repeat a word, taken for a second array.
            let named_by_index = words.enumerate().filter(|&(_, w)| w != 0).all(|(i, w)| {
                names_itself(mem, w, i, build).is_some_and(|base| i != 0 || s.holds_word(base))
            });
            if named_by_index && found.replace(s.base + off as u64).is_some() {
                return Err("two arrays look like jemalloc's arenas".into());
            }
        }
        off += 8;
    }
    found.ok_or_else(|| "jemalloc's arenas were not found in its data".into())
}

/// The arena at `at` carries `index` as its own and its page allocator's, with one base:
/// that base.
fn names_itself(mem: &mut ProcessMemory, at: u64, index: usize, build: &Release) -> Option<u64> {
    let mut tail = vec![0u8; build.arena_bins - build.pa_shard];
    mem.read(at + build.pa_shard as u64, &mut tail).ok()?;
    let field = |off: usize| off - build.pa_shard;
    let base = le_u64(&tail, field(build.arena_base));
    (le_u32(&tail, field(build.arena_ind)) as usize == index
        && le_u32(&tail, field(build.pa_shard_ind)) as usize == index
        && base != 0
        && le_u64(&tail, field(build.pa_shard_base)) == base)
        .then_some(base)
}
