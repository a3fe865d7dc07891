//! The object walk: every object of the dynamic space sized from its header as the
//! runtime sizes it, counted by class (as `(room)` groups them), widetag and generation.

use super::*;

/// What objects are, as `(room)` groups them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ObjectClass {
    /// simple-base-string and simple-character-string.
    Strings,
    Conses,
    /// (simple-array (unsigned-byte 8) (*)).
    OctetVectors,
    /// Every other one-dimensional simple array (simple-vector, bit vectors, numeric
    /// vectors).
    OtherVectors,
    /// Structure and standard-object instances.
    Instances,
    Code,
    Other,
}

impl ObjectClass {
    pub const ALL: [ObjectClass; 7] = [
        ObjectClass::Strings,
        ObjectClass::Conses,
        ObjectClass::OctetVectors,
        ObjectClass::OtherVectors,
        ObjectClass::Instances,
        ObjectClass::Code,
        ObjectClass::Other,
    ];

    pub fn name(self) -> &'static str {
        match self {
            ObjectClass::Strings => "strings",
            ObjectClass::Conses => "conses",
            ObjectClass::OctetVectors => "octet vectors",
            ObjectClass::OtherVectors => "other vectors",
            ObjectClass::Instances => "instances",
            ObjectClass::Code => "code",
            ObjectClass::Other => "other",
        }
    }

    /// The class of an object whose header has `widetag` (conses have none).
    pub fn of_widetag(widetag: u8) -> Self {
        match widetag {
            225 | 229 => ObjectClass::Strings,
            157 => ObjectClass::OctetVectors,
            133..=221 => ObjectClass::OtherVectors,
            57 => ObjectClass::Instances,
            53 => ObjectClass::Code,
            _ => ObjectClass::Other,
        }
    }

    /// The place of this class in [`ObjectClass::ALL`].
    pub fn index_in_all(self) -> usize {
        self.index()
    }

    pub(super) fn index(self) -> usize {
        ObjectClass::ALL
            .iter()
            .position(|&c| c == self)
            .unwrap_or(0)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ObjectFigures {
    pub count: u64,
    pub bytes: u64,
}

/// Every object of the dynamic space, by type: what `(room)` and
/// `sb-vm:map-allocated-objects` see (fillers and pseudo-conses left out).
#[derive(Debug, Clone, PartialEq, Default)]
pub struct SbclObjects {
    /// By [`ObjectClass::ALL`].
    pub classes: Vec<ObjectFigures>,
    /// By header widetag (256 entries; conses are in `classes` only).
    pub by_widetag: Vec<ObjectFigures>,
    /// By generation (of the page an object starts on; open regions' objects are the
    /// nursery's, 0), then by [`ObjectClass::ALL`].
    pub by_generation: Vec<Vec<ObjectFigures>>,
    /// Fillers and pseudo-conses: space inside used pages that holds no object.
    pub filler_bytes: u64,
    /// How long the walk took (the process stopped).
    pub walk_us: u64,
}

impl SbclObjects {
    pub fn class(&self, c: ObjectClass) -> ObjectFigures {
        self.classes[c.index()]
    }
}

/// How the runtime sizes an object from its header (gc-common.c, the `sizetab` entries).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Sizer {
    /// The first word of a cons (a fixnum, pointer or immediate): no header.
    NotHeader,
    /// No object starts with this widetag in the heap (`size_lose`).
    Lose,
    /// 1 + (23-bit payload | 1): size_boxed, also size_unboxed.
    Boxed,
    /// 1 + (15-bit payload | 1).
    ShortBoxed,
    /// Numbers without pointers other than bignums (double-float, complex floats, SAP,
    /// SIMD pack): 1 + (payload | 1), the payload a byte. 2.6's runtime sizes them with
    /// `size_unboxed`; earlier ones with `size_boxed`, which agrees on such payloads.
    Unboxed,
    Bignum,
    Symbol,
    Code,
    Instance,
    WeakPointer,
    Fdefn,
    Filler,
    Array,
    VectorT,
    VectorNil,
    /// Bits per element.
    Vector(u8),
    BaseString,
}

/// The sizer of each header widetag (`4n + 1`), from SBCL 2.2.9's gc-tables.h.
pub(super) fn sizer(widetag: u8) -> Sizer {
    use Sizer::*;
    if widetag % 4 != 1 {
        return NotHeader;
    }
    match widetag {
        17 => Bignum,
        21 | 33 | 77 => Boxed,
        29 | 37 | 41 | 49 | 101 | 105 => Unboxed,
        9 | 25 | 81 => NotHeader, // unbound marker, single-float, character: immediates
        45 => Symbol,
        53 => Code,
        57 => Instance,
        61 | 69 => ShortBoxed,
        89 => WeakPointer,
        93 => Fdefn,
        109 => Filler,
        129 | 233 | 237 | 241 | 245 | 249 => Array,
        133 => VectorNil,
        137 => VectorT,
        141 => Vector(1),
        145 => Vector(2),
        149 => Vector(4),
        153 | 157 | 189 => Vector(8),
        161 | 165 | 193 => Vector(16),
        169 | 173 | 197 | 209 | 229 => Vector(32),
        177 | 181 | 185 | 201 | 205 | 213 | 217 => Vector(64),
        221 => Vector(128),
        225 => BaseString,
        _ => Lose,
    }
}

/// `widetag_lowtag[w]` as SBCL 2.2.9 has it: 0x80 | the pointer's lowtag for a header,
/// 7 (a cons) for a word that can start a cons, 0 for neither.
pub(super) fn expected_lowtag(widetag: u8) -> u8 {
    match (sizer(widetag), widetag) {
        (Sizer::NotHeader, _) => 7,
        (_, 65) => 0x8B, // simple-fun: a header, but only inside code objects
        (Sizer::Lose, _) => 0,
        (Sizer::Filler, _) => 0x80,
        (Sizer::Instance, _) => 0x83,
        (Sizer::ShortBoxed, _) => 0x8B,
        _ => 0x8F,
    }
}

/// Checks that the process's own tag table is SBCL 2.2.9's and that its size table
/// groups widetags as [`sizer`] does: a core or runtime with other tags or sizes is
/// refused instead of walked wrongly.
pub(super) fn check_tag_tables(
    mem: &mut ProcessMemory,
    rt: &SbclRuntime,
) -> Result<(), CensusError> {
    let mut lowtags = [0u8; 256];
    mem.read(rt.widetag_lowtag, &mut lowtags)?;
    for w in 0..=255u8 {
        if lowtags[usize::from(w)] != expected_lowtag(w) {
            return Err(inconsistent(format!(
                "the runtime's widetag_lowtag[{w}] is {:#x}, not SBCL {}'s {:#x}",
                lowtags[usize::from(w)],
                rt.release.version,
                expected_lowtag(w)
            )));
        }
    }
    let mut raw = vec![0u8; 256 * 8];
    mem.read(rt.sizetab, &mut raw)?;
    let fns: Vec<u64> = (0..256).map(|w| le_u64(&raw, w * 8)).collect();
    let mut by_sizer: Vec<(Sizer, u64)> = Vec::new();
    for w in 0..=255u8 {
        let (s, f) = match sizer(w) {
            Sizer::Unboxed if !rt.release.size_unboxed => (Sizer::Boxed, fns[usize::from(w)]),
            s => (s, fns[usize::from(w)]),
        };
        let ok = match s {
            Sizer::NotHeader => f == 0,
            _ if f == 0 => false,
            _ => match by_sizer.iter().find(|(k, _)| *k == s) {
                Some(&(_, g)) => g == f,
                // A new sizer must have a function no other sizer has.
                None => {
                    let fresh = by_sizer.iter().all(|&(_, g)| g != f);
                    by_sizer.push((s, f));
                    fresh
                }
            },
        };
        if !ok {
            return Err(inconsistent(format!(
                "the runtime sizes widetag {w} unlike SBCL {}",
                rt.release.version
            )));
        }
    }
    Ok(())
}

/// Reads the heap forward through a window, so that the payload of a large object is
/// skipped rather than read.
pub(super) struct Window<'a> {
    mem: &'a mut ProcessMemory,
    base: u64,
    buf: Vec<u8>,
}

pub(super) const WINDOW: u64 = 256 << 10;

impl Window<'_> {
    /// The word at `addr`, inside `[.., limit)`.
    fn word(&mut self, addr: u64, limit: u64) -> Result<u64, CensusError> {
        let len = self.buf.len() as u64;
        if addr < self.base || addr + 8 > self.base + len {
            let n = WINDOW.min(limit.saturating_sub(addr)).max(8);
            self.buf.resize(n as usize, 0);
            self.mem.read_ranges(&[(addr, n as usize)], &mut self.buf)?;
            self.base = addr;
        }
        Ok(le_u64(&self.buf, (addr - self.base) as usize))
    }
}

/// Words of the object whose header is `h` at `addr` (its size in the heap).
pub(super) fn object_words(
    read: &mut dyn FnMut(u64) -> Result<u64, CensusError>,
    addr: u64,
    h: u64,
) -> Result<u64, CensusError> {
    // Saturating: a misread length must end the walk with an error, not wrap around.
    let align2 = |n: u64| n.saturating_add(1) & !1;
    let value = h >> 8;
    let mut vector_len = || -> Result<u64, CensusError> { Ok(read(addr + 8)? >> 1) };
    let nwords = |len: u64, bits: u64| {
        if bits <= 64 {
            let per = 64 / bits;
            len.div_ceil(per)
        } else {
            len.saturating_mul(bits / 64)
        }
    };
    Ok(match sizer(h as u8) {
        Sizer::NotHeader => 2,
        Sizer::Lose => {
            return Err(inconsistent(format!(
                "an object at {addr:#x} has header {h:#x}, which no heap object has"
            )))
        }
        Sizer::Boxed => 1 + ((value & 0x7F_FFFF) | 1),
        Sizer::ShortBoxed => 1 + ((value & 0x7FFF) | 1),
        Sizer::Unboxed => 1 + ((value & 0xFF) | 1),
        Sizer::Bignum => 1 + ((value & 0xFFFF_FFFF) | 1),
        Sizer::Symbol => 6,
        Sizer::Code => h >> 32,
        Sizer::Instance => {
            let h = h as u32;
            let extra = (h >> 10) & (h >> 9) & 1;
            let len = u64::from(((h >> 10) & 0x3FFF) + extra);
            1 + (len | 1)
        }
        Sizer::WeakPointer => align2(1 + ((h >> 8) & 0xF)),
        Sizer::Fdefn => 4,
        Sizer::Filler => h >> 32,
        Sizer::Array => {
            let rank = ((h >> 8) as u8).wrapping_add(1);
            // struct array is 8 words with one dimension.
            align2(8 + u64::from(rank) - 1)
        }
        Sizer::VectorT => align2(vector_len()?.saturating_add(2)),
        Sizer::VectorNil => 2,
        Sizer::Vector(bits) => align2(nwords(vector_len()?, u64::from(bits)).saturating_add(2)),
        Sizer::BaseString => align2(nwords(vector_len()? + 1, 8).saturating_add(2)),
    })
}

/// Walks every object: each contiguous block of pages as walk-dynamic-space in
/// room.lisp finds them (a block goes on while its page is full and the next page does
/// not start a block), then the open regions' objects.
pub(super) fn walk_objects(
    mem: &mut ProcessMemory,
    start: u64,
    next_free: u64,
    entry: &dyn Fn(u64) -> (u32, u16, u8, u8),
    regions: &[OpenRegion],
    mut starts: Option<&mut [u64]>,
) -> Result<SbclObjects, CensusError> {
    let mut o = SbclObjects {
        classes: vec![ObjectFigures::default(); ObjectClass::ALL.len()],
        by_widetag: vec![ObjectFigures::default(); 256],
        by_generation: vec![vec![ObjectFigures::default(); ObjectClass::ALL.len()]; GENERATIONS],
        ..Default::default()
    };
    let gen_of = |addr: u64| -> usize {
        let page = (addr - start) / PAGE_BYTES;
        usize::from(entry(page).3).min(GENERATIONS - 1)
    };
    let mut w = Window {
        mem,
        base: 0,
        buf: Vec::new(),
    };
    let used = |i: u64| u64::from(entry(i).1 >> 1) * 8;
    let mut first = 0;
    while first < next_free {
        let mut last = first;
        while used(last) == PAGE_BYTES && last + 1 < next_free && entry(last + 1).0 != 0 {
            last += 1;
        }
        let from = start + first * PAGE_BYTES;
        let to = start + last * PAGE_BYTES + used(last);
        if to > from && entry(first).2 != 0 {
            walk_range(
                &mut w,
                from,
                to,
                &mut o,
                &gen_of,
                start,
                starts.as_deref_mut(),
            )?;
        }
        first = last + 1;
    }
    for r in regions {
        if r.free > r.start {
            walk_range(
                &mut w,
                r.start,
                r.free,
                &mut o,
                &|_| 0,
                start,
                starts.as_deref_mut(),
            )?;
        }
    }
    Ok(o)
}

pub(super) fn walk_range(
    w: &mut Window,
    from: u64,
    to: u64,
    o: &mut SbclObjects,
    gen_of: &dyn Fn(u64) -> usize,
    space_start: u64,
    mut starts: Option<&mut [u64]>,
) -> Result<(), CensusError> {
    let mut addr = from;
    while addr < to {
        let h = w.word(addr, to)?;
        let widetag = h as u8;
        let words = if h == PSEUDO_CONS {
            2
        } else {
            object_words(&mut |a| w.word(a, to), addr, h)?
        };
        let bytes = words.saturating_mul(8);
        if words == 0 || bytes > to - addr {
            return Err(inconsistent(format!(
                "the object at {addr:#x} (header {h:#x}, {bytes} bytes) overruns its block \
                 ending at {to:#x}"
            )));
        }
        if h == PSEUDO_CONS || widetag == FILLER_WIDETAG {
            o.filler_bytes += bytes;
        } else {
            if let Some(s) = starts.as_deref_mut() {
                mark::set_bit(s, (addr - space_start) / 16);
            }
            let class = if sizer(widetag) == Sizer::NotHeader {
                ObjectClass::Conses
            } else {
                let f = &mut o.by_widetag[usize::from(widetag)];
                f.count += 1;
                f.bytes += bytes;
                ObjectClass::of_widetag(widetag)
            };
            let f = &mut o.classes[class.index()];
            f.count += 1;
            f.bytes += bytes;
            let g = &mut o.by_generation[gen_of(addr)][class.index()];
            g.count += 1;
            g.bytes += bytes;
        }
        addr += bytes;
    }
    Ok(())
}
