//! The mark from the roots: which objects of the dynamic space a full collection would
//! keep, found from outside the process while it is stopped.
//!
//! Roots, as the gencgc of SBCL 2.2.9, 2.5.2 and 2.6.4 takes them for `(gc :full t)`
//! (gencgc.c, `garbage_collect_generation`), on x86-64 with immobile space:
//!
//! - each Lisp thread's control stack, conservatively: from the thread's stack pointer
//!   (the task of `/proc/PID/task` whose stack pointer, read from its `syscall`, is
//!   inside the thread's control stack, less the 128-byte red zone; the whole stack
//!   when there is none) to `control_stack_end`. A word keeps an object when
//!   it is a tagged pointer to its start with the lowtag its header calls for, or, on a
//!   code page, any address inside a code object's instructions (a return address) or
//!   a funcallable instance's trampoline words (`conservative_root_p`). Registers are
//!   not read: a thread stopped in a system call (the usual case, Lisp waiting on I/O)
//!   holds Lisp references on its stack, not in registers (SBCL spills them around
//!   foreign calls); a thread stopped while running Lisp code may hold a fresh object
//!   only in a register. For such threads (counted in
//!   `MarkRoots::threads_outside_syscall`) every object of the thread's open allocation
//!   regions, the newest small objects, is kept live; a large object just allocated
//!   and held only in a register would still count as garbage.
//! - each thread's binding stack (`binding_stack_start` to `binding_stack_pointer`) and
//!   thread-local values (`struct thread` from `lisp_thread`, the release's offset, to
//!   the static symbol FREE-TLS-INDEX's value);
//! - static space (`0x50000000`, or 2.6's exported `STATIC_SPACE_START`, to
//!   `static_space_free_pointer`, and 2.6's trailer of static constants, NIL and T, from
//!   `static_space_trailer_start` to its end), every word, except the value of
//!   DYNSPACE-CODEBLOB-TREE, which the collector clears before it marks; the static
//!   symbols are found in it by name;
//! - the permanent generation (2.5 on, `permgen_bounds[0]` to
//!   `permgen_space_free_pointer`), every word, when a core put objects there;
//! - immobile space, fixed-object (`FIXEDOBJ_SPACE_START` to `fixedobj_free_pointer`)
//!   and text (`TEXT_SPACE_START` to `text_space_highwatermark`), every word, all of it
//!   a root: the collector also frees immobile objects of the collected generations,
//!   so garbage there can keep a dynamic object that the collection would free;
//! - every object of the pseudo-static generation (6, the core's), scanned precisely;
//! - the runtime's C roots: `lisp_sig_handlers[65]`, `lisp_package_vector`,
//!   `lisp_init_function`, `gc_object_watcher` (2.2.9), `alloc_profile_data`;
//! - with sb-sprof on (`sb_sprof_enabled`), every code object of the dynamic space.
//!
//! Words of whole spaces are taken as ambiguous roots (a superset of the precise ones).
//! From the roots the mark traces precisely, as gc-common.c's scavenge functions do:
//! conses' two words; boxed objects' words; symbols' value, fdefn, info and name (less
//! its package bits); code objects' boxed words (the header's boxed size); closures'
//! function (a raw entry address) and closed-over values; funcallable instances'
//! trampoline and slots from the function on; fdefns' name, function and raw entry;
//! instances' slots, each taken when it is a tagged pointer to an object's start (the
//! layout's bitmap is not read: a raw slot that happens to equal such a pointer keeps
//! its target), and an instance's first slot also as an untagged lock-free list link;
//! weak vectors (the weak flag alone: 2.3 on interns types in weak hashsets) as
//! holding nothing, as the collector; weak pointers and weak hash tables as strong (a
//! full collection would free what only they reach: the mark counts it live). Unboxed objects (numbers, specialized
//! vectors, strings) hold nothing.
//!
//! Memory: two bits per 16 bytes of used dynamic space (object starts, from the walk,
//! and marks), a page cache of at most 64 MiB, and a stack of at most one entry per
//! live object; nothing recursive.

use std::time::Instant;

use super::*;

/// Static space's size in the three releases (genesis/constants.h: 2.2.9's and 2.5.2's
/// static space is 0x50000000 to 0x50100000; 2.6.4's trailer of static constants ends
/// 1 MiB above its `STATIC_SPACE_START`). A free pointer beyond is a misread.
const STATIC_SPACE_SIZE: u64 = 0x10_0000;
/// The static symbols the mark reads, found by name in static space.
const FREE_TLS_INDEX: &str = "*FREE-TLS-INDEX*";
const DYNSPACE_CODEBLOB_TREE: &str = "*DYNSPACE-CODEBLOB-TREE*";
const SYMBOL_WIDETAG: u8 = 45;
const SIMPLE_BASE_STRING_WIDETAG: u8 = 225;
/// struct symbol: header, hash, value, fdefn, info, name.
const SYMBOL_VALUE: u64 = 16;
const SYMBOL_NAME: usize = 40;
/// FIXEDOBJ_SPACE_SIZE and TEXT_SPACE_SIZE: a free pointer beyond is a misread.
const FIXEDOBJ_SPACE_SIZE: u64 = 0x280_0000;
const TEXT_SPACE_SIZE: u64 = 0x820_0000;
/// A permanent generation of more is a misread.
const MAX_PERMGEN: u64 = 1 << 32;

// struct thread, the same in the three releases up to `next` and `state_word` (the
// debug information of each one's /usr/lib/sbcl/sbcl.o); where the thread-local values
// start is the release's (`Release::thread_lisp_thread`). 2.6 keeps no `os_kernel_tid`:
// a thread's task is the one whose stack pointer is inside its control stack.
const THREAD_BINDING_STACK_POINTER: usize = 16;
const THREAD_BINDING_STACK_START: usize = 168;
const THREAD_CONTROL_STACK_START: usize = 176;
const THREAD_CONTROL_STACK_END: usize = 184;
const THREAD_STATE: usize = 218;
const STATE_DEAD: u8 = 3;
/// `lisp_sig_handlers` is `lispobj[NSIG]`, NSIG 65.
const NSIG: usize = 65;
/// The x86-64 ABI's red zone below the stack pointer.
const RED_ZONE: u64 = 128;
/// A stack or binding stack of more is a misread.
const MAX_STACK: u64 = 1 << 30;

const CODE_WIDETAG: u8 = 53;
const SIMPLE_VECTOR_WIDETAG: u8 = 137;
/// A vector's header flags (`sb-vm:array-flags-position` 16): `vector-weak-flag` 1 and
/// `vector-hashing-flag` 4, the same in the three releases. A weak vector has the first
/// alone; a weak hash table's storage has both and is traced as strong.
const VECTOR_WEAK_FLAG: u64 = 1 << 16;
const VECTOR_HASHING_FLAG: u64 = 4 << 16;
const FUNCALLABLE_INSTANCE_WIDETAG: u8 = 61;
const SIMPLE_FUN_WIDETAG: u8 = 65;
const CLOSURE_WIDETAG: u8 = 69;
const CODE_PAGE_TYPE: u8 = 7;
/// How far back a pointer into a code page looks for the object holding it: 1 MiB.
const MAX_BACK_GRANULES: u64 = 1 << 16;
/// Page cache slots (32 KiB each: 64 MiB at most).
const CACHE_SLOTS: usize = 2048;
/// Words read at a time from an object spanning pages.
const CHUNK_WORDS: u64 = 32 << 10;

/// What the mark read as roots.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct MarkRoots {
    pub threads: u32,
    /// Threads whose stack was scanned from its stack pointer; the others' whole stack
    /// was scanned.
    pub stacks_from_sp: u32,
    /// Threads stopped outside a system call: their registers (not read) may hold
    /// references the mark does not see.
    pub threads_outside_syscall: u32,
    pub stack_bytes: u64,
    pub binding_stack_bytes: u64,
    pub tls_bytes: u64,
    pub static_bytes: u64,
    pub immobile_bytes: u64,
    /// Objects of generation 6 scanned as roots.
    pub pseudo_static_objects: u64,
    /// Objects in the open allocation regions of threads stopped in Lisp code, kept
    /// live: what a register alone may hold is most likely the newest small objects.
    pub open_region_objects: u64,
}

/// Which objects a full collection would keep (see the module's comment).
#[derive(Debug, Clone, PartialEq, Default)]
pub struct SbclMark {
    /// Reachable objects by generation (as `SbclObjects::by_generation`: the page each
    /// starts on; open regions' objects are generation 0's), then by
    /// [`ObjectClass::ALL`]. Generation 6 is all live (roots).
    pub live_by_generation: Vec<Vec<ObjectFigures>>,
    pub roots: MarkRoots,
    /// How long the mark took (the process stopped), the walk not included.
    pub mark_us: u64,
}

impl SbclMark {
    pub fn live(&self, gen: usize, class: ObjectClass) -> ObjectFigures {
        self.live_by_generation
            .get(gen)
            .map_or_else(ObjectFigures::default, |g| g[class.index()])
    }

    /// Live bytes of generation `gen`.
    pub fn live_bytes(&self, gen: usize) -> u64 {
        self.live_by_generation
            .get(gen)
            .map_or(0, |g| g.iter().map(|f| f.bytes).sum())
    }

    /// Bytes of `class` in generation `gen` that a full collection would free: the
    /// walk's less the live.
    pub fn garbage(&self, objects: &SbclObjects, gen: usize, class: ObjectClass) -> u64 {
        objects.by_generation[gen][class.index()]
            .bytes
            .saturating_sub(self.live(gen, class).bytes)
    }
}

/// The dynamic space as the census read it.
pub(super) struct Space<'a> {
    pub start: u64,
    pub next_free: u64,
    /// (generation, type bits) of each page below `next_free`.
    pub pages: &'a [(u8, u8)],
    pub regions: &'a [OpenRegion],
    /// One bit per 16 bytes: an object (not a filler) starts there (the walk's).
    pub starts: &'a [u64],
}

pub(super) fn set_bit(bits: &mut [u64], i: u64) {
    if let Some(w) = bits.get_mut((i / 64) as usize) {
        *w |= 1 << (i % 64);
    }
}

fn bit(bits: &[u64], i: u64) -> bool {
    bits.get((i / 64) as usize)
        .is_some_and(|w| w & (1 << (i % 64)) != 0)
}

struct Marker<'a, 'm> {
    mem: &'m mut ProcessMemory,
    space: &'a Space<'a>,
    top: u64,
    marks: Vec<u64>,
    /// Marked objects not traced yet, with their first word.
    stack: Vec<(u64, u64)>,
    cache_tags: Vec<u64>,
    cache: Vec<Vec<u8>>,
    scratch: Vec<u8>,
    live: Vec<Vec<ObjectFigures>>,
}

impl Marker<'_, '_> {
    fn page(&self, addr: u64) -> Option<(u8, u8)> {
        if addr < self.space.start || addr >= self.top {
            return None;
        }
        let i = ((addr - self.space.start) / PAGE_BYTES) as usize;
        self.space.pages.get(i).copied().filter(|p| p.1 != 0)
    }

    fn granule(&self, addr: u64) -> u64 {
        (addr - self.space.start) / 16
    }

    /// The word at `addr` (8-aligned, inside the used dynamic space).
    fn word(&mut self, addr: u64) -> Result<u64, CensusError> {
        let Some((_, bits)) = self.page(addr) else {
            return Err(inconsistent(format!(
                "the mark read {addr:#x}, outside the dynamic space in use"
            )));
        };
        if bits & SINGLE_OBJECT_FLAG != 0 {
            // A large object's page: read the word alone, not the page.
            return Ok(self.mem.read_u64(addr)?);
        }
        let slot = self.cached_page((addr - self.space.start) / PAGE_BYTES)?;
        let off = ((addr - self.space.start) % PAGE_BYTES) as usize;
        Ok(le_u64(&self.cache[slot], off))
    }

    /// The cache slot holding page `page`, read into it if it was not there.
    fn cached_page(&mut self, page: u64) -> Result<usize, CensusError> {
        let slot = (page as usize) % CACHE_SLOTS;
        if self.cache_tags[slot] != page {
            let buf = &mut self.cache[slot];
            buf.resize(PAGE_BYTES as usize, 0);
            self.mem
                .read(self.space.start + page * PAGE_BYTES, buf.as_mut_slice())?;
            self.cache_tags[slot] = page;
        }
        Ok(slot)
    }

    /// Words `[from, to)` of an object, read in chunks (not cached when they span pages).
    fn words(&mut self, from: u64, to: u64, out: &mut Vec<u64>) -> Result<(), CensusError> {
        out.clear();
        if to <= from {
            return Ok(());
        }
        let same_page =
            (from - self.space.start) / PAGE_BYTES == (to - 1 - self.space.start) / PAGE_BYTES;
        if same_page
            && self
                .page(from)
                .is_some_and(|p| p.1 & SINGLE_OBJECT_FLAG == 0)
        {
            let slot = self.cached_page((from - self.space.start) / PAGE_BYTES)?;
            let off = ((from - self.space.start) % PAGE_BYTES) as usize;
            let len = (to - from) as usize;
            out.extend(
                self.cache[slot][off..off + len]
                    .chunks_exact(8)
                    .map(|c| le_u64(c, 0)),
            );
            return Ok(());
        }
        let mut a = from;
        while a < to {
            let n = ((to - a) / 8).min(CHUNK_WORDS) as usize;
            self.scratch.resize(n * 8, 0);
            let mut buf = std::mem::take(&mut self.scratch);
            self.mem.read(a, &mut buf)?;
            out.extend(buf.chunks_exact(8).map(|c| le_u64(c, 0)));
            self.scratch = buf;
            a += n as u64 * 8;
        }
        Ok(())
    }

    fn is_start(&self, addr: u64) -> bool {
        addr.is_multiple_of(16) && bit(self.space.starts, self.granule(addr))
    }

    fn marked(&self, addr: u64) -> bool {
        bit(&self.marks, self.granule(addr))
    }

    /// Marks the object at `base`, whose first word is `h`.
    fn set_mark(&mut self, base: u64, h: u64) {
        let g = self.granule(base);
        set_bit(&mut self.marks, g);
        self.stack.push((base, h));
    }

    /// A word that may refer to an object of the dynamic space: marks the object it
    /// refers to, if any (see the module's comment for what refers).
    fn consider(&mut self, w: u64) -> Result<(), CensusError> {
        let Some((gen, bits)) = self.page(w) else {
            return Ok(());
        };
        if gen == PSEUDO_STATIC_GENERATION {
            return Ok(()); // a root, scanned on its own
        }
        if w & 3 == 3 {
            let base = w & !15;
            if self.is_start(base) {
                if self.marked(base) {
                    return Ok(());
                }
                let h = self.word(base)?;
                let lowtag = if sizer(h as u8) == Sizer::NotHeader {
                    7
                } else {
                    expected_lowtag(h as u8) & 15
                };
                if lowtag != 0 && u64::from(lowtag) == w & 15 {
                    self.set_mark(base, h);
                }
                return Ok(());
            }
            if w & 15 == 11 && self.page(base).is_some() {
                // A simple-fun inside a code object: the code object.
                let h = self.word(base)?;
                if h as u8 == SIMPLE_FUN_WIDETAG {
                    let code = base.wrapping_sub(((h >> 8) & 0xFF_FFFF) * 8);
                    if self.page(code).is_some() && self.is_start(code) && !self.marked(code) {
                        let ch = self.word(code)?;
                        if ch as u8 == CODE_WIDETAG {
                            self.set_mark(code, ch);
                        }
                    }
                }
                return Ok(());
            }
        }
        if bits & PAGE_TYPE_MASK == CODE_PAGE_TYPE {
            self.consider_code_interior(w)?;
        }
        Ok(())
    }

    /// An address inside a code page: the code object whose instructions it points
    /// into, or the funcallable instance whose trampoline words it points to.
    fn consider_code_interior(&mut self, w: u64) -> Result<(), CensusError> {
        let g = self.granule(w);
        let Some(obj_g) = (g.saturating_sub(MAX_BACK_GRANULES)..=g)
            .rev()
            .find(|&i| bit(self.space.starts, i))
        else {
            return Ok(());
        };
        let obj = self.space.start + obj_g * 16;
        if self.marked(obj) {
            return Ok(());
        }
        let h = self.word(obj)?;
        let widetag = h as u8;
        if widetag != CODE_WIDETAG && widetag != FUNCALLABLE_INSTANCE_WIDETAG {
            return Ok(());
        }
        let words = object_words(&mut |a| self.word(a), obj, h)?;
        if w >= obj.saturating_add(words.saturating_mul(8)) {
            return Ok(());
        }
        let keeps = if widetag == CODE_WIDETAG {
            let boxed = self.word(obj + 8)? & 0xFFFF_FFFF;
            w >= obj + boxed || w == obj + 15
        } else {
            (obj + 16..obj + 32).contains(&w) || w == obj + 8 || w == obj + 11
        };
        if keeps {
            self.set_mark(obj, h);
        }
        Ok(())
    }

    fn consider_all(&mut self, words: &[u64]) -> Result<(), CensusError> {
        for &w in words {
            self.consider(w)?;
        }
        Ok(())
    }

    /// Every word of `[from, to)` outside the dynamic space, as ambiguous roots.
    fn scan_range(&mut self, from: u64, to: u64, skip: Option<u64>) -> Result<u64, CensusError> {
        let mut a = from & !7;
        let mut buf = Vec::new();
        while a < to {
            let n = ((to - a) / 8).min(CHUNK_WORDS) as usize;
            buf.resize(n * 8, 0);
            // A stack's guard pages cannot be read: read 4 KiB at a time and skip them.
            let mut readable = vec![true; n.div_ceil(512)];
            if self.mem.read(a, &mut buf).is_err() {
                for (k, piece) in buf.chunks_mut(4096).enumerate() {
                    if self.mem.read(a + k as u64 * 4096, piece).is_err() {
                        readable[k] = false;
                    }
                }
                if !readable.iter().any(|&r| r) {
                    return Err(inconsistent(format!(
                        "the mark cannot read its roots at {a:#x}"
                    )));
                }
            }
            for (i, c) in buf.chunks_exact(8).enumerate() {
                if readable[i / 512] && Some(a + i as u64 * 8) != skip {
                    self.consider(le_u64(c, 0))?;
                }
            }
            a += n as u64 * 8;
            self.drain()?;
        }
        Ok(to.saturating_sub(from))
    }

    /// Marks every object starting in `[from, to)` of the dynamic space (the walk's
    /// starts) and traces them; returns how many were marked.
    fn mark_all(&mut self, from: u64, to: u64) -> Result<u64, CensusError> {
        let mut n = 0;
        let mut a = from & !15;
        while a < to {
            if self.page(a).is_some() && self.is_start(a) && !self.marked(a) {
                let h = self.word(a)?;
                self.set_mark(a, h);
                n += 1;
            }
            a += 16;
        }
        self.drain()?;
        Ok(n)
    }

    /// Traces every marked object not traced yet.
    fn drain(&mut self) -> Result<(), CensusError> {
        let mut words = Vec::new();
        while let Some((base, h)) = self.stack.pop() {
            self.trace(base, h, &mut words)?;
        }
        Ok(())
    }

    fn generation_of(&self, base: u64) -> usize {
        let (gen, bits) = self.page(base).unwrap_or((0, 0));
        if bits & OPEN_REGION_PAGE_FLAG != 0
            && self
                .space
                .regions
                .iter()
                .any(|r| (r.start..r.free).contains(&base))
        {
            return 0;
        }
        usize::from(gen).min(GENERATIONS - 1)
    }

    /// Counts the object at `base` live and considers the words it refers through.
    fn trace(&mut self, base: u64, h: u64, words: &mut Vec<u64>) -> Result<(), CensusError> {
        let widetag = h as u8;
        let size = if sizer(widetag) == Sizer::NotHeader {
            2
        } else {
            object_words(&mut |a| self.word(a), base, h)?
        };
        let end = base.saturating_add(size.saturating_mul(8));
        let gen = self.generation_of(base);
        if size == 0 || end > self.top || self.page(end - 8).is_none() {
            return Err(inconsistent(format!(
                "the mark found an object at {base:#x} (header {h:#x}, {size} words) that \
                 overruns the dynamic space in use"
            )));
        }
        let class = if sizer(widetag) == Sizer::NotHeader {
            ObjectClass::Conses
        } else {
            ObjectClass::of_widetag(widetag)
        };
        let f = &mut self.live[gen][class.index()];
        f.count += 1;
        f.bytes += size * 8;

        match (sizer(widetag), widetag) {
            (Sizer::NotHeader, _) => {
                self.words(base, base + 16, words)?;
            }
            (Sizer::VectorT, SIMPLE_VECTOR_WIDETAG)
                if h & (VECTOR_WEAK_FLAG | VECTOR_HASHING_FLAG) == VECTOR_WEAK_FLAG =>
            {
                // A weak vector (2.3 on interns types and other values in weak
                // hashsets): its elements keep nothing, as in the collector.
            }
            (Sizer::Boxed | Sizer::Array | Sizer::VectorT, 21 | 33 | 77 | 129 | 137 | 233..) => {
                self.words(base + 8, end, words)?;
            }
            (Sizer::Symbol, _) => {
                self.words(base + 16, base + 48, words)?;
                words[3] &= 0xFFFF_FFFF_FFFF; // the name, less its package id
            }
            (Sizer::Code, _) => {
                let boxed = (self.word(base + 8)? & 0xFFFF_FFFF) / 8 * 8;
                self.words(base + 16, (base + boxed).min(end), words)?;
            }
            (Sizer::Instance, _) => {
                self.words(base + 8, end, words)?;
                // A lock-free list node's `next` may be an untagged instance pointer.
                // (`consider` keeps it only when an instance starts there.)
                if let Some(&first) = words.first() {
                    if first != 0 && first & 15 == 0 {
                        self.consider(first | 3)?;
                    }
                }
            }
            (_, FUNCALLABLE_INSTANCE_WIDETAG) => {
                // trampoline, two raw words, then the function and the slots
                self.words(base + 8, end, words)?;
                if words.len() >= 3 {
                    words.drain(1..3);
                }
            }
            (_, CLOSURE_WIDETAG) => {
                self.words(base + 8, end, words)?;
                if let Some(fun) = words.first().copied() {
                    // The raw entry address of the simple-fun: its tagged pointer.
                    words.push(fun.wrapping_sub(16).wrapping_add(11));
                }
            }
            (Sizer::WeakPointer, _) => {
                self.words(base + 8, base + 16, words)?;
            }
            (Sizer::Fdefn, _) => {
                self.words(base + 8, base + 32, words)?;
            }
            _ => return Ok(()), // unboxed: numbers, specialized vectors, strings
        }
        let taken = std::mem::take(words);
        let r = self.consider_all(&taken);
        *words = taken;
        r
    }
}

/// The value cells of the static symbols named `names`, found in static space
/// (`[from, to)`, read in `buf`): each symbol (header widetag 45, 16-byte aligned) whose
/// name, a simple-base-string, is one of them. Nothing is taken from a table of this
/// build's addresses, so a symbol that moved is still found, and one that is not there
/// refuses the mark.
fn static_symbols<const N: usize>(
    mem: &mut ProcessMemory,
    from: u64,
    buf: &[u8],
    names: [&str; N],
) -> Result<[u64; N], CensusError> {
    let mut found = [0u64; N];
    for off in (0..buf.len().saturating_sub(48)).step_by(16) {
        if buf[off] != SYMBOL_WIDETAG {
            continue;
        }
        let p = le_u64(buf, off + SYMBOL_NAME) & 0xFFFF_FFFF_FFFF;
        let mut head = [0u8; 16];
        if p & 15 != 15 || mem.read(p - 15, &mut head).is_err() {
            continue;
        }
        let len = le_u64(&head, 8) >> 1;
        if head[0] != SIMPLE_BASE_STRING_WIDETAG || len > 64 {
            continue;
        }
        let mut chars = vec![0u8; len as usize];
        if mem.read(p - 15 + 16, &mut chars).is_err() {
            continue;
        }
        for (i, name) in names.iter().enumerate() {
            if found[i] == 0 && chars == name.as_bytes() {
                found[i] = from + off as u64 + SYMBOL_VALUE;
            }
        }
    }
    for (i, name) in names.iter().enumerate() {
        if found[i] == 0 {
            return Err(inconsistent(format!(
                "static space does not hold the symbol {name}: not an SBCL build whose \
                 roots the mark knows"
            )));
        }
    }
    Ok(found)
}

/// Each task of `pid`: its stack pointer and whether it is in a system call.
fn task_stack_pointers(pid: u32) -> Vec<(u64, bool)> {
    let Ok(dir) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return Vec::new();
    };
    dir.filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u64>().ok())
        .filter_map(|tid| stack_pointer(pid, tid))
        .collect()
}

/// The stack pointer of thread `tid` of `pid`, and whether it is in a system call.
fn stack_pointer(pid: u32, tid: u64) -> Option<(u64, bool)> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/task/{tid}/syscall")).ok()?;
    let f: Vec<&str> = s.split_whitespace().collect();
    if f.len() < 3 {
        return None;
    }
    let sp = u64::from_str_radix(f[f.len() - 2].trim_start_matches("0x"), 16).ok()?;
    Some((sp, f[0] != "-1"))
}

pub(super) fn mark(
    mem: &mut ProcessMemory,
    rt: &SbclRuntime,
    space: &Space,
) -> Result<SbclMark, CensusError> {
    let t = Instant::now();
    if !rt.release.mark {
        return Err(inconsistent(format!(
            "the mark from the roots does not know SBCL {}'s roots",
            rt.version
        )));
    }
    let syms = rt
        .mark_symbols
        .clone()
        .map_err(|e| inconsistent(format!("the mark cannot find the runtime's roots: {e}")))?;
    let [fixedobj_start, fixedobj_free, text_start, text_high, static_free, sig_handlers, package_vector, init_function, profile_data, sprof_enabled] =
        syms[..]
    else {
        return Err(inconsistent("the mark's symbols are not all there".into()));
    };
    let [object_watcher, static_start_at, trailer_at, permgen_bounds, permgen_free] =
        rt.mark_optional[..]
    else {
        return Err(inconsistent("the mark's symbols are not all there".into()));
    };
    let top = space.start + space.next_free * PAGE_BYTES;
    let nbits = space.next_free * PAGE_BYTES / 16;
    let mut m = Marker {
        mem,
        space,
        top,
        marks: vec![0u64; (nbits as usize).div_ceil(64)],
        stack: Vec::new(),
        cache_tags: vec![u64::MAX; CACHE_SLOTS],
        cache: vec![Vec::new(); CACHE_SLOTS],
        scratch: Vec::new(),
        live: vec![vec![ObjectFigures::default(); ObjectClass::ALL.len()]; GENERATIONS],
    };
    let mut roots = MarkRoots::default();

    mark_c_roots(
        &mut m,
        sig_handlers,
        [
            Some(package_vector),
            Some(init_function),
            object_watcher,
            Some(profile_data),
        ],
    )?;
    let free_tls_at = mark_static_space(
        &mut m,
        rt,
        &mut roots,
        static_start_at,
        static_free,
        trailer_at,
    )?;
    mark_permanent_generation(&mut m, &mut roots, permgen_bounds, permgen_free)?;
    mark_immobile_space(
        &mut m,
        &mut roots,
        [
            (
                "fixed-object",
                fixedobj_start,
                fixedobj_free,
                FIXEDOBJ_SPACE_SIZE,
            ),
            ("text", text_start, text_high, TEXT_SPACE_SIZE),
        ],
    )?;
    mark_threads(&mut m, rt, &mut roots, free_tls_at)?;
    mark_pseudo_static(&mut m, &mut roots)?;
    mark_profiled_code(&mut m, sprof_enabled)?;
    Ok(SbclMark {
        live_by_generation: m.live,
        roots,
        mark_us: t.elapsed().as_micros() as u64,
    })
}

/// The runtime's C roots: the signal handlers and the Lisp objects C variables hold.
fn mark_c_roots(
    m: &mut Marker,
    sig_handlers: u64,
    variables: [Option<u64>; 4],
) -> Result<(), CensusError> {
    let mut words = vec![0u8; NSIG * 8];
    m.mem.read(sig_handlers, &mut words)?;
    let mut c_roots: Vec<u64> = words.chunks_exact(8).map(|c| le_u64(c, 0)).collect();
    for a in variables.into_iter().flatten() {
        c_roots.push(m.mem.read_u64(a)?);
    }
    m.consider_all(&c_roots)?;
    m.drain()?;
    Ok(())
}

/// Static space: from its start to its free pointer, and 2.6's trailer; where
/// FREE-TLS-INDEX is (a static symbol found there by name).
fn mark_static_space(
    m: &mut Marker,
    rt: &SbclRuntime,
    roots: &mut MarkRoots,
    static_start_at: Option<u64>,
    static_free_at: u64,
    trailer_at: Option<u64>,
) -> Result<u64, CensusError> {
    // Static space: from its start to its free pointer, and 2.6's trailer of static
    // constants (NIL, T) at its end; the static symbols found there by name.
    let static_start = match (rt.release.static_space_start, static_start_at) {
        (Some(a), _) => a,
        (None, Some(at)) => m.mem.read_u64(at)?,
        (None, None) => {
            return Err(inconsistent(
                "the runtime exports no STATIC_SPACE_START, which this release places at \
                 run time"
                    .into(),
            ))
        }
    };
    let static_end = static_start + STATIC_SPACE_SIZE;
    let static_free = m.mem.read_u64(static_free_at)?;
    if !(static_start < static_free && static_free <= static_end) {
        return Err(inconsistent(format!(
            "static_space_free_pointer {static_free:#x} is outside static space \
             ({static_start:#x}-{static_end:#x})"
        )));
    }
    let mut static_buf = vec![0u8; (static_free - static_start) as usize];
    m.mem.read(static_start, &mut static_buf)?;
    let [free_tls_at, codeblob_tree] = static_symbols(
        m.mem,
        static_start,
        &static_buf,
        [FREE_TLS_INDEX, DYNSPACE_CODEBLOB_TREE],
    )?;
    drop(static_buf);
    roots.static_bytes = m.scan_range(static_start, static_free, Some(codeblob_tree))?;
    if rt.release.static_space_start.is_none() {
        let Some(at) = trailer_at else {
            return Err(inconsistent(
                "the runtime exports no static_space_trailer_start (NIL and T)".into(),
            ));
        };
        let trailer = m.mem.read_u64(at)?;
        if !(static_free <= trailer && trailer < static_end) {
            return Err(inconsistent(format!(
                "static space's trailer {trailer:#x} is outside static space"
            )));
        }
        roots.static_bytes += m.scan_range(trailer, static_end, None)?;
    }
    Ok(free_tls_at)
}

/// The permanent generation (2.5 on), when a core put objects there.
fn mark_permanent_generation(
    m: &mut Marker,
    roots: &mut MarkRoots,
    permgen_bounds: Option<u64>,
    permgen_free: Option<u64>,
) -> Result<(), CensusError> {
    // The permanent generation (2.5 on), when a core put objects there: every word.
    if let (Some(bounds), Some(free_at)) = (permgen_bounds, permgen_free) {
        let from = m.mem.read_u64(bounds)?;
        let to = m.mem.read_u64(free_at)?;
        if from != 0 || to != 0 {
            if to < from || to - from > MAX_PERMGEN {
                return Err(inconsistent(format!(
                    "the permanent generation does not hold together ({from:#x}-{to:#x})"
                )));
            }
            roots.static_bytes += m.scan_range(from, to, None)?;
        }
    }
    Ok(())
}

/// Immobile space: each of its spaces (name, start and free pointer's symbols, size)
/// from its start to its free pointer.
fn mark_immobile_space(
    m: &mut Marker,
    roots: &mut MarkRoots,
    spaces: [(&str, u64, u64, u64); 2],
) -> Result<(), CensusError> {
    for (what, start_at, free_at, size) in spaces {
        let from = m.mem.read_u64(start_at)?;
        let to = m.mem.read_u64(free_at)?;
        if from == 0 || to < from || to - from > size {
            return Err(inconsistent(format!(
                "immobile {what} space does not hold together (start {from:#x}, free \
                 pointer {to:#x})"
            )));
        }
        roots.immobile_bytes += m.scan_range(from, to, None)?;
    }
    Ok(())
}

/// Every live thread: its stacks, binding stack and thread-local values, and the
/// objects of its open regions when it is not in a system call.
fn mark_threads(
    m: &mut Marker,
    rt: &SbclRuntime,
    roots: &mut MarkRoots,
    free_tls_at: u64,
) -> Result<(), CensusError> {
    let lisp_thread = rt.release.thread_lisp_thread;
    let free_tls = m.mem.read_u64(free_tls_at)?;
    if free_tls % 8 != 0 || free_tls <= lisp_thread || free_tls > 1 << 24 {
        return Err(inconsistent(format!(
            "FREE-TLS-INDEX is {free_tls}, not a thread-local area's size"
        )));
    }
    let tasks = task_stack_pointers(m.mem.pid());
    let mut thread = m.mem.read_u64(rt.all_threads)?;
    let mut t_buf = vec![0u8; 256];
    let mut buf = Vec::new();
    while thread != 0 {
        roots.threads += 1;
        if u64::from(roots.threads) > MAX_THREADS {
            return Err(inconsistent(
                "the runtime's thread list does not end".into(),
            ));
        }
        m.mem.read(thread, &mut t_buf)?;
        let next = le_u64(&t_buf, rt.release.thread_next as usize);
        if le_u64(&t_buf, rt.release.thread_this as usize) != thread {
            return Err(inconsistent(format!(
                "the thread structure at {thread:#x} does not point to itself"
            )));
        }
        if t_buf[THREAD_STATE] == STATE_DEAD {
            thread = next;
            continue;
        }
        let (cs_start, cs_end) = (
            le_u64(&t_buf, THREAD_CONTROL_STACK_START),
            le_u64(&t_buf, THREAD_CONTROL_STACK_END),
        );
        let (bs_start, bs_ptr) = (
            le_u64(&t_buf, THREAD_BINDING_STACK_START),
            le_u64(&t_buf, THREAD_BINDING_STACK_POINTER),
        );
        let stacks_hold = cs_start < cs_end
            && cs_end - cs_start <= MAX_STACK
            && bs_start <= bs_ptr
            && bs_ptr - bs_start <= MAX_STACK;
        if !stacks_hold {
            return Err(inconsistent(format!(
                "the thread at {thread:#x} has stacks that do not hold together (control \
                 {cs_start:#x}-{cs_end:#x}, binding {bs_start:#x}-{bs_ptr:#x})"
            )));
        }
        let task = tasks
            .iter()
            .copied()
            .find(|&(sp, _)| (cs_start..cs_end).contains(&sp));
        let (from, in_syscall) = match task {
            Some((sp, in_syscall)) => {
                roots.stacks_from_sp += 1;
                (sp.saturating_sub(RED_ZONE).max(cs_start), in_syscall)
            }
            _ => (cs_start, false),
        };
        if !in_syscall {
            roots.threads_outside_syscall += 1;
            let owner = format!("thread {thread:#x} ");
            for r in m
                .space
                .regions
                .iter()
                .filter(|r| r.owner.starts_with(&owner))
            {
                roots.open_region_objects += m.mark_all(r.start, r.free)?;
            }
        }
        roots.stack_bytes += m.scan_range(from, cs_end, None)?;
        roots.binding_stack_bytes += m.scan_range(bs_start, bs_ptr, None)?;
        buf.resize((free_tls - lisp_thread) as usize, 0);
        m.mem.read(thread + lisp_thread, &mut buf)?;
        let tls: Vec<u64> = buf.chunks_exact(8).map(|c| le_u64(c, 0)).collect();
        m.consider_all(&tls)?;
        m.drain()?;
        roots.tls_bytes += free_tls - lisp_thread;
        thread = next;
    }
    Ok(())
}

/// The pseudo-static generation: every object a root.
fn mark_pseudo_static(m: &mut Marker, roots: &mut MarkRoots) -> Result<(), CensusError> {
    for (i, &(gen, bits)) in m.space.pages.iter().enumerate() {
        if gen != PSEUDO_STATIC_GENERATION || bits == 0 {
            continue;
        }
        let first = i as u64 * PAGE_BYTES / 16;
        let last = first + PAGE_BYTES / 16;
        let mut g = first;
        while g < last {
            let w = m.space.starts.get((g / 64) as usize).copied().unwrap_or(0) >> (g % 64);
            if w == 0 {
                g = (g / 64 + 1) * 64;
                continue;
            }
            g += u64::from(w.trailing_zeros());
            if g >= last {
                break;
            }
            if !bit(&m.marks, g) {
                roots.pseudo_static_objects += 1;
                let base = m.space.start + g * 16;
                let h = m.word(base)?;
                m.set_mark(base, h);
            }
            g += 1;
        }
        m.drain()?;
    }
    Ok(())
}

/// With sb-sprof on, the collector keeps every code object of the dynamic space (its
/// samples may name them).
fn mark_profiled_code(m: &mut Marker, sprof_enabled: u64) -> Result<(), CensusError> {
    if m.mem.read_u32(sprof_enabled)? != 0 {
        for (i, &(_, bits)) in m.space.pages.iter().enumerate() {
            if bits != 0 && bits & PAGE_TYPE_MASK == CODE_PAGE_TYPE {
                let from = m.space.start + i as u64 * PAGE_BYTES;
                for a in (from..from + PAGE_BYTES).step_by(16) {
                    if m.is_start(a) && !m.marked(a) {
                        let h = m.word(a)?;
                        if h as u8 == CODE_WIDETAG
                            && m.page(a).is_some_and(|p| p.0 != PSEUDO_STATIC_GENERATION)
                        {
                            m.set_mark(a, h);
                        }
                    }
                }
                m.drain()?;
            }
        }
    }
    Ok(())
}
