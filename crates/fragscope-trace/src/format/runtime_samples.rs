//! A runtime's sampled stacks, one encoding for two chunks. Chunk 18: a CPython process's
//! sampled object allocations with their Python stacks, and the frees of those objects,
//! in the order of the calls (every call made with the GIL held, into one buffer).
//! Chunk 22: an SBCL process's allocation-region refills with their Lisp stacks, every
//! thread's in the order they were taken. Written by the interposer (preload/samples.h,
//! with preload/cpython.h and preload/sbcl.h) as they are; decoded here.

use crate::format::wire::{Reader, Writer};
use crate::format::TraceError;

/// One buffer of records.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RuntimeSamples {
    pub stream: u32,
    /// CPython: the mean bytes between samples (a Poisson process over allocated bytes).
    /// SBCL: the bytes of an allocation region (a page).
    pub mean_bytes: u64,
    pub first_tick: u64,
    /// The records, as the interposer wrote them (see [`RuntimeSamples::records`]).
    pub records: Vec<u8>,
}

/// A record of [`RuntimeSamples`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SampleRecord {
    /// A sampled object of `size` bytes at `address`, allocated with stack `stack` (0:
    /// none could be read).
    Alloc {
        tick: u64,
        address: u64,
        size: u64,
        stack: u32,
    },
    /// A sampled object was freed (or given to realloc).
    Free { tick: u64, address: u64 },
    /// A frame: a code object's line. Ids count up; one may be defined again later.
    Frame {
        id: u32,
        line: u32,
        file: String,
        function: String,
    },
    /// A stack of frame ids, innermost first.
    Stack { id: u32, frames: Vec<u32> },
    /// SBCL: a thread's allocation region was refilled, or a large object allocated, for
    /// a request of `requested` bytes (0: not read) from stack `stack` (0: no Lisp
    /// frame). It stands for `bytes` bytes allocated: those of the region it retired, or
    /// the large object's.
    LispAlloc {
        tick: u64,
        requested: u64,
        bytes: u64,
        stack: u32,
    },
    /// CPython: this process's objects are not sampled, and why (an unknown release, a
    /// debug or free-threaded build, a function the sampler needs not exported).
    Unsampled { reason: String },
}

impl RuntimeSamples {
    pub fn encode(&self) -> Vec<u8> {
        let mut w = Writer::new();
        w.varint(self.stream.into())
            .varint(self.mean_bytes)
            .varint(self.first_tick);
        w.bytes.extend_from_slice(&self.records);
        w.bytes
    }

    pub fn decode(data: &[u8]) -> Result<Self, TraceError> {
        let mut r = Reader::new(data);
        let stream = r.varint()? as u32;
        let mean_bytes = r.varint()?;
        let first_tick = r.varint()?;
        Ok(Self {
            stream,
            mean_bytes,
            first_tick,
            records: r.remaining().to_vec(),
        })
    }

    /// The records in order. A record cut short or of an unknown kind is an error; the
    /// records before it are returned with it.
    pub fn records(&self) -> (Vec<SampleRecord>, Option<TraceError>) {
        let mut out = Vec::new();
        let mut r = Reader::new(&self.records);
        let mut tick = self.first_tick;
        while !r.is_empty() {
            match next_record(&mut r, &mut tick) {
                Ok(rec) => out.push(rec),
                Err(e) => return (out, Some(e)),
            }
        }
        (out, None)
    }
}

/// A frame as defined by a FRAME record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FrameDef {
    pub line: u32,
    pub file: String,
    pub function: String,
}

/// The frames and stacks a process's records defined, by id (ids count up per process,
/// so later chunks never redefine an id differently).
#[derive(Debug, Default, Clone)]
pub struct Definitions {
    pub frames: std::collections::HashMap<u32, FrameDef>,
    pub stacks: std::collections::HashMap<u32, Vec<u32>>,
}

impl Definitions {
    /// Keeps a FRAME or STACK record's definition; any other record is handed back.
    pub fn take(&mut self, r: SampleRecord) -> Option<SampleRecord> {
        match r {
            SampleRecord::Frame {
                id,
                line,
                file,
                function,
            } => {
                self.frames.insert(
                    id,
                    FrameDef {
                        line,
                        file,
                        function,
                    },
                );
                None
            }
            SampleRecord::Stack { id, frames } => {
                self.stacks.insert(id, frames);
                None
            }
            other => Some(other),
        }
    }
}

fn next_record(r: &mut Reader<'_>, tick: &mut u64) -> Result<SampleRecord, TraceError> {
    *tick = tick.saturating_add(r.varint()?);
    let small = |v: u64, what: &str| {
        u32::try_from(v).map_err(|_| TraceError::Malformed(format!("sample {what} {v}")))
    };
    Ok(match r.u8()? {
        1 => SampleRecord::Alloc {
            tick: *tick,
            address: r.varint()?,
            size: r.varint()?,
            stack: small(r.varint()?, "stack id")?,
        },
        2 => SampleRecord::Free {
            tick: *tick,
            address: r.varint()?,
        },
        3 => SampleRecord::Frame {
            id: small(r.varint()?, "frame id")?,
            line: small(r.varint()?, "line")?,
            file: String::from_utf8_lossy(r.bytes()?).into_owned(),
            function: String::from_utf8_lossy(r.bytes()?).into_owned(),
        },
        4 => {
            let id = small(r.varint()?, "stack id")?;
            let n = r.count(1)?;
            let frames = (0..n)
                .map(|_| small(r.varint()?, "frame id"))
                .collect::<Result<_, _>>()?;
            SampleRecord::Stack { id, frames }
        }
        5 => SampleRecord::LispAlloc {
            tick: *tick,
            requested: r.varint()?,
            bytes: r.varint()?,
            stack: small(r.varint()?, "stack id")?,
        },
        6 => SampleRecord::Unsampled {
            reason: String::from_utf8_lossy(r.bytes()?).into_owned(),
        },
        other => {
            return Err(TraceError::Malformed(format!(
                "sample record of unknown kind {other}"
            )))
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn written(records: &[SampleRecord]) -> Vec<u8> {
        // As preload/cpython.h writes them.
        let mut w = Writer::new();
        let mut last = 100;
        for rec in records {
            let tick = match rec {
                SampleRecord::Alloc { tick, .. }
                | SampleRecord::Free { tick, .. }
                | SampleRecord::LispAlloc { tick, .. } => *tick,
                _ => last,
            };
            w.varint(tick - last);
            last = tick;
            match rec {
                SampleRecord::Alloc {
                    address,
                    size,
                    stack,
                    ..
                } => {
                    w.u8(1)
                        .varint(*address)
                        .varint(*size)
                        .varint((*stack).into());
                }
                SampleRecord::Free { address, .. } => {
                    w.u8(2).varint(*address);
                }
                SampleRecord::Frame {
                    id,
                    line,
                    file,
                    function,
                } => {
                    w.u8(3).varint((*id).into()).varint((*line).into());
                    w.str(file).str(function);
                }
                SampleRecord::Stack { id, frames } => {
                    w.u8(4).varint((*id).into()).varint(frames.len() as u64);
                    for f in frames {
                        w.varint((*f).into());
                    }
                }
                SampleRecord::LispAlloc {
                    requested,
                    bytes,
                    stack,
                    ..
                } => {
                    w.u8(5)
                        .varint(*requested)
                        .varint(*bytes)
                        .varint((*stack).into());
                }
                SampleRecord::Unsampled { reason } => {
                    w.u8(6).str(reason);
                }
            }
        }
        w.bytes
    }

    #[test]
    fn records_round_trip_and_a_cut_keeps_what_came_before() {
        let records = vec![
            SampleRecord::Frame {
                id: 1,
                line: 88,
                file: "handlers.py".into(),
                function: "handle".into(),
            },
            SampleRecord::Stack {
                id: 1,
                frames: vec![1],
            },
            SampleRecord::Alloc {
                tick: 105,
                address: 0x7f00_0000_1000,
                size: 64,
                stack: 1,
            },
            SampleRecord::Free {
                tick: 107,
                address: 0x7f00_0000_1000,
            },
            SampleRecord::LispAlloc {
                tick: 109,
                requested: 48,
                bytes: 30000,
                stack: 1,
            },
            SampleRecord::Unsampled {
                reason: "fragscope reads the frames of CPython 3.8 to 3.14, not 3.15.0's".into(),
            },
        ];
        let chunk = RuntimeSamples {
            stream: 3,
            mean_bytes: 65536,
            first_tick: 100,
            records: written(&records),
        };
        let back = RuntimeSamples::decode(&chunk.encode()).unwrap();
        assert_eq!(back, chunk);
        let (got, err) = back.records();
        assert_eq!(got, records);
        assert!(err.is_none(), "{err:?}");
        let cut = RuntimeSamples {
            records: chunk.records[..chunk.records.len() - 2].to_vec(),
            ..chunk
        };
        let (got, err) = cut.records();
        assert_eq!(got, records[..5]);
        assert!(err.is_some());
    }
}
