//! `--format parquet`: a directory of Parquet tables — sites, snapshots, occupancy, each
//! runtime's sites (see [`RUNTIMES`]), and the raw calls and RSS samples.

use std::path::Path;
use std::sync::Arc;

use anyhow::{Context, Result};
use arrow_array::builder::{ListBuilder, StringBuilder};
use arrow_array::{
    Array, ArrayRef, Float64Array, Int64Array, RecordBatch, StringArray, UInt32Array, UInt64Array,
};
use arrow_schema::{DataType, Field, Schema};
use fragscope_model::calls::{self, Row};
use fragscope_model::report::{Report, Site};
use fragscope_model::symbols::Frame;
use parquet::arrow::ArrowWriter;
use parquet::basic::{Compression, Encoding};
use parquet::file::properties::WriterProperties;
use parquet::format::KeyValue;
use parquet::schema::types::ColumnPath;

use super::runtimes::RUNTIMES;
use super::Value;
use crate::progress;

/// Rows per record batch (and so per row group at most) of the event table.
const EVENT_BATCH: usize = 1 << 16;

pub(super) fn u64_col(name: &str, v: Vec<u64>) -> (Field, ArrayRef) {
    (
        Field::new(name, DataType::UInt64, false),
        Arc::new(UInt64Array::from(v)),
    )
}

pub(super) fn u32_col(name: &str, v: Vec<u32>) -> (Field, ArrayRef) {
    (
        Field::new(name, DataType::UInt32, false),
        Arc::new(UInt32Array::from(v)),
    )
}

/// A column null where a figure is unknown.
pub(super) fn optional_u64_col(name: &str, v: Vec<Option<u64>>) -> (Field, ArrayRef) {
    (
        Field::new(name, DataType::UInt64, true),
        Arc::new(UInt64Array::from(v)),
    )
}

pub(super) fn f64_col(name: &str, v: Vec<f64>) -> (Field, ArrayRef) {
    (
        Field::new(name, DataType::Float64, false),
        Arc::new(Float64Array::from(v)),
    )
}

pub(super) fn str_col(name: &str, v: Vec<Option<String>>) -> (Field, ArrayRef) {
    let nullable = v.iter().any(Option::is_none);
    (
        Field::new(name, DataType::Utf8, nullable),
        Arc::new(StringArray::from(v)),
    )
}

/// A batch from named columns (and the schema it fixes).
pub(super) fn batch(cols: Vec<(Field, ArrayRef)>) -> Result<RecordBatch> {
    let (fields, arrays): (Vec<Field>, Vec<ArrayRef>) = cols.into_iter().unzip();
    Ok(RecordBatch::try_new(Arc::new(Schema::new(fields)), arrays)?)
}

/// Writes Parquet files of one run, each with the run's identity in its key-value metadata.
struct TableWriter<'a> {
    dir: &'a Path,
    metadata: Vec<KeyValue>,
}

impl TableWriter<'_> {
    fn open(&self, name: &str, schema: Arc<Schema>) -> Result<ArrowWriter<std::fs::File>> {
        let path = self.dir.join(format!("{name}.parquet"));
        let file = std::fs::File::create(&path)
            .with_context(|| format!("cannot write {}", path.display()))?;
        let mut props = WriterProperties::builder()
            .set_compression(Compression::SNAPPY)
            .set_key_value_metadata(Some(self.metadata.clone()));
        // Sequence numbers and addresses (neighbours come close together in time) move by
        // small steps: deltas take a few bits where a dictionary fails. Sizes repeat: they
        // keep the default dictionary.
        for field in schema.fields() {
            if ["seq", "address", "old_address"].contains(&field.name().as_str()) {
                let col = ColumnPath::from(field.name().as_str());
                props = props
                    .set_column_dictionary_enabled(col.clone(), false)
                    .set_column_encoding(col, Encoding::DELTA_BINARY_PACKED);
            }
        }
        let props = props.build();
        ArrowWriter::try_new(file, schema, Some(props))
            .with_context(|| format!("cannot write {}", path.display()))
    }

    /// One table written in one go.
    fn write(&self, name: &str, b: RecordBatch) -> Result<String> {
        let mut w = self.open(name, b.schema())?;
        w.write(&b)?;
        w.close()?;
        Ok(format!("{name}: {} rows", b.num_rows()))
    }
}

/// Writes the tables into `dir`; returns a line per table.
pub(super) fn parquet_tables(
    trace: &Path,
    dir: &Path,
    r: &Report,
    events: bool,
    trace_bytes: u64,
) -> Result<Vec<String>> {
    std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    let kv = |k: &str, v: String| KeyValue::new(format!("fragscope.{k}"), v);
    let w = TableWriter {
        dir,
        metadata: vec![
            kv("trace", r.trace.clone()),
            kv("pid", r.pid.to_string()),
            kv("stream", r.stream.to_string()),
            kv("argv", serde_json::to_string(&r.argv)?),
            kv("stacks", r.stacks.clone()),
            kv("version", env!("CARGO_PKG_VERSION").to_string()),
        ],
    };
    let mut done = vec![
        w.write("sites", sites_batch(r)?)?,
        w.write("snapshots", snapshots_batch(r)?)?,
        w.write("occupancy", occupancy_batch(r)?)?,
    ];
    for runtime in &RUNTIMES {
        if let Some((name, rows)) = (runtime.table)(r) {
            done.push(w.write(name, rows?)?);
        }
    }
    done.extend(raw_tables(&w, trace, r.stream, events, trace_bytes)?);
    Ok(done)
}

fn sites_batch(r: &Report) -> Result<RecordBatch> {
    let sites = &r.all_sites;
    let leaf = |s: &Site| {
        s.frames
            .iter()
            .find(|f| f.label() == s.label)
            .or(s.frames.first())
            .cloned()
    };
    let leaves: Vec<Option<Frame>> = sites.iter().map(leaf).collect();
    let mut frames = ListBuilder::new(StringBuilder::new());
    for s in sites {
        for f in &s.frames {
            frames.values().append_value(f.label());
        }
        frames.append(true);
    }
    let frames = frames.finish();
    let mut cols = vec![
        u32_col("stack", sites.iter().map(|s| s.stack).collect()),
        str_col(
            "label",
            sites.iter().map(|s| Some(s.label.clone())).collect(),
        ),
        str_col(
            "function",
            leaves
                .iter()
                .map(|f| f.as_ref().and_then(|f| f.function.clone()))
                .collect(),
        ),
        str_col(
            "file",
            leaves
                .iter()
                .map(|f| f.as_ref().and_then(|f| f.file.clone()))
                .collect(),
        ),
        (
            Field::new("line", DataType::UInt32, true),
            Arc::new(UInt32Array::from(
                leaves
                    .iter()
                    .map(|f| f.as_ref().and_then(|f| f.line))
                    .collect::<Vec<_>>(),
            )),
        ),
        str_col(
            "module",
            leaves
                .iter()
                .map(|f| f.as_ref().map(|f| f.module.clone()))
                .collect(),
        ),
        (
            Field::new("frames", frames.data_type().clone(), false),
            Arc::new(frames),
        ),
    ];
    for v in Value::ALL {
        cols.push(u64_col(
            v.pprof().0,
            sites.iter().map(|s| v.of(s)).collect(),
        ));
    }
    cols.push(u64_col(
        "pinning_objects",
        sites.iter().map(|s| s.pinning_objects).collect(),
    ));
    cols.push(f64_col(
        "pinned_pages",
        sites.iter().map(|s| s.pinned_pages).collect(),
    ));
    batch(cols)
}

fn snapshots_batch(r: &Report) -> Result<RecordBatch> {
    let s = &r.snapshots;
    let u = |name: &str, f: fn(&fragscope_model::report::Snapshot) -> u64| {
        u64_col(name, s.iter().map(f).collect())
    };
    // A part unknown at some snapshots (a runtime's heap without its census there): null.
    let unknown_or_u64 = |name: &str, f: fn(&fragscope_model::report::Snapshot) -> Option<u64>| {
        optional_u64_col(name, s.iter().map(f).collect())
    };
    let mut cols = vec![
        u32_col("snapshot", (0..s.len() as u32).collect()),
        f64_col("t_ms", s.iter().map(|x| x.t_ms).collect()),
        str_col("reason", s.iter().map(|x| Some(x.reason.clone())).collect()),
        u("rss", |x| x.parts.rss),
        unknown_or_u64("live", |x| {
            (!x.parts.malloc_unknown).then_some(x.parts.live)
        }),
        unknown_or_u64("rounding", |x| {
            (!x.parts.malloc_unknown).then_some(x.parts.rounding)
        }),
        unknown_or_u64("allocator_overhead", |x| {
            (!x.parts.malloc_unknown).then_some(x.parts.allocator_overhead)
        }),
        unknown_or_u64("free_in_used_pages", |x| {
            (!x.parts.malloc_unknown).then_some(x.parts.free_in_used_pages)
        }),
        unknown_or_u64("free_resident_pages", |x| {
            (!x.parts.malloc_unknown).then_some(x.parts.free_resident_pages)
        }),
        unknown_or_u64("lazy_free", |x| {
            (!x.parts.malloc_unknown).then_some(x.parts.lazy_free)
        }),
        unknown_or_u64("pymalloc_arenas", |x| x.parts.pymalloc_arenas),
        unknown_or_u64("sbcl_dynamic_space", |x| x.parts.sbcl_dynamic_space),
        unknown_or_u64("go_heap", |x| x.parts.go_heap),
        unknown_or_u64("jvm_heap", |x| x.parts.jvm_heap),
        unknown_or_u64("jvm_runtime", |x| x.parts.jvm_runtime),
        unknown_or_u64("v8_heap", |x| x.parts.v8_heap),
        u("other_anon", |x| x.parts.other_anon),
        u("file", |x| x.parts.file),
        u("fragscope_own", |x| x.parts.fragscope_own),
        (
            Field::new("unexplained", DataType::Int64, false),
            Arc::new(Int64Array::from(
                s.iter().map(|x| x.parts.unexplained).collect::<Vec<_>>(),
            )),
        ),
        u("rss_anon", |x| x.parts.rss_anon),
        u("heap_resident", |x| x.parts.heap_resident),
        u("live_not_resident", |x| x.live_not_resident),
        u("page_size", |x| x.page_size),
        u("used_pages", |x| x.used_pages),
        u("empty_pages", |x| x.empty_pages),
    ];
    // Each runtime's split of its heap, where it has one.
    for runtime in &RUNTIMES {
        cols.extend((runtime.snapshot_columns)(s));
    }
    batch(cols)
}

fn occupancy_batch(r: &Report) -> Result<RecordBatch> {
    let rows: Vec<(u32, f64, &fragscope_model::report::OccupancyBucket)> = r
        .snapshots
        .iter()
        .enumerate()
        .flat_map(|(i, s)| s.occupancy.iter().map(move |b| (i as u32, s.t_ms, b)))
        .collect();
    batch(vec![
        u32_col("snapshot", rows.iter().map(|x| x.0).collect()),
        f64_col("t_ms", rows.iter().map(|x| x.1).collect()),
        u32_col("lo_pct", rows.iter().map(|x| x.2.lo_pct).collect()),
        u32_col("hi_pct", rows.iter().map(|x| x.2.hi_pct).collect()),
        u64_col("pages", rows.iter().map(|x| x.2.pages).collect()),
        u64_col("live_bytes", rows.iter().map(|x| x.2.live_bytes).collect()),
    ])
}

/// Columns of the event table, filled a batch at a time.
#[derive(Default)]
struct Events {
    seq: Vec<u64>,
    t_ms: Vec<f64>,
    tid: Vec<u32>,
    func: Vec<&'static str>,
    address: Vec<u64>,
    old_address: Vec<u64>,
    size: Vec<u64>,
    usable: Vec<u64>,
    freed: Vec<u64>,
    stack: Vec<u32>,
}

impl Events {
    fn push(&mut self, seq: u64, c: calls::CallRow) {
        self.seq.push(seq);
        self.t_ms.push(c.t_ms);
        self.tid.push(c.tid);
        self.func.push(c.func);
        self.address.push(c.address);
        self.old_address.push(c.old_address);
        self.size.push(c.size);
        self.usable.push(c.usable);
        self.freed.push(c.freed);
        self.stack.push(c.stack);
    }

    fn take(&mut self) -> Result<RecordBatch> {
        let e = std::mem::take(self);
        batch(vec![
            u64_col("seq", e.seq),
            f64_col("t_ms", e.t_ms),
            u32_col("tid", e.tid),
            (
                Field::new("func", DataType::Utf8, false),
                Arc::new(StringArray::from(e.func)),
            ),
            u64_col("address", e.address),
            u64_col("old_address", e.old_address),
            u64_col("size", e.size),
            u64_col("usable", e.usable),
            u64_col("freed", e.freed),
            u32_col("stack", e.stack),
        ])
    }
}

/// The RSS table, and the event table unless `events` is false: a second pass over the
/// trace, written a batch at a time.
fn raw_tables(
    w: &TableWriter,
    trace: &Path,
    stream: u32,
    events: bool,
    trace_bytes: u64,
) -> Result<Vec<String>> {
    let mut rss: Vec<calls::RssRow> = Vec::new();
    let mut ev = Events::default();
    let mut writer = if events {
        Some(w.open("events", ev.take()?.schema())?)
    } else {
        None
    };
    let mut seq = 0u64;
    let mut failed: Option<anyhow::Error> = None;
    let bar = progress::bar(trace_bytes, "exporting calls");
    calls::for_each(
        trace,
        stream,
        events,
        |row| match row {
            Row::Rss(r) => rss.push(r),
            Row::Call(c) => {
                let Some(out) = writer.as_mut() else { return };
                if failed.is_some() {
                    return;
                }
                ev.push(seq, c);
                seq += 1;
                if ev.seq.len() >= EVENT_BATCH {
                    if let Err(e) = ev.take().and_then(|b| Ok(out.write(&b)?)) {
                        failed = Some(e);
                    }
                }
            }
        },
        |done, _| bar.set_position(done),
    )
    .with_context(|| format!("reading {}", trace.display()))?;
    bar.finish_and_clear();
    if let Some(e) = failed {
        return Err(e.context("writing events.parquet"));
    }
    let mut done = Vec::new();
    if let Some(mut out) = writer {
        if !ev.seq.is_empty() {
            out.write(&ev.take()?)?;
        }
        out.close()?;
        done.push(format!("events: {seq} rows"));
    }
    rss.sort_by(|a, b| a.t_ms.total_cmp(&b.t_ms));
    done.push(w.write(
        "rss",
        batch(vec![
            f64_col("t_ms", rss.iter().map(|x| x.t_ms).collect()),
            u64_col("rss", rss.iter().map(|x| x.rss).collect()),
            u64_col("rss_anon", rss.iter().map(|x| x.rss_anon).collect()),
            u64_col("rss_file", rss.iter().map(|x| x.rss_file).collect()),
            u64_col("rss_shmem", rss.iter().map(|x| x.rss_shmem).collect()),
        ])?,
    )?);
    Ok(done)
}
