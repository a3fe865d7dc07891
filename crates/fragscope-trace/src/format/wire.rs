//! Little-endian integers and LEB128 varints: the byte-level vocabulary of every record.

use crate::format::TraceError;

/// Appends encoded values to a byte vector.
#[derive(Default, Debug, Clone)]
pub struct Writer {
    pub bytes: Vec<u8>,
}

impl Writer {
    pub fn new() -> Self {
        Self::default()
    }
    pub fn u8(&mut self, v: u8) -> &mut Self {
        self.bytes.push(v);
        self
    }
    pub fn u32(&mut self, v: u32) -> &mut Self {
        self.bytes.extend_from_slice(&v.to_le_bytes());
        self
    }
    pub fn varint(&mut self, mut v: u64) -> &mut Self {
        while v >= 0x80 {
            self.bytes.push(v as u8 | 0x80);
            v >>= 7;
        }
        self.bytes.push(v as u8);
        self
    }
    pub fn svarint(&mut self, v: i64) -> &mut Self {
        self.varint(zigzag(v))
    }
    /// A length-prefixed byte string.
    pub fn bytes(&mut self, b: &[u8]) -> &mut Self {
        self.varint(b.len() as u64);
        self.bytes.extend_from_slice(b);
        self
    }
    pub fn str(&mut self, s: &str) -> &mut Self {
        self.bytes(s.as_bytes())
    }
}

pub fn zigzag(v: i64) -> u64 {
    ((v << 1) ^ (v >> 63)) as u64
}
pub fn unzigzag(v: u64) -> i64 {
    ((v >> 1) as i64) ^ -((v & 1) as i64)
}

/// Reads encoded values from a byte slice; every read checks bounds.
#[derive(Debug, Clone)]
pub struct Reader<'a> {
    pub data: &'a [u8],
    pub pos: usize,
}

impl<'a> Reader<'a> {
    pub fn new(data: &'a [u8]) -> Self {
        Self { data, pos: 0 }
    }
    pub fn is_empty(&self) -> bool {
        self.pos >= self.data.len()
    }
    pub fn remaining(&self) -> &'a [u8] {
        &self.data[self.pos.min(self.data.len())..]
    }
    fn short(&self) -> TraceError {
        TraceError::Malformed(format!("record ends early at byte {}", self.pos))
    }
    #[inline]
    pub fn u8(&mut self) -> Result<u8, TraceError> {
        let b = *self.data.get(self.pos).ok_or_else(|| self.short())?;
        self.pos += 1;
        Ok(b)
    }
    pub fn u32(&mut self) -> Result<u32, TraceError> {
        let b = self.take(4)?;
        Ok(u32::from_le_bytes(b.try_into().unwrap()))
    }
    pub fn u64(&mut self) -> Result<u64, TraceError> {
        let b = self.take(8)?;
        Ok(u64::from_le_bytes(b.try_into().unwrap()))
    }
    pub fn take(&mut self, n: usize) -> Result<&'a [u8], TraceError> {
        let end = self
            .pos
            .checked_add(n)
            .filter(|&e| e <= self.data.len())
            .ok_or_else(|| self.short())?;
        let s = &self.data[self.pos..end];
        self.pos = end;
        Ok(s)
    }
    #[inline]
    pub fn varint(&mut self) -> Result<u64, TraceError> {
        let mut v = 0u64;
        let mut shift = 0;
        loop {
            let b = self.u8()?;
            if shift == 63 && b > 1 {
                return Err(TraceError::Malformed(format!(
                    "varint overflows at byte {}",
                    self.pos
                )));
            }
            v |= u64::from(b & 0x7f) << shift;
            if b < 0x80 {
                return Ok(v);
            }
            shift += 7;
            if shift > 63 {
                return Err(TraceError::Malformed(format!(
                    "varint too long at byte {}",
                    self.pos
                )));
            }
        }
    }
    pub fn svarint(&mut self) -> Result<i64, TraceError> {
        Ok(unzigzag(self.varint()?))
    }
    pub fn bytes(&mut self) -> Result<&'a [u8], TraceError> {
        let n = self.varint()?;
        let n = usize::try_from(n).map_err(|_| self.short())?;
        self.take(n)
    }
    pub fn string(&mut self) -> Result<String, TraceError> {
        Ok(String::from_utf8_lossy(self.bytes()?).into_owned())
    }
    /// A count of items that each take at least `min_item_bytes`: rejects counts the
    /// remaining bytes cannot hold, so a corrupt count never drives a huge allocation.
    pub fn count(&mut self, min_item_bytes: usize) -> Result<usize, TraceError> {
        let n = self.varint()?;
        let left = self.data.len().saturating_sub(self.pos) as u64;
        if n.saturating_mul(min_item_bytes.max(1) as u64) > left {
            return Err(TraceError::Malformed(format!(
                "count {n} exceeds the record at byte {}",
                self.pos
            )));
        }
        Ok(n as usize)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn varints_round_trip_at_every_width() {
        let values = [0u64, 1, 127, 128, 300, 1 << 35, u64::MAX - 1, u64::MAX];
        let mut w = Writer::new();
        for v in values {
            w.varint(v);
        }
        let mut r = Reader::new(&w.bytes);
        for v in values {
            assert_eq!(r.varint().unwrap(), v);
        }
        assert!(r.is_empty());
    }

    #[test]
    fn signed_varints_round_trip() {
        for v in [0i64, -1, 1, i64::MIN, i64::MAX, -4096, 4096] {
            assert_eq!(unzigzag(zigzag(v)), v);
        }
    }

    #[test]
    fn truncated_and_overlong_varints_are_errors() {
        assert!(Reader::new(&[0x80]).varint().is_err());
        assert!(Reader::new(&[0xff; 11]).varint().is_err());
        assert!(Reader::new(&[5, 1, 2]).bytes().is_err());
        assert!(Reader::new(&[0xff, 0xff, 0xff, 0x7f]).count(1).is_err());
    }
}
