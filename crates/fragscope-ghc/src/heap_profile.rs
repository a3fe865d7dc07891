//! Heap profile censuses gathered from the sample events.

use std::collections::HashMap;

use crate::event::{Event, EventKind, HeapProfBreakdown};

/// An interned census label (a closure type such as "ARR_WORDS" under -hT, a cost-centre
/// stack under -hc, ...), resolved with [`HeapProfile::label`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct LabelId(u32);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HeapSampleEntry {
    pub label: LabelId,
    pub residency_bytes: u64,
}

/// One census: the residency per label at one moment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HeapSample {
    pub era: u64,
    /// When the census started (for biographical profiles, when it was taken).
    pub time_ns: u64,
    /// When the census ended; `None` when the log stops inside it.
    pub end_time_ns: Option<u64>,
    pub entries: Vec<HeapSampleEntry>,
}

impl HeapSample {
    pub fn total_bytes(&self) -> u64 {
        self.entries.iter().map(|e| e.residency_bytes).sum()
    }

    pub fn bytes_of(&self, label: LabelId) -> u64 {
        self.entries
            .iter()
            .filter(|e| e.label == label)
            .map(|e| e.residency_bytes)
            .sum()
    }
}

/// The censuses of a log, built by [`push`](Self::push)ing its events in file order
/// (which is how the RTS writes each census: begin, entries, end).
#[derive(Debug, Clone, Default)]
pub struct HeapProfile {
    pub breakdown: Option<HeapProfBreakdown>,
    pub sampling_period_ns: Option<u64>,
    pub samples: Vec<HeapSample>,
    /// Entries that came outside any census, which a well-formed log never has.
    pub stray_entries: u64,
    labels: Vec<String>,
    label_ids: HashMap<String, LabelId>,
    cost_centre_labels: HashMap<u32, String>,
    open: bool,
}

impl HeapProfile {
    pub fn push(&mut self, event: &Event) {
        match &event.kind {
            EventKind::HeapProfBegin {
                sampling_period_ns,
                breakdown,
                ..
            } => {
                self.breakdown = Some(*breakdown);
                self.sampling_period_ns = Some(*sampling_period_ns);
            }
            EventKind::HeapProfCostCentre(cc) => {
                self.cost_centre_labels.insert(cc.id, cc.label.clone());
            }
            EventKind::HeapProfSampleBegin { era } => self.begin(*era, event.time_ns),
            EventKind::HeapBioProfSampleBegin { era, time_ns } => self.begin(*era, *time_ns),
            EventKind::HeapProfSampleString {
                residency_bytes,
                label,
                ..
            } => {
                let label = self.intern(label);
                self.add(label, *residency_bytes);
            }
            EventKind::HeapProfSampleCostCentre {
                residency_bytes,
                stack,
                ..
            } => {
                let name = self.stack_name(stack);
                let label = self.intern(&name);
                self.add(label, *residency_bytes);
            }
            EventKind::HeapProfSampleEnd { .. } if self.open => {
                if let Some(sample) = self.samples.last_mut() {
                    sample.end_time_ns = Some(event.time_ns);
                }
                self.open = false;
            }
            _ => {}
        }
    }

    pub fn label(&self, id: LabelId) -> &str {
        &self.labels[id.0 as usize]
    }

    /// All labels seen, indexed by `LabelId` order.
    pub fn labels(&self) -> impl Iterator<Item = (LabelId, &str)> {
        self.labels
            .iter()
            .enumerate()
            .map(|(i, l)| (LabelId(i as u32), l.as_str()))
    }

    pub fn find_label(&self, name: &str) -> Option<LabelId> {
        self.label_ids.get(name).copied()
    }

    fn begin(&mut self, era: u64, time_ns: u64) {
        self.samples.push(HeapSample {
            era,
            time_ns,
            end_time_ns: None,
            entries: Vec::new(),
        });
        self.open = true;
    }

    fn add(&mut self, label: LabelId, residency_bytes: u64) {
        match self.samples.last_mut() {
            Some(sample) if self.open => sample.entries.push(HeapSampleEntry {
                label,
                residency_bytes,
            }),
            _ => self.stray_entries += 1,
        }
    }

    fn intern(&mut self, name: &str) -> LabelId {
        if let Some(&id) = self.label_ids.get(name) {
            return id;
        }
        let id = LabelId(self.labels.len() as u32);
        self.labels.push(name.to_owned());
        self.label_ids.insert(name.to_owned(), id);
        id
    }

    /// Innermost first, '/'-separated, as in GHC's .hp files.
    fn stack_name(&self, stack: &[u32]) -> String {
        let names: Vec<String> = stack
            .iter()
            .map(|id| match self.cost_centre_labels.get(id) {
                Some(label) => label.clone(),
                None => format!("#{id}"),
            })
            .collect();
        names.join("/")
    }
}
