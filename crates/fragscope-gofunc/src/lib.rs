//! A Go program's function table (`.gopclntab`), read from its file. It survives
//! stripping (`-ldflags=-s -w`), since the runtime needs it for its own tracebacks: it
//! names every function and where its code starts. The census finds the runtime's
//! variables in that code (fragscope-census's `golang::pclntab`); the model names a
//! stripped program's frames by it.
//!
//! The table's format (runtime/symtab.go, Go 1.18 and later): a header (magic, two zero
//! bytes, the instruction size quantum, the pointer size, then words: number of
//! functions, number of files, the text's start, and the offsets of the function name
//! table, the compilation units, the file table, the pc tables and the function table);
//! the function table holds, per function, its entry's offset from the text's start and
//! its `_func` record's offset from the function table, whose first two fields are that
//! entry offset again and its name's offset in the name table. 64-bit x86 programs only.

use object::{Object, ObjectSection};

/// Magic numbers of the Go 1.18 and Go 1.20 tables (the layout read here is the same).
const MAGIC_GO118: u32 = 0xffff_fff0;
const MAGIC_GO120: u32 = 0xffff_fff1;

/// More functions than this are not a table of a program.
const MAX_FUNCTIONS: u64 = 1 << 24;

/// A function's code: where it starts as linked, and its bytes.
pub struct Code<'a> {
    pub entry: u64,
    pub bytes: &'a [u8],
}

/// The program's functions by name, with their code.
pub struct Functions<'a> {
    /// (entry, name), in the table's order (by entry).
    entries: Vec<(u64, &'a [u8])>,
    text_address: u64,
    text: &'a [u8],
}

fn word(data: &[u8], at: usize) -> Option<u64> {
    Some(u64::from_le_bytes(data.get(at..at + 8)?.try_into().ok()?))
}

fn half(data: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_le_bytes(data.get(at..at + 4)?.try_into().ok()?))
}

impl<'a> Functions<'a> {
    /// The table of `file`; Err says why it has none or it does not hold together.
    pub fn read(file: &'a object::File) -> Result<Self, String> {
        let bad = |what: &str| format!("its function table (.gopclntab) {what}");
        let section = file
            .section_by_name(".gopclntab")
            .ok_or_else(|| "it has no function table (.gopclntab)".to_string())?;
        let data = section.data().map_err(|_| bad("does not read"))?;
        // The header: 8 bytes, then 8 words.
        if data.len() < 72 {
            return Err(bad("is cut"));
        }
        let magic = half(data, 0).ok_or_else(|| bad("is cut"))?;
        if magic != MAGIC_GO118 && magic != MAGIC_GO120 {
            return Err(bad(&format!(
                "has a magic number {magic:#x} fragscope does not read"
            )));
        }
        if data[4] != 0 || data[5] != 0 || data[6] != 1 || data[7] != 8 {
            return Err(bad("is not one of a 64-bit x86 program"));
        }
        let header = |i: usize| word(data, 8 + 8 * i).ok_or_else(|| bad("is cut"));
        let nfunc = header(0)?;
        let names_at = header(3)? as usize;
        let table_at = header(7)? as usize;
        if nfunc > MAX_FUNCTIONS {
            return Err(bad(&format!("says it holds {nfunc} functions")));
        }
        let text = file
            .section_by_name(".text")
            .ok_or_else(|| "it has no .text section".to_string())?;
        // The header's text start may be left for the loader to relocate (a
        // position-independent program): the .text section's address is the same.
        let text_start = match header(2)? {
            0 => text.address(),
            start => start,
        };
        let names = data.get(names_at..).ok_or_else(|| bad("is cut"))?;
        let table = data.get(table_at..).ok_or_else(|| bad("is cut"))?;
        let mut entries = Vec::with_capacity(nfunc as usize);
        for i in 0..nfunc as usize {
            let (entry_off, func_off) = (half(table, 8 * i), half(table, 8 * i + 4));
            let (Some(entry_off), Some(func_off)) = (entry_off, func_off) else {
                return Err(bad("is cut"));
            };
            let func = func_off as usize;
            let (Some(own_entry), Some(name_off)) = (half(table, func), half(table, func + 4))
            else {
                return Err(bad("is cut"));
            };
            if own_entry != entry_off {
                return Err(bad("does not hold together (a function's entry differs)"));
            }
            let name = names
                .get(name_off as usize..)
                .ok_or_else(|| bad("is cut"))?;
            let end = memchr::memchr(0, name).ok_or_else(|| bad("is cut"))?;
            entries.push((text_start + u64::from(entry_off), &name[..end]));
        }
        if entries.windows(2).any(|w| w[0].0 > w[1].0) {
            return Err(bad("is not in the order of the code"));
        }
        Ok(Self {
            entries,
            text_address: text.address(),
            text: text
                .data()
                .map_err(|_| "its .text does not read".to_string())?,
        })
    }

    /// The code of the function named `name` (up to the next function's entry). An
    /// assembly function called from Go, or the reverse, has a wrapper of the same name
    /// in the table (its symbol's `.abi0` suffix is not kept): the function is the
    /// longer of the two.
    pub fn code(&self, name: &str) -> Result<Code<'a>, String> {
        let end_of = |i: usize| {
            self.entries
                .get(i + 1)
                .map_or(self.entries[i].0 + 4096, |e| e.0)
        };
        let (i, &(entry, _)) = self
            .entries
            .iter()
            .enumerate()
            .filter(|(_, (_, n))| *n == name.as_bytes())
            .max_by_key(|&(i, (entry, _))| end_of(i) - entry)
            .ok_or_else(|| format!("its function table has no {name}"))?;
        let from = entry.checked_sub(self.text_address);
        let bytes = from
            .and_then(|from| {
                self.text
                    .get(from as usize..(end_of(i) - self.text_address) as usize)
            })
            .ok_or_else(|| format!("{name}'s code is not in .text"))?;
        Ok(Code { entry, bytes })
    }

    /// Each function's entry (as linked) and name, in the order of the code.
    pub fn entries(&self) -> &[(u64, &'a [u8])] {
        &self.entries
    }
}
