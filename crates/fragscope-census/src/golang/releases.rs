//! The layouts of the Go runtime's structs the census reads, per release, for programs
//! built without DWARF (`-ldflags=-w` or `-s`): `releases.tsv`, one line per release
//! series, its columns the fields of `Layouts::cells` (a size, or a field as
//! `offset+size`). Made from each release's own DWARF, never by hand: `cargo run -p
//! fragscope-census --example go_layouts -- PROGRAM...` prints the header and a line for
//! each unstripped program, and crates/fragscope-census/tests/golang.rs checks every line
//! against the DWARF of every toolchain on the machine.

use std::sync::OnceLock;

use super::layout::Release;

const TABLE: &str = include_str!("releases.tsv");

/// The table's releases, read once.
pub(super) fn releases() -> Result<&'static [Release], String> {
    static READ: OnceLock<Result<Vec<Release>, String>> = OnceLock::new();
    READ.get_or_init(|| Release::read_table(TABLE))
        .as_deref()
        .map_err(|e| format!("fragscope's table of Go releases does not read: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_table_reads_and_writes_back_as_it_is() {
        let releases = releases().unwrap();
        assert!(releases.iter().any(|r| r.series == "go1.22"));
        let rows: Vec<String> = releases.iter().map(|r| r.row().unwrap()).collect();
        let written = format!("{}\n{}\n", Release::header(), rows.join("\n"));
        let kept: Vec<&str> = TABLE.lines().filter(|l| !l.starts_with('#')).collect();
        assert_eq!(written, format!("{}\n", kept.join("\n")));
    }
}
