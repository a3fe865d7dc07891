//! Which allocator a process really uses: a shared library it maps (Debian's
//! libjemalloc.so.2, libtcmalloc.so.4, libmimalloc.so.2, else glibc's malloc in libc), or
//! a copy linked into the program itself, as Rust services link theirs (tikv-jemallocator,
//! the mimalloc crate) and as libpython links mimalloc in CPython's free-threaded build.
//!
//! A linked copy is found by its symbols (`_rjem_mallctl`, `mi_malloc`,
//! `tcmalloc::...`), in the symbol table or the dynamic one; in an image stripped of
//! both, by the messages the allocator prints (`<jemalloc>: `, `mimalloc: warning: `,
//! `TCMALLOC_` settings) in its read-only data. Its calls do not go through the C
//! library's malloc, so an interposer never sees them: a recording must say so.

use std::path::Path;

use object::{Object, ObjectSection, ObjectSymbol};

use fragscope_trace::Mapping;

/// An allocator compiled into an image rather than loaded as its own library.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LinkedAllocator {
    /// "jemalloc", "tcmalloc" or "mimalloc".
    pub allocator: &'static str,
    /// The image that carries it (the program, or a library such as libpython).
    pub image: String,
    /// What gave it away: a symbol (`_rjem_mallctl`) or, in a stripped image, a message.
    pub evidence: String,
    /// The image defines `malloc` itself: every malloc call in the process goes to it,
    /// the C library's included, and the interposer sees none. Otherwise (prefixed
    /// symbols, as Rust's allocator crates build it) only the allocations made through
    /// the copy are missed: the C library's malloc is still traced.
    pub serves_malloc: bool,
}

impl LinkedAllocator {
    /// The trace's record of it (chunk 24), for process stream `stream`.
    pub fn record(&self, stream: u32) -> fragscope_trace::heap_census::LinkedAllocator {
        fragscope_trace::heap_census::LinkedAllocator {
            stream,
            allocator: self.allocator.into(),
            image: self.image.clone(),
            evidence: self.evidence.clone(),
            serves_malloc: self.serves_malloc,
        }
    }

    /// What a recording misses, in a sentence fit for a note or a warning.
    pub fn consequence(&self) -> String {
        let file = self.image.rsplit('/').next().unwrap_or(&self.image);
        let missed = if self.serves_malloc {
            "every malloc call in the process goes to it, so the trace holds none"
        } else {
            "the allocations it serves are not calls to the C library's malloc, so the \
             trace does not hold them (the C library's own calls are traced)"
        };
        // jemalloc's and mimalloc's own metadata is read at each snapshot instead, when the
        // build is one whose layout is verified (see `jemalloc`, `mimalloc`); tcmalloc's
        // linked copy is not read yet.
        let shown = if self.allocator == "jemalloc" {
            "its heap is read from jemalloc's own metadata at each snapshot instead, if \
             fragscope knows its build (else it shows as other anonymous)"
        } else if self.allocator == "mimalloc" {
            "its heap is read from mimalloc's own pages and their metadata at each snapshot \
             instead, if fragscope knows its release (else it shows as other anonymous)"
        } else {
            "its memory shows as other anonymous"
        };
        format!(
            "{file} links its own {} ({}): {missed}; {shown}",
            self.allocator, self.evidence
        )
    }
}

/// Defined symbols that only a copy of each allocator carries, by allocator.
fn allocator_by_symbol(name: &str, function: bool) -> Option<&'static str> {
    // jemalloc's control entry, with or without a prefix (`je_`, `_rjem_`), and its
    // private namespace's functions (`je_arena_boot`, `_rjem_je_arena_boot`): functions,
    // not a program's pointer to the mallctl it looks up (`static void *je_mallctl`).
    let jemalloc = function
        && (name == "mallctl" || name.ends_with("_mallctl") || name.ends_with("je_arena_boot"));
    // mimalloc's entries, or its page allocation and main heap, as 1.x-2.x (`_mi_heap_main`)
    // and 3.x (`__mi_theap_main`, `_mi_page_malloc_zero`) name them: a program that
    // links it whole keeps these even when the entries it does not call are dropped.
    let mimalloc = matches!(name, "mi_malloc" | "mi_heap_new")
        || name.contains("_mi_page_malloc")
        || name.ends_with("_mi_heap_main")
        || name.ends_with("_mi_theap_main");
    // gperftools' and Google's tcmalloc: the C entry, or the `tcmalloc` namespace.
    let tcmalloc = name == "tc_malloc" || name.starts_with("_ZN8tcmalloc");
    if jemalloc {
        Some("jemalloc")
    } else if mimalloc {
        Some("mimalloc")
    } else if tcmalloc {
        Some("tcmalloc")
    } else {
        None
    }
}

/// Messages each allocator prints, found in a stripped image's read-only data.
const MESSAGES: [(&str, &str); 3] = [
    ("jemalloc", "<jemalloc>: "),
    ("mimalloc", "mimalloc: warning: "),
    ("tcmalloc", "TCMALLOC_RELEASE_RATE"),
];

/// The allocator linked into the image at `path`, if one is. None when the file cannot
/// be read or is not an ELF image: nothing is claimed.
pub fn linked_allocator(path: &Path) -> Option<LinkedAllocator> {
    let data = crate::image::map(path).ok()?;
    linked_allocator_in(&data, &path.to_string_lossy())
}

/// [`linked_allocator`] of an image already read.
pub fn linked_allocator_in(data: &[u8], image: &str) -> Option<LinkedAllocator> {
    let obj = object::File::parse(data).ok()?;
    let defined = |s: &object::Symbol| !s.is_undefined() && s.kind() != object::SymbolKind::File;
    let mut found = None;
    let mut serves_malloc = false;
    for s in obj.symbols().chain(obj.dynamic_symbols()) {
        if !defined(&s) {
            continue;
        }
        let Ok(name) = s.name() else { continue };
        serves_malloc |= name == "malloc" && s.kind() == object::SymbolKind::Text;
        if found.is_none() {
            let function = s.kind() == object::SymbolKind::Text;
            found = allocator_by_symbol(name, function).map(|a| (a, format!("symbol {name}")));
        }
    }
    // Stripped of its symbol table (the dynamic one lists what it imports): the messages.
    if found.is_none() && obj.symbols().next().is_none() {
        found = obj
            .sections()
            .filter(|s| s.name().is_ok_and(|n| n.starts_with(".rodata")))
            .filter_map(|s| s.data().ok())
            .find_map(|bytes| {
                MESSAGES.iter().find_map(|&(allocator, message)| {
                    memchr::memmem::find(bytes, message.as_bytes())
                        .map(|_| (allocator, format!("its message {:?}", message.trim_end())))
                })
            });
    }
    let (allocator, evidence) = found?;
    if allocator == "mimalloc" && unused_cpython_mimalloc(&obj, data) {
        return None;
    }
    Some(LinkedAllocator {
        allocator,
        image: image.to_string(),
        evidence,
        serves_malloc,
    })
}

/// Whether `obj` is a CPython image (it defines `_PyRuntime`) of the default build, whose
/// mimalloc (compiled in from 3.13) serves nothing: its objects come from pymalloc and
/// the rest from the C library's malloc. The free-threaded build, whose extension
/// modules' ABI tag ends in `t` (`.cpython-313t-x86_64-linux-gnu.so`), serves its objects
/// from it. (PYTHONMALLOC=mimalloc would select it in the default build too; the image
/// cannot say so.)
fn unused_cpython_mimalloc(obj: &object::File, data: &[u8]) -> bool {
    let cpython = obj
        .dynamic_symbols()
        .chain(obj.symbols())
        .any(|s| !s.is_undefined() && s.name() == Ok("_PyRuntime"));
    if !cpython {
        return false;
    }
    let free_threaded = memchr::memmem::find_iter(data, b".cpython-3").any(|at| {
        let tag = &data[at + b".cpython-3".len()..];
        let digits = tag.iter().take_while(|b| b.is_ascii_digit()).count();
        digits > 0 && tag[digits..].starts_with(b"t-")
    });
    !free_threaded
}

/// The shared library of an allocator a process maps, by file name, else "glibc" when it
/// maps glibc's libc, else "unknown".
pub fn allocator_of(maps: &[Mapping]) -> &'static str {
    maps.iter()
        .find_map(|m| allocator_library(file_name(&m.path)))
        .unwrap_or_else(|| {
            if maps.iter().any(|m| is_libc(file_name(&m.path))) {
                "glibc"
            } else {
                "unknown"
            }
        })
}

fn file_name(path: &str) -> &str {
    path.rsplit('/').next().unwrap_or("")
}

/// The allocator a shared library is, by its file name.
fn allocator_library(file: &str) -> Option<&'static str> {
    [
        ("libjemalloc", "jemalloc"),
        ("libtcmalloc", "tcmalloc"),
        ("libmimalloc", "mimalloc"),
    ]
    .into_iter()
    .find_map(|(prefix, name)| file.starts_with(prefix).then_some(name))
}

pub(crate) fn is_libc(file: &str) -> bool {
    file == "libc.so.6" || (file.starts_with("libc-2.") && file.ends_with(".so"))
}

/// The allocators linked into the images a process maps: its program first, then its
/// libraries, each file once. The C library, the dynamic loader, the allocators' own
/// shared libraries (named by [`allocator_of`]) and fragscope's interposer are not
/// looked into.
pub fn linked_allocators(maps: &[Mapping]) -> Vec<LinkedAllocator> {
    let mut seen = std::collections::HashSet::new();
    maps.iter()
        .filter(|m| m.perms.contains('x') && m.path.starts_with('/'))
        .filter(|m| {
            let file = file_name(&m.path);
            !is_libc(file)
                && allocator_library(file).is_none()
                && !file.starts_with("ld-linux")
                && !file.starts_with("libfragscope")
        })
        .filter(|m| seen.insert(m.path.as_str()))
        .filter_map(|m| linked_allocator(Path::new(&m.path)))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A shared object of `source` built with the system's C compiler, mapped.
    fn built(dir: &Path, name: &str, source: &str) -> Vec<u8> {
        let src = dir.join(format!("{name}.c"));
        let out = dir.join(format!("{name}.so"));
        std::fs::write(&src, source).unwrap();
        let ok = std::process::Command::new("cc")
            .args(["-shared", "-fPIC", "-o"])
            .arg(&out)
            .arg(&src)
            .status()
            .unwrap();
        assert!(ok.success(), "cc {name}.c");
        std::fs::read(out).unwrap()
    }

    /// CPython links mimalloc from 3.13 but serves from it only in its free-threaded
    /// build: a default build's image is not taken for a process on mimalloc.
    #[test]
    fn cpythons_mimalloc_counts_only_in_its_free_threaded_build() {
        let dir = tempfile::tempdir().unwrap();
        let image = |name: &str, tag: &str| {
            let source = format!(
                "int _PyRuntime[4];\nvoid *mi_malloc(unsigned long n) {{ return 0; }}\n\
                 const char *suffix = \".cpython-313{tag}-x86_64-linux-gnu.so\";\n"
            );
            built(dir.path(), name, &source)
        };
        assert_eq!(linked_allocator_in(&image("default", ""), "default"), None);
        let free_threaded = linked_allocator_in(&image("nogil", "t"), "nogil").unwrap();
        assert_eq!(free_threaded.allocator, "mimalloc");
        // Not CPython: a program linking mimalloc is on it, whatever its strings say.
        let plain = built(
            dir.path(),
            "plain",
            "void *mi_malloc(unsigned long n) { return 0; }\n\
             const char *s = \".cpython-313-x86_64-linux-gnu.so\";\n",
        );
        assert_eq!(
            linked_allocator_in(&plain, "plain").unwrap().allocator,
            "mimalloc"
        );
    }

    fn mapping(path: &str) -> Mapping {
        Mapping {
            start: 0x1000,
            end: 0x2000,
            perms: "r-xp".into(),
            offset: 0,
            inode: 1,
            path: path.into(),
            build_id: Vec::new(),
        }
    }

    #[test]
    fn the_library_names_the_allocator() {
        let libc = mapping("/usr/lib/x86_64-linux-gnu/libc.so.6");
        assert_eq!(allocator_of(std::slice::from_ref(&libc)), "glibc");
        let je = mapping("/usr/lib/x86_64-linux-gnu/libjemalloc.so.2");
        assert_eq!(allocator_of(&[libc.clone(), je]), "jemalloc");
        assert_eq!(
            allocator_of(&[mapping("/lib/ld-musl-x86_64.so.1")]),
            "unknown"
        );
    }

    #[test]
    fn each_allocators_own_symbols_name_it() {
        for (name, allocator) in [
            ("_rjem_mallctl", Some("jemalloc")),
            ("_rjem_je_arena_boot", Some("jemalloc")),
            ("mallctl", Some("jemalloc")),
            ("mi_malloc", Some("mimalloc")),
            ("_mi_page_malloc", Some("mimalloc")),
            ("_mi_page_malloc_zero", Some("mimalloc")),
            ("__mi_theap_main", Some("mimalloc")),
            ("tc_malloc", Some("tcmalloc")),
            ("_ZN8tcmalloc11ThreadCache7NewHeapEm", Some("tcmalloc")),
            // A program that only calls them, or names like them, is not one.
            ("malloc", None),
            ("my_mallctl_wrapper", None),
            ("emi_malloc", None),
        ] {
            assert_eq!(allocator_by_symbol(name, true), allocator, "{name}");
        }
        // A program's own pointer to the mallctl it looks up with dlsym is no jemalloc.
        assert_eq!(allocator_by_symbol("je_mallctl", false), None);
        assert_eq!(allocator_by_symbol("je_mallctl", true), Some("jemalloc"));
    }

    /// The system's own programs and libraries are on glibc's malloc: none is named.
    #[test]
    fn the_c_library_and_a_plain_program_link_no_allocator() {
        for path in ["/bin/ls", "/usr/bin/env"] {
            assert_eq!(linked_allocator(Path::new(path)), None, "{path}");
        }
    }

    /// A shared allocator library carries the allocator too: what the symbols find in
    /// Debian's (stripped to its exported symbols), when it is installed.
    #[test]
    fn debians_allocator_libraries_are_recognised_by_their_symbols() {
        for (file, allocator) in [
            ("libjemalloc.so.2", "jemalloc"),
            ("libtcmalloc.so.4", "tcmalloc"),
            ("libmimalloc.so.2", "mimalloc"),
        ] {
            let path = Path::new("/usr/lib/x86_64-linux-gnu").join(file);
            if !path.exists() {
                eprintln!("skipped {file}: not installed");
                continue;
            }
            let found = linked_allocator(&path).unwrap_or_else(|| panic!("{file}"));
            assert_eq!(found.allocator, allocator, "{file}");
            // Debian's libjemalloc and libtcmalloc define malloc; libmimalloc too.
            assert!(found.serves_malloc, "{file}: {found:?}");
        }
    }
}
