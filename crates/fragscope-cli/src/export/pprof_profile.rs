//! `--format pprof`: the heap profile as pprof's profile.proto, gzipped by the caller.

use std::collections::HashMap;

use fragscope_model::report::Report;
use fragscope_model::symbols::Frame;

use super::runtimes::python_stacks;
use super::{named_frame, sampled_stacks, SampledStack, Value};

/// pprof's profile.proto (github.com/google/pprof/proto/profile.proto), the messages this
/// export writes. Field numbers and types are the proto's.
mod proto {
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Profile {
        #[prost(message, repeated, tag = "1")]
        pub sample_type: Vec<ValueType>,
        #[prost(message, repeated, tag = "2")]
        pub sample: Vec<Sample>,
        #[prost(message, repeated, tag = "3")]
        pub mapping: Vec<Mapping>,
        #[prost(message, repeated, tag = "4")]
        pub location: Vec<Location>,
        #[prost(message, repeated, tag = "5")]
        pub function: Vec<Function>,
        #[prost(string, repeated, tag = "6")]
        pub string_table: Vec<String>,
        #[prost(int64, tag = "9")]
        pub time_nanos: i64,
        #[prost(int64, tag = "10")]
        pub duration_nanos: i64,
        #[prost(message, optional, tag = "11")]
        pub period_type: Option<ValueType>,
        #[prost(int64, tag = "12")]
        pub period: i64,
        #[prost(int64, repeated, tag = "13")]
        pub comment: Vec<i64>,
        #[prost(int64, tag = "14")]
        pub default_sample_type: i64,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct ValueType {
        #[prost(int64, tag = "1")]
        pub r#type: i64,
        #[prost(int64, tag = "2")]
        pub unit: i64,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Sample {
        #[prost(uint64, repeated, tag = "1")]
        pub location_id: Vec<u64>,
        #[prost(int64, repeated, tag = "2")]
        pub value: Vec<i64>,
        #[prost(message, repeated, tag = "3")]
        pub label: Vec<Label>,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Label {
        #[prost(int64, tag = "1")]
        pub key: i64,
        #[prost(int64, tag = "2")]
        pub str: i64,
        #[prost(int64, tag = "3")]
        pub num: i64,
        #[prost(int64, tag = "4")]
        pub num_unit: i64,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Mapping {
        #[prost(uint64, tag = "1")]
        pub id: u64,
        #[prost(uint64, tag = "2")]
        pub memory_start: u64,
        #[prost(uint64, tag = "3")]
        pub memory_limit: u64,
        #[prost(uint64, tag = "4")]
        pub file_offset: u64,
        #[prost(int64, tag = "5")]
        pub filename: i64,
        #[prost(int64, tag = "6")]
        pub build_id: i64,
        #[prost(bool, tag = "7")]
        pub has_functions: bool,
        #[prost(bool, tag = "8")]
        pub has_filenames: bool,
        #[prost(bool, tag = "9")]
        pub has_line_numbers: bool,
        #[prost(bool, tag = "10")]
        pub has_inline_frames: bool,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Location {
        #[prost(uint64, tag = "1")]
        pub id: u64,
        #[prost(uint64, tag = "2")]
        pub mapping_id: u64,
        #[prost(uint64, tag = "3")]
        pub address: u64,
        #[prost(message, repeated, tag = "4")]
        pub line: Vec<Line>,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Line {
        #[prost(uint64, tag = "1")]
        pub function_id: u64,
        #[prost(int64, tag = "2")]
        pub line: i64,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Function {
        #[prost(uint64, tag = "1")]
        pub id: u64,
        #[prost(int64, tag = "2")]
        pub name: i64,
        #[prost(int64, tag = "3")]
        pub system_name: i64,
        #[prost(int64, tag = "4")]
        pub filename: i64,
        #[prost(int64, tag = "5")]
        pub start_line: i64,
    }
}

/// Builds a profile's string table, locations, functions and mappings.
#[derive(Default)]
struct ProfileBuilder {
    p: proto::Profile,
    strings: HashMap<String, i64>,
    functions: HashMap<(i64, i64), u64>,
    locations: HashMap<u64, u64>,
    /// Locations of frames without an address, by function and line.
    line_locations: HashMap<(u64, i64), u64>,
    mappings: HashMap<String, usize>,
}

impl ProfileBuilder {
    fn new() -> Self {
        let mut b = Self::default();
        b.s("");
        b
    }

    fn s(&mut self, text: &str) -> i64 {
        if let Some(&i) = self.strings.get(text) {
            return i;
        }
        let i = self.p.string_table.len() as i64;
        self.p.string_table.push(text.to_string());
        self.strings.insert(text.to_string(), i);
        i
    }

    fn value_type(&mut self, (kind, unit): (&str, &str)) -> proto::ValueType {
        proto::ValueType {
            r#type: self.s(kind),
            unit: self.s(unit),
        }
    }

    fn function(&mut self, f: &Frame) -> u64 {
        let name = match &f.function {
            Some(n) => self.s(n),
            None => self.s(&format!("{}+{:#x}", f.module, f.offset)),
        };
        let file = self.s(f.file.as_deref().unwrap_or(""));
        let next = self.p.function.len() as u64 + 1;
        let id = *self.functions.entry((name, file)).or_insert(next);
        if id == next {
            self.p.function.push(proto::Function {
                id,
                name,
                system_name: name,
                filename: file,
                start_line: 0,
            });
        }
        id
    }

    fn mapping(&mut self, f: &Frame) -> u64 {
        if f.module.is_empty() || f.module == "?" {
            return 0;
        }
        let start = f.addr.saturating_sub(f.offset);
        let i = match self.mappings.get(&f.module) {
            Some(&i) => i,
            None => {
                let filename = self.s(&f.module);
                self.p.mapping.push(proto::Mapping {
                    id: self.p.mapping.len() as u64 + 1,
                    memory_start: start,
                    memory_limit: f.addr + 1,
                    filename,
                    ..Default::default()
                });
                self.mappings
                    .insert(f.module.clone(), self.p.mapping.len() - 1);
                self.p.mapping.len() - 1
            }
        };
        let m = &mut self.p.mapping[i];
        m.memory_start = m.memory_start.min(start);
        m.memory_limit = m.memory_limit.max(f.addr + 1);
        m.has_functions |= f.function.is_some();
        m.has_filenames |= f.file.is_some();
        m.has_line_numbers |= f.line.is_some();
        m.has_inline_frames |= f.inlined;
        m.id
    }

    /// The location of one return address: its frames (inlined ones first, as pprof
    /// lists a location's lines).
    fn location(&mut self, frames: &[Frame]) -> u64 {
        let addr = frames[0].addr;
        if let Some(&id) = self.locations.get(&addr) {
            return id;
        }
        let mapping_id = self.mapping(&frames[frames.len() - 1]);
        let line = frames
            .iter()
            .map(|f| proto::Line {
                function_id: self.function(f),
                line: i64::from(f.line.unwrap_or(0)),
            })
            .collect();
        let id = self.p.location.len() as u64 + 1;
        self.p.location.push(proto::Location {
            id,
            mapping_id,
            address: addr,
            line,
        });
        self.locations.insert(addr, id);
        id
    }

    /// The location of a frame without an address (an interpreted line): one per function
    /// and line, in no mapping.
    fn line_location(&mut self, f: &Frame) -> u64 {
        let function_id = self.function(f);
        let line = i64::from(f.line.unwrap_or(0));
        if let Some(&id) = self.line_locations.get(&(function_id, line)) {
            return id;
        }
        let id = self.p.location.len() as u64 + 1;
        self.p.location.push(proto::Location {
            id,
            mapping_id: 0,
            address: 0,
            line: vec![proto::Line { function_id, line }],
        });
        self.line_locations.insert((function_id, line), id);
        id
    }
}

/// The heap profile: one sample per allocation site, with every figure of [`Value::ALL`].
///
/// A CPython process's sampled Python stacks are samples of the same profile, with the
/// same sample types, labelled `kind=python`: the objects sampled (512 bytes or less) live
/// in pymalloc's arenas, which it maps itself, not in malloc's blocks, so nothing is
/// counted twice, and `go tool pprof
/// -top` then ranks Python lines beside native sites by the same figure (what holds
/// memory, whichever allocator), while `-tagfocus=kind=python` keeps the Python lines
/// alone. Separate sample types would leave every Python figure out of the default view.
pub(super) fn pprof(r: &Report) -> Vec<u8> {
    use prost::Message as _;
    let mut b = ProfileBuilder::new();
    b.p.sample_type = Value::ALL.iter().map(|v| b.value_type(v.pprof())).collect();
    b.p.default_sample_type = b.s("inuse_space");
    b.p.period_type = Some(b.value_type(("space", "bytes")));
    b.p.period = 1;
    b.p.duration_nanos = (r.duration_ms * 1e6) as i64;
    let mut comments = vec![
        format!("fragscope export of {} (pid {})", r.trace, r.pid),
        format!("program: {}", r.argv.join(" ")),
    ];
    if let Some(t) = r.sites.t_ms {
        comments.push(format!(
            "inuse_* and pinned_waste at {t:.0} ms (the report's focus snapshot); \
             pinned_waste: free bytes in pages under {}% live",
            r.sites.sparse_pct
        ));
    }
    if r.stacks == "sampled" {
        comments.push("stacks were sampled: figures are estimates".into());
    }
    let census_ms = r
        .pymalloc_snapshot
        .and_then(|i| r.snapshots.get(i))
        .map(|s| s.t_ms);
    if !python_stacks(r).is_empty() {
        comments.push(format!(
            "samples labelled kind=python: CPython objects of 512 bytes or less by Python \
             stack, estimated from sampled allocations; inuse_* {}, pinned_waste their \
             share of the free space of the arenas they are in; leaked and temporary not \
             followed (0)",
            census_ms.map_or("unknown (no pymalloc census)".to_string(), |t| format!(
                "at the pymalloc census at {t:.0} ms"
            ))
        ));
    }
    b.p.comment = comments.iter().map(|c| b.s(c)).collect();
    // pprof names the profile after its first mapping: make it the program's.
    let program = r.argv.first().map(|a| a.rsplit('/').next().unwrap_or(a));
    if let Some(f) = r
        .all_sites
        .iter()
        .flat_map(|s| &s.frames)
        .find(|f| Some(f.module.as_str()) == program)
    {
        b.mapping(f);
    }
    let stack_key = b.s("stack");
    let no_stack = Frame {
        addr: 0,
        function: Some("(no stack)".into()),
        file: None,
        line: None,
        module: String::new(),
        offset: 0,
        inlined: false,
    };
    for s in &r.all_sites {
        let value: Vec<i64> = Value::ALL.iter().map(|v| v.of(s) as i64).collect();
        if value.iter().all(|&v| v == 0) {
            continue;
        }
        let mut location_id = Vec::new();
        // Frames sharing a return address (inlined, then their caller) make one location.
        for group in s.frames.chunk_by(|a, b| a.addr == b.addr) {
            location_id.push(b.location(group));
        }
        if location_id.is_empty() {
            location_id.push(b.location(std::slice::from_ref(&no_stack)));
        }
        b.p.sample.push(proto::Sample {
            location_id,
            value,
            label: vec![proto::Label {
                key: stack_key,
                num: i64::from(s.stack),
                ..Default::default()
            }],
        });
    }
    runtime_samples(&mut b, &sampled_stacks(r, true));
    b.p.encode_to_vec()
}

/// The samples of a runtime's stacks (CPython's, SBCL's), labelled kind=python or
/// kind=lisp (see [`pprof`]).
fn runtime_samples(b: &mut ProfileBuilder, stacks: &[SampledStack]) {
    for s in stacks {
        let value: Vec<i64> = s.values.iter().map(|&v| v as i64).collect();
        if value.iter().all(|&v| v == 0) {
            continue;
        }
        let mut location_id: Vec<u64> = s.frames.iter().map(|f| b.line_location(f)).collect();
        if location_id.is_empty() {
            location_id.push(b.line_location(&named_frame(s.none)));
        }
        let kind = proto::Label {
            key: b.s("kind"),
            str: b.s(s.kind),
            ..Default::default()
        };
        b.p.sample.push(proto::Sample {
            location_id,
            value,
            label: vec![kind],
        });
    }
}
