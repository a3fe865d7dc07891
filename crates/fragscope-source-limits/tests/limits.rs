//! fragscope's source stays within its limits: every file under crates/*/src, parsed.

use std::path::Path;

use fragscope_source_limits::{excesses, source_files, MAX_FILE_LINES, MAX_FN_LINES};

#[test]
fn no_source_file_or_function_is_over_its_limit() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let files = source_files(&root).unwrap();
    assert!(files.len() > 100, "only {} source files found", files.len());
    let mut over = Vec::new();
    for file in &files {
        let source = std::fs::read_to_string(file).unwrap();
        let shown = file.strip_prefix(&root).unwrap_or(file);
        let found = excesses(shown, &source).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
        over.extend(found.iter().map(ToString::to_string));
    }
    assert!(
        over.is_empty(),
        "over {MAX_FILE_LINES} lines a file or {MAX_FN_LINES} a function (split it by job):\n{}",
        over.join("\n")
    );
}

#[test]
fn a_long_function_and_a_long_file_are_found_and_tests_are_not() {
    let body = "    let x = 1;\n".repeat(MAX_FN_LINES);
    let long_fn = format!("fn long() {{\n{body}}}\n");
    let source = format!(
        "{long_fn}#[cfg(test)]\nmod tests {{\n{long_fn}}}\n#[test]\n{long_fn}\
         struct S;\nimpl S {{\n{long_fn}}}\n{}",
        "// filler\n".repeat(MAX_FILE_LINES)
    );
    let found = excesses(Path::new("x.rs"), &source).unwrap();
    let lines: Vec<(Option<&str>, usize)> = found
        .iter()
        .map(|e| (e.function.as_deref(), e.line))
        .collect();
    let method_line = source.lines().position(|l| l == "impl S {").unwrap() + 2;
    assert_eq!(
        lines,
        [(None, 1), (Some("long"), 1), (Some("long"), method_line)],
        "{found:?}"
    );
    assert_eq!(found[1].lines, MAX_FN_LINES + 2);
}

/// The interposer, in C, keeps the same limit on its files (its functions are not parsed).
#[test]
fn no_c_file_of_the_interposer_is_over_the_file_limit() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../fragscope-record/preload");
    let mut seen = 0;
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        if !matches!(path.extension().and_then(|e| e.to_str()), Some("c" | "h")) {
            continue;
        }
        seen += 1;
        let lines = std::fs::read_to_string(&path).unwrap().lines().count();
        assert!(
            lines <= MAX_FILE_LINES,
            "{} has {lines} lines, over {MAX_FILE_LINES} (split it by job)",
            path.display()
        );
    }
    assert!(seen > 5, "only {seen} C files found in {}", dir.display());
}
