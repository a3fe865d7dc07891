//! The column layout of packed event records.
//!
//! A general-purpose compressor codes what it cannot match (nearly all of an event
//! stream: slots and sizes are close to random) with one Huffman table per block. Records
//! in a row mix tags, slots, sizes and address deltas, so that table fits none of them
//! well. The packed form therefore writes each kind of value to a column of its own, and
//! splits each varint column into two planes, first bytes and continuation bytes (a
//! 12-bit slot is 7 random bits and a flag, then 5 random bits: two different byte
//! distributions). The chunk stores each plane as its own zstd frame ([`crate::format::chunk`],
//! codec 2). Measured on churn.c under glibc: 2.56 bytes per call in rows, 1.86 in planes.
//!
//! ```text
//! packed records := plane_len:varint * PLANES, then the planes in order
//! ```
//! Plane 0 holds the tag of every record (and realloc's flags byte), planes 1-2 the
//! slots, 3-4 address deltas, 5-6 sizes, 7-8 everything else (first bytes, then the rest).

use crate::format::wire::{unzigzag, zigzag, Reader};
use crate::format::TraceError;

/// What a value in a record is, which decides its column.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum Field {
    Tag,
    Slot,
    Addr,
    Size,
    Other,
}

pub(crate) const PLANES: usize = 9;

/// The planes holding a field's first bytes and continuation bytes.
#[inline]
fn planes_of(f: Field) -> (usize, usize) {
    match f {
        Field::Tag => (0, 0),
        Field::Slot => (1, 2),
        Field::Addr => (3, 4),
        Field::Size => (5, 6),
        Field::Other => (7, 8),
    }
}

/// Reads a chunk's records field by field, from one row of bytes (the raw form) or from
/// the planes of the packed form.
pub(crate) struct FieldReader<'a> {
    planes: [Reader<'a>; PLANES],
    /// Everything is in `planes[0]`, in record order.
    row: bool,
    /// A second reading of the slot planes (first bytes, continuation bytes), which runs
    /// ahead of the records' own ([`FieldReader::slot_ahead`]).
    slots_ahead: (usize, usize),
}

impl<'a> FieldReader<'a> {
    pub fn row(data: &'a [u8]) -> Self {
        Self {
            planes: std::array::from_fn(|i| Reader::new(if i == 0 { data } else { &[] })),
            row: true,
            slots_ahead: (0, 0),
        }
    }

    /// The planes of packed records, after their directory.
    pub fn columns(data: &'a [u8]) -> Result<Self, TraceError> {
        let mut dir = Reader::new(data);
        let mut lens = [0usize; PLANES];
        for len in &mut lens {
            *len = usize::try_from(dir.varint()?).unwrap_or(usize::MAX);
        }
        let mut rest = dir.remaining();
        let mut planes: [Reader<'a>; PLANES] = std::array::from_fn(|_| Reader::new(&[]));
        for (plane, len) in planes.iter_mut().zip(lens) {
            if len > rest.len() {
                return Err(TraceError::Malformed(
                    "packed events: a plane runs past the chunk".into(),
                ));
            }
            let (here, after) = rest.split_at(len);
            *plane = Reader::new(here);
            rest = after;
        }
        if !rest.is_empty() {
            return Err(TraceError::Malformed(
                "packed events: bytes after the last plane".into(),
            ));
        }
        Ok(Self {
            planes,
            row: false,
            slots_ahead: (0, 0),
        })
    }

    /// The next slot of the look-ahead reading of the slot planes, which goes through
    /// the same slots as the records, as far ahead of them as its caller keeps it: what a
    /// later free names, for the decoder to ask for its block's memory now. `None` at the
    /// planes' end, where a slot cannot be read, and in a row (which has no slots).
    #[inline(always)]
    pub fn slot_ahead(&mut self) -> Option<u64> {
        if self.row {
            return None;
        }
        let (first, rest) = planes_of(Field::Slot);
        let b = *self.planes[first].data.get(self.slots_ahead.0)?;
        self.slots_ahead.0 += 1;
        let mut v = u64::from(b & 0x7f);
        let mut shift = 7;
        let mut more = b >= 0x80;
        while more {
            let b = *self.planes[rest].data.get(self.slots_ahead.1)?;
            self.slots_ahead.1 += 1;
            v |= u64::from(b & 0x7f).checked_shl(shift).unwrap_or(0);
            shift += 7;
            more = b >= 0x80;
        }
        Some(v)
    }

    #[inline]
    fn first(&mut self, f: Field) -> &mut Reader<'a> {
        let i = if self.row { 0 } else { planes_of(f).0 };
        &mut self.planes[i]
    }

    /// No record left: every record starts with a tag.
    pub fn is_empty(&self) -> bool {
        self.planes[0].is_empty()
    }

    #[inline]
    pub fn u8(&mut self, f: Field) -> Result<u8, TraceError> {
        self.first(f).u8()
    }

    pub fn take(&mut self, f: Field, n: usize) -> Result<&'a [u8], TraceError> {
        self.first(f).take(n)
    }

    /// Every call's slot, size and address is a varint: the value comes back in a
    /// register from [`FieldReader::try_varint`], and only a varint that cannot be read
    /// takes the checked path (which reads it again, from its start, for the error).
    #[inline(always)]
    pub fn varint(&mut self, f: Field) -> Result<u64, TraceError> {
        match self.try_varint(f) {
            Some(v) => Ok(v),
            None => self.checked_varint(f),
        }
    }

    /// A varint of field `f`, or `None` (and nothing read) where it runs out or overflows.
    #[inline(always)]
    fn try_varint(&mut self, f: Field) -> Option<u64> {
        let (first, rest) = if self.row { (0, 0) } else { planes_of(f) };
        let head = &self.planes[first];
        let b = *head.data.get(head.pos)?;
        if b < 0x80 {
            self.planes[first].pos += 1;
            return Some(u64::from(b));
        }
        // In a row the continuation bytes follow the first; in planes they have their own.
        let tail = &self.planes[rest];
        let mut at = if first == rest {
            head.pos + 1
        } else {
            tail.pos
        };
        let mut v = u64::from(b & 0x7f);
        let mut shift = 7;
        loop {
            let b = *tail.data.get(at)?;
            at += 1;
            if shift == 63 && b > 1 {
                return None;
            }
            v |= u64::from(b & 0x7f) << shift;
            if b < 0x80 {
                break;
            }
            shift += 7;
            if shift > 63 {
                return None;
            }
        }
        if first != rest {
            self.planes[first].pos += 1;
        }
        self.planes[rest].pos = at;
        Some(v)
    }

    /// [`FieldReader::varint`] byte by byte, with the error where it fails.
    #[cold]
    #[inline(never)]
    fn checked_varint(&mut self, f: Field) -> Result<u64, TraceError> {
        if self.row {
            return self.planes[0].varint();
        }
        let (first, rest) = planes_of(f);
        let b = self.planes[first].u8()?;
        if b < 0x80 {
            return Ok(u64::from(b));
        }
        let mut v = u64::from(b & 0x7f);
        let mut shift = 7;
        loop {
            let b = self.planes[rest].u8()?;
            if shift == 63 && b > 1 {
                return Err(TraceError::Malformed(
                    "packed events: varint overflows".into(),
                ));
            }
            v |= u64::from(b & 0x7f) << shift;
            if b < 0x80 {
                return Ok(v);
            }
            shift += 7;
            if shift > 63 {
                return Err(TraceError::Malformed(
                    "packed events: varint too long".into(),
                ));
            }
        }
    }

    #[inline(always)]
    pub fn svarint(&mut self, f: Field) -> Result<i64, TraceError> {
        Ok(unzigzag(self.varint(f)?))
    }

    /// A count of items that each take at least one first byte of field `f`: a corrupt
    /// count never drives a huge allocation.
    pub fn count(&mut self, f: Field) -> Result<usize, TraceError> {
        let n = self.varint(f)?;
        let left = self.first(f).remaining().len() as u64;
        if n > left {
            return Err(TraceError::Malformed(format!(
                "count {n} exceeds the record"
            )));
        }
        Ok(n as usize)
    }
}

/// Writes records field by field into planes (the packed form's layout).
#[derive(Default)]
pub(crate) struct ColumnWriter {
    planes: [Vec<u8>; PLANES],
}

impl ColumnWriter {
    #[inline]
    pub fn u8(&mut self, f: Field, v: u8) -> &mut Self {
        self.planes[planes_of(f).0].push(v);
        self
    }

    pub fn raw(&mut self, f: Field, bytes: &[u8]) -> &mut Self {
        self.planes[planes_of(f).0].extend_from_slice(bytes);
        self
    }

    #[inline]
    pub fn varint(&mut self, f: Field, mut v: u64) -> &mut Self {
        let (first, rest) = planes_of(f);
        if v < 0x80 {
            self.planes[first].push(v as u8);
            return self;
        }
        self.planes[first].push(v as u8 | 0x80);
        v >>= 7;
        while v >= 0x80 {
            self.planes[rest].push(v as u8 | 0x80);
            v >>= 7;
        }
        self.planes[rest].push(v as u8);
        self
    }

    #[inline]
    pub fn svarint(&mut self, f: Field, v: i64) -> &mut Self {
        self.varint(f, zigzag(v))
    }

    /// The bytes written to the tag plane so far (a tag may be amended after its body).
    pub fn tags_len(&self) -> usize {
        self.planes[0].len()
    }

    pub fn amend_tag(&mut self, at: usize, flags: u8) {
        self.planes[0][at] |= flags;
    }

    /// Appends the directory and the planes to `out`, and the end of the directory and
    /// of each plane (offsets in `out`) to `ends`; empties the planes for the next chunk.
    pub fn finish(&mut self, out: &mut Vec<u8>, ends: &mut Vec<usize>) {
        let mut dir = crate::format::wire::Writer::new();
        for p in &self.planes {
            dir.varint(p.len() as u64);
        }
        out.extend_from_slice(&dir.bytes);
        ends.push(out.len());
        for p in &mut self.planes {
            out.extend_from_slice(p);
            ends.push(out.len());
            p.clear();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fields_round_trip_through_planes() {
        let values = [0u64, 1, 127, 128, 300, 1 << 35, u64::MAX];
        let fields = [Field::Slot, Field::Addr, Field::Size, Field::Other];
        let mut w = ColumnWriter::default();
        for (i, &v) in values.iter().enumerate() {
            w.u8(Field::Tag, i as u8);
            w.varint(fields[i % 4], v);
            w.svarint(Field::Addr, -(v as i64));
        }
        w.raw(Field::Other, b"name");
        let mut out = vec![0xEE];
        let mut ends = Vec::new();
        w.finish(&mut out, &mut ends);
        assert_eq!(ends.len(), PLANES + 1);
        assert_eq!(*ends.last().unwrap(), out.len());
        let mut r = FieldReader::columns(&out[1..]).unwrap();
        for (i, &v) in values.iter().enumerate() {
            assert_eq!(r.u8(Field::Tag).unwrap(), i as u8);
            assert_eq!(r.varint(fields[i % 4]).unwrap(), v);
            assert_eq!(r.svarint(Field::Addr).unwrap(), -(v as i64));
        }
        assert!(r.is_empty());
        assert_eq!(r.take(Field::Other, 4).unwrap(), b"name");
        assert!(
            r.varint(Field::Size).is_err(),
            "the size planes are used up"
        );
    }

    /// Reads every varint of `r` in field `f` until one fails, returning each value or
    /// error message with the positions of the field's planes after it.
    fn varints(
        mut r: FieldReader,
        f: Field,
        checked: bool,
    ) -> Vec<(Result<u64, String>, usize, usize)> {
        let (first, rest) = planes_of(f);
        let mut out = Vec::new();
        loop {
            let v = if checked {
                r.checked_varint(f)
            } else {
                r.varint(f)
            };
            let failed = v.is_err();
            out.push((
                v.map_err(|e| e.to_string()),
                r.planes[first].pos,
                r.planes[rest].pos,
            ));
            if failed {
                return out;
            }
        }
    }

    /// The register path of `varint` reads what the byte-by-byte one reads, in a row and
    /// in planes, and fails where it fails with the same error: over random bytes (cut
    /// varints, 10-byte overflows, runs of continuation bytes).
    #[test]
    fn a_varint_reads_the_same_on_either_path() {
        let mut seed = 0x2545_F491_4F6C_DD1Du64;
        let mut next = move || crate::xorshift(&mut seed);
        for round in 0..2000 {
            let len = (next() % 40) as usize;
            // Mostly continuation bytes, so that long and overflowing varints come up.
            let bytes: Vec<u8> = (0..len)
                .map(|_| {
                    let b = next() as u8;
                    if next() % 4 == 0 {
                        b & 0x7f
                    } else {
                        b | 0x80
                    }
                })
                .chain((round % 3 == 0).then_some(1))
                .collect();
            let row = || FieldReader::row(&bytes);
            assert_eq!(
                varints(row(), Field::Size, false),
                varints(row(), Field::Size, true)
            );
            let cut = (next() as usize) % (bytes.len() + 1);
            let (firsts, rests) = bytes.split_at(cut);
            let mut w = ColumnWriter::default();
            w.raw(Field::Size, firsts);
            w.planes[6].extend_from_slice(rests);
            let mut packed = Vec::new();
            w.finish(&mut packed, &mut Vec::new());
            let planes = || FieldReader::columns(&packed).unwrap();
            assert_eq!(
                varints(planes(), Field::Size, false),
                varints(planes(), Field::Size, true)
            );
        }
    }

    /// The look-ahead reading of the slot planes goes through the slots the records
    /// hold, in their order, whatever fields lie between them; a row has none.
    #[test]
    fn the_slot_look_ahead_reads_the_records_slots() {
        let slots = [0u64, 5, 127, 128, 1 << 20, 3, u64::from(u32::MAX)];
        let mut w = ColumnWriter::default();
        for &s in &slots {
            w.u8(Field::Tag, 9)
                .varint(Field::Slot, s)
                .varint(Field::Size, s + 1);
        }
        let mut out = Vec::new();
        w.finish(&mut out, &mut Vec::new());
        let mut r = FieldReader::columns(&out).unwrap();
        let ahead: Vec<u64> = std::iter::from_fn(|| r.slot_ahead()).collect();
        assert_eq!(ahead, slots);
        for &s in &slots {
            r.u8(Field::Tag).unwrap();
            assert_eq!(r.varint(Field::Slot).unwrap(), s);
            assert_eq!(r.varint(Field::Size).unwrap(), s + 1);
        }
        assert_eq!(FieldReader::row(&out).slot_ahead(), None);
    }

    #[test]
    fn a_bad_directory_is_an_error() {
        assert!(FieldReader::columns(&[]).is_err());
        // Nine planes of which the first claims more bytes than there are.
        let mut bad = vec![5u8, 0, 0, 0, 0, 0, 0, 0, 0];
        bad.extend_from_slice(&[1, 2]);
        assert!(FieldReader::columns(&bad).is_err());
        let mut extra = vec![0u8; PLANES];
        extra.push(7);
        assert!(FieldReader::columns(&extra).is_err());
    }
}
