//! The Go runtime's structs and constants as the program's own DWARF describes them
//! (gimli): each struct's size and its members' offsets and sizes.

use std::borrow::Cow;
use std::collections::HashMap;

use object::{Object, ObjectSection};

use super::layout::Field;

/// A struct as the DWARF describes it: its size and its members by name (a name Go uses
/// twice, such as `_` for padding, keeps its first).
#[derive(Debug, Default)]
pub(super) struct Struct {
    pub size: usize,
    pub members: HashMap<String, Field>,
}

impl Struct {
    pub fn field(&self, owner: &str, name: &str) -> Result<Field, String> {
        self.members
            .get(name)
            .copied()
            .ok_or_else(|| format!("its DWARF has no field {owner}.{name}"))
    }
}

/// Structs and constants found by name in the executable's DWARF.
pub(super) type DwarfTypes = (HashMap<String, Struct>, HashMap<String, u64>);

/// The structs named `wanted` and the constants named `constants` in the executable's
/// DWARF.
pub(super) fn dwarf_types(
    file: &object::File,
    wanted: &[&str],
    constants: &[&str],
) -> Result<DwarfTypes, String> {
    let no_dwarf = || {
        "it has no DWARF (built with -ldflags=-w or -s); fragscope reads the runtime's \
         layouts from it"
            .to_string()
    };
    if file.section_by_name(".debug_info").is_none() {
        return Err(no_dwarf());
    }
    let load = |id: gimli::SectionId| -> Result<Cow<[u8]>, String> {
        Ok(match file.section_by_name(id.name()) {
            Some(s) => s
                .uncompressed_data()
                .map_err(|e| format!("its {} does not decompress ({e})", id.name()))?,
            None => Cow::Borrowed(&[][..]),
        })
    };
    let sections = gimli::DwarfSections::load(load)?;
    let dwarf = sections.borrow(|s| gimli::EndianSlice::new(s, gimli::LittleEndian));
    let bad = |e: gimli::Error| format!("its DWARF does not read ({e})");
    let mut found: HashMap<String, Struct> = HashMap::new();
    let mut values: HashMap<String, u64> = HashMap::new();
    let mut headers = Vec::new();
    let mut iter = dwarf.units();
    while let Some(header) = iter.next().map_err(bad)? {
        headers.push(header);
    }
    for &header in &headers {
        let unit = dwarf.unit(header).map_err(bad)?;
        let mut entries = unit.entries();
        // The struct being read, at which depth its members are.
        let mut current: Option<(String, isize)> = None;
        let mut depth = 0isize;
        while let Some((delta, entry)) = entries.next_dfs().map_err(bad)? {
            depth += delta;
            if current.as_ref().is_some_and(|(_, d)| depth <= *d) {
                current = None;
            }
            match entry.tag() {
                gimli::DW_TAG_structure_type => {
                    let Some(name) = attr_string(&dwarf, &unit, entry) else {
                        continue;
                    };
                    if wanted.contains(&name.as_str()) && !found.contains_key(&name) {
                        let size = udata(entry, gimli::DW_AT_byte_size).unwrap_or(0) as usize;
                        found.insert(
                            name.clone(),
                            Struct {
                                size,
                                members: HashMap::new(),
                            },
                        );
                        current = Some((name, depth));
                    }
                }
                gimli::DW_TAG_constant => {
                    let Some(name) = attr_string(&dwarf, &unit, entry) else {
                        continue;
                    };
                    if constants.contains(&name.as_str()) {
                        let value = entry.attr_value(gimli::DW_AT_const_value).ok().flatten();
                        if let Some(v) = value
                            .and_then(|v| v.udata_value().or(v.sdata_value().map(|s| s as u64)))
                        {
                            values.insert(name, v);
                        }
                    }
                }
                gimli::DW_TAG_member => {
                    let Some((owner, d)) = &current else { continue };
                    if depth != d + 1 {
                        continue;
                    }
                    let (Some(name), Some(offset)) = (
                        attr_string(&dwarf, &unit, entry),
                        udata(entry, gimli::DW_AT_data_member_location),
                    ) else {
                        continue;
                    };
                    let size = member_size(&dwarf, &headers, &unit, entry).unwrap_or(0);
                    found
                        .get_mut(owner)
                        .unwrap()
                        .members
                        .entry(name)
                        .or_insert(Field {
                            offset: offset as usize,
                            size,
                        });
                }
                _ => {}
            }
        }
        if found.len() == wanted.len() && values.len() == constants.len() && current.is_none() {
            break;
        }
    }
    if found.is_empty() {
        return Err(no_dwarf());
    }
    Ok((found, values))
}

type Slice<'a> = gimli::EndianSlice<'a, gimli::LittleEndian>;

fn attr_string(
    dwarf: &gimli::Dwarf<Slice>,
    unit: &gimli::Unit<Slice>,
    entry: &gimli::DebuggingInformationEntry<Slice>,
) -> Option<String> {
    let value = entry.attr_value(gimli::DW_AT_name).ok()??;
    let s = dwarf.attr_string(unit, value).ok()?;
    Some(s.to_string_lossy().into_owned())
}

fn udata(entry: &gimli::DebuggingInformationEntry<Slice>, at: gimli::DwAt) -> Option<u64> {
    entry.attr_value(at).ok()??.udata_value()
}

/// Bytes of a member's type (following typedefs), wherever in the DWARF the type is.
fn member_size(
    dwarf: &gimli::Dwarf<Slice>,
    units: &[gimli::UnitHeader<Slice>],
    unit: &gimli::Unit<Slice>,
    member: &gimli::DebuggingInformationEntry<Slice>,
) -> Option<usize> {
    let mut at = member.attr_value(gimli::DW_AT_type).ok()??;
    let mut here: Option<gimli::Unit<Slice>> = None;
    for _ in 0..8 {
        let (size, next) = {
            let current = here.as_ref().unwrap_or(unit);
            let (entry_unit, offset) = match at {
                gimli::AttributeValue::UnitRef(off) => (None, off),
                gimli::AttributeValue::DebugInfoRef(off) => {
                    let header = units.iter().find(|h| off.to_unit_offset(h).is_some())?;
                    let other = dwarf.unit(*header).ok()?;
                    let off = off.to_unit_offset(header)?;
                    (Some(other), off)
                }
                _ => return None,
            };
            let owner = entry_unit.as_ref().unwrap_or(current);
            let entry = owner.entry(offset).ok()?;
            // A pointer is a word, whatever it points to (Go's pointer types may carry
            // no size of their own).
            let size = match entry.tag() {
                gimli::DW_TAG_pointer_type => Some(8),
                _ => udata(&entry, gimli::DW_AT_byte_size),
            };
            let next = entry.attr_value(gimli::DW_AT_type).ok()?;
            if entry_unit.is_some() {
                here = entry_unit;
            }
            (size, next)
        };
        if let Some(size) = size {
            return Some(size as usize);
        }
        at = next?;
    }
    None
}
