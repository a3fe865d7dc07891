//! The recorder's rewrite of each thread buffer into the packed form, before it is stored.
//!
//! What is left of an event stream after sizes and times is addresses, and a raw address
//! delta costs about three bytes whatever the compressor does: a free names one of
//! thousands of live blocks, and a malloc gets whichever block the allocator had at hand.
//! Both are predictable from what the stream has already said: a free names a block
//! that is live (its slot in a table of live blocks needs a byte or two), and a malloc
//! usually gets back the block its thread freed last at the same usable size (allocator
//! thread caches are last-in first-out per size class), which then costs nothing. The
//! rewrite runs in the recorder, off the program's path; the reader keeps the same tables
//! ([`crate::format::event::StreamTables`]) and undoes it. Buffers of one stream must be packed
//! in the order they are stored.

use crate::format::columns::ColumnWriter;
use crate::format::event::packed_writer::PackedWriter;
use crate::format::event::{ChunkDecoder, Record, StreamTables};
use crate::format::TraceError;

/// A buffer in the packed form: its bytes (the records' planes and their directory) and
/// where each plane ends, so that the chunk compresses each on its own
/// ([`crate::format::chunk::ChunkWriter::write_sections`]).
#[derive(Default)]
pub struct PackedBuffer {
    pub bytes: Vec<u8>,
    /// Offsets in `bytes` where the directory and each plane end.
    pub section_ends: Vec<usize>,
    /// The stream's tables of blocks started empty for this buffer: its chunk must be
    /// flagged so ([`crate::format::records::EventsHeader::tables_reset`]).
    pub tables_reset: bool,
}

/// Packs one stream's buffers (a process image: the recorder keeps one per stream).
pub struct Packer {
    /// The tables the raw records need (usable sizes).
    raw: StreamTables,
    /// The tables the packed records build, as the reader will, plus an index by address.
    packed: StreamTables,
    /// The planes being written (kept to reuse their allocations).
    columns: ColumnWriter,
    /// The next packed buffer starts from empty tables of blocks.
    reset_pending: bool,
}

impl Default for Packer {
    fn default() -> Self {
        Self {
            raw: StreamTables::default(),
            packed: StreamTables::for_writer(),
            columns: ColumnWriter::default(),
            reset_pending: false,
        }
    }
}

impl Packer {
    /// Packing resumes after buffers of the stream were stored raw: the blocks those
    /// allocated and freed were not followed, so the next packed buffer starts from empty
    /// tables of blocks (the reader empties its own at the flag), and names blocks
    /// allocated before it by address.
    pub fn resume(&mut self) {
        self.packed.forget_blocks();
        self.reset_pending = true;
    }

    /// Takes the usable sizes a buffer stored raw defines (usable records), as the reader
    /// will when it decodes that buffer: a later packed buffer's records rely on them.
    /// Only buffers that hold such records need this (the interposer flags them).
    pub fn learn_usable(&mut self, tid: u32, first_tick: u64, records: &[u8]) {
        let mut d =
            ChunkDecoder::with_form(records, first_tick, tid, false, &mut self.raw).report_all();
        while let Ok(Some(rec)) = d.next_record() {
            if let Record::Usable { size, usable } = rec {
                self.packed.set_usable(size, usable);
            }
        }
    }

    /// Rewrites thread `tid`'s raw `records` (starting at `first_tick`) into `out`
    /// (emptied first). Records after one that does not decode are dropped, as a reader
    /// of the raw buffer would stop there; the error says why.
    pub fn pack(
        &mut self,
        tid: u32,
        first_tick: u64,
        records: &[u8],
        out: &mut PackedBuffer,
    ) -> Result<(), TraceError> {
        out.bytes.clear();
        out.section_ends.clear();
        out.tables_reset = std::mem::take(&mut self.reset_pending);
        let mut d =
            ChunkDecoder::with_form(records, first_tick, tid, false, &mut self.raw).report_all();
        let mut w = PackedWriter::new(tid, &mut self.packed, &mut self.columns);
        let result = loop {
            match d.next_record() {
                Ok(Some(rec)) => w.record(&rec),
                Ok(None) => break Ok(()),
                Err(e) => break Err(e),
            }
        };
        self.columns.finish(&mut out.bytes, &mut out.section_ends);
        result
    }

    /// Writes thread `tid`'s `records` (tick records included, from the chunk's first
    /// tick) into `out` in the packed form: a writer that makes records instead of
    /// reading an interposer's buffer (an aggregated recording).
    pub fn pack_records(&mut self, tid: u32, records: &[Record], out: &mut PackedBuffer) {
        out.bytes.clear();
        out.section_ends.clear();
        out.tables_reset = std::mem::take(&mut self.reset_pending);
        let mut w = PackedWriter::new(tid, &mut self.packed, &mut self.columns);
        for rec in records {
            w.record(rec);
        }
        self.columns.finish(&mut out.bytes, &mut out.section_ends);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::event::*;
    use crate::format::records::EventsHeader;
    use crate::format::wire::Writer;

    /// Raw buffers of three threads that free each other's blocks, reuse addresses at
    /// once (last freed, first returned, as thread caches do), realloc, fail, and carry
    /// stacks, ticks, usable sizes and stats: every path of the packed form.
    fn raw_buffers() -> Vec<(u32, u64, Vec<u8>)> {
        let mut x = 0x2545_F491_4F6C_DD1Du64;
        let mut rand = move || crate::xorshift(&mut x);
        let mut live: Vec<u64> = Vec::new();
        let mut freed: Vec<u64> = Vec::new();
        let mut next = 0x5555_0000_0000u64;
        let mut out = Vec::new();
        for chunk in 0..60u64 {
            let tid = 100 + (chunk % 3) as u32;
            let mut w = Writer::new();
            let mut prev = 0u64;
            let addr_delta = |w: &mut Writer, prev: &mut u64, a: u64, tag: u8, unaligned: u8| {
                let d = a.wrapping_sub(*prev) as i64;
                *prev = a;
                if d % 16 == 0 {
                    w.u8(tag).svarint(d / 16);
                } else {
                    w.u8(tag | unaligned).svarint(d);
                }
            };
            // Sizes 200 and 201 share a usable size, defined in different buffers.
            let sizes: &[u64] = match chunk {
                0 => &[24, 40, 100],
                15 => &[200],
                30 => &[201],
                _ => &[],
            };
            for &size in sizes {
                w.u8(KIND_USABLE).varint(size).varint((size + 8 + 15) & !15);
            }
            for i in 0..500 {
                let r = rand();
                match r % 10 {
                    0..=3 if !live.is_empty() => {
                        let a = live.swap_remove((r >> 8) as usize % live.len());
                        addr_delta(&mut w, &mut prev, a, Func::Free as u8, FLAG_UNALIGNED);
                        freed.push(a);
                    }
                    4 => {
                        w.u8(KIND_TICK).varint(r >> 60);
                    }
                    5 if !live.is_empty() => {
                        // realloc: sometimes in place, sometimes moved, unaligned.
                        let k = (r >> 8) as usize % live.len();
                        let old = live[k];
                        let new = if r & 0x100 != 0 { old } else { next + 3 };
                        next += 4096;
                        live[k] = new;
                        if new != old {
                            // Moved: the old block was given back at a value taken
                            // before the call, the call read the counter after it.
                            w.u8(KIND_TICK | FLAG_ORDER).varint(4 + (r >> 61));
                            w.u8(KIND_TICK | FLAG_ANCHOR | FLAG_RELEASED)
                                .varint((1 + (r >> 62)) << 8);
                        }
                        w.u8(Func::Realloc as u8 | FLAG_USABLE);
                        let d = old.wrapping_sub(prev) as i64;
                        prev = old;
                        w.u8(REALLOC_OLD_UNALIGNED).svarint(d);
                        let d = new.wrapping_sub(prev) as i64;
                        prev = new;
                        w.svarint(d / 16).varint(300).varint(12);
                    }
                    6 => {
                        w.u8(Func::Malloc as u8 | FLAG_NULL).varint(1 << 50);
                    }
                    8 if i % 7 == 0 && !live.is_empty() => {
                        // An address returned again while live (its free was lost).
                        let a = live[(r >> 8) as usize % live.len()];
                        live.push(a);
                        addr_delta(&mut w, &mut prev, a, Func::Malloc as u8, FLAG_UNALIGNED);
                        w.varint(40);
                    }
                    7 if i % 50 == 0 => {
                        w.u8(KIND_STACK)
                            .varint(i)
                            .varint(2)
                            .svarint(0x4000)
                            .svarint(-8);
                        w.u8(KIND_STATS).u8(2).u8(1).u8(3);
                        w.bytes.extend_from_slice(b"abc");
                        w.varint(r >> 40);
                        // A fork's mark (lost, flag 0x20).
                        w.u8(14 | 0x20).varint(i);
                    }
                    _ => {
                        // Reuse what was freed last, or a fresh block.
                        let a = if r & 1 == 0 {
                            freed.pop().unwrap_or_else(|| {
                                next += 64;
                                next
                            })
                        } else {
                            next += 48;
                            next
                        };
                        live.push(a);
                        let known = match chunk {
                            0..=14 => 3,
                            15..=29 => 4,
                            _ => 5,
                        };
                        let size = [24u64, 40, 100, 200, 201][(r >> 20) as usize % known];
                        let stack = r & 0x200 != 0;
                        let tag = Func::Malloc as u8 | if stack { FLAG_STACK } else { 0 };
                        addr_delta(&mut w, &mut prev, a, tag, FLAG_UNALIGNED);
                        w.varint(size);
                        if stack {
                            w.varint(7);
                        }
                    }
                }
            }
            out.push((tid, chunk * 10, w.bytes));
        }
        out
    }

    fn decode_all(buffers: &[(u32, u64, Vec<u8>)], packed: bool) -> Vec<(u64, Record)> {
        let mut tables = StreamTables::default();
        let mut got = Vec::new();
        for (tid, tick, records) in buffers {
            let mut d = ChunkDecoder::with_form(records, *tick, *tid, packed, &mut tables);
            while let Some(r) = d.next_record().unwrap() {
                got.push((d.tick(), r));
            }
        }
        got
    }

    /// `raw` buffers packed by one packer, in order.
    fn packed_buffers(raw: &[(u32, u64, Vec<u8>)]) -> Vec<(u32, u64, Vec<u8>)> {
        let mut packer = Packer::default();
        raw.iter()
            .map(|(tid, tick, r)| {
                let mut out = PackedBuffer::default();
                packer.pack(*tid, *tick, r, &mut out).unwrap();
                (*tid, *tick, out.bytes)
            })
            .collect()
    }

    /// A call's place, and for a realloc the (tick, place) of its RELEASED record.
    type Places = (Option<u64>, Option<(u64, u64)>);

    /// Each call's [`Places`].
    fn places_all(buffers: &[(u32, u64, Vec<u8>)], packed: bool) -> Vec<Places> {
        let mut tables = StreamTables::default();
        let mut got = Vec::new();
        for (tid, tick, records) in buffers {
            let mut d = ChunkDecoder::with_form(records, *tick, *tid, packed, &mut tables);
            while let Some(r) = d.next_record().unwrap() {
                if matches!(r, Record::Alloc { .. } | Record::Free { .. }) {
                    got.push((d.place(), d.take_released()));
                }
            }
        }
        got
    }

    #[test]
    fn a_reallocs_release_keeps_its_place_through_packing() {
        let raw = raw_buffers();
        let packed = packed_buffers(&raw);
        let want = places_all(&raw, false);
        let released: Vec<_> = want.iter().filter_map(|&(p, r)| Some((p?, r?))).collect();
        assert!(released.len() > 100, "{} releases", released.len());
        // Placed as a free before the call's own reading: one value below it at least.
        assert!(released
            .iter()
            .all(|&(place, (_, r))| r % 2 == 1 && r < place));
        assert_eq!(places_all(&packed, true), want);
    }

    #[test]
    fn packing_keeps_every_record_and_saves_address_bytes() {
        let raw = raw_buffers();
        let packed = packed_buffers(&raw);
        let want = decode_all(&raw, false);
        assert!(want.len() > 20_000);
        assert!(want.iter().any(|(_, r)| matches!(
            r,
            Record::Stats {
                source: StatsSource::Jemalloc,
                ..
            }
        )));
        assert!(want
            .iter()
            .any(|(_, r)| matches!(r, Record::Forked { mark: 50.. })));
        assert_eq!(decode_all(&packed, true), want);
    }

    #[test]
    fn packing_resumes_after_buffers_stored_raw() {
        // Packed, then raw while the recorder is behind (one of them defines a usable
        // size), then packed again from empty tables: decoded in file order, the same
        // records as the raw buffers.
        let raw = raw_buffers();
        let mut packer = Packer::default();
        let mut stored = Vec::new();
        for (i, (tid, tick, records)) in raw.iter().enumerate() {
            let mut h = EventsHeader {
                tid: *tid,
                seq: i as u32,
                first_tick: *tick,
                last_tick: *tick,
                ..Default::default()
            };
            if (10..25).contains(&i) {
                packer.learn_usable(*tid, *tick, records);
                stored.push((h, records.clone()));
                continue;
            }
            if i == 25 {
                packer.resume();
            }
            let mut out = PackedBuffer::default();
            packer.pack(*tid, *tick, records, &mut out).unwrap();
            h.packed = true;
            h.tables_reset = out.tables_reset;
            assert_eq!(h.tables_reset, i == 25);
            stored.push((h, out.bytes));
        }
        let mut tables = StreamTables::default();
        let mut got = Vec::new();
        for (h, records) in &stored {
            let mut d = ChunkDecoder::new(records, h, &mut tables);
            while let Some(r) = d.next_record().unwrap() {
                got.push((d.tick(), r));
            }
        }
        let want = decode_all(&raw, false);
        assert!(want
            .iter()
            .any(|(_, r)| matches!(r, Record::Alloc { size: 201, .. })));
        assert_eq!(got, want);
    }

    #[test]
    fn a_usable_size_defined_while_raw_serves_the_packing_after() {
        // 200 and 201 bytes share a usable size; 200's is defined in a buffer stored raw.
        // Packed after it: X (200 bytes) and Y (201) are freed, Y then X, and 201 bytes
        // get Y back. A packer that missed 200's usable size would not list X among the
        // thread's frees of that size, and predict Y as the last one freed, which the
        // reader, who lists X last, would take for X.
        let mut raw_part = Writer::new();
        raw_part.u8(KIND_USABLE).varint(200).varint(208);
        let (x, y) = (0x5555_0000_1000u64, 0x5555_0000_2000u64);
        let mut w = Writer::new();
        let mut prev = 0u64;
        let mut delta = |w: &mut Writer, a: u64| {
            w.svarint(a.wrapping_sub(prev) as i64 / 16);
            prev = a;
        };
        w.u8(KIND_USABLE).varint(201).varint(208);
        w.u8(Func::Malloc as u8);
        delta(&mut w, x);
        w.varint(200);
        w.u8(Func::Malloc as u8);
        delta(&mut w, y);
        w.varint(201);
        w.u8(Func::Free as u8);
        delta(&mut w, y);
        w.u8(Func::Free as u8);
        delta(&mut w, x);
        w.u8(Func::Malloc as u8);
        delta(&mut w, y);
        w.varint(201);
        let mut packer = Packer::default();
        packer.learn_usable(1, 0, &raw_part.bytes);
        packer.resume();
        let mut out = PackedBuffer::default();
        packer.pack(1, 0, &w.bytes, &mut out).unwrap();
        let h = EventsHeader {
            tid: 1,
            ..Default::default()
        };
        let mut tables = StreamTables::default();
        let mut got = Vec::new();
        for (h, records) in [
            (h, &raw_part.bytes),
            (
                EventsHeader {
                    packed: true,
                    tables_reset: out.tables_reset,
                    seq: 1,
                    ..h
                },
                &out.bytes,
            ),
        ] {
            let mut d = ChunkDecoder::new(records, &h, &mut tables);
            while let Some(r) = d.next_record().unwrap() {
                got.push(r);
            }
        }
        let last = got.last().unwrap();
        assert!(
            matches!(last, Record::Alloc { addr, size: 201, .. } if *addr == y),
            "{last:?}"
        );
    }

    #[test]
    fn a_churning_heap_packs_to_under_two_thirds() {
        // One thread frees a random one of 4096 blocks and mallocs 8..1031 bytes, getting
        // back the block last freed at that usable size when there is one (a thread cache).
        let mut x = 88172645463325252u64;
        let mut ring = vec![(0u64, 0u64); 4096];
        let mut cache: std::collections::HashMap<u64, Vec<u64>> = Default::default();
        let mut next = 0x5555_0000_0000u64;
        let mut known = std::collections::HashSet::new();
        let mut w = Writer::new();
        let mut prev = 0u64;
        let mut delta = |w: &mut Writer, a: u64| {
            w.svarint(a.wrapping_sub(prev) as i64 / 16);
            prev = a;
        };
        for _ in 0..100_000 {
            crate::xorshift(&mut x);
            let k = (x % 4096) as usize;
            let (old, old_usable) = ring[k];
            if old != 0 {
                w.u8(Func::Free as u8);
                delta(&mut w, old);
                cache.entry(old_usable).or_default().push(old);
            }
            let size = 8 + (x >> 32) % 1024;
            let usable = (size + 8 + 15) & !15;
            let addr = cache
                .get_mut(&usable)
                .and_then(|c| c.pop())
                .unwrap_or_else(|| {
                    next += usable + 16;
                    next
                });
            if known.insert(size) {
                w.u8(KIND_USABLE).varint(size).varint(usable);
            }
            w.u8(Func::Malloc as u8);
            delta(&mut w, addr);
            w.varint(size);
            ring[k] = (addr, usable);
        }
        let raw = vec![(1, 0, w.bytes)];
        let mut out = PackedBuffer::default();
        // (Its speed on a real trace: examples/pack_speed.rs.)
        Packer::default().pack(1, 0, &raw[0].2, &mut out).unwrap();
        assert!(
            out.bytes.len() * 3 < raw[0].2.len() * 2,
            "{} of {}",
            out.bytes.len(),
            raw[0].2.len()
        );
        assert_eq!(
            decode_all(&[(1, 0, out.bytes)], true),
            decode_all(&raw, false)
        );
    }

    #[test]
    fn a_bad_buffer_keeps_what_came_before() {
        let mut w = Writer::new();
        w.u8(Func::Malloc as u8).svarint(0x1000).varint(10);
        w.u8(Func::Malloc as u8); // cut short
        let mut out = PackedBuffer::default();
        let mut packer = Packer::default();
        assert!(packer.pack(1, 0, &w.bytes, &mut out).is_err());
        let got = decode_all(&[(1, 0, out.bytes)], true);
        assert_eq!(got.len(), 1);
        assert!(matches!(got[0].1, Record::Alloc { addr: 0x10000, .. }));
    }
}
