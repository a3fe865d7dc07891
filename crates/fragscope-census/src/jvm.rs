//! A HotSpot JVM's Java heap, read from outside the process: its collector's regions or
//! spaces, and the runtime areas its own tables locate (code cache, Java thread stacks,
//! card table).
//!
//! HotSpot describes its own layout for debuggers (the serviceability agent, `jhsdb`):
//! libjvm.so exports `gHotSpotVMStructs`, `gHotSpotVMTypes` and `gHotSpotVMIntConstants`,
//! tables naming every field the agent reads with its offset (or, for a static, its
//! address), every type's size and the constants it needs. The census reads those tables
//! once, then only the fields they describe: no offset is written here, so one reader
//! serves every release whose tables name the fields (a field they do not name refuses the
//! census with a note, never a guess). The collector is the one the JVM's own flags say
//! (`UseG1GC`, ...), read through the flag table the same tables locate.
//!
//! G1's heap is regions of one size (`HeapRegion::GrainBytes`), each with its type, bottom,
//! top and end, listed in the region manager's table; Parallel's and Serial's are spaces of
//! generations (eden, two survivor spaces, old). Either way a space holds objects from its
//! bottom to its top: what the collector counts as used (live objects and garbage it has
//! not collected yet). The regions must lie one after another from the heap's reserved
//! start; a stop that lands while the collector changes them finds them apart, and the
//! census is taken again.

use std::collections::HashMap;

use fragscope_trace::jvm_heap::{JvmAreaKind, JvmCollector, JvmHeap, JvmSpace, JvmSpaceKind};

use crate::ghc::CensusError;
use crate::jvm_attach::NativeCategory;
use crate::library::MappedLibrary;
use crate::memory::le_u64;
use crate::{ProcessMemory, Symbols};

/// More regions or threads than this are corrupt pointers rather than a JVM.
const MAX_REGIONS: u64 = 1 << 22;
const MAX_THREADS: u64 = 1 << 20;

/// The symbols libjvm.so exports for its debuggers: the tables and their strides.
const EXPORTS: [&str; 21] = [
    "gHotSpotVMStructs",
    "gHotSpotVMStructEntryArrayStride",
    "gHotSpotVMStructEntryTypeNameOffset",
    "gHotSpotVMStructEntryFieldNameOffset",
    "gHotSpotVMStructEntryIsStaticOffset",
    "gHotSpotVMStructEntryOffsetOffset",
    "gHotSpotVMStructEntryAddressOffset",
    "gHotSpotVMTypes",
    "gHotSpotVMTypeEntryArrayStride",
    "gHotSpotVMTypeEntryTypeNameOffset",
    "gHotSpotVMTypeEntrySizeOffset",
    "gHotSpotVMIntConstants",
    "gHotSpotVMIntConstantEntryArrayStride",
    "gHotSpotVMIntConstantEntryNameOffset",
    "gHotSpotVMIntConstantEntryValueOffset",
    "gHotSpotVMLongConstants",
    "gHotSpotVMLongConstantEntryArrayStride",
    "gHotSpotVMLongConstantEntryNameOffset",
    "gHotSpotVMLongConstantEntryValueOffset",
    "gHotSpotVMTypeEntryIsOopTypeOffset",
    "gHotSpotVMTypeEntrySuperclassNameOffset",
];

/// HotSpot's self-description, as its tables give it.
#[derive(Debug, Clone, Default)]
struct VmStructs {
    /// "Type::field" -> offset in the type (a field of an instance) or address (a static).
    fields: HashMap<String, u64>,
    sizes: HashMap<String, u64>,
    ints: HashMap<String, i64>,
}

impl VmStructs {
    fn read(mem: &mut ProcessMemory, syms: &Symbols) -> Result<Self, String> {
        let mut strings = Strings::default();
        let word = |mem: &mut ProcessMemory, name: &str| -> Result<u64, String> {
            let at = syms.need(name)?;
            mem.read_u64(at)
                .map_err(|e| format!("libjvm.so's {name} cannot be read ({e})"))
        };
        let mut out = VmStructs::default();
        // The structs: {typeName, fieldName, typeString, isStatic, offset, address}.
        let table = word(mem, "gHotSpotVMStructs")?;
        let stride = word(mem, "gHotSpotVMStructEntryArrayStride")?;
        let type_name = word(mem, "gHotSpotVMStructEntryTypeNameOffset")?;
        let field_name = word(mem, "gHotSpotVMStructEntryFieldNameOffset")?;
        let is_static = word(mem, "gHotSpotVMStructEntryIsStaticOffset")?;
        let offset = word(mem, "gHotSpotVMStructEntryOffsetOffset")?;
        let address = word(mem, "gHotSpotVMStructEntryAddressOffset")?;
        for entry in entries(mem, table, stride, type_name)? {
            let ty = strings.get(mem, le_u64(&entry, type_name as usize))?;
            let field = strings.get(mem, le_u64(&entry, field_name as usize))?;
            let statik = entry.get(is_static as usize).is_some_and(|b| *b != 0);
            let value = le_u64(&entry, if statik { address } else { offset } as usize);
            out.fields.insert(format!("{ty}::{field}"), value);
        }
        // The types: {typeName, superclassName, isOopType, isIntegerType, isUnsigned, size}.
        let table = word(mem, "gHotSpotVMTypes")?;
        let stride = word(mem, "gHotSpotVMTypeEntryArrayStride")?;
        let type_name = word(mem, "gHotSpotVMTypeEntryTypeNameOffset")?;
        let size = word(mem, "gHotSpotVMTypeEntrySizeOffset")?;
        for entry in entries(mem, table, stride, type_name)? {
            let ty = strings.get(mem, le_u64(&entry, type_name as usize))?;
            out.sizes.insert(ty, le_u64(&entry, size as usize));
        }
        // The int constants: {name, value (int32)}.
        let table = word(mem, "gHotSpotVMIntConstants")?;
        let stride = word(mem, "gHotSpotVMIntConstantEntryArrayStride")?;
        let name = word(mem, "gHotSpotVMIntConstantEntryNameOffset")?;
        let value = word(mem, "gHotSpotVMIntConstantEntryValueOffset")? as usize;
        for entry in entries(mem, table, stride, name)? {
            let n = strings.get(mem, le_u64(&entry, name as usize))?;
            let v = entry
                .get(value..value + 4)
                .map_or(0, |b| i32::from_le_bytes(b.try_into().unwrap()));
            out.ints.insert(n, i64::from(v));
        }
        if out.fields.is_empty() {
            return Err("libjvm.so's VMStructs table is empty".into());
        }
        Ok(out)
    }

    /// The offset of `ty::field` in an instance of `ty`.
    fn offset(&self, ty: &str, field: &str) -> Result<u64, String> {
        self.fields
            .get(&format!("{ty}::{field}"))
            .copied()
            .ok_or_else(|| format!("this JVM's VMStructs do not describe {ty}::{field}"))
    }

    /// The address of the static `ty::field`.
    fn address(&self, ty: &str, field: &str) -> Result<u64, String> {
        self.offset(ty, field)
    }

    fn size(&self, ty: &str) -> Result<u64, String> {
        self.sizes
            .get(ty)
            .copied()
            .ok_or_else(|| format!("this JVM's VMStructs do not describe the type {ty}"))
    }

    fn int(&self, name: &str) -> Result<i64, String> {
        self.ints
            .get(name)
            .copied()
            .ok_or_else(|| format!("this JVM's VMStructs have no constant {name}"))
    }
}

/// The entries of one of the tables, read until the one whose name (at `name`) is null.
fn entries(
    mem: &mut ProcessMemory,
    table: u64,
    stride: u64,
    name: u64,
) -> Result<Vec<Vec<u8>>, String> {
    if !(8..=4096).contains(&stride) || name + 8 > stride {
        return Err(format!("libjvm.so's tables have entries of {stride} bytes"));
    }
    let mut out = Vec::new();
    // A few hundred entries: read them 256 at a time.
    let batch = 256u64;
    let mut buf = vec![0u8; (batch * stride) as usize];
    for first in (0..).step_by(batch as usize) {
        let at = table + first * stride;
        if mem.read(at, &mut buf).is_err() {
            // The table may end near its mapping's end: entry by entry then.
            buf.truncate(stride as usize);
            for i in 0..batch {
                mem.read(at + i * stride, &mut buf)
                    .map_err(|e| format!("libjvm.so's tables cannot be read ({e})"))?;
                if le_u64(&buf, name as usize) == 0 {
                    return Ok(out);
                }
                out.push(buf.clone());
            }
            buf.resize((batch * stride) as usize, 0);
            continue;
        }
        for entry in buf.chunks_exact(stride as usize) {
            if le_u64(entry, name as usize) == 0 {
                return Ok(out);
            }
            out.push(entry.to_vec());
        }
        if out.len() > 100_000 {
            return Err("libjvm.so's tables do not end".into());
        }
    }
    unreachable!()
}

/// C strings of the process, each read once.
#[derive(Default)]
struct Strings(HashMap<u64, String>);

impl Strings {
    fn get(&mut self, mem: &mut ProcessMemory, at: u64) -> Result<String, String> {
        if at == 0 {
            return Ok(String::new());
        }
        if let Some(s) = self.0.get(&at) {
            return Ok(s.clone());
        }
        let s = read_c_string(mem, at)?;
        self.0.insert(at, s.clone());
        Ok(s)
    }
}

/// The NUL-terminated string at `at` (at most 4 KiB), read in pieces that stop at a page's
/// end so that a string near the end of its mapping is read too.
fn read_c_string(mem: &mut ProcessMemory, at: u64) -> Result<String, String> {
    let mut bytes = Vec::new();
    let mut p = at;
    while bytes.len() < 4096 {
        let piece = (64 - (p % 64)) as usize;
        let mut buf = vec![0u8; piece];
        mem.read(p, &mut buf)
            .map_err(|e| format!("a string of libjvm.so cannot be read ({e})"))?;
        if let Some(n) = buf.iter().position(|&b| b == 0) {
            bytes.extend_from_slice(&buf[..n]);
            return Ok(String::from_utf8_lossy(&bytes).into_owned());
        }
        bytes.extend_from_slice(&buf);
        p += piece as u64;
    }
    Err(format!("the string at {at:#x} of libjvm.so does not end"))
}

/// The garbage collector a JVM runs, as its flags say.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Collector {
    /// One whose heap the census reads.
    Read(JvmCollector),
    /// ZGC, Shenandoah, Epsilon: named, not read.
    Other(&'static str),
}

/// A JVM found in a process: its tables, its release and its collector.
#[derive(Debug, Clone)]
pub struct HotSpot {
    /// The VM's release, as "17.0.15+6-Debian-1deb12u1".
    pub release: String,
    pub collector: Collector,
    vm: VmStructs,
    max_heap: u64,
    initial_heap: u64,
    min_free_ratio: u8,
    max_free_ratio: u8,
    /// -XX:NativeMemoryTracking ("off", "summary", "detail").
    pub native_memory_tracking: String,
    /// The JVM handles SIGQUIT and keeps its attach mechanism (neither -Xrs nor
    /// -XX:+DisableAttachMechanism): `jvm_attach` may ask it.
    pub attach_allowed: bool,
}

/// The flags the census reads: the collector's and the heap's sizing.
const FLAGS: [&str; 13] = [
    "UseG1GC",
    "UseParallelGC",
    "UseSerialGC",
    "UseZGC",
    "UseShenandoahGC",
    "UseEpsilonGC",
    "MaxHeapSize",
    "InitialHeapSize",
    "MinHeapFreeRatio",
    "MaxHeapFreeRatio",
    "ReduceSignalUsage",
    "DisableAttachMechanism",
    "NativeMemoryTracking",
];

impl HotSpot {
    /// The JVM of process `pid`: `None` when it maps no libjvm.so, Err when it does but
    /// its tables cannot be read (a note for the report).
    pub fn detect(pid: u32) -> Option<Result<Self, String>> {
        let lib = match MappedLibrary::find(pid, "libjvm.so") {
            Ok(Some(lib)) => lib,
            Ok(None) => return None,
            Err(e) => return Some(Err(format!("a JVM whose maps cannot be read: {e}"))),
        };
        Some(Self::locate(pid, &lib).map_err(|e| format!("no JVM heap census: {e}")))
    }

    fn locate(pid: u32, lib: &MappedLibrary) -> Result<Self, String> {
        let elf = lib.elf(pid)?;
        let syms = Symbols::resolve_at(&elf, &EXPORTS, lib.base)?;
        let mut mem = ProcessMemory::open(pid)
            .map_err(|e| format!("the JVM's memory cannot be read ({e})"))?;
        let vm = VmStructs::read(&mut mem, &syms)?;
        let release_at = mem
            .read_u64(vm.address("Abstract_VM_Version", "_s_vm_release")?)
            .map_err(|e| e.to_string())?;
        let release = Strings::default().get(&mut mem, release_at)?;
        let flags = read_flags(&mut mem, &vm)?;
        let flag = |name: &str| flags.get(name).copied();
        let on = |name: &str| flag(name).is_some_and(|v| v & 0xff != 0);
        let collector = if on("UseG1GC") {
            Collector::Read(JvmCollector::G1)
        } else if on("UseParallelGC") {
            Collector::Read(JvmCollector::Parallel)
        } else if on("UseSerialGC") {
            Collector::Read(JvmCollector::Serial)
        } else if on("UseZGC") {
            Collector::Other("ZGC")
        } else if on("UseShenandoahGC") {
            Collector::Other("Shenandoah")
        } else if on("UseEpsilonGC") {
            Collector::Other("Epsilon")
        } else {
            return Err("the JVM's flags name no collector the census knows".into());
        };
        Ok(Self {
            release,
            collector,
            max_heap: flag("MaxHeapSize").unwrap_or(0),
            initial_heap: flag("InitialHeapSize").unwrap_or(0),
            min_free_ratio: flag("MinHeapFreeRatio").map_or(0, |v| v.min(100) as u8),
            max_free_ratio: flag("MaxHeapFreeRatio").map_or(0, |v| v.min(100) as u8),
            native_memory_tracking: match flag("NativeMemoryTracking") {
                Some(at) if at != 0 => Strings::default().get(&mut mem, at)?,
                _ => "off".into(),
            },
            attach_allowed: !on("ReduceSignalUsage") && !on("DisableAttachMechanism"),
            vm,
        })
    }

    /// The JVM's own account of its memory by category (`VM.native_memory summary`, asked
    /// through its attach mechanism while it runs), when native memory tracking is on;
    /// None when it is off.
    pub fn native_memory(&self, pid: u32) -> Option<Result<Vec<NativeCategory>, String>> {
        if self.native_memory_tracking == "off" || self.native_memory_tracking.is_empty() {
            return None;
        }
        if !self.attach_allowed {
            return Some(Err(
                "native memory tracking is on, but the JVM runs with -Xrs or \
                 -XX:+DisableAttachMechanism: it cannot be asked"
                    .into(),
            ));
        }
        let answer = crate::jvm_attach::jcmd(
            pid,
            "VM.native_memory summary",
            std::time::Duration::from_secs(2),
        );
        Some(answer.and_then(|text| {
            let categories = crate::jvm_attach::parse_native_memory(&text);
            if categories.is_empty() {
                Err(format!(
                    "VM.native_memory answered without categories: {}",
                    text.trim()
                ))
            } else {
                Ok(categories)
            }
        }))
    }
}

/// The values of [`FLAGS`] the JVM defines, each as the word at its address (a bool is
/// its low byte).
fn read_flags(mem: &mut ProcessMemory, vm: &VmStructs) -> Result<HashMap<String, u64>, String> {
    let err = |e: std::io::Error| format!("the JVM's flags cannot be read ({e})");
    let table = mem.read_u64(vm.address("JVMFlag", "flags")?).map_err(err)?;
    let count = mem
        .read_u64(vm.address("JVMFlag", "numFlags")?)
        .map_err(err)?;
    let size = vm.size("JVMFlag")?;
    let (name_at, addr_at) = (
        vm.offset("JVMFlag", "_name")?,
        vm.offset("JVMFlag", "_addr")?,
    );
    if count > 10_000 || !(16..=256).contains(&size) || name_at + 8 > size || addr_at + 8 > size {
        return Err(format!(
            "the JVM's flag table ({count} flags of {size} bytes) is not one"
        ));
    }
    let mut all = vec![0u8; (count * size) as usize];
    mem.read(table, &mut all).map_err(err)?;
    let mut strings = Strings::default();
    let mut out = HashMap::new();
    for flag in all.chunks_exact(size as usize) {
        let name = le_u64(flag, name_at as usize);
        if name == 0 {
            continue;
        }
        let name = strings.get(mem, name)?;
        if FLAGS.contains(&name.as_str()) {
            let value = mem.read_u64(le_u64(flag, addr_at as usize)).map_err(err)?;
            out.insert(name, value);
        }
    }
    Ok(out)
}

/// A record of `size` bytes at `at`, for reading its fields by the tables' offsets.
struct Record {
    bytes: Vec<u8>,
    at: u64,
}

impl Record {
    fn read(mem: &mut ProcessMemory, at: u64, size: u64) -> Result<Self, CensusError> {
        if at == 0 || size > 1 << 16 {
            return Err(CensusError::Inconsistent(format!(
                "a JVM structure of {size} bytes at {at:#x}"
            )));
        }
        let mut bytes = vec![0u8; size as usize];
        mem.read(at, &mut bytes)?;
        Ok(Self { bytes, at })
    }

    fn word(&self, offset: u64) -> Result<u64, CensusError> {
        let o = offset as usize;
        self.bytes
            .get(o..o + 8)
            .map(|b| u64::from_le_bytes(b.try_into().unwrap()))
            .ok_or_else(|| {
                CensusError::Inconsistent(format!(
                    "a field at offset {offset} beyond the structure at {:#x}",
                    self.at
                ))
            })
    }

    fn u32(&self, offset: u64) -> Result<u32, CensusError> {
        let o = offset as usize;
        self.bytes
            .get(o..o + 4)
            .map(|b| u32::from_le_bytes(b.try_into().unwrap()))
            .ok_or_else(|| {
                CensusError::Inconsistent(format!(
                    "a field at offset {offset} beyond the structure at {:#x}",
                    self.at
                ))
            })
    }
}

fn layout(e: String) -> CensusError {
    CensusError::Inconsistent(e)
}

/// A census of the JVM's heap, taken while the process is held. `NoHeap` while the JVM
/// has not made its heap yet.
pub fn census(mem: &mut ProcessMemory, jvm: &HotSpot) -> Result<JvmHeap, CensusError> {
    let vm = &jvm.vm;
    let Collector::Read(collector) = jvm.collector else {
        let Collector::Other(name) = jvm.collector else {
            unreachable!()
        };
        return Err(CensusError::Inconsistent(format!(
            "this JVM runs {name}; the census reads the G1, Parallel and Serial collectors' heaps"
        )));
    };
    let heap = mem.read_u64(vm.address("Universe", "_collectedHeap").map_err(layout)?)?;
    if heap == 0 {
        return Err(CensusError::NoHeap);
    }
    let reserved_at = heap + vm.offset("CollectedHeap", "_reserved").map_err(layout)?;
    let start = mem.read_u64(reserved_at + vm.offset("MemRegion", "_start").map_err(layout)?)?;
    let words =
        mem.read_u64(reserved_at + vm.offset("MemRegion", "_word_size").map_err(layout)?)?;
    let reserved = (start, start.saturating_add(words.saturating_mul(8)));
    let (spaces, region_bytes, committed, used) = match collector {
        JvmCollector::G1 => g1_regions(mem, vm, heap, reserved)?,
        JvmCollector::Parallel => {
            let spaces = parallel_spaces(mem, vm)?;
            let (c, u) = totals(&spaces);
            (spaces, 0, c, u)
        }
        JvmCollector::Serial => {
            let spaces = serial_spaces(mem, vm, heap)?;
            let (c, u) = totals(&spaces);
            (spaces, 0, c, u)
        }
    };
    check_spaces(&spaces, reserved)?;
    let mut areas = Vec::new();
    areas.extend(code_cache(mem, vm)?);
    areas.extend(java_thread_stacks(mem, vm)?);
    areas.extend(card_table(mem, vm)?);
    let archive = class_data_archive(mem, vm)?;
    let archive_copied = match archive {
        Some((_, lo, hi)) => copied_bytes(mem.pid(), lo, hi)?,
        None => 0,
    };
    areas.extend(archive);
    Ok(JvmHeap {
        jvm: jvm.release.clone(),
        collector,
        reserved,
        region_bytes,
        spaces,
        areas,
        archive_copied,
        native_memory: None,
        committed,
        used,
        max_heap: jvm.max_heap,
        initial_heap: jvm.initial_heap,
        min_free_ratio: jvm.min_free_ratio,
        max_free_ratio: jvm.max_free_ratio,
        pause_us: 0,
    })
}

/// Bytes of the spaces and bytes used in them.
fn totals(spaces: &[JvmSpace]) -> (u64, u64) {
    (
        spaces.iter().map(JvmSpace::bytes).sum(),
        spaces.iter().map(JvmSpace::used).sum(),
    )
}

type Regions = (Vec<JvmSpace>, u64, u64, u64);

/// G1's committed regions, its region size, and its own committed and used figures
/// (`G1MonitoringSupport`, what `jstat` and `jcmd GC.heap_info` report).
fn g1_regions(
    mem: &mut ProcessMemory,
    vm: &VmStructs,
    heap: u64,
    reserved: (u64, u64),
) -> Result<Regions, CensusError> {
    let grain = mem.read_u64(vm.address("HeapRegion", "GrainBytes").map_err(layout)?)?;
    if grain == 0 || !grain.is_power_of_two() {
        return Err(CensusError::Inconsistent(format!(
            "G1 regions of {grain} bytes"
        )));
    }
    let table = heap
        + vm.offset("G1CollectedHeap", "_hrm").map_err(layout)?
        + vm.offset("HeapRegionManager", "_regions").map_err(layout)?;
    let base = mem.read_u64(table + vm.offset("G1HeapRegionTable", "_base").map_err(layout)?)?;
    let length =
        mem.read_u64(table + vm.offset("G1HeapRegionTable", "_length").map_err(layout)?)?;
    if length > MAX_REGIONS || length * grain > reserved.1 - reserved.0 {
        return Err(CensusError::Inconsistent(format!(
            "{length} G1 regions of {grain} bytes in a heap of {} bytes",
            reserved.1 - reserved.0
        )));
    }
    let mut pointers = vec![0u8; (length * 8) as usize];
    mem.read(base, &mut pointers)?;
    let size = vm.size("HeapRegion").map_err(layout)?;
    let off = |f: &str| vm.offset("HeapRegion", f).map_err(layout);
    let (bottom_at, top_at, end_at) = (off("_bottom")?, off("_top")?, off("_end")?);
    let type_at = off("_type")? + vm.offset("HeapRegionType", "_tag").map_err(layout)?;
    let tags = G1Tags::read(vm).map_err(layout)?;
    // A region given back to the kernel keeps its descriptor; its memory is mapped
    // without access then (G1 uncommits by mapping PROT_NONE over it).
    let committed_ranges = writable_mappings(mem.pid(), reserved)?;
    let mut spaces = Vec::new();
    for (i, p) in pointers.chunks_exact(8).enumerate() {
        let p = u64::from_le_bytes(p.try_into().unwrap());
        if p == 0 {
            continue; // never committed
        }
        let r = Record::read(mem, p, size)?;
        let space = JvmSpace {
            kind: tags.kind(r.u32(type_at)?)?,
            bottom: r.word(bottom_at)?,
            top: r.word(top_at)?,
            end: r.word(end_at)?,
        };
        let expected = reserved.0 + i as u64 * grain;
        if space.bottom != expected || space.end != expected + grain {
            return Err(CensusError::Inconsistent(format!(
                "G1 region {i} spans {:#x}-{:#x}, not {expected:#x}-{:#x}",
                space.bottom,
                space.end,
                expected + grain
            )));
        }
        let committed = committed_ranges
            .iter()
            .any(|&(lo, hi)| lo <= space.bottom && space.end <= hi);
        if committed {
            spaces.push(space);
        } else if space.kind != JvmSpaceKind::Free {
            return Err(CensusError::Inconsistent(format!(
                "the {} G1 region at {:#x} is not mapped writable",
                space.kind.name(),
                space.bottom
            )));
        }
    }
    let g1mm = mem.read_u64(heap + vm.offset("G1CollectedHeap", "_g1mm").map_err(layout)?)?;
    let m = Record::read(mem, g1mm, vm.size("G1MonitoringSupport").map_err(layout)?)?;
    let field = |f: &str| -> Result<u64, CensusError> {
        m.word(vm.offset("G1MonitoringSupport", f).map_err(layout)?)
    };
    let committed = field("_eden_space_committed")?
        + field("_survivor_space_committed")?
        + field("_old_gen_committed")?;
    let used =
        field("_eden_space_used")? + field("_survivor_space_used")? + field("_old_gen_used")?;
    Ok((spaces, grain, committed, used))
}

/// The writable mappings of `pid` within `range`, neighbours joined.
fn writable_mappings(pid: u32, range: (u64, u64)) -> Result<Vec<(u64, u64)>, CensusError> {
    let text = crate::maps::read(pid)?;
    let mut out: Vec<(u64, u64)> = Vec::new();
    for m in crate::maps::parse(&text) {
        if m.perms.starts_with("rw") && m.hi > range.0 && m.lo < range.1 {
            match out.last_mut() {
                Some(last) if last.1 == m.lo => last.1 = m.hi,
                _ => out.push((m.lo, m.hi)),
            }
        }
    }
    Ok(out)
}

/// G1's region type tags (`HeapRegionType::Tag`), as the tables give them.
struct G1Tags {
    free: i64,
    eden: i64,
    survivor: i64,
    starts_humongous: i64,
    continues_humongous: i64,
    old_mask: i64,
    archive_mask: i64,
}

impl G1Tags {
    fn read(vm: &VmStructs) -> Result<Self, String> {
        let c = |n: &str| vm.int(&format!("HeapRegionType::{n}"));
        Ok(Self {
            free: c("FreeTag")?,
            eden: c("EdenTag")?,
            survivor: c("SurvTag")?,
            starts_humongous: c("StartsHumongousTag")?,
            continues_humongous: c("ContinuesHumongousTag")?,
            old_mask: c("OldMask")?,
            archive_mask: c("ArchiveMask").unwrap_or(0),
        })
    }

    fn kind(&self, tag: u32) -> Result<JvmSpaceKind, CensusError> {
        let t = i64::from(tag);
        Ok(if t == self.free {
            JvmSpaceKind::Free
        } else if t == self.eden {
            JvmSpaceKind::Eden
        } else if t == self.survivor {
            JvmSpaceKind::Survivor
        } else if t == self.starts_humongous {
            JvmSpaceKind::HumongousStart
        } else if t == self.continues_humongous {
            JvmSpaceKind::HumongousContinues
        } else if self.archive_mask != 0 && t & self.archive_mask != 0 {
            JvmSpaceKind::Archive
        } else if t & self.old_mask != 0 {
            JvmSpaceKind::Old
        } else {
            return Err(CensusError::Inconsistent(format!(
                "a G1 region of unknown type {tag}"
            )));
        })
    }
}

/// One space (a `MutableSpace` or a `ContiguousSpace`) at `at`: its bottom, top and end.
fn space_at(
    mem: &mut ProcessMemory,
    vm: &VmStructs,
    at: u64,
    kind: JvmSpaceKind,
    (ty, bottom_ty, top_ty): (&str, &str, &str),
) -> Result<JvmSpace, CensusError> {
    let size = vm.size(ty).map_err(layout)?;
    let r = Record::read(mem, at, size)?;
    Ok(JvmSpace {
        kind,
        bottom: r.word(vm.offset(bottom_ty, "_bottom").map_err(layout)?)?,
        top: r.word(vm.offset(top_ty, "_top").map_err(layout)?)?,
        end: r.word(vm.offset(bottom_ty, "_end").map_err(layout)?)?,
    })
}

/// The Parallel collector's spaces: the young generation's eden and survivor spaces, the
/// old generation's object space.
fn parallel_spaces(mem: &mut ProcessMemory, vm: &VmStructs) -> Result<Vec<JvmSpace>, CensusError> {
    let young = mem.read_u64(
        vm.address("ParallelScavengeHeap", "_young_gen")
            .map_err(layout)?,
    )?;
    let old = mem.read_u64(
        vm.address("ParallelScavengeHeap", "_old_gen")
            .map_err(layout)?,
    )?;
    let types = ("MutableSpace", "MutableSpace", "MutableSpace");
    let mut spaces = Vec::new();
    for (field, kind) in [
        ("_eden_space", JvmSpaceKind::Eden),
        ("_from_space", JvmSpaceKind::Survivor),
        ("_to_space", JvmSpaceKind::Survivor),
    ] {
        let at = mem.read_u64(young + vm.offset("PSYoungGen", field).map_err(layout)?)?;
        spaces.push(space_at(mem, vm, at, kind, types)?);
    }
    let at = mem.read_u64(old + vm.offset("PSOldGen", "_object_space").map_err(layout)?)?;
    spaces.push(space_at(mem, vm, at, JvmSpaceKind::Old, types)?);
    spaces.sort_by_key(|s| s.bottom);
    Ok(spaces)
}

/// The Serial collector's spaces: the young generation's eden and survivor spaces, the
/// tenured generation's space.
fn serial_spaces(
    mem: &mut ProcessMemory,
    vm: &VmStructs,
    heap: u64,
) -> Result<Vec<JvmSpace>, CensusError> {
    let young = mem.read_u64(
        heap + vm
            .offset("GenCollectedHeap", "_young_gen")
            .map_err(layout)?,
    )?;
    let old = mem.read_u64(heap + vm.offset("GenCollectedHeap", "_old_gen").map_err(layout)?)?;
    let types = ("ContiguousSpace", "Space", "ContiguousSpace");
    let mut spaces = Vec::new();
    for (field, kind) in [
        ("_eden_space", JvmSpaceKind::Eden),
        ("_from_space", JvmSpaceKind::Survivor),
        ("_to_space", JvmSpaceKind::Survivor),
    ] {
        let at = mem.read_u64(young + vm.offset("DefNewGeneration", field).map_err(layout)?)?;
        spaces.push(space_at(mem, vm, at, kind, types)?);
    }
    let at = mem.read_u64(
        old + vm
            .offset("TenuredGeneration", "_the_space")
            .map_err(layout)?,
    )?;
    spaces.push(space_at(mem, vm, at, JvmSpaceKind::Old, types)?);
    spaces.sort_by_key(|s| s.bottom);
    Ok(spaces)
}

/// The spaces (in address order) lie within the reserved heap without overlapping, each
/// used from its bottom.
fn check_spaces(spaces: &[JvmSpace], reserved: (u64, u64)) -> Result<(), CensusError> {
    let mut end = reserved.0;
    for s in spaces {
        if !(s.bottom <= s.top && s.top <= s.end && s.bottom >= end && s.end <= reserved.1) {
            return Err(CensusError::Inconsistent(format!(
                "a {} space {:#x}-{:#x} (top {:#x}) does not fit the heap {:#x}-{:#x}",
                s.kind.name(),
                s.bottom,
                s.end,
                s.top,
                reserved.0,
                reserved.1
            )));
        }
        end = s.end;
    }
    Ok(())
}

/// The code cache's reserved range (its code heaps lie within it).
fn code_cache(
    mem: &mut ProcessMemory,
    vm: &VmStructs,
) -> Result<Option<(JvmAreaKind, u64, u64)>, CensusError> {
    let (Ok(low), Ok(high)) = (
        vm.address("CodeCache", "_low_bound"),
        vm.address("CodeCache", "_high_bound"),
    ) else {
        return Ok(None);
    };
    let (low, high) = (mem.read_u64(low)?, mem.read_u64(high)?);
    Ok((low < high && high - low < 1 << 40).then_some((JvmAreaKind::CodeCache, low, high)))
}

/// Each Java thread's stack, from the JVM's list of Java threads.
fn java_thread_stacks(
    mem: &mut ProcessMemory,
    vm: &VmStructs,
) -> Result<Vec<(JvmAreaKind, u64, u64)>, CensusError> {
    let Ok(list) = vm.address("ThreadsSMRSupport", "_java_thread_list") else {
        return Ok(Vec::new());
    };
    let list = mem.read_u64(list)?;
    if list == 0 {
        return Ok(Vec::new());
    }
    let length = mem.read_u32(list + vm.offset("ThreadsList", "_length").map_err(layout)?)?;
    let threads = mem.read_u64(list + vm.offset("ThreadsList", "_threads").map_err(layout)?)?;
    if u64::from(length) > MAX_THREADS {
        return Err(CensusError::Inconsistent(format!("{length} Java threads")));
    }
    let mut pointers = vec![0u8; length as usize * 8];
    mem.read(threads, &mut pointers)?;
    let base_at = vm.offset("JavaThread", "_stack_base").map_err(layout)?;
    let size_at = vm.offset("JavaThread", "_stack_size").map_err(layout)?;
    let mut out = Vec::new();
    for p in pointers.chunks_exact(8) {
        let t = u64::from_le_bytes(p.try_into().unwrap());
        let base = mem.read_u64(t + base_at)?;
        let size = mem.read_u64(t + size_at)?;
        // A thread not started yet has no stack.
        if base != 0 && size != 0 && size <= base && size < 1 << 34 {
            out.push((JvmAreaKind::ThreadStack, base - size, base));
        }
    }
    out.sort();
    Ok(out)
}

/// The card table of a collector that keeps one (G1, Parallel, Serial).
fn card_table(
    mem: &mut ProcessMemory,
    vm: &VmStructs,
) -> Result<Option<(JvmAreaKind, u64, u64)>, CensusError> {
    let lookup = || -> Result<_, String> {
        Ok((
            vm.address("BarrierSet", "_barrier_set")?,
            vm.offset("BarrierSet", "_fake_rtti")?
                + vm.offset("BarrierSet::FakeRtti", "_concrete_tag")?,
            vm.offset("CardTableBarrierSet", "_card_table")?,
            vm.offset("CardTable", "_byte_map")?,
            vm.offset("CardTable", "_byte_map_size")?,
            [
                vm.int("BarrierSet::CardTableBarrierSet")?,
                vm.int("BarrierSet::G1BarrierSet")?,
            ],
        ))
    };
    let Ok((bs_at, tag_at, table_at, map_at, map_size_at, with_cards)) = lookup() else {
        return Ok(None);
    };
    let bs = mem.read_u64(bs_at)?;
    if bs == 0 || !with_cards.contains(&i64::from(mem.read_u32(bs + tag_at)?)) {
        return Ok(None);
    }
    let table = mem.read_u64(bs + table_at)?;
    let map = mem.read_u64(table + map_at)?;
    let size = mem.read_u64(table + map_size_at)?;
    Ok((map != 0 && size > 0 && size < 1 << 40).then_some((
        JvmAreaKind::CardTable,
        map,
        map + size,
    )))
}

/// The class data sharing archive's range, when the JVM mapped one.
fn class_data_archive(
    mem: &mut ProcessMemory,
    vm: &VmStructs,
) -> Result<Option<(JvmAreaKind, u64, u64)>, CensusError> {
    let (Ok(base), Ok(top)) = (
        vm.address("MetaspaceObj", "_shared_metaspace_base"),
        vm.address("MetaspaceObj", "_shared_metaspace_top"),
    ) else {
        return Ok(None);
    };
    let (base, top) = (mem.read_u64(base)?, mem.read_u64(top)?);
    Ok(
        (base != 0 && base < top && top - base < 1 << 34).then_some((
            JvmAreaKind::ClassDataArchive,
            base,
            top,
        )),
    )
}

/// Bytes of the resident pages of [lo, hi) in `pid` that are its own anonymous copies
/// (pagemap: present, not a page of a file or of shared memory).
fn copied_bytes(pid: u32, lo: u64, hi: u64) -> Result<u64, CensusError> {
    use std::os::unix::fs::FileExt;
    const PRESENT: u64 = 1 << 63;
    const FILE_OR_SHARED: u64 = 1 << 61;
    // SAFETY: sysconf has no memory effects.
    let page = u64::try_from(unsafe { libc::sysconf(libc::_SC_PAGESIZE) }).unwrap_or(4096);
    let pagemap = std::fs::File::open(format!("/proc/{pid}/pagemap"))?;
    let (first, last) = (lo / page, hi.div_ceil(page));
    let mut entries = vec![0u8; 8 * (last - first).min(1 << 16) as usize];
    let mut copied = 0;
    let mut at = first;
    while at < last {
        let n = ((last - at) as usize).min(entries.len() / 8);
        pagemap.read_exact_at(&mut entries[..n * 8], at * 8)?;
        copied += (entries[..n * 8].chunks_exact(8))
            .map(|e| u64::from_le_bytes(e.try_into().unwrap()))
            .filter(|e| e & PRESENT != 0 && e & FILE_OR_SHARED == 0)
            .count() as u64;
        at += n as u64;
    }
    Ok(copied * page)
}

/// The census of process `pid`, read while `pause` holds it (None: not held), taken again
/// a few times when the stop lands while the collector changes its regions.
pub fn census_held(
    pid: u32,
    jvm: &HotSpot,
    mem: &mut ProcessMemory,
    pause: &mut Option<crate::Pause>,
) -> Result<JvmHeap, CensusError> {
    crate::pause::retrying(
        pid,
        pause,
        || census(mem, jvm),
        |e| matches!(e, CensusError::Inconsistent(_)),
    )
    .map_err(|e| e.unwrap_or_else(CensusError::Unreadable))
    .map(|mut heap| {
        heap.pause_us = pause.as_ref().map_or(0, |p| p.held().as_micros() as u64);
        heap
    })
}
