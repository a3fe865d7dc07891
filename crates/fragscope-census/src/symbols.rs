//! A runtime's variables, found by name in the executable's symbol table and placed at
//! their run-time addresses.

use std::collections::HashMap;

use object::{Object, ObjectSegment, ObjectSymbol};

/// Addresses of the symbols asked for, as the running process sees them.
#[derive(Debug, Clone, Default)]
pub struct Symbols {
    addresses: HashMap<String, u64>,
    /// Names defined more than once (file-local symbols of different objects).
    ambiguous: Vec<String>,
}

impl Symbols {
    /// Looks `names` up in `elf` (the executable's bytes) and relocates them by the load
    /// bias of the image mapped in `pid` (none for a fixed-address executable). Names the
    /// file does not define are absent.
    pub fn resolve(elf: &[u8], names: &[&str], pid: Option<u32>) -> Result<Self, String> {
        Self::resolve_with(elf, names, |_| match pid {
            Some(pid) => image_base(pid).map(Some),
            None => Ok(None),
        })
    }

    /// As [`Symbols::resolve`], for a shared library (or its separate debug file, which
    /// keeps its segments' addresses) whose first page is mapped at `base`.
    pub fn resolve_at(elf: &[u8], names: &[&str], base: u64) -> Result<Self, String> {
        Self::resolve_with(elf, names, |_| Ok(Some(base)))
    }

    /// Addresses of the executable (as linked) found some other way than by its symbol
    /// table (in its code, for a stripped Go program), placed as [`Symbols::resolve`]
    /// places symbols.
    pub fn place(
        elf: &[u8],
        found: HashMap<String, u64>,
        pid: Option<u32>,
    ) -> Result<Self, String> {
        let file = object::File::parse(elf).map_err(|e| format!("not an ELF file ({e})"))?;
        let bias = load_bias(&file, || match pid {
            Some(pid) => image_base(pid).map(Some),
            None => Ok(None),
        })?;
        let addresses = found
            .into_iter()
            .map(|(name, a)| (name, a.wrapping_add(bias)))
            .collect();
        Ok(Self {
            addresses,
            ambiguous: Vec::new(),
        })
    }

    /// `base`: where the image's first page is mapped, for a position-independent one
    /// (None: not placed).
    fn resolve_with(
        elf: &[u8],
        names: &[&str],
        base: impl FnOnce(()) -> Result<Option<u64>, String>,
    ) -> Result<Self, String> {
        let file = object::File::parse(elf).map_err(|e| format!("not an ELF file ({e})"))?;
        let mut addresses = HashMap::new();
        let mut ambiguous = Vec::new();
        // A stripped executable keeps the names it exports (SBCL's runtime links with
        // --export-dynamic) in its dynamic symbol table only.
        for sym in file.symbols().chain(file.dynamic_symbols()) {
            let Ok(name) = sym.name() else { continue };
            if sym.is_definition() && names.contains(&name) {
                if let Some(old) = addresses.insert(name.to_string(), sym.address()) {
                    if old != sym.address() {
                        ambiguous.push(name.to_string());
                    }
                }
            }
        }
        for name in &ambiguous {
            addresses.remove(name);
        }
        let bias = load_bias(&file, || base(()))?;
        for a in addresses.values_mut() {
            *a = a.wrapping_add(bias);
        }
        Ok(Self {
            addresses,
            ambiguous,
        })
    }

    pub fn get(&self, name: &str) -> Option<u64> {
        self.addresses.get(name).copied()
    }

    /// The address of `name`, or an error naming what is missing.
    pub fn need(&self, name: &str) -> Result<u64, String> {
        self.get(name).ok_or_else(|| {
            if self.ambiguous.iter().any(|a| a == name) {
                format!("the executable defines {name} more than once")
            } else {
                format!("the executable has no symbol {name}")
            }
        })
    }
}

/// What to add to the image's addresses as linked for where they run: zero but for a
/// position-independent image placed at `base` (its first page's address).
fn load_bias(
    file: &object::File,
    base: impl FnOnce() -> Result<Option<u64>, String>,
) -> Result<u64, String> {
    Ok(match file.kind() {
        object::ObjectKind::Dynamic => match base()? {
            Some(base) => {
                let first_vaddr = file.segments().map(|s| s.address()).min().unwrap_or(0) & !0xfff;
                base.wrapping_sub(first_vaddr)
            }
            None => 0,
        },
        _ => 0,
    })
}

/// Where the executable's first page is mapped in `pid`: the lowest mapping of the file
/// /proc/PID/exe names, at file offset 0.
fn image_base(pid: u32) -> Result<u64, String> {
    let exe = std::fs::read_link(format!("/proc/{pid}/exe"))
        .map_err(|e| format!("cannot read /proc/{pid}/exe: {e}"))?;
    let exe = exe.to_string_lossy();
    let maps = crate::maps::read(pid).map_err(|e| format!("cannot read /proc/{pid}/maps: {e}"))?;
    if let Some(m) = crate::maps::parse(&maps).find(|m| m.path == exe && m.offset == 0) {
        return Ok(m.lo);
    }
    Err(format!("/proc/{pid}/maps does not map {exe} from offset 0"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_our_own_symbols_where_they_run() {
        // The test binary is position-independent: its load bias is not zero, and the
        // relocated address of a function must be where the function really is.
        let me = std::fs::read("/proc/self/exe").unwrap();
        let name = "fragscope_census_symbol_probe";
        let s = Symbols::resolve(
            &me,
            &[name, "no_such_symbol_here"],
            Some(std::process::id()),
        )
        .unwrap();
        assert_eq!(
            s.get(name),
            Some(fragscope_census_symbol_probe as *const () as usize as u64)
        );
        assert!(s
            .need("no_such_symbol_here")
            .unwrap_err()
            .contains("no symbol"));
        assert!(Symbols::resolve(b"not elf", &[name], None).is_err());
    }

    #[no_mangle]
    #[inline(never)]
    extern "C" fn fragscope_census_symbol_probe() -> u32 {
        std::hint::black_box(7)
    }
}
