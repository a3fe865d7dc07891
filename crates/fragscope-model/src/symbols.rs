//! Return addresses to function, file and line, for PIE executables and shared libraries
//! loaded anywhere (ASLR): a runtime address is turned into an offset in the mapped file,
//! then into the file's own virtual address through its program headers. DWARF comes
//! from a separate debug file found by build-id (/usr/lib/debug/.build-id/) when present,
//! else from the file itself; without DWARF the symbol table names the function; without
//! either, the frame is shown as module+offset, never dropped.

use std::borrow::Cow;
use std::collections::HashMap;
use std::path::{Path, PathBuf};

use fragscope_trace::records::Mapping;
use object::{Object, ObjectSegment};
use serde::Serialize;

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Frame {
    /// The return address as recorded.
    pub addr: u64,
    pub function: Option<String>,
    pub file: Option<String>,
    pub line: Option<u32>,
    /// The mapped file (basename) and the address's offset in it.
    pub module: String,
    pub offset: u64,
    /// Inlined into the next frame (same return address).
    pub inlined: bool,
}

impl Frame {
    /// "func (file.c:12)", "func (prog)" without line tables (every call in the function
    /// is one site then), or "libfoo.so+0x1234" without a symbol.
    pub fn label(&self) -> String {
        let location = match (&self.file, self.line, &self.function) {
            (Some(f), Some(l), _) => format!(" ({}:{l})", basename(f)),
            (Some(f), None, _) => format!(" ({})", basename(f)),
            // A runtime's function known by name only (a Lisp function).
            (None, _, Some(_)) if self.module.is_empty() => String::new(),
            (None, _, Some(_)) => format!(" ({})", self.module),
            _ => String::new(),
        };
        match &self.function {
            Some(func) => format!("{func}{location}"),
            None => format!("{}+{:#x}{location}", self.module, self.offset),
        }
    }
}

fn basename(p: &str) -> &str {
    p.rsplit('/').next().unwrap_or(p)
}

struct Module {
    /// Loaded lazily; `None` when the file cannot be read or is not the one recorded.
    dwarf: Option<addr2line::Loader>,
    symbols: Option<addr2line::Loader>,
    /// (file offset, file size, virtual address) of each loadable segment.
    segments: Vec<(u64, u64, u64)>,
    /// A Go program's functions by entry (as linked), from its function table: the
    /// names of a program stripped of its symbol table and DWARF. Empty for others.
    go_functions: Vec<(u64, String)>,
}

impl Module {
    /// The Go function whose code holds `probe` (as linked).
    fn go_function(&self, probe: u64) -> Option<String> {
        let i = self
            .go_functions
            .partition_point(|&(entry, _)| entry <= probe);
        Some(self.go_functions.get(i.checked_sub(1)?)?.1.clone())
    }
}

/// Symbolizes the addresses of one process, given every memory map recorded for it.
pub struct Symbolizer {
    mappings: Vec<Mapping>,
    modules: HashMap<String, Option<Module>>,
    cache: HashMap<u64, Vec<Frame>>,
    debug_root: PathBuf,
}

impl Symbolizer {
    /// `mappings`: executable mappings seen during the run (later ones win on overlap).
    pub fn new(mappings: Vec<Mapping>) -> Self {
        Self {
            mappings,
            modules: HashMap::new(),
            cache: HashMap::new(),
            debug_root: PathBuf::from("/usr/lib/debug"),
        }
    }

    /// The frames (inlined functions first) for a return address.
    pub fn frames(&mut self, addr: u64) -> Vec<Frame> {
        if let Some(f) = self.cache.get(&addr) {
            return f.clone();
        }
        let frames = self.resolve(addr);
        self.cache.insert(addr, frames.clone());
        frames
    }

    fn resolve(&mut self, addr: u64) -> Vec<Frame> {
        let Some(m) = self
            .mappings
            .iter()
            .rev()
            .find(|m| addr >= m.start && addr < m.end)
            .cloned()
        else {
            return vec![Frame {
                addr,
                function: None,
                file: None,
                line: None,
                module: "?".into(),
                offset: addr,
                inlined: false,
            }];
        };
        let file_offset = addr - m.start + m.offset;
        let module_name = basename(&m.path).to_string();
        let unknown = Frame {
            addr,
            function: None,
            file: None,
            line: None,
            module: module_name.clone(),
            offset: file_offset,
            inlined: false,
        };
        let debug_root = self.debug_root.clone();
        let module = self
            .modules
            .entry(m.path.clone())
            .or_insert_with(|| load_module(&m, &debug_root));
        let Some(module) = module else {
            return vec![unknown];
        };
        let Some(&(seg_off, _, seg_vaddr)) = module
            .segments
            .iter()
            .find(|(off, size, _)| file_offset >= *off && file_offset < off + size)
        else {
            return vec![unknown];
        };
        // A return address points after the call: look up the call itself.
        let probe = (file_offset - seg_off + seg_vaddr).saturating_sub(1);
        let mut out = Vec::new();
        if let Some(dwarf) = &module.dwarf {
            if let Ok(mut it) = dwarf.find_frames(probe) {
                while let Ok(Some(f)) = it.next() {
                    let function = f
                        .function
                        .as_ref()
                        .and_then(|n| n.demangle().ok())
                        .map(Cow::into_owned);
                    let (file, line) = f
                        .location
                        .as_ref()
                        .map_or((None, None), |l| (l.file.map(str::to_string), l.line));
                    out.push(Frame {
                        addr,
                        function,
                        file,
                        line,
                        module: module_name.clone(),
                        offset: file_offset,
                        inlined: true,
                    });
                }
            }
        }
        if let Some(last) = out.last_mut() {
            last.inlined = false;
        }
        if out.iter().all(|f| f.function.is_none()) {
            let symbol = [&module.dwarf, &module.symbols]
                .into_iter()
                .flatten()
                .find_map(|l| l.find_symbol(probe))
                .map(demangle_symbol)
                .or_else(|| module.go_function(probe));
            if symbol.is_some() || out.is_empty() {
                let (file, line) = out
                    .first()
                    .map_or((None, None), |f| (f.file.clone(), f.line));
                out = vec![Frame {
                    function: symbol,
                    file,
                    line,
                    ..unknown
                }];
            }
        }
        out
    }
}

/// A symbol table name, demangled if it is mangled (C++ `_Z`, Rust `_R` or legacy
/// `_ZN..E`): a plain C name such as `a` or `c` is a C++ mangling of a type too ("signed
/// char", "char") and must stay as it is.
fn demangle_symbol(name: &str) -> String {
    if name.starts_with("_Z") || name.starts_with("_R") {
        addr2line::demangle_auto(Cow::Borrowed(name), None).into_owned()
    } else {
        name.to_string()
    }
}

fn load_module(m: &Mapping, debug_root: &Path) -> Option<Module> {
    let path = Path::new(&m.path);
    if !m.path.starts_with('/') {
        return None;
    }
    let data = std::fs::read(path).ok()?;
    let obj = object::File::parse(&*data).ok()?;
    if !m.build_id.is_empty() {
        // A file rebuilt since the recording would give wrong names: better none.
        if obj.build_id().ok().flatten() != Some(m.build_id.as_slice()) {
            return None;
        }
    }
    let segments = obj
        .segments()
        .map(|s| {
            let (off, size) = s.file_range();
            (off, size, s.address())
        })
        .collect();
    let symbols = addr2line::Loader::new(path).ok();
    let debug_file = debug_file_for(&m.build_id, debug_root);
    let dwarf = debug_file.and_then(|p| addr2line::Loader::new(p).ok());
    // Only a program without a symbol table needs them (a Go program's symbols name the
    // same functions).
    let go_functions = if obj.symbols().next().is_none() {
        fragscope_gofunc::Functions::read(&obj)
            .map(|f| {
                (f.entries().iter())
                    .map(|&(entry, name)| (entry, String::from_utf8_lossy(name).into_owned()))
                    .collect()
            })
            .unwrap_or_default()
    } else {
        Vec::new()
    };
    Some(Module {
        dwarf: dwarf.or_else(|| addr2line::Loader::new(path).ok()),
        symbols,
        segments,
        go_functions,
    })
}

/// Debian's -dbgsym packages install /usr/lib/debug/.build-id/ab/cdef....debug.
fn debug_file_for(build_id: &[u8], root: &Path) -> Option<PathBuf> {
    if build_id.len() < 2 {
        return None;
    }
    let hex: String = build_id.iter().map(|b| format!("{b:02x}")).collect();
    let p = root
        .join(".build-id")
        .join(&hex[..2])
        .join(format!("{}.debug", &hex[2..]));
    p.exists().then_some(p)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_mangled_symbols_are_demangled() {
        for plain in ["a", "b", "c", "palloc", "main", "Z"] {
            assert_eq!(demangle_symbol(plain), plain);
        }
        assert_eq!(demangle_symbol("_Z3fooi"), "foo(int)");
        assert!(
            demangle_symbol("_ZN4core3ptr13drop_in_place17h0123456789abcdefE")
                .starts_with("core::ptr::drop_in_place")
        );
    }

    #[test]
    fn a_function_without_line_tables_is_labelled_by_name_and_module_alone() {
        let f = Frame {
            addr: 0x5555_1f70,
            function: Some("palloc".into()),
            file: None,
            line: None,
            module: "cfrac".into(),
            offset: 0x1f70,
            inlined: false,
        };
        let g = Frame {
            addr: 0x5555_1f98,
            offset: 0x1f98,
            ..f.clone()
        };
        assert_eq!(f.label(), "palloc (cfrac)");
        assert_eq!(f.label(), g.label());
    }

    #[test]
    fn unknown_addresses_are_kept_as_module_and_offset() {
        let mut s = Symbolizer::new(vec![Mapping {
            start: 0x1000,
            end: 0x2000,
            perms: "r-xp".into(),
            offset: 0x3000,
            inode: 1,
            path: "/nonexistent/libgone.so".into(),
            build_id: vec![],
        }]);
        let f = s.frames(0x1010);
        assert_eq!(f.len(), 1);
        assert_eq!(f[0].module, "libgone.so");
        assert_eq!(f[0].offset, 0x3010);
        assert_eq!(f[0].label(), "libgone.so+0x3010");
        assert_eq!(s.frames(0x9999)[0].module, "?");
    }

    #[test]
    fn resolves_a_function_of_this_test_binary() {
        // This test's own code, mapped at a random address (PIE): find our mapping.
        let maps = std::fs::read_to_string("/proc/self/maps").unwrap();
        let exe = std::fs::read_link("/proc/self/exe").unwrap();
        let exe = exe.to_string_lossy().to_string();
        let mappings: Vec<Mapping> = maps
            .lines()
            .filter_map(|l| {
                let f: Vec<&str> = l.split_whitespace().collect();
                if f.len() < 6 || f[5] != exe {
                    return None;
                }
                let (s, e) = f[0].split_once('-')?;
                Some(Mapping {
                    start: u64::from_str_radix(s, 16).ok()?,
                    end: u64::from_str_radix(e, 16).ok()?,
                    perms: f[1].into(),
                    offset: u64::from_str_radix(f[2], 16).ok()?,
                    inode: f[4].parse().ok()?,
                    path: exe.clone(),
                    build_id: vec![],
                })
            })
            .collect();
        let mut s = Symbolizer::new(mappings);
        let here = resolves_a_function_of_this_test_binary as *const () as u64;
        let frames = s.frames(here + 1);
        let name = frames
            .last()
            .and_then(|f| f.function.clone())
            .unwrap_or_default();
        assert!(
            name.contains("resolves_a_function_of_this_test_binary"),
            "got {frames:?}"
        );
    }
}
