//! CPython programs: pymalloc's arenas, read from the pools' own headers, inside the
//! decomposition; figures checked against the interpreter's own statistics.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;

use common::report_json;

fn script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/python/keep_a_tenth.py")
}

/// Debian's interpreter, and any pyenv releases this machine has (older layouts).
fn interpreters() -> Vec<PathBuf> {
    let mut found = vec![PathBuf::from("/usr/bin/python3")];
    let home = std::env::var_os("HOME")
        .map(PathBuf::from)
        .unwrap_or_default();
    for v in ["3.8", "3.9", "3.12", "3.13"] {
        let Ok(dir) = std::fs::read_dir(home.join(".pyenv/versions")) else {
            break;
        };
        for e in dir.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            let exe = e.path().join(format!("bin/python{v}"));
            if name.starts_with(&format!("{v}.")) && exe.exists() {
                found.push(exe);
            }
        }
    }
    found
}

/// A figure of sys._debugmallocstats: "# arenas allocated current = 10".
fn stat(text: &str, name: &str) -> u64 {
    let line = text
        .lines()
        .find(|l| l.starts_with(&format!("# {name}")))
        .unwrap_or_else(|| panic!("no '{name}' in:\n{text}"));
    line.rsplit('=')
        .next()
        .unwrap()
        .trim()
        .replace(',', "")
        .parse()
        .unwrap()
}

/// The snapshots with a pymalloc census.
fn censused(report: &Value) -> Vec<&Value> {
    report["snapshots"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|s| !s["pymalloc"].is_null())
        .collect()
}

#[test]
fn pymalloc_census_agrees_with_the_interpreters_own_statistics() {
    let dir = tempfile::tempdir().unwrap();
    for python in interpreters() {
        let trace = dir.path().join("py.fsc");
        let out = Command::new(env!("CARGO_BIN_EXE_fragscope"))
            .args(["record", "--stacks", "none", "--snapshot-ms", "300", "-o"])
            .arg(&trace)
            .arg("--")
            .arg(&python)
            .arg(script())
            .args(["300000", "2"])
            .output()
            .unwrap();
        let err = common::stderr(&out);
        assert!(out.status.success(), "{}: {err}", python.display());
        let report = report_json(&trace);
        let theirs = stat(&err, "bytes in allocated blocks") as f64;
        // Censuses are taken every 300 ms while the program idles after printing its
        // statistics: the one nearest them is one of those.
        let snaps = censused(&report);
        let seen: Vec<(f64, u64)> = snaps
            .iter()
            .map(|s| {
                (
                    s["t_ms"].as_f64().unwrap(),
                    s["pymalloc"]["in_use"].as_u64().unwrap(),
                )
            })
            .collect();
        let snap = *snaps
            .iter()
            .find(|s| std::ptr::eq(&s["pymalloc"], nearest_census(&report, theirs)))
            .unwrap();
        let p = &snap["pymalloc"];
        let what = format!("{}: censuses {seen:?}\n{p}\n{err}", python.display());
        assert_eq!(
            p["arenas"].as_u64().unwrap(),
            stat(&err, "arenas allocated current"),
            "{what}"
        );
        let in_use = p["in_use"].as_u64().unwrap() as f64;
        assert!((in_use - theirs).abs() <= 0.02 * theirs, "{what}");
        // A tenth kept: the arenas are mostly free space inside pools still in use.
        let resident = p["resident"].as_u64().unwrap();
        assert!(
            p["free_in_used_pools"].as_u64().unwrap() * 2 > resident,
            "{what}"
        );
        let parts = ["in_use", "free_in_used_pools", "free_pools", "empty_arenas"];
        let sum: u64 = parts.iter().map(|k| p[k].as_u64().unwrap()).sum();
        assert_eq!(sum, resident, "{what}");
        // pymalloc's arenas are no longer "other anonymous", and they make the headline.
        assert_eq!(
            snap["pymalloc_arenas"].as_u64().unwrap(),
            resident,
            "{what}"
        );
        assert!(snap["other_anon"].as_u64().unwrap() < resident, "{what}");
        assert_eq!(
            report["headline"]["dominant"], "pymalloc_free_in_used_pools",
            "{what}"
        );
        let text = common::fragscope(&["report".as_ref(), trace.as_os_str()]);
        let text = String::from_utf8_lossy(&text.stdout);
        assert!(text.contains("pymalloc arenas"), "{text}");
        assert!(text.contains("small objects (pymalloc)"), "{text}");
    }
}

/// Records keep_a_tenth.py with `python` (`mode`: "scattered" or "first"); its report,
/// and the census taken while it idled after printing its statistics (the one whose
/// bytes in use are nearest theirs).
fn record_tenth(dir: &Path, python: &Path, mode: &str) -> (Value, Value) {
    let trace = dir.join(format!("{mode}.fsc"));
    let out = Command::new(env!("CARGO_BIN_EXE_fragscope"))
        .args(["record", "--stacks", "none", "--snapshot-ms", "300", "-o"])
        .arg(&trace)
        .arg("--")
        .arg(python)
        .arg(script())
        .args(["300000", "1", mode])
        .output()
        .unwrap();
    let err = common::stderr(&out);
    assert!(out.status.success(), "{err}");
    let report = report_json(&trace);
    let idle = nearest_census(&report, stat(&err, "bytes in allocated blocks") as f64).clone();
    (report, idle)
}

/// The census whose bytes in use are nearest `bytes`.
fn nearest_census(report: &Value, bytes: f64) -> &Value {
    let distance =
        |s: &&Value| (s["pymalloc"]["in_use"].as_u64().unwrap() as f64 - bytes).abs() as u64;
    &censused(report)
        .into_iter()
        .min_by_key(distance)
        .expect("a pymalloc census")["pymalloc"]
}

#[test]
fn keeping_the_first_tenth_frees_arenas_that_a_scattered_tenth_pins() {
    let dir = tempfile::tempdir().unwrap();
    let python = Path::new("/usr/bin/python3");
    let (scattered, s) = record_tenth(dir.path(), python, "scattered");
    let (first, f) = record_tenth(dir.path(), python, "first");
    let (s, f) = (&s, &f);
    let what = format!("scattered: {s}\nfirst: {f}");
    // The same objects kept, in a third of the arenas or fewer: survivors packed
    // together leave whole pools and arenas free to go back.
    let in_use = |p: &Value| p["in_use"].as_u64().unwrap() as f64;
    assert!((in_use(s) - in_use(f)).abs() < 0.2 * in_use(s), "{what}");
    let arenas = |p: &Value| p["arenas"].as_u64().unwrap();
    assert!(arenas(f) * 3 <= arenas(s), "{what}");
    assert_eq!(
        scattered["headline"]["dominant"], "pymalloc_free_in_used_pools",
        "{what}"
    );
    assert_ne!(
        first["headline"]["dominant"], "pymalloc_free_in_used_pools",
        "{what}"
    );
}

/// Records keep_a_tenth.py with `python` as a user would (Python sites sampled: the
/// wrapped allocators make sys._debugmallocstats print nothing of pymalloc's, as under
/// tracemalloc); the report.
fn record_with_sites(dir: &Path, python: &Path, mode: &str) -> Value {
    let trace = dir.join(format!("sites-{mode}.fsc"));
    let out = Command::new(env!("CARGO_BIN_EXE_fragscope"))
        .args(["record", "--snapshot-ms", "300", "-o"])
        .arg(&trace)
        .arg("--")
        .arg(python)
        .arg(script())
        .args(["300000", "1", mode])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", common::stderr(&out));
    let text = common::fragscope(&["report".as_ref(), trace.as_os_str()]);
    let text = String::from_utf8_lossy(&text.stdout);
    assert!(
        text.contains("Python lines whose objects keep the arenas"),
        "{text}"
    );
    report_json(&trace)
}

/// Who pins the arenas, read from the frames of every release at hand: the dicts of
/// line 11, whose survivors are scattered over the arenas (or packed into a few when the
/// first tenth is kept).
#[test]
fn the_python_line_whose_survivors_pin_the_arenas_is_named() {
    let dir = tempfile::tempdir().unwrap();
    for python in interpreters() {
        let report = record_with_sites(dir.path(), &python, "scattered");
        let what = python.display().to_string();
        // Who pins them: the dicts of line 11 (read from the frames of every release).
        let sites = &report["python_sites"];
        let what = format!("{what}\n{sites}");
        let top = &sites["sites"][0];
        let location = top["location"].as_str().unwrap_or_default();
        assert!(location.contains("keep_a_tenth.py:11 ("), "{what}");
        assert!(top["arenas"].as_u64().unwrap() > 10, "{what}");
        let sentence = report["headline"]["sentence"].as_str().unwrap();
        assert!(sentence.contains("keep_a_tenth.py:11"), "{sentence}");
        // The samples' estimate of what lives at the census, against the census (which
        // also counts what the interpreter made before its allocators were wrapped).
        let focus = report["pymalloc_snapshot"].as_u64().unwrap() as usize;
        let census = report["snapshots"][focus]["pymalloc"]["in_use"]
            .as_f64()
            .unwrap();
        let estimated: f64 = sites["sites"]
            .as_array()
            .unwrap()
            .iter()
            .map(|s| s["live_bytes"].as_f64().unwrap())
            .sum();
        assert!(
            (0.5 * census..1.3 * census).contains(&estimated),
            "estimated {estimated} live of {census}: {what}"
        );
        // Kept first, the same line's survivors fill their arenas and hold little free
        // space (with 256 KiB arenas before 3.10 they still span tens of arenas: the
        // free space they hold, not the count, tells the two apart).
        let first = record_with_sites(dir.path(), &python, "first");
        let top_held = |r: &Value| {
            r["python_sites"]["sites"][0]["held_bytes"]
                .as_f64()
                .unwrap()
        };
        assert!(
            top_held(&first) * 4.0 <= top_held(&report),
            "{what}\n{}",
            first["python_sites"]
        );
    }
}

#[test]
fn a_program_that_is_not_python_has_no_pymalloc_census() {
    let dir = tempfile::tempdir().unwrap();
    let trace = dir.path().join("sh.fsc");
    let out = Command::new(env!("CARGO_BIN_EXE_fragscope"))
        .args(["record", "--snapshot-ms", "100", "-o"])
        .arg(&trace)
        .args(["--", "sh", "-c", "sleep 0.5"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", common::stderr(&out));
    let info = common::info(&trace);
    for p in info["processes"].as_array().unwrap() {
        assert_eq!(p["pymalloc_censuses"], 0, "{p}");
    }
}

#[test]
fn a_running_cpython_process_gets_its_pymalloc_and_glibc_censuses_from_a_snapshot() {
    use std::io::{BufRead, BufReader};
    let dir = tempfile::tempdir().unwrap();
    let mut child = Command::new("/usr/bin/python3")
        .arg(script())
        .args(["300000", "30"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    assert!(line.starts_with("kept"), "{line}");
    let trace = dir.path().join("snap.fsc");
    let out = common::fragscope(&[
        "snapshot".as_ref(),
        child.id().to_string().as_ref(),
        "-o".as_ref(),
        trace.as_os_str(),
    ]);
    let still_running = child.try_wait().unwrap().is_none();
    let _ = child.kill();
    let _ = child.wait();
    assert!(out.status.success(), "{}", common::stderr(&out));
    assert!(still_running, "the snapshot must leave the process running");
    let report = report_json(&trace);
    let p = &report["snapshots"][0]["pymalloc"];
    assert!(p["arenas"].as_u64().unwrap() > 50, "{p}");
    // glibc's mmapped chunks share mappings with pymalloc's arenas: found all the same.
    let s = &report["snapshot"];
    assert!(s["note"].is_null(), "{s}");
    assert!(s["glibc"]["mmapped_chunks"].as_u64().unwrap() > 0, "{s}");
}

#[test]
fn every_worker_of_a_multiprocessing_pool_gets_its_own_pymalloc_census() {
    let dir = tempfile::tempdir().unwrap();
    let trace = dir.path().join("pool.fsc");
    let out = Command::new(env!("CARGO_BIN_EXE_fragscope"))
        .args(["record", "--snapshot-ms", "300", "-o"])
        .arg(&trace)
        .arg("--")
        .arg("/usr/bin/python3")
        .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/python/pool_workers.py"))
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", common::stderr(&out));
    let info = common::info(&trace);
    let processes = info["processes"].as_array().unwrap();
    assert_eq!(processes.len(), 3, "{info}");
    for p in processes {
        assert!(p["pymalloc_censuses"].as_u64().unwrap() > 0, "{p}");
        // The allocators wrapped in the parent stay wrapped in each forked worker.
        assert!(p["python_samples"].as_u64().unwrap() > 0, "{p}");
    }
    // A worker, asked for by pid, is explained with its own arenas.
    let worker = processes[1]["pid"].as_u64().unwrap().to_string();
    let out = common::fragscope(&[
        "report".as_ref(),
        trace.as_os_str(),
        "--json".as_ref(),
        "--pid".as_ref(),
        worker.as_ref(),
    ]);
    assert!(out.status.success(), "{}", common::stderr(&out));
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(!censused(&report).is_empty(), "worker {worker}");
}

/// Survivors among objects over 512 bytes (bytearrays) fragment malloc's heap, not
/// pymalloc's arenas: the headline says so, and what helps there.
#[test]
fn a_python_program_whose_malloc_heap_fragments_is_told_so() {
    let dir = tempfile::tempdir().unwrap();
    let trace = dir.path().join("buffers.fsc");
    let out = Command::new(env!("CARGO_BIN_EXE_fragscope"))
        .args(["record", "-o"])
        .arg(&trace)
        .arg("--")
        .arg("/usr/bin/python3")
        .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/python/big_buffers.py"))
        .args(["100000", "1"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", common::stderr(&out));
    let report = report_json(&trace);
    let h = &report["headline"];
    let dominant = h["dominant"].as_str().unwrap_or_default();
    assert!(!dominant.starts_with("pymalloc"), "{h}");
    let sentence = h["sentence"].as_str().unwrap();
    assert!(
        sentence.contains("malloc's heap, not pymalloc's arenas"),
        "{h}"
    );
    assert!(sentence.contains("malloc_trim(0)"), "{h}");
}

/// Through a pyenv shim (a bash script that runs pyenv, which runs several processes
/// before exec'ing python): the report explains the interpreter, not the wrappers.
#[test]
fn through_a_pyenv_shim_the_report_explains_the_interpreter() {
    let Some(shim) = std::env::var_os("HOME")
        .map(|h| Path::new(&h).join(".pyenv/shims/python3"))
        .filter(|s| s.exists())
    else {
        eprintln!("skipped: no pyenv shims on this machine");
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let trace = dir.path().join("shim.fsc");
    let out = Command::new(env!("CARGO_BIN_EXE_fragscope"))
        .args(["record", "-o"])
        .arg(&trace)
        .arg("--")
        .arg(&shim)
        .arg(script())
        // Idle past a periodic snapshot (one a second): with only the peak's and the
        // exit's, a loaded machine could take both before pymalloc's pools emptied.
        .args(["200000", "1.5"])
        .output()
        .unwrap();
    // Seen once under a full suite's load: a short run ending in failure, with nothing
    // on stderr. Say how each process of the shim ended.
    assert!(
        out.status.success(),
        "{}: {}\nstdout: {}\nprocesses: {:#}",
        out.status,
        common::stderr(&out),
        String::from_utf8_lossy(&out.stdout),
        common::info(&trace)["processes"]
    );
    let report = report_json(&trace);
    assert!(
        report["processes"].as_array().unwrap().len() > 1,
        "{report}"
    );
    let program = report["argv"][0].as_str().unwrap();
    assert!(program.contains("python3"), "{}", report["argv"]);
    assert!(report["python_sites"].is_object(), "{}", report["argv"]);
    assert_eq!(
        report["headline"]["dominant"],
        "pymalloc_free_in_used_pools"
    );
}

/// When pymalloc's arenas hold the waste, the first lines a user reads are about them:
/// the headline, the "most heap waste" line with its ratio over every heap, and a focus
/// snapshot that carries the census; the exit snapshot (CPython has finalized by then, so
/// no census is taken) shows the arenas as unknown, not as 0.
#[test]
fn the_first_lines_name_pymalloc_when_its_arenas_hold_the_waste() {
    let dir = tempfile::tempdir().unwrap();
    let trace = dir.path().join("first-lines.fsc");
    let out = Command::new(env!("CARGO_BIN_EXE_fragscope"))
        .args(["record", "--stacks", "none", "--snapshot-ms", "300", "-o"])
        .arg(&trace)
        .arg("--")
        .arg("/usr/bin/python3")
        .arg(script())
        .args(["300000", "1", "scattered"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", common::stderr(&out));
    let report = report_json(&trace);
    let headline = &report["headline"];
    assert_eq!(headline["heap"], "pymalloc", "{headline}");
    let focus = &report["snapshots"][report["focus_snapshot"].as_u64().unwrap() as usize];
    assert!(!focus["pymalloc"].is_null(), "{focus}");
    assert_eq!(focus["missing_census"], serde_json::json!([]));
    // The ratio is over every heap at the focus, pymalloc's arenas included.
    let heaps = focus["heaps"].as_array().unwrap();
    let sum = |k: &str| heaps.iter().map(|h| h[k].as_u64().unwrap()).sum::<u64>() as f64;
    let ratio = headline["fragmentation_ratio"].as_f64().unwrap();
    assert!(
        (ratio - sum("resident") / sum("live")).abs() < 1e-9,
        "{focus}"
    );
    assert!(ratio > 2.0, "{headline}");
    let exit = report["snapshots"].as_array().unwrap().last().unwrap();
    assert_eq!(exit["reason"], "exit");
    assert!(exit["pymalloc_arenas"].is_null(), "{exit}");
    assert_eq!(exit["missing_census"], serde_json::json!(["pymalloc"]));
    let text = common::report_text(&trace);
    let most = common::line_with(&text, "(the most heap waste)");
    assert!(most.contains("pymalloc arenas"), "{most}");
    let row = common::line_with(&text, "  pymalloc arenas ");
    assert!(row.contains('–') && !row.contains(" 0 B"), "{row}");
    assert!(
        text.contains("no census of the pymalloc arenas at"),
        "{text}"
    );
    // No lines, as asked: said in the pymalloc part, not in the headline.
    let note = report["python_sites_note"].as_str().unwrap();
    assert_eq!(
        note,
        "Python lines are not sampled: recorded with --stacks none."
    );
    assert!(text.contains(note), "{text}");
    assert!(!headline["sentence"].as_str().unwrap().contains(note));
}

/// A CPython whose frames the sampler does not read (here Debian's debug build, whose
/// objects are laid out differently) gets no Python lines, and the report says why: in
/// the JSON, the text's pymalloc part, the headline when pymalloc's arenas make it, and
/// the HTML page.
#[test]
fn a_cpython_without_python_lines_is_told_why() {
    let python = Path::new("/usr/bin/python3-dbg");
    assert!(
        python.exists(),
        "{} is missing: scripts/install-deps.sh installs python3-dbg",
        python.display()
    );
    let dir = tempfile::tempdir().unwrap();
    let trace = dir.path().join("debug-build.fsc");
    let out = Command::new(env!("CARGO_BIN_EXE_fragscope"))
        .args(["record", "--snapshot-ms", "300", "-o"])
        .arg(&trace)
        .arg("--")
        .arg(python)
        .arg(script())
        .args(["100000", "1", "scattered"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", common::stderr(&out));
    let report = report_json(&trace);
    assert!(report.get("python_sites").is_none(), "{report}");
    let note = report["python_sites_note"].as_str().unwrap_or_default();
    assert!(
        note.starts_with("Python lines are not sampled: CPython 3.")
            && note.contains("is a debug build"),
        "{note}"
    );
    if report["headline"]["heap"] == "pymalloc" {
        let sentence = report["headline"]["sentence"].as_str().unwrap();
        assert!(sentence.contains(note), "{sentence}");
    }
    let text = common::report_text(&trace);
    assert!(text.contains(note), "{text}");
    let page = dir.path().join("debug-build.html");
    let out = common::fragscope(&[
        "report".as_ref(),
        trace.as_os_str(),
        "--html".as_ref(),
        page.as_os_str(),
    ]);
    assert!(out.status.success(), "{}", common::stderr(&out));
    let html = std::fs::read_to_string(&page).unwrap();
    assert!(html.contains("python_sites_note") && html.contains("is a debug build"));
}

/// Each forked worker of such a CPython is a process (and a report) of its own, and is
/// told the same reason, not left with none or a guessed one.
#[test]
fn every_forked_worker_of_a_cpython_without_python_lines_is_told_why() {
    let dir = tempfile::tempdir().unwrap();
    let trace = dir.path().join("debug-pool.fsc");
    let out = Command::new(env!("CARGO_BIN_EXE_fragscope"))
        .args(["record", "--snapshot-ms", "300", "-o"])
        .arg(&trace)
        .arg("--")
        .arg("/usr/bin/python3-dbg")
        .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/python/pool_workers.py"))
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", common::stderr(&out));
    let info = common::info(&trace);
    let processes = info["processes"].as_array().unwrap();
    assert_eq!(processes.len(), 3, "{info}");
    for p in processes {
        let pid = p["pid"].as_u64().unwrap().to_string();
        let out = common::fragscope(&[
            "report".as_ref(),
            trace.as_os_str(),
            "--json".as_ref(),
            "--pid".as_ref(),
            pid.as_ref(),
        ]);
        assert!(out.status.success(), "{}", common::stderr(&out));
        let report: Value = serde_json::from_slice(&out.stdout).unwrap();
        let note = report["python_sites_note"].as_str().unwrap_or_default();
        assert!(note.contains("is a debug build"), "pid {pid}: {note:?}");
    }
}

fn prefork_script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/python/prefork_readers.py")
}

/// A part of a snapshot's sharing: (resident, shared, copied).
fn sharing_part(snapshot: &Value, part: &str) -> (f64, f64, f64) {
    let p = snapshot["sharing"]["parts"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["part"] == part)
        .unwrap_or_else(|| panic!("no {part} in {}", snapshot["sharing"]));
    let f = |k: &str| p[k].as_f64().unwrap();
    (f("resident"), f("shared"), f("copied"))
}

/// The worker's last snapshot with a pymalloc census.
fn last_census(report: &Value) -> &Value {
    censused(report).last().copied().expect("a pymalloc census")
}

/// Two workers forked from a parent holding 300 000 small dicts: the one that reads
/// them all writes their reference counts and so copies most of the arenas; the one
/// that touches none keeps them shared. Each report says so, the reader's headline names
/// the copies, and the process list sets the workers under their parent with their PSS.
#[test]
fn a_worker_that_reads_its_parents_objects_copies_their_arenas_and_an_idle_one_shares_them() {
    let dir = tempfile::tempdir().unwrap();
    let trace = dir.path().join("prefork.fsc");
    let out = Command::new(env!("CARGO_BIN_EXE_fragscope"))
        .args(["record", "--snapshot-ms", "300", "-o"])
        .arg(&trace)
        .arg("--")
        .arg("/usr/bin/python3")
        .arg(prefork_script())
        .arg("300000")
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", common::stderr(&out));
    let stdout = String::from_utf8_lossy(&out.stdout);
    let pid_of = |role: &str| -> u64 {
        let line = stdout.lines().find(|l| l.starts_with(role)).unwrap();
        line.split(' ').nth(1).unwrap().parse().unwrap()
    };
    let (reader_pid, idle_pid) = (pid_of("reader "), pid_of("idle "));

    let reader = common::report_json_of(&trace, reader_pid);
    let s = last_census(&reader);
    let (resident, shared, copied) = sharing_part(s, "pymalloc_arenas");
    assert!(resident > 60.0 * 1048576.0, "{}", s["sharing"]);
    assert!(copied > 0.4 * resident, "{}", s["sharing"]);
    assert!(shared + copied <= resident, "{}", s["sharing"]);
    assert_eq!(reader["headline"]["dominant"], "copied_after_fork");
    let sentence = reader["headline"]["sentence"].as_str().unwrap();
    assert!(sentence.contains("gc.freeze()"), "{sentence}");
    // The line whose dicts fill the copied arenas is named.
    let top = reader["python_sites"]["sites"]
        .as_array()
        .unwrap()
        .iter()
        .max_by(|a, b| {
            let c = |s: &Value| s["copied_bytes"].as_f64().unwrap();
            c(a).total_cmp(&c(b))
        })
        .unwrap();
    assert!(
        top["location"]
            .as_str()
            .unwrap()
            .contains("prefork_readers.py:19"),
        "{top}"
    );
    assert!(
        top["copied_bytes"].as_f64().unwrap() > 0.5 * copied,
        "{top}"
    );
    assert!(sentence.contains("prefork_readers.py:19"), "{sentence}");
    // smaps_rollup of the same moment: the private bytes hold what was copied.
    let rollup = &s["sharing"]["rollup"];
    assert!(
        rollup["private"].as_f64().unwrap() >= copied,
        "{rollup} {copied}"
    );

    let idle = common::report_json_of(&trace, idle_pid);
    let s = last_census(&idle);
    let (resident, shared, copied) = sharing_part(s, "pymalloc_arenas");
    assert!(copied < 0.05 * resident, "{}", s["sharing"]);
    assert!(shared > 0.9 * resident, "{}", s["sharing"]);
    assert_ne!(idle["headline"]["dominant"], "copied_after_fork");

    // The list of processes: each worker forked from the parent, the reader's PSS above
    // the idle one's.
    let procs = reader["processes"].as_array().unwrap();
    let parent = procs[0]["pid"].as_u64().unwrap();
    let brief = |pid: u64| procs.iter().find(|p| p["pid"] == pid).unwrap();
    for pid in [reader_pid, idle_pid] {
        assert_eq!(brief(pid)["forked_from"], parent, "{}", brief(pid));
    }
    let pss = |pid: u64| brief(pid)["sharing"]["rollup"]["pss"].as_f64().unwrap();
    assert!(pss(reader_pid) > pss(idle_pid) * 1.3, "{procs:?}");
    let text = common::fragscope(&[
        "report".as_ref(),
        trace.as_os_str(),
        "--pid".as_ref(),
        reader_pid.to_string().as_ref(),
    ]);
    let text = String::from_utf8_lossy(&text.stdout);
    assert!(text.contains("Shared and private at"), "{text}");
    assert!(text.contains(&format!("    {idle_pid} ")), "{text}");
}

/// Resident (from smaps) shared and private bytes of `pid`'s mappings that can hold heap
/// objects, as fragscope reads them from pagemap.
fn smaps_heap_sharing(pid: u32) -> (f64, f64) {
    let text = std::fs::read_to_string(format!("/proc/{pid}/smaps")).unwrap();
    let (mut shared, mut private, mut counted) = (0u64, 0u64, false);
    for line in text.lines() {
        let mut words = line.split_whitespace();
        let first = words.next().unwrap_or("");
        if first.contains('-') && !first.ends_with(':') {
            let perms = words.next().unwrap_or("");
            let inode = words.nth(2).unwrap_or("1");
            let path = words.next().unwrap_or("");
            counted = perms == "rw-p"
                && inode == "0"
                && (path.is_empty()
                    || path == "[heap]"
                    || (path.starts_with("[anon:") && path != "[anon:fragscope]"));
            continue;
        }
        if !counted {
            continue;
        }
        let kib: u64 = words.next().and_then(|v| v.parse().ok()).unwrap_or(0);
        match first {
            "Shared_Clean:" | "Shared_Dirty:" => shared += kib * 1024,
            "Private_Clean:" | "Private_Dirty:" => private += kib * 1024,
            _ => {}
        }
    }
    (shared as f64, private as f64)
}

/// `fragscope snapshot` of a forked worker (held stopped by the test, so that both
/// readings see the same moment): its pages shared with its parent and its own agree
/// with the kernel's smaps within 2%.
#[test]
fn a_snapshots_shared_and_private_pages_agree_with_smaps() {
    use std::io::{BufRead, BufReader};
    use std::process::Stdio;
    let dir = tempfile::tempdir().unwrap();
    let mut child = Command::new("/usr/bin/python3")
        .arg(prefork_script())
        .args(["--wait", "200000"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let mut reader_pid = 0u32;
    for _ in 0..2 {
        let line = lines.next().unwrap().unwrap();
        if let Some(rest) = line.strip_prefix("reader ") {
            reader_pid = rest.split(' ').next().unwrap().parse().unwrap();
        }
    }
    assert!(reader_pid > 0);
    // SAFETY: plain signals to our own grandchild.
    unsafe { libc::kill(reader_pid as i32, libc::SIGSTOP) };
    std::thread::sleep(std::time::Duration::from_millis(100));
    let (smaps_shared, smaps_private) = smaps_heap_sharing(reader_pid);
    let trace = dir.path().join("worker.fsc");
    let out = common::fragscope(&[
        "snapshot".as_ref(),
        reader_pid.to_string().as_ref(),
        "-o".as_ref(),
        trace.as_os_str(),
    ]);
    let (after_shared, after_private) = smaps_heap_sharing(reader_pid);
    unsafe { libc::kill(reader_pid as i32, libc::SIGCONT) };
    drop(child.stdin.take());
    child.wait().unwrap();
    assert!(out.status.success(), "{}", common::stderr(&out));
    // Reading the worker's heap copied none of it.
    assert_eq!((smaps_shared, smaps_private), (after_shared, after_private));
    let report = report_json(&trace);
    let a = &report["snapshots"][0]["sharing"]["anonymous"];
    let resident = a["resident"].as_f64().unwrap();
    let shared = a["shared"].as_f64().unwrap();
    let private = resident - shared;
    assert!(smaps_shared > 20.0 * 1048576.0 && smaps_private > 20.0 * 1048576.0);
    assert!(
        (shared - smaps_shared).abs() <= 0.02 * smaps_shared,
        "pagemap {shared}, smaps {smaps_shared}"
    );
    assert!(
        (private - smaps_private).abs() <= 0.02 * smaps_private,
        "pagemap {private}, smaps {smaps_private}"
    );
}
