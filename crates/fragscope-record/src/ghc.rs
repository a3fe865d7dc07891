//! GHC-compiled programs: recognise them, and ask their RTS for an eventlog (through
//! GHCRTS) when it will accept the flags; a closure-type heap profile only on request,
//! since its censuses are extra major collections that change the program measured.

use std::ffi::OsString;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use object::{Object, ObjectSymbol};

/// What the program's binary says about its RTS.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GhcBinary {
    /// Linked with an RTS that can write an eventlog (-eventlog, -debug or -prof).
    pub eventlog_rts: bool,
}

/// How a GHC program will be recorded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GhcSetup {
    /// The GHCRTS value to run the program with (the user's flags, then ours).
    pub ghcrts: Option<OsString>,
    /// Where the RTS will write its eventlog.
    pub eventlog: Option<PathBuf>,
    /// Why there is no eventlog, and how to rebuild to get one.
    pub advice: Option<String>,
}

/// The RTS flags fragscope adds (before `-ol<file>`): an eventlog. Its heap, GC and
/// block figures cost the program nothing measurable; the block census is read from
/// outside (census.rs).
pub const RTS_FLAGS: &str = "-l";

/// Added on request (`record --ghc-heap-profile`): a heap profile by closure type every
/// 0.1 s (available without profiling). Each census is a major collection: on seed
/// 000's Pinned.hs it adds collections and copying (BENCHMARKS.md).
pub const HEAP_PROFILE_FLAGS: &str = "-hT -i0.1";

/// Recognises a GHC-compiled ELF by its RTS: symbols when the binary has a symbol table,
/// else the RTS's own strings (a stripped binary keeps those). A binary with a symbol
/// table and none of the RTS's symbols is not GHC's, whatever strings it holds: a tool
/// that reads GHC programs (this one) names the RTS's messages too.
pub fn inspect(data: &[u8]) -> Option<GhcBinary> {
    let file = object::File::parse(data).ok()?;
    let mut ghc = false;
    let mut eventlog = false;
    let symbol_table = file.symbols().next().is_some();
    for sym in file.symbols().chain(file.dynamic_symbols()) {
        let Ok(name) = sym.name() else { continue };
        match name {
            "hs_main" | "hs_init" | "hs_init_ghc" => ghc = true,
            "postEvent" | "initEventLogging" | "endEventLogging" => eventlog = true,
            _ if name.starts_with("ghczm") || name.starts_with("__stginit") => ghc = true,
            _ => {}
        }
    }
    if !ghc && !symbol_table {
        // `+RTS --info`'s first line, as the RTS prints it.
        ghc = contains(data, b"RTS options are disabled")
            && contains(data, b" [(\"GHC RTS\", \"YES\")");
        // The RTS's way name: rts_l (eventlog), rts_thr_l, rts_debug, rts_p, ...
        eventlog = [
            "rts_l\0",
            "rts_thr_l\0",
            "_debug\0",
            "rts_p\0",
            "rts_thr_p\0",
        ]
        .iter()
        .any(|w| contains(data, w.as_bytes()));
    }
    ghc.then_some(GhcBinary {
        eventlog_rts: eventlog,
    })
}

/// Whether `needle` occurs in `haystack` (an executable: Node's is 98 MB, where a byte by
/// byte comparison took a third of a second).
fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    memchr::memmem::find(haystack, needle).is_some()
}

/// Words a wrapper's command line and scripts may name a program by, at most this many.
const WRAPPER_WORDS: usize = 512;
/// Scripts read for program names up to this size.
const WRAPPER_SCRIPT_BYTES: u64 = 64 << 10;

/// The GHC program a wrapper runs: `sh -c './prog 10'`, a shell script that execs it,
/// `stack exec -- bin/prog`, `env X=1 prog` (a name `stack` or `cabal` would resolve in
/// their own build directories is not found). Looks at the words of the
/// command's arguments and of the scripts among them (the program itself, when it is a
/// script, included): the first that names a GHC-compiled executable (a path, or a name
/// found on PATH) is it. `None` when no word does.
pub fn wrapped_program(program: &Path, args: &[OsString]) -> Option<(PathBuf, GhcBinary)> {
    let mut words: Vec<String> = Vec::new();
    let add = |text: &str, words: &mut Vec<String>| {
        for w in text.split(|c: char| {
            c.is_whitespace()
                || matches!(
                    c,
                    ';' | '&' | '|' | '(' | ')' | '<' | '>' | '"' | '\'' | '`' | '='
                )
        }) {
            if !w.is_empty() && words.len() < WRAPPER_WORDS {
                words.push(w.to_string());
            }
        }
    };
    let script = |path: &Path| -> Option<String> {
        let meta = std::fs::metadata(path).ok()?;
        if !meta.is_file() || meta.len() > WRAPPER_SCRIPT_BYTES {
            return None;
        }
        let text = std::fs::read(path).ok()?;
        text.starts_with(b"#!")
            .then(|| String::from_utf8_lossy(&text).into_owned())
            .or_else(|| {
                // `sh script`: a script need not start with #!; text only.
                (!text.contains(&0)).then(|| String::from_utf8_lossy(&text).into_owned())
            })
    };
    if let Some(text) = script(program).filter(|t| t.starts_with("#!")) {
        add(&text, &mut words);
    }
    for a in args {
        let a = a.to_string_lossy();
        add(&a, &mut words);
        if let Some(text) = script(Path::new(a.as_ref())) {
            add(&text, &mut words);
        }
    }
    let path_dirs: Vec<PathBuf> = std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).collect())
        .unwrap_or_default();
    let mut seen = std::collections::HashSet::new();
    for w in words {
        let candidates: Vec<PathBuf> = if w.contains('/') {
            vec![PathBuf::from(&w)]
        } else {
            path_dirs.iter().map(|d| d.join(&w)).collect()
        };
        for c in candidates {
            let Ok(meta) = std::fs::metadata(&c) else {
                continue;
            };
            if !meta.is_file() || !seen.insert(c.clone()) {
                continue;
            }
            let mut head = [0u8; 4];
            let is_elf = std::fs::File::open(&c)
                .and_then(|mut f| f.read_exact(&mut head))
                .is_ok()
                && head == *b"\x7fELF";
            if !is_elf {
                continue;
            }
            if let Some(binary) = std::fs::read(&c).ok().and_then(|d| inspect(&d)) {
                let c = std::path::absolute(&c).unwrap_or(c);
                return Some((c, binary));
            }
            break;
        }
    }
    None
}

/// The eventlog's path for a trace: `run.fsc` → `run.eventlog`, beside it.
pub fn eventlog_path(trace: &Path) -> PathBuf {
    trace.with_extension("eventlog")
}

/// Decides how to record a GHC program: probes its RTS with the flags we would add (the
/// RTS parses GHCRTS, then `+RTS --info` prints and exits before `main` runs), so a
/// program whose RTS would refuse them is run without them rather than aborted.
pub fn prepare(
    program: &Path,
    binary: GhcBinary,
    trace: &Path,
    heap_profile: bool,
    args: &[OsString],
) -> GhcSetup {
    let name = program.file_name().map_or_else(
        || program.display().to_string(),
        |n| n.to_string_lossy().into(),
    );
    if !binary.eventlog_rts {
        return no_eventlog(format!(
            "{name} is a GHC program linked without an eventlog-capable RTS, so fragscope \
             records its RSS and the RTS's block censuses only. For the heap's live data and \
             size over time and the GC statistics, rebuild it with `ghc -eventlog -rtsopts` \
             (cabal: ghc-options: -eventlog -rtsopts) and record again."
        ));
    }
    let eventlog = eventlog_path(trace);
    let eventlog = std::path::absolute(&eventlog).unwrap_or(eventlog);
    let eventlog_str = eventlog.to_string_lossy();
    // GHCRTS is split at white space, with no quoting.
    if eventlog_str.chars().any(char::is_whitespace) {
        return no_eventlog(format!(
            "the eventlog path {eventlog_str} holds white space, which GHCRTS cannot carry; \
             record to a path without spaces for {name}'s eventlog. RSS is recorded."
        ));
    }
    // GHC 9.0 aborts at start-up when the nonmoving collector meets a heap profile
    // ("The non-moving collector doesn't support profiling").
    let theirs = std::env::var_os("GHCRTS").unwrap_or_default();
    let nonmoving = theirs
        .to_string_lossy()
        .split_whitespace()
        .chain(args.iter().filter_map(|a| a.to_str()))
        .any(|f| f == "-xn" || f == "--nonmoving-gc");
    let mut note = None;
    let heap_profile = if heap_profile && nonmoving {
        note = Some(format!(
            "{name} runs the nonmoving collector (-xn), which GHC does not run with a heap \
             profile: fragscope recorded it without -hT; the block census and the \
             eventlog's figures are there."
        ));
        false
    } else {
        heap_profile
    };
    let ours = if heap_profile {
        format!("{RTS_FLAGS} {HEAP_PROFILE_FLAGS} -ol{eventlog_str}")
    } else {
        format!("{RTS_FLAGS} -ol{eventlog_str}")
    };
    let ghcrts = match std::env::var_os("GHCRTS").filter(|v| !v.is_empty()) {
        Some(theirs) => {
            let mut v = theirs;
            v.push(" ");
            v.push(&ours);
            v
        }
        None => OsString::from(&ours),
    };
    match probe(program, &ghcrts) {
        Ok(()) => {
            // A log left by an earlier recording must not pass for this one's.
            let _ = std::fs::remove_file(&eventlog);
            GhcSetup {
                ghcrts: Some(ghcrts),
                eventlog: Some(eventlog),
                advice: note,
            }
        }
        Err(stderr) => {
            let rebuild = if stderr.contains("requires the program to be built with") {
                "its RTS cannot write an eventlog: rebuild it with `ghc -eventlog -rtsopts`"
            } else if stderr.contains("options are disabled") {
                "it was linked without -rtsopts, so its RTS refuses options from GHCRTS: \
                 rebuild it with `ghc -rtsopts` (or bake the flags in with \
                 -with-rtsopts=-l)"
            } else {
                "its RTS refused them"
            };
            let first_line = stderr.lines().next().unwrap_or("").trim();
            no_eventlog(format!(
                "{name} is a GHC program, but fragscope did not ask it for an eventlog \
                 (GHCRTS=\"{ours}\"): {rebuild}. RSS is recorded.{}",
                if first_line.is_empty() {
                    String::new()
                } else {
                    format!(" The RTS said: {first_line}")
                }
            ))
        }
    }
}

fn no_eventlog(advice: String) -> GhcSetup {
    GhcSetup {
        ghcrts: None,
        eventlog: None,
        advice: Some(advice),
    }
}

/// Runs `program +RTS --info -RTS` with `ghcrts`; Err(stderr) when the RTS refuses.
fn probe(program: &Path, ghcrts: &OsString) -> Result<(), String> {
    const PROBE_TIMEOUT: Duration = Duration::from_secs(5);
    let mut child = Command::new(program)
        .args(["+RTS", "--info", "-RTS"])
        .env("GHCRTS", ghcrts)
        .env_remove("LD_PRELOAD")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("cannot start it: {e}"))?;
    let started = Instant::now();
    let status = loop {
        match child.try_wait() {
            Ok(Some(status)) => break status,
            Ok(None) if started.elapsed() < PROBE_TIMEOUT => {
                std::thread::sleep(Duration::from_millis(5))
            }
            _ => {
                let _ = child.kill();
                let _ = child.wait();
                return Err("it did not answer `+RTS --info` in time".into());
            }
        }
    };
    let mut stderr = String::new();
    if let Some(mut e) = child.stderr.take() {
        let _ = e.read_to_string(&mut stderr);
    }
    if status.success() {
        Ok(())
    } else {
        Err(stderr)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// This test binary has a symbol table and holds the RTS's messages that `inspect`
    /// looks for in stripped programs.
    #[test]
    fn a_program_naming_the_rts_messages_is_not_ghc() {
        let me = std::fs::read(std::env::current_exe().unwrap()).unwrap();
        assert!(contains(&me, b"RTS options are disabled"));
        assert_eq!(inspect(&me), None);
    }

    #[test]
    fn a_c_program_is_not_ghc() {
        let me = std::fs::read("/bin/sh").unwrap();
        assert_eq!(inspect(&me), None);
    }

    #[test]
    fn the_eventlog_goes_beside_the_trace() {
        assert_eq!(
            eventlog_path(Path::new("out/run.fsc")),
            Path::new("out/run.eventlog")
        );
        assert_eq!(eventlog_path(Path::new("run")), Path::new("run.eventlog"));
    }
}
