//! The limits fragscope's own source keeps, checked by `tests/limits.rs`: no source file
//! over [`MAX_FILE_LINES`] lines and no function over [`MAX_FN_LINES`], tests aside.
//! Long files and functions are where a new runtime's code would otherwise be wedged in.

use std::path::{Path, PathBuf};

use syn::visit::Visit;

/// The most lines a source file outside tests may have.
pub const MAX_FILE_LINES: usize = 1200;
/// The most lines a function outside tests may have, from `fn` to its closing brace.
pub const MAX_FN_LINES: usize = 150;

/// A file or function over its limit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Excess {
    pub file: PathBuf,
    /// The function's name, or `None` for the file itself.
    pub function: Option<String>,
    /// Its first line (1-based).
    pub line: usize,
    pub lines: usize,
}

impl std::fmt::Display for Excess {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.function {
            Some(name) => write!(
                f,
                "{}:{}: fn {name} is {} lines (at most {MAX_FN_LINES})",
                self.file.display(),
                self.line,
                self.lines
            ),
            None => write!(
                f,
                "{}: {} lines (at most {MAX_FILE_LINES})",
                self.file.display(),
                self.lines
            ),
        }
    }
}

/// Every `.rs` file under `crates/*/src` of the workspace at `root`, tests aside: a file
/// named `tests.rs` or under a `tests` directory holds only tests.
pub fn source_files(root: &Path) -> std::io::Result<Vec<PathBuf>> {
    let mut files = Vec::new();
    for krate in std::fs::read_dir(root.join("crates"))? {
        let src = krate?.path().join("src");
        if src.is_dir() {
            collect_rs(&src, &mut files)?;
        }
    }
    files.sort();
    Ok(files)
}

fn collect_rs(dir: &Path, files: &mut Vec<PathBuf>) -> std::io::Result<()> {
    for entry in std::fs::read_dir(dir)? {
        let path = entry?.path();
        let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
        if path.is_dir() {
            if name != "tests" {
                collect_rs(&path, files)?;
            }
        } else if name.ends_with(".rs") && name != "tests.rs" {
            files.push(path);
        }
    }
    Ok(())
}

/// The file and the functions of one source file that are over their limits.
pub fn excesses(file: &Path, source: &str) -> syn::Result<Vec<Excess>> {
    let mut found = Vec::new();
    let lines = source.lines().count();
    if lines > MAX_FILE_LINES {
        found.push(Excess {
            file: file.to_path_buf(),
            function: None,
            line: 1,
            lines,
        });
    }
    let mut long = LongFunctions {
        file,
        found: &mut found,
    };
    long.visit_file(&syn::parse_file(source)?);
    Ok(found)
}

/// Walks a file's items, leaving test modules and test functions out.
struct LongFunctions<'a> {
    file: &'a Path,
    found: &'a mut Vec<Excess>,
}

impl LongFunctions<'_> {
    fn check(&mut self, name: &syn::Ident, fn_token: proc_macro2::Span, end: proc_macro2::Span) {
        let (first, last) = (fn_token.start().line, end.end().line);
        let lines = last + 1 - first;
        if lines > MAX_FN_LINES {
            self.found.push(Excess {
                file: self.file.to_path_buf(),
                function: Some(name.to_string()),
                line: first,
                lines,
            });
        }
    }
}

/// Whether attributes mark test code: `#[test]`, `#[cfg(test)]`.
fn is_test(attrs: &[syn::Attribute]) -> bool {
    attrs.iter().any(|attr| {
        let path = attr.path();
        path.is_ident("test")
            || (path.is_ident("cfg")
                && attr
                    .parse_args::<syn::Ident>()
                    .is_ok_and(|arg| arg == "test"))
    })
}

impl<'ast> Visit<'ast> for LongFunctions<'_> {
    fn visit_item_mod(&mut self, module: &'ast syn::ItemMod) {
        if !is_test(&module.attrs) {
            syn::visit::visit_item_mod(self, module);
        }
    }

    fn visit_item_fn(&mut self, function: &'ast syn::ItemFn) {
        if !is_test(&function.attrs) {
            let close = function.block.brace_token.span.close();
            self.check(&function.sig.ident, function.sig.fn_token.span, close);
            syn::visit::visit_item_fn(self, function);
        }
    }

    fn visit_impl_item_fn(&mut self, method: &'ast syn::ImplItemFn) {
        if !is_test(&method.attrs) {
            let close = method.block.brace_token.span.close();
            self.check(&method.sig.ident, method.sig.fn_token.span, close);
            syn::visit::visit_impl_item_fn(self, method);
        }
    }

    fn visit_trait_item_fn(&mut self, method: &'ast syn::TraitItemFn) {
        if let Some(block) = &method.default {
            let close = block.brace_token.span.close();
            self.check(&method.sig.ident, method.sig.fn_token.span, close);
        }
        syn::visit::visit_trait_item_fn(self, method);
    }
}
