//! Chunk 27: a Node.js process's V8 heap as V8 counts it (`v8.getHeapSpaceStatistics()`
//! and `v8.getHeapStatistics()` of each of its isolates, summed), handed to the recorder
//! by a module it loads into Node (`fragscope-record/runtime/v8_heap.js`) and taken at a
//! snapshot. The body of a [`Census`].

use crate::format::records::{Census, CensusBody};
use crate::format::wire::{Reader, Writer};
use crate::format::TraceError;

pub type V8Census = Census<V8Heap>;

/// One space of V8's heap (new_space, old_space, code_space, large_object_space ...),
/// summed over the isolates.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct V8Space {
    pub name: String,
    /// Bytes the space has committed (`space_size`).
    pub size: u64,
    /// Bytes of its objects (`space_used_size`).
    pub used: u64,
    /// Bytes it could still allocate into without growing (`space_available_size`).
    pub available: u64,
    /// Bytes of its committed memory that are backed by physical pages
    /// (`physical_space_size`).
    pub physical: u64,
}

/// The census: Node's release, the isolates seen, how old their figures were when the
/// snapshot took them, their spaces, and `v8.getHeapStatistics()`'s figures by name.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct V8Heap {
    /// As `process.version` gives it ("v20.20.2").
    pub node: String,
    /// Isolates: the main thread's and each worker thread's.
    pub isolates: u32,
    /// Age of the oldest isolate's figures at the snapshot, in ms (a busy event loop
    /// writes them late).
    pub age_ms: u64,
    pub spaces: Vec<V8Space>,
    pub figures: Vec<(String, u64)>,
}

impl V8Heap {
    /// A figure of `v8.getHeapStatistics()` (summed over isolates), 0 when absent.
    pub fn figure(&self, name: &str) -> u64 {
        (self.figures.iter())
            .find(|(n, _)| n == name)
            .map_or(0, |f| f.1)
    }
}

impl CensusBody for V8Heap {
    const WHAT: &'static str = "a V8 heap census";

    fn encode_body(&self, w: &mut Writer) {
        w.str(&self.node)
            .varint(self.isolates.into())
            .varint(self.age_ms)
            .varint(self.spaces.len() as u64);
        for s in &self.spaces {
            w.str(&s.name)
                .varint(s.size)
                .varint(s.used)
                .varint(s.available)
                .varint(s.physical);
        }
        w.varint(self.figures.len() as u64);
        for (name, value) in &self.figures {
            w.str(name).varint(*value);
        }
    }

    fn decode_body(r: &mut Reader) -> Result<Self, TraceError> {
        let node = r.string()?;
        let isolates = u32::try_from(r.varint()?)
            .map_err(|_| TraceError::Malformed("a V8 census of too many isolates".into()))?;
        let age_ms = r.varint()?;
        let n = r.count(5)?;
        let mut spaces = Vec::with_capacity(n);
        for _ in 0..n {
            spaces.push(V8Space {
                name: r.string()?,
                size: r.varint()?,
                used: r.varint()?,
                available: r.varint()?,
                physical: r.varint()?,
            });
        }
        let n = r.count(2)?;
        let mut figures = Vec::with_capacity(n);
        for _ in 0..n {
            figures.push((r.string()?, r.varint()?));
        }
        Ok(V8Heap {
            node,
            isolates,
            age_ms,
            spaces,
            figures,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::records::SnapshotReason;

    #[test]
    fn v8_censuses_round_trip_and_refuse_cut_bodies() {
        let taken = V8Census {
            stream: 2,
            tick: 90,
            reason: SnapshotReason::Periodic,
            result: Ok(V8Heap {
                node: "v20.20.2".into(),
                isolates: 2,
                age_ms: 37,
                spaces: vec![
                    V8Space {
                        name: "old_space".into(),
                        size: 120 << 20,
                        used: 30 << 20,
                        available: 80 << 20,
                        physical: 119 << 20,
                    },
                    V8Space {
                        name: "new_space".into(),
                        size: 16 << 20,
                        used: 1 << 20,
                        available: 7 << 20,
                        physical: 16 << 20,
                    },
                ],
                figures: vec![
                    ("external_memory".into(), 4096),
                    ("heap_size_limit".into(), 1 << 32),
                ],
            }),
        };
        let bytes = taken.encode();
        assert_eq!(V8Census::decode(&bytes).unwrap(), taken);
        for cut in 0..bytes.len() {
            assert!(V8Census::decode(&bytes[..cut]).is_err(), "cut at {cut}");
        }
    }
}
