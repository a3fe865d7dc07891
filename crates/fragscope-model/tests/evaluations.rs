//! Snapshots evaluated from the live blocks kept by page, summarised page by page as calls
//! change them, report what evaluating every live block at each snapshot reports, on
//! recorded traces: the trace crate's fixtures (threads with every stack, packed calls
//! without stacks) and `stripe strip` (shared/cases/stripe.c, 40 000 objects of which
//! every tenth is kept, 186 snapshots, stacks sampled every 4 KiB: sparse pages pinned by
//! sampled sites, recorded with `fragscope record --snapshot-ms 2 --sample-bytes 4096`).

use std::path::{Path, PathBuf};

use fragscope_model::analyze::{analyze, Options};
use fragscope_model::heap_pages::Evaluation;
use serde_json::Value;

fn fixtures() -> Vec<PathBuf> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut traces = Vec::new();
    for dir in ["tests/fixtures", "../fragscope-trace/tests/fixtures"] {
        for entry in std::fs::read_dir(root.join(dir)).unwrap() {
            let path = entry.unwrap().path();
            if path.extension().is_some_and(|e| e == "fsc") {
                traces.push(path);
            }
        }
    }
    traces.sort();
    traces
}

/// The report of `trace` as JSON, its snapshots evaluated as `evaluation` says.
fn report(trace: &Path, evaluation: Evaluation) -> Value {
    let opts = Options {
        evaluation,
        ..Options::default()
    };
    let report = analyze(trace, &opts, |_, _| {}).unwrap();
    serde_json::to_value(report).unwrap()
}

/// Where `a` and `b` first differ (a JSON path), if they do. Fractional numbers may
/// differ in their last bits (sums of page shares added in another order); integers,
/// strings and everything else must be equal.
fn first_difference(a: &Value, b: &Value, path: String) -> Option<String> {
    let fraction = |v: &Value| v.as_f64().filter(|_| v.is_f64());
    match (a, b) {
        (Value::Number(_), Value::Number(_)) if fraction(a).is_some() && fraction(b).is_some() => {
            let (x, y) = (a.as_f64().unwrap(), b.as_f64().unwrap());
            let close = (x - y).abs() <= 1e-9 * x.abs().max(y.abs()).max(1.0);
            (!close).then(|| format!("{path}: {x} against {y}"))
        }
        (Value::Object(x), Value::Object(y)) if x.len() == y.len() => {
            x.iter().find_map(|(k, v)| match y.get(k) {
                Some(w) => first_difference(v, w, format!("{path}.{k}")),
                None => Some(format!("{path}.{k}")),
            })
        }
        (Value::Array(x), Value::Array(y)) if x.len() == y.len() => (x.iter().zip(y))
            .enumerate()
            .find_map(|(i, (v, w))| first_difference(v, w, format!("{path}[{i}]"))),
        _ if a == b => None,
        _ => Some(format!("{path}: {a} against {b}")),
    }
}

#[test]
fn snapshots_evaluated_by_page_report_what_every_block_reports_on_the_fixtures() {
    let traces = fixtures();
    assert!(traces.len() >= 3, "{traces:?}");
    let mut snapshots = 0;
    for trace in &traces {
        let blocks = report(trace, Evaluation::Blocks);
        snapshots += blocks["snapshots"].as_array().unwrap().len();
        for evaluation in [Evaluation::Pages, Evaluation::Chosen] {
            let other = report(trace, evaluation);
            if let Some(at) = first_difference(&blocks, &other, String::new()) {
                panic!("{} by {evaluation:?}: {at}", trace.display());
            }
        }
    }
    assert!(snapshots > 100, "{snapshots} snapshots");
}

/// The stripe trace's sites pin pages, so the comparison above covers pinned waste.
#[test]
fn the_stripe_fixture_has_sites_that_pin_pages() {
    let trace =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/stripe-strip-sampled.fsc");
    let r = report(&trace, Evaluation::Pages);
    let pinning = r["sites"]["by_pinned_waste"].as_array().unwrap();
    assert!(
        pinning
            .iter()
            .any(|s| s["pinned_pages"].as_f64().unwrap() > 100.0),
        "{pinning:?}"
    );
}
