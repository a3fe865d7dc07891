//! SBCL programs: the dynamic space, read from gencgc's own page table at each snapshot,
//! inside the decomposition; figures checked against what the Lisp says of its heap.

mod common;

use std::path::Path;
use std::process::Command;

use serde_json::Value;

use common::report_json;

/// A figure the Lisp printed: "dynamic-usage 34224784", "generation 1 2609824".
fn figure(text: &str, prefix: &str) -> u64 {
    text.lines()
        .find_map(|l| l.strip_prefix(prefix))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("no '{prefix}' in:\n{text}"))
}

/// Whether sbcl cannot be run (the test is skipped, saying so).
fn sbcl_missing() -> bool {
    let missing = Command::new("sbcl").arg("--version").output().is_err();
    if missing {
        eprintln!("skipped: sbcl is not installed (scripts/install-deps.sh installs it)");
    }
    missing
}

#[test]
fn the_dynamic_space_is_split_and_agrees_with_the_lisps_own_figures() {
    if sbcl_missing() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let trace = dir.path().join("lisp.fsc");
    let job = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/lisp/import_job.lisp");
    let out = Command::new(env!("CARGO_BIN_EXE_fragscope"))
        .args(["record", "--snapshot-ms", "300", "-o"])
        .arg(&trace)
        .args(["--", "sbcl", "--script"])
        .arg(&job)
        .args(["600", "2"])
        .output()
        .unwrap();
    let err = common::stderr(&out);
    assert!(out.status.success(), "{err}");
    let report = report_json(&trace);
    // The program idles after printing its figures: the last census (the one at exit
    // is not taken) sees the same heap.
    let snaps: Vec<&Value> = report["snapshots"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|s| s.get("sbcl").is_some())
        .collect();
    assert!(snaps.len() >= 4, "{report}");
    let last = &snaps.last().unwrap()["sbcl"];
    let what = format!("{last}\n{err}");
    let near = |ours: u64, theirs: u64| (ours as f64 - theirs as f64).abs() <= 0.05 * theirs as f64;
    let used = last["bytes_used"].as_u64().unwrap();
    assert!(near(used, figure(&err, "dynamic-usage ")), "{what}");
    for g in last["generations"].as_array().unwrap() {
        let gen = g["gen"].as_u64().unwrap();
        let theirs = figure(&err, &format!("generation {gen} "));
        assert!(
            near(g["bytes_used"].as_u64().unwrap(), theirs),
            "generation {gen}: {what}"
        );
    }
    // The split adds up, and the space is its own part of RSS, not "other anonymous".
    let parts = ["in_use", "free_in_used_pages", "free_pages"];
    let sum: u64 = parts.iter().map(|k| last[k].as_u64().unwrap()).sum();
    assert_eq!(sum, last["resident"].as_u64().unwrap(), "{what}");
    let snap = snaps.last().unwrap();
    assert_eq!(snap["sbcl_dynamic_space"], last["resident"], "{what}");
    assert!(
        snap["other_anon"].as_u64().unwrap() < last["resident"].as_u64().unwrap(),
        "{snap}"
    );
    // The heap was walked now and then (within the pause budget), octet vectors found.
    let walked = snaps
        .iter()
        .filter_map(|s| s["sbcl"]["objects"].as_array())
        .next_back()
        .expect("at least one census walked the objects");
    let octets = walked
        .iter()
        .find(|c| c["class"] == "octet vectors")
        .unwrap();
    assert!(octets["count"].as_u64().unwrap() > 0, "{walked:?}");
    // The same walk by generation adds up to it, class by class.
    let census = snaps
        .iter()
        .rev()
        .find(|s| s["sbcl"]["objects"].is_array())
        .unwrap();
    let gens = census["sbcl"]["generations"].as_array().unwrap();
    for (k, class) in walked.iter().enumerate() {
        let by_gen: u64 = gens
            .iter()
            .filter_map(|g| g["objects"].as_array())
            .map(|o| o[k]["bytes"].as_u64().unwrap())
            .sum();
        assert_eq!(
            by_gen,
            class["bytes"].as_u64().unwrap(),
            "{class}: {census}"
        );
    }
    // Censuses that walked also marked from the roots: each class's garbage is part of
    // its bytes, and the generation's classes add up to the census's garbage.
    let marked: Vec<&Value> = snaps
        .iter()
        .map(|s| &s["sbcl"])
        .filter(|p| p["garbage"].is_u64())
        .collect();
    assert!(!marked.is_empty(), "no census marked: {report}");
    for p in &marked {
        let mut by_gen = 0;
        for g in p["generations"].as_array().unwrap() {
            for c in g["objects"]
                .as_array()
                .expect("a census that marked walked")
            {
                let garbage = c["garbage"].as_u64().expect("garbage by class");
                assert!(garbage <= c["bytes"].as_u64().unwrap(), "{c}");
                if g["gen"].as_u64().unwrap() < 6 {
                    by_gen += garbage;
                }
            }
        }
        assert_eq!(by_gen, p["garbage"].as_u64().unwrap(), "{p}");
        assert!(p["garbage"].as_u64().unwrap() <= p["bytes_used"].as_u64().unwrap());
    }
    // The last census saw the heap the Lisp measured: its 8 referenced buffers are live
    // (the mark never calls them garbage), and the dropped ones that were promoted are
    // garbage in an older generation.
    let last_marked = marked.last().unwrap();
    let octets_of = |p: &Value, gens: std::ops::RangeInclusive<u64>| -> (u64, u64) {
        p["generations"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|g| gens.contains(&g["gen"].as_u64().unwrap()))
            .flat_map(|g| g["objects"].as_array().unwrap())
            .filter(|c| c["class"] == "octet vectors")
            .fold((0, 0), |(b, gb), c| {
                (
                    b + c["bytes"].as_u64().unwrap(),
                    gb + c["garbage"].as_u64().unwrap(),
                )
            })
    };
    for p in &marked {
        // At any census after the first rounds, 8 buffers of at least 100000 bytes.
        let (bytes, garbage) = octets_of(p, 0..=7);
        assert!(
            bytes - garbage >= 8 * 100_000,
            "live octets {}: {p}",
            bytes - garbage
        );
    }
    if std::ptr::eq(*last_marked, &snaps.last().unwrap()["sbcl"]) {
        // The census of the idle program: the very buffers the Lisp counted.
        let (bytes, garbage) = octets_of(last_marked, 0..=7);
        let recent = figure(&err, "recent-octet-bytes ");
        assert!(
            bytes - garbage >= recent,
            "live octets {} < {recent}: {what}",
            bytes - garbage
        );
    }
    let (_, old_garbage) = octets_of(last_marked, 1..=5);
    assert!(old_garbage > 4 << 20, "{last_marked}");
    // The headline says it in the seed's terms.
    let headline = &report["headline"];
    assert_eq!(headline["dominant"], "sbcl_promoted_garbage", "{headline}");
    let sentence = headline["sentence"].as_str().unwrap();
    assert!(
        sentence.contains("of octet vectors in generation")
            && sentence.contains("garbage that only a full GC reclaims")
            && sentence.contains("promoted before dying"),
        "{sentence}"
    );
    let text = common::fragscope(&["report".as_ref(), trace.as_os_str()]);
    let text = String::from_utf8_lossy(&text.stdout);
    assert!(text.contains("SBCL dynamic space"), "{text}");
    assert!(text.contains("dynamic space at"), "{text}");
    assert!(text.contains("generation 0 holds most:"), "{text}");
    assert!(
        text.contains("the census that found the most garbage"),
        "{text}"
    );
    assert!(
        text.contains("garbage that only a full GC reclaims"),
        "{text}"
    );
}

#[test]
fn a_program_that_is_not_sbcl_has_no_sbcl_census() {
    let dir = tempfile::tempdir().unwrap();
    let trace = dir.path().join("sh.fsc");
    let out = Command::new(env!("CARGO_BIN_EXE_fragscope"))
        .args(["record", "--snapshot-ms", "100", "-o"])
        .arg(&trace)
        .args(["--", "sh", "-c", "sleep 0.5"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", common::stderr(&out));
    let report = report_json(&trace);
    assert!(report.get("sbcl_snapshot").is_none(), "{report}");
    assert!(report.get("sbcl_note").is_none(), "{report}");
    assert!(report.get("lisp_sites").is_none(), "{report}");
    assert_eq!(common::info(&trace)["processes"][0]["lisp_samples"], 0);
}

/// The same job with its buffers malloc'd outside the dynamic space (sb-alien): compare
/// shows both dynamic spaces side by side, and no CPython rows.
#[test]
fn compare_shows_buffers_moved_out_of_the_dynamic_space() {
    if sbcl_missing() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let job = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/lisp/import_job.lisp");
    let record = |name: &str, extra: &[&str]| {
        let trace = dir.path().join(name);
        let out = Command::new(env!("CARGO_BIN_EXE_fragscope"))
            .args(["record", "--snapshot-ms", "200", "-o"])
            .arg(&trace)
            .args(["--", "sbcl", "--script"])
            .arg(&job)
            .args(["600", "1"])
            .args(extra)
            .output()
            .unwrap();
        assert!(out.status.success(), "{}", common::stderr(&out));
        trace
    };
    let inside = record("inside.fsc", &[]);
    let outside = record("alien.fsc", &["alien"]);
    let out = common::fragscope(&["compare".as_ref(), inside.as_os_str(), outside.as_os_str()]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}");
    let row = |name: &str| -> Vec<String> {
        text.lines()
            .find(|l| l.get(..26).is_some_and(|label| label.trim_end() == name))
            .unwrap_or_else(|| panic!("no row {name:?} in:\n{text}"))[26..]
            .split("  ")
            .map(str::trim)
            .filter(|c| !c.is_empty())
            .map(str::to_string)
            .collect()
    };
    // Both runs' dynamic spaces, split, side by side (which is smaller depends on
    // where each run's collections fell: the buffers here are transient).
    for name in ["SBCL dynamic space", "  objects", "  free"] {
        assert_eq!(row(name).len(), 2, "{name}: {text}");
    }
    assert!(!text.contains("pymalloc"), "{text}");
}

/// `job` (which defines WORK) saved with save-lisp-and-die as the executable `dir/name`,
/// which runs WORK and exits: a Lisp program as it is shipped. `compressed`: its core
/// compressed (:compression t, in builds with :sb-core-compression, as Debian's).
fn save_executable(dir: &Path, job: &Path, name: &str, compressed: bool) -> std::path::PathBuf {
    let exe = dir.join(name);
    let build = dir.join(format!("build-{name}.lisp"));
    std::fs::write(
        &build,
        format!(
            "(load {:?})\n(sb-ext:save-lisp-and-die {:?} :executable t{} :toplevel (lambda () (work) (sb-ext:exit)))\n",
            job.display().to_string(),
            exe.display().to_string(),
            if compressed { " :compression t" } else { "" }
        ),
    )
    .unwrap();
    let out = Command::new("sbcl")
        .args(["--non-interactive", "--load"])
        .arg(&build)
        .output()
        .unwrap();
    assert!(
        out.status.success() && exe.exists(),
        "{}",
        common::stderr(&out)
    );
    exe
}

#[test]
fn a_saved_executable_and_a_load_are_recorded_like_a_script() {
    if Command::new("sbcl").arg("--version").output().is_err() {
        eprintln!("skipped: sbcl is not installed (scripts/install-deps.sh installs it)");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    // Octet buffers and strings made and mostly dropped, then the Lisp's own figure, and a
    // pause so that the recorder's last census sees the same heap.
    let job = dir.path().join("job.lisp");
    std::fs::write(
        &job,
        r#"(defvar *keep* nil)
(defun work ()
  (dotimes (i 600)
    (push (make-array 100000 :element-type '(unsigned-byte 8)) *keep*)
    (when (> (length *keep*) 20) (setf *keep* (subseq *keep* 0 10)))
    (dotimes (j 500) (push (format nil "str-~a" j) (cdr (last *keep*)))))
  (format *error-output* "dynamic-usage ~a~%" (sb-kernel:dynamic-usage))
  (finish-output *error-output*)
  (sleep 1.5))
"#,
    )
    .unwrap();
    let exe = save_executable(dir.path(), &job, "job-exe", false);
    let compressed = save_executable(dir.path(), &job, "job-exe-z", true);
    assert!(
        std::fs::metadata(&compressed).unwrap().len() * 2 < std::fs::metadata(&exe).unwrap().len(),
        "the core was not compressed"
    );
    let load_args: Vec<std::ffi::OsString> = vec![
        "sbcl".into(),
        "--non-interactive".into(),
        "--load".into(),
        job.clone().into(),
        "--eval".into(),
        "(work)".into(),
    ];
    for (name, command) in [
        ("saved", vec![exe.clone().into_os_string()]),
        (
            "saved compressed",
            vec![compressed.clone().into_os_string()],
        ),
        ("load", load_args),
    ] {
        let trace = dir.path().join(format!("{name}.fsc"));
        let out = Command::new(env!("CARGO_BIN_EXE_fragscope"))
            .args(["record", "--snapshot-ms", "300", "-o"])
            .arg(&trace)
            .arg("--")
            .args(&command)
            .output()
            .unwrap();
        let err = common::stderr(&out);
        assert!(out.status.success(), "{name}: {err}");
        let report = report_json(&trace);
        let last = report["snapshots"]
            .as_array()
            .unwrap()
            .iter()
            .rev()
            .find_map(|s| s.get("sbcl").filter(|c| !c.is_null()))
            .unwrap_or_else(|| panic!("{name}: no SBCL census: {report}"));
        let used = last["bytes_used"].as_u64().unwrap();
        let theirs = figure(&err, "dynamic-usage ");
        assert!(
            (used as f64 - theirs as f64).abs() <= 0.05 * theirs as f64,
            "{name}: census {used} B in use, the Lisp's dynamic-usage {theirs} B"
        );
        // The Lisp lines: WORK's arrays and strings.
        let functions = report["lisp_sites"]["functions"].as_array();
        assert!(
            functions.is_some_and(|f| f.iter().any(|f| f["function"] == "WORK")),
            "{name}: {}",
            report["lisp_sites"]
        );
    }
}
/// What tests/lisp/export_job.lisp printed: each phase's bytes consed, by function.
fn consed(stdout: &[u8]) -> Vec<(String, f64)> {
    String::from_utf8_lossy(stdout)
        .lines()
        .filter_map(|l| {
            let (name, bytes) = l.split_once(' ')?;
            Some((name.to_string(), bytes.trim().parse().ok()?))
        })
        .collect()
}

/// Records tests/lisp/export_job.lisp with `options` and `threads`; its oracle and the
/// report's JSON.
fn record_export_job(
    dir: &Path,
    options: &[&str],
    threads: &str,
) -> (std::path::PathBuf, Vec<(String, f64)>, Value) {
    let trace = dir.join(format!("export{threads}.fsc"));
    let job = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/lisp/export_job.lisp");
    let out = Command::new(env!("CARGO_BIN_EXE_fragscope"))
        .arg("record")
        .args(options)
        .arg("-o")
        .arg(&trace)
        .args(["--", "sbcl", "--script"])
        .arg(&job)
        .args(["1", threads])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", common::stderr(&out));
    let oracle = consed(&out.stdout);
    assert_eq!(oracle.len(), 4, "{}", String::from_utf8_lossy(&out.stdout));
    let report = report_json(&trace);
    (trace, oracle, report)
}

/// Each phase's function allocated, while it ran, what it measured itself with
/// get-bytes-consed (within 5%).
fn check_against_oracle(lisp: &Value, oracle: &[(String, f64)]) {
    let functions = lisp["functions"].as_array().unwrap();
    for (name, theirs) in oracle {
        let ours = functions
            .iter()
            .find(|f| f["function"] == name.as_str())
            .unwrap_or_else(|| panic!("no {name} among the functions: {lisp:#}"))
            ["inclusive_bytes"]
            .as_f64()
            .unwrap();
        assert!(
            (ours - theirs).abs() <= 0.05 * theirs,
            "{name}: {ours:.0} sampled, {theirs:.0} consed\n{lisp:#}"
        );
    }
}

#[test]
fn lisp_allocation_sites_match_what_the_functions_consed() {
    if sbcl_missing() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (trace, oracle, report) = record_export_job(dir.path(), &[], "1");
    let lisp = &report["lisp_sites"];
    check_against_oracle(lisp, &oracle);
    let consed = |name: &str| oracle.iter().find(|(n, _)| n == name).unwrap().1;
    // The sites: CONCATENATE under REDUCE (SEXP->XML's tail call) makes most of the
    // XML phase; the rows and blobs allocate in their own functions.
    let sites = lisp["sites"].as_array().unwrap();
    let site = |name: &str| {
        sites
            .iter()
            .find(|s| s["function"] == name)
            .unwrap_or_else(|| panic!("no site {name}: {lisp:#}"))
    };
    let top = &sites[0];
    assert_eq!(
        top["function"], "SB-KERNEL::%CONCATENATE-TO-STRING",
        "{lisp:#}"
    );
    assert_eq!(top["callers"][0], "REDUCE", "{lisp:#}");
    assert_eq!(top["callers"][1], "EXPORT-XML", "{lisp:#}");
    let xml = top["allocated_bytes"].as_f64().unwrap();
    assert!(
        xml > 0.9 * consed("EXPORT-XML") && xml < 1.01 * consed("EXPORT-XML"),
        "{lisp:#}"
    );
    for (leaf, phase) in [("PARSE-ROW", "PARSE-ROWS"), ("LOAD-BLOBS", "LOAD-BLOBS")] {
        let ours = site(leaf)["allocated_bytes"].as_f64().unwrap();
        let theirs = consed(phase);
        assert!((ours - theirs).abs() <= 0.05 * theirs, "{leaf}: {lisp:#}");
    }
    assert_eq!(site("LOAD-BLOBS")["callers"][0], "RUN-PHASE");
    // Local functions are named as SBCL's backtrace names them, lists read whole.
    let functions = lisp["functions"].as_array().unwrap();
    assert!(
        functions
            .iter()
            .any(|f| f["function"] == "(FLET ROW :IN RENDER-REPORT)"),
        "{lisp:#}"
    );
    for f in functions {
        let name = f["function"].as_str().unwrap();
        assert!(!name.contains("NIL NIL") && !name.contains("#<"), "{name}");
    }
    assert!(lisp["large_samples"].as_u64().unwrap() >= 500, "{lisp:#}");
    // The headline names the dominant site and its callers.
    let sentence = report["headline"]["sentence"].as_str().unwrap();
    assert!(
        sentence.contains(
            "of Lisp allocation comes from SB-KERNEL::%CONCATENATE-TO-STRING called by REDUCE \
             in EXPORT-XML"
        ),
        "{sentence}"
    );
    let text = common::fragscope(&["report".as_ref(), trace.as_os_str()]);
    let text = String::from_utf8_lossy(&text.stdout);
    assert!(text.contains("Lisp allocation sites ("), "{text}");
    assert!(text.contains("<- REDUCE"), "{text}");

    // Exports: folded stacks and pprof samples labelled kind=lisp.
    let export = |format: &str, file: &str| {
        let path = dir.path().join(file);
        let out = common::fragscope(&[
            "export".as_ref(),
            trace.as_os_str(),
            "-f".as_ref(),
            format.as_ref(),
            "-o".as_ref(),
            path.as_os_str(),
        ]);
        assert!(out.status.success(), "{}", common::stderr(&out));
        path
    };
    let folded = std::fs::read_to_string(export("collapsed", "lisp.folded")).unwrap();
    let line = folded
        .lines()
        .find(|l| l.contains("EXPORT-XML;REDUCE;SB-KERNEL::%CONCATENATE-TO-STRING "))
        .unwrap_or_else(|| panic!("no XML stack in:\n{folded}"));
    let bytes: f64 = line.rsplit(' ').next().unwrap().parse().unwrap();
    assert!((bytes - xml).abs() <= 0.01 * xml, "{line}");
    let tables = export("parquet", "lisp.parquet");
    assert!(tables.join("lisp_sites.parquet").exists());
    let pprof = export("pprof", "lisp.pb.gz");
    if let Some(go) = common::go() {
        let (total, rows) = common::pprof_top(&go, &pprof, "alloc_space", &["-tagfocus=kind=lisp"]);
        let all = lisp["allocated_bytes"].as_f64().unwrap();
        assert!((total as f64 - all).abs() <= 0.01 * all, "{total} {rows:?}");
        assert_eq!(rows[0].1, "SB-KERNEL::%CONCATENATE-TO-STRING", "{rows:?}");
    } else {
        eprintln!("skipped go tool pprof: go is not installed");
    }

    // The page: the sites table and the Lisp flame graph render.
    let page = dir.path().join("lisp.html");
    let out = common::fragscope(&[
        "report".as_ref(),
        trace.as_os_str(),
        "--html".as_ref(),
        page.as_os_str(),
    ]);
    assert!(out.status.success(), "{}", common::stderr(&out));
    if let Some(browser) = common::chromium() {
        let dom = common::load_page(&browser, &page, &common::artefacts().join("lisp.png"));
        assert!(dom.contains("id=\"lisp-sites\""), "no Lisp section");
        assert!(dom.contains("Lisp flame graph"), "no Lisp flame graph");
        assert!(
            dom.contains("aria-label=\"EXPORT-XML\""),
            "no EXPORT-XML frame"
        );
    } else {
        eprintln!("skipped the page: chromium is not installed");
    }
}

#[test]
fn lisp_threads_allocation_is_sampled_in_every_thread() {
    if sbcl_missing() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (_, oracle, report) = record_export_job(dir.path(), &[], "3");
    check_against_oracle(&report["lisp_sites"], &oracle);
}

#[test]
fn stacks_none_samples_no_lisp_allocation() {
    if sbcl_missing() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (trace, _, report) = record_export_job(dir.path(), &["--stacks", "none"], "1");
    assert!(report.get("lisp_sites").is_none(), "{report}");
    let info = common::info(&trace);
    assert_eq!(info["processes"][0]["lisp_samples"], 0, "{info}");
}

/// A saved executable whose threads build a heap that only SBCL's dynamic space holds:
/// the headline, the "most heap waste" line and the page's summary name the dynamic
/// space, the focus snapshot carries its census, and the exit snapshot, taken without a
/// census, shows the dynamic space as unknown instead of counting it as other memory.
#[test]
fn the_first_lines_name_the_dynamic_space_of_a_saved_threaded_executable() {
    if sbcl_missing() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let job = dir.path().join("job.lisp");
    std::fs::write(
        &job,
        r#"(defvar *keep* nil)
(defvar *lock* (sb-thread:make-mutex))
(defun worker (n)
  (let ((mine nil))
    (dotimes (i n)
      (let ((rec (list (make-string 40 :initial-element #\x) (make-array 16) i)))
        (when (zerop (mod i 10)) (push rec mine))))
    (sb-thread:with-mutex (*lock*) (push mine *keep*))))
(defun work ()
  (mapc #'sb-thread:join-thread
        (loop repeat 2 collect (sb-thread:make-thread #'worker :arguments (list 600000))))
  (sleep 1.2))
"#,
    )
    .unwrap();
    let exe = save_executable(dir.path(), &job, "threads-exe", false);
    let trace = dir.path().join("threads.fsc");
    let out = Command::new(env!("CARGO_BIN_EXE_fragscope"))
        .args(["record", "--snapshot-ms", "300", "-o"])
        .arg(&trace)
        .arg("--")
        .arg(&exe)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", common::stderr(&out));
    let report = report_json(&trace);
    let headline = &report["headline"];
    let sentence = headline["sentence"].as_str().unwrap();
    assert!(!sentence.contains("outside the traced heap"), "{sentence}");
    let snapshots = report["snapshots"].as_array().unwrap();
    let focus = &snapshots[report["focus_snapshot"].as_u64().unwrap() as usize];
    assert!(!focus["sbcl"].is_null(), "{focus}");
    // The sentence is about the dynamic space when it holds the most waste, a quarter of
    // its pages or more (how much the collector left free at the focus varies from run to
    // run); with less, the heaps are dense, or the dynamic space is named as the heap
    // that wastes most — never malloc's free pages.
    let figure = |heap: &str, what: &str| {
        focus["heaps"]
            .as_array()
            .unwrap()
            .iter()
            .find(|h| h["heap"] == heap)
            .map_or(0, |h| h[what].as_u64().unwrap())
    };
    let waste = |heap: &str| figure(heap, "waste");
    if waste("sbcl") >= 4 << 20
        && waste("sbcl") * 4 >= figure("sbcl", "resident")
        && waste("sbcl") > waste("malloc")
    {
        assert_eq!(headline["heap"], "sbcl", "{headline}");
        assert!(sentence.contains("SBCL's dynamic space"), "{sentence}");
    } else if waste("sbcl") > waste("malloc") && !sentence.starts_with("The heaps are dense") {
        assert_eq!(headline["heap"], "sbcl", "{headline}");
        assert!(
            sentence.starts_with("Most of the waste is in the SBCL dynamic space"),
            "{focus}\n{sentence}"
        );
    } else {
        assert!(
            sentence.starts_with("The heaps are dense"),
            "{focus}\n{sentence}"
        );
    }
    let exit = snapshots.last().unwrap();
    assert_eq!(exit["reason"], "exit");
    assert!(exit["sbcl_dynamic_space"].is_null(), "{exit}");
    assert_eq!(exit["missing_census"], serde_json::json!(["sbcl"]));
    let text = common::report_text(&trace);
    let most = common::line_with(&text, "(the most heap waste)");
    assert!(most.contains("SBCL dynamic space"), "{most}");
    assert!(
        text.contains("no census of the SBCL dynamic space at"),
        "{text}"
    );
    let page = dir.path().join("threads.html");
    let out = common::fragscope(&[
        "report".as_ref(),
        trace.as_os_str(),
        "--html".as_ref(),
        page.as_os_str(),
    ]);
    assert!(out.status.success(), "{}", common::stderr(&out));
    if let Some(browser) = common::chromium() {
        let dom = common::load_page(
            &browser,
            &page,
            &common::artefacts().join("sbcl-first-lines.png"),
        );
        let summary = dom
            .split("id=\"summary\"")
            .nth(1)
            .and_then(|s| s.split("</section>").next())
            .unwrap_or_else(|| panic!("no summary in the page"));
        assert!(summary.contains("SBCL dynamic space"), "{summary}");
        // The page occupancy opens on the heap the headline is about: the dynamic
        // space's pages when it is SBCL's (the collector leaves more or less free at the
        // focus from run to run), else the dynamic space is one choice of its heaps.
        if headline["heap"] == "sbcl" {
            assert!(
                dom.contains("SBCL dynamic space: pages in use"),
                "no SBCL page fill"
            );
        } else {
            assert!(
                dom.contains(">SBCL dynamic space</option>"),
                "no SBCL heap to choose"
            );
        }
    } else {
        eprintln!("skipped the page: chromium is not installed");
    }
}

/// An SBCL runtime of a release fragscope has not verified (here the installed one, its
/// release string rewritten, running its own core): the census and the sampler read
/// nothing, and the report says why, in the JSON and the text.
#[test]
fn an_unknown_release_gets_a_note_and_no_figures() {
    if sbcl_missing() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let lisp = |args: &[&str]| {
        let out = Command::new("sbcl").args(args).output().unwrap();
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    };
    // "SBCL 2.5.2.debian": the release string the runtime carries in its .rodata.
    let release = lisp(&["--version"]).trim_start_matches("SBCL ").to_string();
    let core = lisp(&[
        "--noinform",
        "--non-interactive",
        "--eval",
        "(princ (namestring sb-ext:*core-pathname*))",
    ]);
    let numbers = release
        .split(|c: char| !(c.is_ascii_digit() || c == '.'))
        .next()
        .unwrap();
    let numbers = numbers.trim_end_matches('.');
    let unknown: String = numbers
        .chars()
        .map(|c| if c == '.' { '.' } else { '9' })
        .chain(release[numbers.len()..].chars())
        .collect();
    let runtime = String::from_utf8_lossy(
        &Command::new("sh")
            .args(["-c", "command -v sbcl"])
            .output()
            .unwrap()
            .stdout,
    )
    .trim()
    .to_string();
    let mut elf = std::fs::read(&runtime).unwrap();
    let needle = format!("\0{release}\0");
    let at = elf
        .windows(needle.len())
        .position(|w| w == needle.as_bytes())
        .unwrap_or_else(|| panic!("no {release:?} in {runtime}"));
    elf[at + 1..at + 1 + unknown.len()].copy_from_slice(unknown.as_bytes());
    let patched = dir.path().join("sbcl");
    std::fs::write(&patched, &elf).unwrap();
    std::fs::set_permissions(
        &patched,
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .unwrap();
    let job = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/lisp/export_job.lisp");
    let trace = dir.path().join("unknown.fsc");
    let out = Command::new(env!("CARGO_BIN_EXE_fragscope"))
        .args(["record", "-o"])
        .arg(&trace)
        .arg("--")
        .arg(&patched)
        .args(["--core", &core, "--script"])
        .arg(&job)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", common::stderr(&out));
    assert_eq!(consed(&out.stdout).len(), 4, "the job ran");
    let report = report_json(&trace);
    assert!(report["lisp_sites"].is_null(), "{report}");
    for s in report["snapshots"].as_array().unwrap() {
        assert!(s.get("sbcl").is_none_or(|c| c.is_null()), "{s}");
    }
    let census_note = report["sbcl_note"].as_str().unwrap_or_default();
    assert!(
        census_note.contains(&format!("SBCL {unknown} is not supported")),
        "{report}"
    );
    let lines_note = report["lisp_sites_note"].as_str().unwrap_or_default();
    assert!(
        lines_note.contains(&format!("not {unknown}'s")),
        "{lines_note}"
    );
    let text = common::report_text(&trace);
    assert!(
        text.contains(census_note) && text.contains(lines_note),
        "{text}"
    );
}
