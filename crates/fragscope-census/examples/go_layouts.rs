//! Prints the Go release table (crates/fragscope-census/src/golang/releases.tsv): its
//! header, then a line for each program named, from the program's own DWARF. Build a
//! program with each release's toolchain without -ldflags=-w or -s; the table holds the
//! newest patch release of each series.
//!
//!     GOTOOLCHAIN=go1.24.13 go build -o /tmp/prog ./tests/go/keep_tenth
//!     cargo run -p fragscope-census --example go_layouts -- /tmp/prog
//!
//! Whether the table already holds the same goes to stderr.

fn main() {
    let mut failed = false;
    println!("{}", fragscope_census::golang::release_table_header());
    for path in std::env::args().skip(1) {
        let entry = std::fs::read(&path)
            .map_err(|e| e.to_string())
            .and_then(|elf| fragscope_census::golang::release_entry(&elf));
        match entry {
            Ok(entry) => {
                let state = match entry.agrees {
                    None => "not in the table".to_string(),
                    Some((true, from)) => format!("the table's line (from {from}) is the same"),
                    Some((false, from)) => format!("the table's line (from {from}) differs"),
                };
                eprintln!("{path}: {}, {state}", entry.version);
                println!("{}", entry.line);
            }
            Err(e) => {
                eprintln!("{path}: {e}");
                failed = true;
            }
        }
    }
    std::process::exit(i32::from(failed));
}
