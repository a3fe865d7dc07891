//! The runtime's variables in a Go program without a symbol table (`-ldflags=-s`), found
//! in its code. The function table (`.gopclntab`) survives stripping, since the runtime
//! needs it for its own tracebacks: it names every function and where its code starts.
//! A few runtime functions take the address of the variables the census reads, each in a
//! way that has kept its shape from Go 1.22 to 1.27; each address is read from those
//! instructions, must lie in the program's writable data, and must be the same wherever
//! it is found, or the census is refused. x86-64 only.
//!
//! The function table itself is read by the fragscope-gofunc crate.

use std::collections::HashMap;

use fragscope_gofunc::{Code, Functions};
use object::{Object, ObjectSection, SectionKind};

/// A 32-bit displacement (or immediate) at `at`.
fn disp32(code: &[u8], at: usize) -> Option<i64> {
    Some(i64::from(i32::from_le_bytes(
        code.get(at..at + 4)?.try_into().ok()?,
    )))
}

/// The address an instruction ending at `end` (an offset of `code`) refers to with its
/// displacement at `at`.
fn rip_relative(code: &Code, at: usize, end: usize) -> Option<u64> {
    Some((code.entry + end as u64).wrapping_add_signed(disp32(code.bytes, at)?))
}

/// How a function refers to a variable.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Use {
    /// Loads or takes the address of a word: `MOV r64, [RIP+d]` or `LEA r64, [RIP+d]`.
    Word,
    /// Loads 32 bits: `MOV r32, [RIP+d]`.
    Load32,
}

/// Every address `code` refers to as `how` says. Looked for at every byte: a match
/// inside another instruction is possible, which is why an address is only taken when
/// several functions agree on it.
fn rip_uses(code: &Code, how: Use) -> Vec<u64> {
    let b = code.bytes;
    let mut found = Vec::new();
    for i in 0..b.len().saturating_sub(6) {
        let rex = (0x40..=0x4f).contains(&b[i]).then_some(b[i]);
        let wide = rex.is_some_and(|r| r & 0x08 != 0);
        let at = i + usize::from(rex.is_some());
        let (op, modrm) = (b[at], b[at + 1]);
        let shape = match how {
            Use::Word => wide && (op == 0x8b || op == 0x8d),
            Use::Load32 => !wide && op == 0x8b,
        };
        if shape && modrm & 0xc7 == 0x05 {
            if let Some(target) = rip_relative(code, at + 2, at + 6) {
                found.push(target);
            }
        }
    }
    found
}

/// The one address in the program's writable data that every one of `names` refers
/// to as `how` says.
fn shared_use(
    functions: &Functions,
    names: &[&str],
    how: Use,
    data: &impl Fn(u64) -> bool,
) -> Result<u64, String> {
    let mut common: Option<Vec<u64>> = None;
    for name in names {
        let mut uses = rip_uses(&functions.code(name)?, how);
        uses.retain(|a| data(*a));
        common = Some(match common {
            None => uses,
            Some(c) => c.into_iter().filter(|a| uses.contains(a)).collect(),
        });
    }
    let mut common = common.unwrap_or_default();
    common.sort_unstable();
    common.dedup();
    match common[..] {
        [one] => Ok(one),
        _ => Err(format!(
            "{} share {} addresses in its data, not one",
            names.join(", "),
            common.len()
        )),
    }
}

/// `runtime.mheap_`: `mallocinit` calls `mheap_.init()`, the receiver's address loaded
/// into RAX just before the call (`LEA RAX, [RIP+mheap_]; CALL runtime.(*mheap).init`).
fn mheap(functions: &Functions, data: &impl Fn(u64) -> bool) -> Result<u64, String> {
    let init = functions.code("runtime.(*mheap).init")?.entry;
    let code = functions.code("runtime.mallocinit")?;
    let b = code.bytes;
    let mut found: Vec<u64> = (0..b.len().saturating_sub(11))
        .filter(|&i| b[i..i + 3] == [0x48, 0x8d, 0x05] && b[i + 7] == 0xe8)
        .filter(|&i| rip_relative(&code, i + 8, i + 12) == Some(init))
        .filter_map(|i| rip_relative(&code, i + 3, i + 7))
        .collect();
    found.sort_unstable();
    found.dedup();
    match found[..] {
        [at] if data(at) => Ok(at),
        [at] => Err(format!(
            "the address runtime.mallocinit gives runtime.(*mheap).init ({at:#x}) is not \
             in its data"
        )),
        _ => Err(format!(
            "runtime.mallocinit calls runtime.(*mheap).init {} times with an address",
            found.len()
        )),
    }
}

/// `disableMemoryProfiling` and `MemProfileRate`: `schedinit` sets the rate to 0 when the
/// linker disabled profiling (`CMP BYTE [RIP+disable], 0; JE +11; MOV QWORD
/// [RIP+rate], 0`).
fn profiling_switches(functions: &Functions) -> Result<(u64, u64), String> {
    let code = functions.code("runtime.schedinit")?;
    let b = code.bytes;
    let shape = |i: usize| {
        b[i..i + 2] == [0x80, 0x3d]
            && b[i + 6] == 0
            && b[i + 7..i + 9] == [0x74, 0x0b]
            && b[i + 9..i + 12] == [0x48, 0xc7, 0x05]
            && b[i + 16..i + 20] == [0, 0, 0, 0]
    };
    let found: Vec<(u64, u64)> = (0..b.len().saturating_sub(19))
        .filter(|&i| shape(i))
        .filter_map(|i| {
            Some((
                rip_relative(&code, i + 2, i + 7)?,
                rip_relative(&code, i + 12, i + 20)?,
            ))
        })
        .collect();
    match found[..] {
        [one] => Ok(one),
        _ => Err(format!(
            "runtime.schedinit turns the heap profile off {} times",
            found.len()
        )),
    }
}

/// The runtime's variables the census reads, at their addresses as linked, found in the
/// code of a program without a symbol table. Err when `runtime.mheap_` is not found
/// beyond doubt; the heap profile's variables are left out when they are not (the
/// census then says its profile cannot be read).
pub(super) fn runtime_variables(file: &object::File) -> Result<HashMap<String, u64>, String> {
    let functions = Functions::read(file)?;
    let writable: Vec<(u64, u64)> = file
        .sections()
        .filter(|s| matches!(s.kind(), SectionKind::Data | SectionKind::UninitializedData))
        .map(|s| (s.address(), s.address() + s.size()))
        .collect();
    let data = |a: u64| writable.iter().any(|&(lo, hi)| lo <= a && a < hi);
    let mut found = HashMap::new();
    found.insert(
        "runtime.mheap_".to_string(),
        mheap(&functions, &data)
            .map_err(|why| format!("fragscope finds no runtime.mheap_ in its code: {why}"))?,
    );
    if let Ok((disabled, rate)) = profiling_switches(&functions) {
        if data(disabled) && data(rate) {
            found.insert("runtime.disableMemoryProfiling".to_string(), disabled);
            found.insert("runtime.MemProfileRate".to_string(), rate);
        }
    }
    // `mbuckets`: the list's head, pushed to by stkbucket and walked by
    // mProf_FlushLocked. `mProfCycle`: the 32-bit cycle count every function that
    // counts a cycle loads.
    let profile = [
        (
            "runtime.mbuckets",
            Use::Word,
            &["runtime.stkbucket", "runtime.mProf_FlushLocked"][..],
        ),
        (
            "runtime.mProfCycle",
            Use::Load32,
            &[
                "runtime.mProf_Flush",
                "runtime.mProf_PostSweep",
                "runtime.mProf_Malloc",
                "runtime.mProf_Free",
            ][..],
        ),
    ];
    for (name, how, functions_of) in profile {
        if let Ok(at) = shared_use(&functions, functions_of, how, &data) {
            found.insert(name.to_string(), at);
        }
    }
    Ok(found)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_program_without_a_go_function_table_is_refused_and_the_search_stays_in_the_function() {
        let me = std::fs::read("/proc/self/exe").unwrap();
        let file = object::File::parse(&*me).unwrap();
        let err = runtime_variables(&file).unwrap_err();
        assert!(err.contains("no function table"), "{err}");
        // A code search never reads past the function's end.
        let code = Code {
            entry: 0x1000,
            bytes: &[0x48, 0x8d, 0x05, 1, 0, 0],
        };
        assert!(rip_uses(&code, Use::Word).is_empty());
        let code = Code {
            entry: 0x1000,
            bytes: &[0x48, 0x8d, 0x05, 0x10, 0, 0, 0],
        };
        assert_eq!(rip_uses(&code, Use::Word), [0x1000 + 7 + 0x10]);
        assert!(rip_uses(&code, Use::Load32).is_empty());
    }
}
