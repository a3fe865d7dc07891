//! Which Lisp functions allocate in an SBCL process: the interposer's samples (chunk 22),
//! one per refill of a thread's allocation region (or large object), with its Lisp stack.
//!
//! A sample stands for the bytes of the region its refill retired (a large object for
//! its own): the allocation that overflows a region of R bytes is a given one of s bytes
//! with probability about s / R, so each stack's expected sum is its own bytes. Summed by
//! stack, that estimates each stack's bytes consed (as `sb-ext:get-bytes-consed` counts
//! them) within sampling error: a site of N bytes has about N / R samples (R up to a
//! 32 KiB page), so 100 MiB (3200 samples or more) is within about 2%.

use std::collections::HashMap;

use fragscope_trace::runtime_samples::{Definitions, RuntimeSamples, SampleRecord};
use serde::Serialize;

/// Sites and functions listed in the report.
const SITES_LISTED: usize = 10;
/// Functions kept (the JSON's list).
const FUNCTIONS_KEPT: usize = 50;
/// Callers shown with a site.
const CALLERS_SHOWN: usize = 4;
/// A site makes the headline's clause when it carries this share of the allocation: one
/// function with a fifth of everything is worth rewriting first.
const HEADLINE_SHARE: f64 = 0.2;

/// One process's samples.
#[derive(Default)]
pub struct LispLog {
    region_bytes: u64,
    defined: Definitions,
    /// (samples, estimated bytes, large samples) by stack id.
    by_stack: HashMap<u32, (u64, f64, u64)>,
    /// Why some records could not be read.
    pub problem: Option<String>,
    /// Why the interposer did not sample this runtime (a release it does not read).
    pub unsampled: Option<String>,
}

impl LispLog {
    pub fn add(&mut self, chunk: &RuntimeSamples) {
        self.region_bytes = chunk.mean_bytes.max(1);
        let (records, problem) = chunk.records();
        if let Some(p) = problem {
            self.problem
                .get_or_insert(format!("Lisp samples cut short: {p}"));
        }
        for r in records.into_iter().filter_map(|r| self.defined.take(r)) {
            match r {
                SampleRecord::LispAlloc {
                    requested,
                    bytes,
                    stack,
                    ..
                } => {
                    let acc = self.by_stack.entry(stack).or_default();
                    acc.0 += 1;
                    acc.1 += bytes as f64;
                    acc.2 += u64::from(requested > self.region_bytes);
                }
                SampleRecord::Unsampled { reason } => {
                    self.unsampled.get_or_insert(reason);
                }
                _ => {}
            }
        }
    }

    pub fn is_empty(&self) -> bool {
        self.by_stack.is_empty()
    }

    fn names(&self, stack: u32) -> Vec<String> {
        self.defined
            .stacks
            .get(&stack)
            .map(|ids| {
                ids.iter()
                    .map(|id| {
                        self.defined
                            .frames
                            .get(id)
                            .map_or_else(|| "?".into(), |f| f.function.clone())
                    })
                    .collect()
            })
            .unwrap_or_default()
    }
}

/// A function that allocated (the innermost Lisp frame of its samples).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct LispSite {
    pub function: String,
    /// Its callers, innermost first, on the stack that allocated most here.
    pub callers: Vec<String>,
    /// Estimated bytes allocated here over the run, and their share of all.
    pub allocated_bytes: f64,
    pub share: f64,
    pub samples: u64,
}

/// A function's bytes: allocated while it was on the stack (inclusive) and by itself.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct LispFunction {
    pub function: String,
    pub inclusive_bytes: f64,
    pub inclusive_share: f64,
    pub leaf_bytes: f64,
    pub leaf_share: f64,
}

/// A sampled stack (stacks whose names read alike are one) and its estimated bytes.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct LispStack {
    /// Innermost first; empty when no Lisp frame was found.
    pub frames: Vec<String>,
    pub allocated_bytes: f64,
    pub samples: u64,
}

/// Lisp allocation sites of an SBCL process (see the module's comment).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct LispSites {
    /// Bytes of an allocation region at most (a page).
    pub region_bytes: u64,
    pub samples: u64,
    /// Samples of objects larger than a region (each stands for its own size).
    pub large_samples: u64,
    /// Estimated bytes allocated over the run.
    pub allocated_bytes: f64,
    /// By bytes allocated.
    pub sites: Vec<LispSite>,
    /// By inclusive bytes, the most allocating first, without those on every stack.
    pub functions: Vec<LispFunction>,
    pub problem: Option<String>,
    /// Every sampled stack, most bytes first, for flame graphs and exports; left out of
    /// the JSON, whose size it would make grow with the program's call paths.
    #[serde(skip)]
    pub stacks: Vec<LispStack>,
}

/// The name a stack without Lisp frames is listed under.
pub const NO_LISP_FRAME: &str = "(no Lisp frame)";

pub fn sites(log: &LispLog) -> LispSites {
    let mut merged: HashMap<Vec<String>, (u64, f64)> = HashMap::new();
    let (mut samples, mut large, mut total) = (0, 0, 0.0);
    for (&id, &(n, bytes, big)) in &log.by_stack {
        let m = merged.entry(log.names(id)).or_default();
        m.0 += n;
        m.1 += bytes;
        samples += n;
        large += big;
        total += bytes;
    }
    let mut stacks: Vec<LispStack> = merged
        .into_iter()
        .map(|(frames, (samples, allocated_bytes))| LispStack {
            frames,
            allocated_bytes,
            samples,
        })
        .collect();
    stacks.sort_by(|a, b| {
        b.allocated_bytes
            .total_cmp(&a.allocated_bytes)
            .then_with(|| a.frames.cmp(&b.frames))
    });
    let share = |b: f64| if total > 0.0 { b / total } else { 0.0 };
    // Sites by innermost frame; the first stack seen of each is its heaviest.
    let mut by_leaf: HashMap<&str, LispSite> = HashMap::new();
    let mut functions: HashMap<&str, (f64, f64)> = HashMap::new();
    for s in &stacks {
        let leaf = s.frames.first().map_or(NO_LISP_FRAME, String::as_str);
        let site = by_leaf.entry(leaf).or_insert_with(|| LispSite {
            function: leaf.to_string(),
            callers: s
                .frames
                .iter()
                .skip(1)
                .take(CALLERS_SHOWN)
                .cloned()
                .collect(),
            allocated_bytes: 0.0,
            share: 0.0,
            samples: 0,
        });
        site.allocated_bytes += s.allocated_bytes;
        site.samples += s.samples;
        if let Some(f) = s.frames.first() {
            functions.entry(f).or_default().1 += s.allocated_bytes;
        }
        // A recursive function counts once per stack.
        let mut seen: Vec<&str> = Vec::new();
        for f in &s.frames {
            if !seen.contains(&f.as_str()) {
                seen.push(f);
                functions.entry(f).or_default().0 += s.allocated_bytes;
            }
        }
    }
    let mut sites: Vec<LispSite> = by_leaf
        .into_values()
        .map(|mut s| {
            s.share = share(s.allocated_bytes);
            s
        })
        .collect();
    sites.sort_by(|a, b| {
        b.allocated_bytes
            .total_cmp(&a.allocated_bytes)
            .then_with(|| a.function.cmp(&b.function))
    });
    sites.truncate(SITES_LISTED);
    // A function on every stack (the program's entry, the script loader) says nothing
    // about where the allocation comes from.
    let mut functions: Vec<LispFunction> = functions
        .into_iter()
        .filter(|(_, (inclusive, leaf))| *leaf > 0.0 || *inclusive < total * 0.999)
        .map(|(name, (inclusive, leaf))| LispFunction {
            function: name.to_string(),
            inclusive_bytes: inclusive,
            inclusive_share: share(inclusive),
            leaf_bytes: leaf,
            leaf_share: share(leaf),
        })
        .collect();
    functions.sort_by(|a, b| {
        b.inclusive_bytes
            .total_cmp(&a.inclusive_bytes)
            .then_with(|| a.function.cmp(&b.function))
    });
    functions.truncate(FUNCTIONS_KEPT);
    LispSites {
        region_bytes: log.region_bytes,
        samples,
        large_samples: large,
        allocated_bytes: total,
        sites,
        functions,
        problem: log.problem.clone(),
        stacks,
    }
}

/// "40% of Lisp allocation comes from CONCATENATE called by REDUCE in SEXP->XML": the
/// site that allocates the most, when it carries a fifth of everything.
/// Why an SBCL process has no Lisp lines: the interposer said so (a release or runtime
/// the sampler does not read), `--stacks none`, or none of its allocation regions was
/// sampled. `version` is the census's name of its release, None when no census was read
/// (then only the interposer's word tells an SBCL process). None when it has lines or is
/// not SBCL.
pub fn unsampled_note(log: &LispLog, version: Option<&str>, stacks: &str) -> Option<String> {
    if !log.is_empty() {
        return None;
    }
    if let Some(reason) = &log.unsampled {
        let complete = if version.is_some() {
            "; the census's figures are complete"
        } else {
            ""
        };
        return Some(format!("Lisp lines are not sampled: {reason}{complete}."));
    }
    version?;
    Some(if stacks == "none" {
        "Lisp lines are not sampled: recorded with --stacks none.".into()
    } else {
        "Lisp lines are not sampled: no allocation region of this process was sampled.".into()
    })
}

pub fn headline_clause(s: &LispSites) -> Option<String> {
    let top = s
        .sites
        .first()
        .filter(|t| t.share >= HEADLINE_SHARE && t.function != NO_LISP_FRAME)?;
    let mut clause = format!(
        "{:.0}% of Lisp allocation comes from {}",
        top.share * 100.0,
        top.function
    );
    if let Some(caller) = top.callers.first() {
        clause.push_str(&format!(" called by {caller}"));
    }
    if let Some(outer) = top.callers.get(1) {
        clause.push_str(&format!(" in {outer}"));
    }
    Some(clause)
}

/// The functions listed in the report (by inclusive bytes).
pub fn listed(s: &LispSites) -> &[LispFunction] {
    &s.functions[..s.functions.len().min(SITES_LISTED)]
}

#[cfg(test)]
mod tests {
    use super::*;
    use fragscope_trace::wire::Writer;

    #[test]
    fn samples_weigh_their_bytes_and_sum_by_function() {
        let mut w = Writer::new();
        for (id, name) in [
            (1, "CONCATENATE"),
            (2, "REDUCE"),
            (3, "SEXP->XML"),
            (4, "MAIN"),
        ] {
            w.varint(0).u8(3).varint(id).varint(0).str("").str(name);
        }
        w.varint(0).u8(4).varint(1).varint(4);
        for f in [1, 2, 3, 4] {
            w.varint(f);
        }
        w.varint(0).u8(4).varint(2).varint(2).varint(3).varint(4);
        // Three under CONCATENATE, one of them a 1 MiB object.
        for (requested, bytes) in [(16, 32768), (0, 32768), (1 << 20, 1 << 20)] {
            w.varint(1).u8(5).varint(requested).varint(bytes).varint(1);
        }
        // One in SEXP->XML itself.
        w.varint(0).u8(5).varint(64).varint(32768).varint(2);
        let mut log = LispLog::default();
        log.add(&RuntimeSamples {
            stream: 0,
            mean_bytes: 32768,
            first_tick: 0,
            records: w.bytes,
        });
        let s = sites(&log);
        assert_eq!((s.samples, s.large_samples), (4, 1));
        let region = 32768.0;
        assert_eq!(s.allocated_bytes, 3.0 * region + (1 << 20) as f64);
        assert_eq!(s.sites[0].function, "CONCATENATE");
        assert_eq!(s.sites[0].callers, ["REDUCE", "SEXP->XML", "MAIN"]);
        assert_eq!(s.sites[0].allocated_bytes, 2.0 * region + (1 << 20) as f64);
        let f = |name: &str| s.functions.iter().find(|f| f.function == name).unwrap();
        assert_eq!(f("REDUCE").inclusive_bytes, s.allocated_bytes - region);
        assert_eq!(f("SEXP->XML").leaf_bytes, region);
        // On every stack: not listed.
        assert!(!s.functions.iter().any(|f| f.function == "MAIN"));
        assert_eq!(
            headline_clause(&s).unwrap(),
            "97% of Lisp allocation comes from CONCATENATE called by REDUCE in SEXP->XML"
        );
    }

    #[test]
    fn an_sbcl_process_without_lines_is_told_why() {
        let none = LispLog::default();
        // Not SBCL (no census, no word from the interposer): nothing to say.
        assert_eq!(unsampled_note(&none, None, "sampled"), None);
        // A release the sampler does not read: the interposer's reason, census or not.
        let mut w = Writer::new();
        w.varint(0)
            .u8(6)
            .str("the sampler reads the frames of SBCL 2.2.9, 2.5.2 and 2.6.4, not 2.7.0's");
        let mut told = LispLog::default();
        told.add(&RuntimeSamples {
            stream: 0,
            mean_bytes: 32768,
            first_tick: 0,
            records: w.bytes,
        });
        let newer = unsampled_note(&told, Some("2.7.0.debian"), "sampled").unwrap();
        assert!(
            newer.contains("not 2.7.0's") && newer.contains("census's figures are complete"),
            "{newer}"
        );
        let uncounted = unsampled_note(&told, None, "sampled").unwrap();
        assert!(uncounted.contains("not 2.7.0's") && !uncounted.contains("census"));
        let off = unsampled_note(&none, Some("2.2.9.debian"), "none").unwrap();
        assert!(off.contains("--stacks none"), "{off}");
        let unlucky = unsampled_note(&none, Some("2.5.2.debian"), "sampled").unwrap();
        assert!(unlucky.contains("no allocation region"), "{unlucky}");
    }
}
