//! `fragscope report --html` and `fragscope compare --html` in a real browser: headless
//! Chromium loads each page from disk; the tests check that every chart drew from the
//! data (element counts that follow the report's JSON), that the page ran without a
//! console message or a resource fetch, that the traced program's hostile names stayed
//! text, and keep a screenshot under target/html-report/.

mod common;

use common::{artefacts, chromium, load_page as load, report_json};

use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;

/// A name that would run script if it reached the page as markup.
const HOSTILE_ARG: &str = "</script><img src=x onerror=alert(3)>";

fn fragscope(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_fragscope"))
        .args(args)
        .output()
        .unwrap()
}

/// Records tests/c/html_sites.c (every stack, snapshots every 100 ms) into `dir`.
fn record(dir: &Path) -> PathBuf {
    let exe = common::build(dir, "html_sites", &["-g"]);
    let trace = dir.join("html_sites.fsc");
    let out = Command::new(env!("CARGO_BIN_EXE_fragscope"))
        .args(["record", "--stacks", "all", "--snapshot-ms", "100", "-o"])
        .arg(&trace)
        .arg("--")
        .arg(&exe)
        .args(["300", HOSTILE_ARG])
        .env_remove("LD_PRELOAD")
        .output()
        .unwrap();
    assert!(out.status.success(), "record: {}", common::stderr(&out));
    trace
}

fn n(dom: &str, needle: &str) -> usize {
    dom.matches(needle).count()
}

/// The page ran to its end, fetched nothing, and shows no markup from the trace.
fn assert_clean(dom: &str) {
    assert!(
        dom.contains("data-rendered=\"ok\""),
        "the script did not finish"
    );
    assert!(
        dom.contains("data-resources=\"0\""),
        "the page fetched something"
    );
    assert!(!dom.contains("data-errors"), "the page reported errors");
    assert_eq!(n(dom, "<img"), 0, "markup from the trace reached the page");
}

#[test]
fn report_html_draws_every_chart_from_the_data() {
    let dir = tempfile::tempdir().unwrap();
    let trace = record(dir.path());
    let report = report_json(&trace);
    let page = dir.path().join("report.html");
    let out = fragscope(&[
        "report",
        trace.to_str().unwrap(),
        "--html",
        page.to_str().unwrap(),
    ]);
    assert!(
        out.status.success(),
        "report --html: {}",
        common::stderr(&out)
    );
    assert!(
        out.stdout.is_empty(),
        "--html alone prints no terminal report"
    );
    let html = std::fs::read_to_string(&page).unwrap();
    eprintln!("report.html: {} bytes", html.len());
    assert!(html.len() < 3 << 20, "the page is {} bytes", html.len());
    assert!(html.contains("Content-Security-Policy"));
    assert!(html.contains("default-src 'none'"));
    assert!(!html.contains("<img"), "a name reached the page as markup");
    assert!(
        !html.contains("src=\"http"),
        "the page references the network"
    );

    let Some(browser) = chromium() else {
        eprintln!("skipped the browser checks: chromium is not installed (scripts/install-deps.sh installs it)");
        return;
    };
    let dom = load(&browser, &page, &artefacts().join("report.png"));
    assert_clean(&dom);

    // The stacked areas: one per part that is ever non-zero, over every snapshot.
    let snaps = report["snapshots"].as_array().unwrap();
    assert!(snaps.len() >= 2, "expected several snapshots");
    let parts = [
        "live",
        "rounding",
        "allocator_overhead",
        "free_in_used_pages",
        "free_resident_pages",
        "lazy_free",
        "other_anon",
        "file",
        "fragscope_own",
    ];
    let nonzero = parts
        .iter()
        .filter(|p| snaps.iter().any(|s| s[**p].as_u64().unwrap() > 0))
        .count();
    assert_eq!(n(&dom, "class=\"area\""), nonzero);
    assert_eq!(n(&dom, "class=\"snap-mark\""), snaps.len());
    assert_eq!(n(&dom, "class=\"rss-line\""), 1);
    assert_eq!(
        n(&dom, "class=\"phase\""),
        2 * report["phases"].as_array().unwrap().len()
    );
    // The path of the live area goes through every snapshot, there and back.
    let live = dom.find("data-part=\"live\"").expect("no live area");
    let d = &dom[live..];
    let d = &d[d.find(" d=\"").unwrap() + 4..];
    let d = &d[..d.find('"').unwrap()];
    assert_eq!(d.matches(['M', 'L']).count(), 2 * snaps.len());

    // The occupancy histogram of the focus snapshot: one bar per bucket, one option
    // per snapshot.
    let focus = report["focus_snapshot"].as_u64().unwrap() as usize;
    let buckets = snaps[focus]["occupancy"].as_array().unwrap().len();
    assert_eq!(n(&dom, "class=\"bar\""), buckets);
    assert_eq!(n(&dom, "<option value="), snaps.len() + 2 + 3);

    // Size classes: the table, and one line per class drawn over time.
    let classes = report["size_classes"].as_array().unwrap().len().min(50);
    let table = &dom[dom.find("class=\"data classes\"").unwrap()..];
    let table = &table[..table.find("</table>").unwrap()];
    assert_eq!(n(table, "<tr>"), classes + 1);
    let mut history: Vec<u64> = report["size_class_history"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|h| h["classes"].as_array().unwrap().iter())
        .map(|c| c["usable"].as_u64().unwrap())
        .collect();
    history.sort_unstable();
    history.dedup();
    assert_eq!(
        n(&dom, "class=\"series class-line\""),
        history.len().min(10)
    );

    // The flame graph holds every site, the top allocator widest.
    let flame = &dom[dom.find("class=\"flame\"").expect("no flame graph")..];
    let flame = &flame[..flame.find("</svg>").unwrap()];
    assert!(n(flame, "class=\"frame\"") >= 6, "{flame}");
    assert!(flame.contains("aria-label=\"big_buffers (html_sites.c:"));
    assert!(flame.contains("aria-label=\"scatter_records (html_sites.c:"));

    // The hostile names are there, as text.
    assert!(dom.contains("&lt;/script&gt;&lt;img src=x onerror=alert(3)&gt;"));
    assert!(dom.contains("&lt;/script&gt;&lt;img src=x onerror=alert(2)&gt;"));
}

#[test]
fn compare_and_ghc_pages_draw_in_the_browser() {
    let dir = tempfile::tempdir().unwrap();
    let a = record(dir.path());
    let b = dir.path().join("again.fsc");
    std::fs::copy(&a, &b).unwrap();
    let page = dir.path().join("compare.html");
    let out = fragscope(&[
        "compare",
        a.to_str().unwrap(),
        b.to_str().unwrap(),
        "--html",
        page.to_str().unwrap(),
    ]);
    assert!(
        out.status.success(),
        "compare --html: {}",
        common::stderr(&out)
    );
    let eventlog = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../fragscope-ghc/tests/fixtures/pinned-strip-200000.eventlog");
    let ghc_page = dir.path().join("ghc.html");
    let out = fragscope(&[
        "report",
        eventlog.to_str().unwrap(),
        "--html",
        ghc_page.to_str().unwrap(),
    ]);
    assert!(out.status.success(), "ghc --html: {}", common::stderr(&out));
    let ghc_json: Value = serde_json::from_slice(
        &fragscope(&["report", "--json", eventlog.to_str().unwrap()]).stdout,
    )
    .unwrap();

    let Some(browser) = chromium() else {
        eprintln!("skipped the browser checks: chromium is not installed (scripts/install-deps.sh installs it)");
        return;
    };
    let dom = load(&browser, &page, &artefacts().join("compare.png"));
    assert_clean(&dom);
    assert_eq!(n(&dom, "class=\"run\""), 2, "one panel per trace");
    assert_eq!(n(&dom, "class=\"chart decomposition\""), 2);
    assert_eq!(n(&dom, "class=\"chart occupancy\""), 2);
    assert!(n(&dom, "class=\"cmp-bar\"") == 14, "7 parts x 2 traces");
    let table = &dom[dom.find("class=\"data compare\"").unwrap()..];
    let table = &table[..table.find("</table>").unwrap()];
    assert_eq!(n(table, "<tr>"), 15);

    let dom = load(&browser, &ghc_page, &artefacts().join("ghc.png"));
    assert_clean(&dom);
    let phases = ghc_json["phases"].as_array().unwrap();
    let bands: usize = phases
        .iter()
        .map(|p| p["closure_types"].as_array().unwrap().len())
        .sum();
    assert!(bands > 0);
    assert_eq!(n(&dom, "class=\"band\""), bands);
    // live, blocks (when the RTS wrote them) and heap size; no RSS for an eventlog alone.
    let blocks = ghc_json["timeline"]
        .as_array()
        .unwrap()
        .iter()
        .any(|p| !p["blocks_size"].is_null());
    assert_eq!(
        n(&dom, "class=\"series ghc-line\""),
        if blocks { 3 } else { 2 }
    );
    // Pauses of a few milliseconds read as such, not as "0.00 s".
    for g in ghc_json["gc"]["generations"].as_array().unwrap() {
        let pause = g["max_pause_ms"].as_f64().unwrap();
        assert!(pause < 1000.0, "{g}");
        let shown = format!(
            "<td>{}</td>",
            if pause < 10.0 {
                format!("{pause:.2} ms")
            } else {
                format!("{pause:.1} ms")
            }
        );
        assert!(dom.contains(&shown), "{shown} not in the GC table");
    }
}

#[test]
fn report_html_names_the_images_that_could_not_be_traced() {
    let dir = tempfile::tempdir().unwrap();
    let static_exe = common::build(dir.path(), "fork_exit", &["-static"]);
    let exe = common::build(dir.path(), "fork_exit", &[]);
    let trace = dir.path().join("t.fsc");
    let script = format!("{} 0; {} 0", static_exe.display(), exe.display());
    let out = Command::new(env!("CARGO_BIN_EXE_fragscope"))
        .args(["record", "--stacks", "none", "-o"])
        .arg(&trace)
        .args(["--", "sh", "-c", &script])
        .env_remove("LD_PRELOAD")
        .output()
        .unwrap();
    assert!(out.status.success(), "record: {}", common::stderr(&out));
    let page = dir.path().join("report.html");
    let out = fragscope(&[
        "report",
        trace.to_str().unwrap(),
        "--html",
        page.to_str().unwrap(),
    ]);
    assert!(out.status.success(), "{}", common::stderr(&out));
    let Some(browser) = chromium() else {
        eprintln!("skipped the browser checks: chromium is not installed (scripts/install-deps.sh installs it)");
        return;
    };
    let dom = load(&browser, &page, &artefacts().join("untraced.png"));
    assert_clean(&dom);
    let report = report_json(&trace);
    let pid = &report["untraced"][0]["pid"];
    let shown = format!("Not traced, its calls are missing: pid {pid} (");
    assert_eq!(n(&dom, &shown), 1, "{dom}");
    assert!(dom.contains("statically linked"), "{dom}");
}

/// Bytes as the page writes them (binary units, one decimal).
fn binary(n: f64) -> String {
    let units = ["B", "KiB", "MiB", "GiB", "TiB"];
    let (mut v, mut u) = (n.round(), 0);
    while v >= 1024.0 && u + 1 < units.len() {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 {
        format!("{v} B")
    } else {
        format!("{v:.1} {}", units[u])
    }
}

/// The first `<table class="data NAME">` of `dom`.
fn data_table<'a>(dom: &'a str, name: &str) -> &'a str {
    let t = &dom[dom
        .find(&format!("class=\"data {name}\""))
        .unwrap_or_else(|| panic!("no {name} table"))..];
    &t[..t.find("</table>").unwrap()]
}

#[test]
fn a_cpython_report_html_shows_pymalloc_and_the_python_lines() {
    let dir = tempfile::tempdir().unwrap();
    let trace = common::record_keep_a_tenth(dir.path(), &["300000", "0.5"]);
    let report = report_json(&trace);
    let page = dir.path().join("python.html");
    let out = fragscope(&[
        "report",
        trace.to_str().unwrap(),
        "--html",
        page.to_str().unwrap(),
    ]);
    assert!(out.status.success(), "{}", common::stderr(&out));
    let Some(browser) = chromium() else {
        eprintln!("skipped the browser checks: chromium is not installed (scripts/install-deps.sh installs it)");
        return;
    };
    let dom = load(&browser, &page, &artefacts().join("python.png"));
    assert_clean(&dom);
    let focus = report["pymalloc_snapshot"]
        .as_u64()
        .expect("a pymalloc census") as usize;
    let p = &report["snapshots"][focus]["pymalloc"];
    let what = format!("{p}");
    assert_eq!(n(&dom, "id=\"pymalloc\""), 1);
    // The census figures.
    let arenas = p["arenas"].as_u64().unwrap();
    assert!(arenas < 10_000, "{what}");
    assert!(
        dom.contains(&format!(" in {arenas} arenas of 1.0 MiB (")),
        "{what}"
    );
    let parts = data_table(&dom, "pymalloc-parts");
    assert_eq!(n(parts, "<tr>"), 5);
    let free = p["free_in_used_pools"].as_f64().unwrap();
    assert!(
        parts.contains(&format!("<td>{}</td>", binary(free))),
        "{parts}"
    );
    // The pools-by-fill histogram: a bar per bucket, drawn as the page occupancy is.
    let chart = &dom[dom
        .find("class=\"chart pool-fill\"")
        .expect("no pool-fill chart")..];
    let chart = &chart[..chart.find("</svg>").unwrap()];
    assert_eq!(
        n(chart, "class=\"bar\""),
        p["pool_fill"].as_array().unwrap().len()
    );
    let classes = p["classes"].as_array().unwrap().len().min(5);
    assert_eq!(n(data_table(&dom, "pymalloc-classes"), "<tr>"), classes + 1);
    // The Python lines: line 11's dicts hold the arenas, its caller one click away.
    let sites = data_table(&dom, "python-sites");
    let listed = report["python_sites"]["sites"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|s| s["allocated_bytes"].as_f64().unwrap() > 0.0)
        .count();
    assert_eq!(n(sites, "<tr>"), listed + 1, "{sites}");
    let top = &report["python_sites"]["sites"][0];
    let first = &sites[sites.find("<td").unwrap()..];
    let first = &first[..first.find("</tr>").unwrap()];
    assert!(
        first.contains("<summary>") && first.contains("keep_a_tenth.py:11 ("),
        "{first}"
    );
    assert!(first.contains("class=\"caller\""), "{first}");
    let held = binary(top["held_bytes"].as_f64().unwrap());
    assert!(
        first.contains(&format!("<td>{held}</td>")),
        "{held}: {first}"
    );
}

/// A pre-fork worker's page: its shared and private pages by part, and the processes of
/// the trace with the worker under its parent.
#[test]
fn a_forked_workers_report_html_shows_its_shared_and_private_pages() {
    let dir = tempfile::tempdir().unwrap();
    let (trace, workers) = common::record_prefork(dir.path(), "prefork");
    let worker = &workers[0];
    let report = common::report_json_of(&trace, worker);
    let page = dir.path().join("prefork.html");
    let out = fragscope(&[
        "report",
        trace.to_str().unwrap(),
        "--pid",
        worker,
        "--html",
        page.to_str().unwrap(),
    ]);
    assert!(out.status.success(), "{}", common::stderr(&out));
    let Some(browser) = chromium() else {
        eprintln!("skipped the browser checks: chromium is not installed (scripts/install-deps.sh installs it)");
        return;
    };
    let dom = load(&browser, &page, &artefacts().join("prefork.png"));
    assert_clean(&dom);
    assert_eq!(n(&dom, "id=\"sharing\""), 1);
    let shown = report["sharing_snapshot"]
        .as_u64()
        .expect("a sharing snapshot") as usize;
    let sharing = &report["snapshots"][shown]["sharing"];
    let parts = sharing["parts"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|p| p["resident"].as_u64().unwrap() > 0)
        .count();
    let table = data_table(&dom, "sharing-parts");
    // A header, a row per part with resident pages, and the total.
    assert_eq!(n(table, "<tr>"), parts + 2, "{table}");
    let copied = binary(sharing["anonymous"]["copied"].as_f64().unwrap());
    assert!(table.contains(&format!("<td>{copied}</td>")), "{table}");
    let procs = data_table(&dom, "processes");
    assert_eq!(n(procs, "<tr>"), 3, "{procs}");
    assert!(
        procs.contains(&format!("{worker} (this report)")),
        "{procs}"
    );
}
