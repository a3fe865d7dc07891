//! Prints the Go release table's entry (crates/fragscope-census/src/golang/releases.rs)
//! for each program named, from its own DWARF: build a program with the release's
//! toolchain without -ldflags=-w or -s, and paste the entry into the table.
//!
//!     GOTOOLCHAIN=go1.24.13 go build -o /tmp/prog ./tests/go/keep_tenth
//!     cargo run -p fragscope-census --example go_layouts -- /tmp/prog

fn main() {
    let mut failed = false;
    for path in std::env::args().skip(1) {
        let entry = std::fs::read(&path)
            .map_err(|e| e.to_string())
            .and_then(|elf| fragscope_census::golang::release_entry(&elf));
        match entry {
            Ok(entry) => {
                let state = match entry.agrees {
                    None => "not in the table".to_string(),
                    Some((true, from)) => format!("the table's entry (from {from}) is the same"),
                    Some((false, from)) => format!("the table's entry (from {from}) differs"),
                };
                println!("// {path}: {}, {state}\n{}", entry.version, entry.source);
            }
            Err(e) => {
                eprintln!("{path}: {e}");
                failed = true;
            }
        }
    }
    std::process::exit(i32::from(failed));
}
