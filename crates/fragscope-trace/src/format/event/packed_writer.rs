//! The writer of the packed form ([`crate::format::pack`] drives it): each record
//! rewritten with the blocks it names found in the stream's tables, which it keeps as
//! the decoder will.

use super::tables::StreamTables;
use super::{
    Func, Record, FLAG_ANCHOR, FLAG_FORKED, FLAG_JOINED, FLAG_LIVE, FLAG_NULL, FLAG_ORDER,
    FLAG_PREDICTED, FLAG_RELEASED, FLAG_SLOT, FLAG_STACK, FLAG_SUMMED, FLAG_UNALIGNED, FLAG_USABLE,
    KIND_LOST, KIND_OWN_MEMORY, KIND_STACK, KIND_STATS, KIND_TICK, KIND_USABLE, REALLOC_OLD_NULL,
    REALLOC_OLD_SLOT, REALLOC_OLD_UNALIGNED,
};
use crate::format::columns::{ColumnWriter, Field};

/// The other side of [`read_delta`]: whether the delta is in bytes, and the delta.
fn write_delta(base: &mut u64, addr: u64) -> (bool, i64) {
    let d = addr.wrapping_sub(*base) as i64;
    *base = addr;
    if d % 16 == 0 {
        (false, d / 16)
    } else {
        (true, d)
    }
}

/// Writes records in the packed form. Keeps the stream's tables as the reader will.
pub(crate) struct PackedWriter<'t> {
    w: &'t mut ColumnWriter,
    prev_addr: u64,
    prev_alloc: u64,
    tid: u32,
    tables: &'t mut StreamTables,
}

impl<'t> PackedWriter<'t> {
    pub fn new(tid: u32, tables: &'t mut StreamTables, w: &'t mut ColumnWriter) -> Self {
        Self {
            w,
            prev_addr: 0,
            prev_alloc: 0,
            tid,
            tables,
        }
    }

    /// Whether the delta of a literal address is in bytes, and the delta.
    fn delta(&mut self, addr: u64) -> (bool, i64) {
        write_delta(&mut self.prev_addr, addr)
    }

    /// Rewrites one record. Calls are written inline, into the packer's loop; the other
    /// kinds out of line.
    #[inline(always)]
    pub fn record(&mut self, rec: &Record) {
        match *rec {
            Record::Free { addr } => {
                let kind = Func::Free as u8;
                if addr == 0 {
                    self.w.u8(Field::Tag, kind | FLAG_NULL);
                } else if let Some(slot) = self.tables.end_block(addr, self.tid, true) {
                    self.prev_addr = addr;
                    self.w
                        .u8(Field::Tag, kind | FLAG_SLOT)
                        .varint(Field::Slot, slot.into());
                } else {
                    let (unaligned, d) = self.delta(addr);
                    let flag = if unaligned { FLAG_UNALIGNED } else { 0 };
                    self.w.u8(Field::Tag, kind | flag).svarint(Field::Addr, d);
                }
            }
            Record::Alloc {
                func,
                addr,
                old_addr,
                size,
                align,
                usable,
                stack,
            } => self.alloc(func, addr, old_addr, size, align, usable, stack),
            _ => self.rare_record(rec),
        }
    }

    #[inline(never)]
    fn rare_record(&mut self, rec: &Record) {
        match *rec {
            Record::Free { .. } | Record::Alloc { .. } => unreachable!("calls are record's"),
            Record::StackDef { id, ref frames } => {
                self.w
                    .u8(Field::Tag, KIND_STACK)
                    .varint(Field::Other, id.into());
                self.w.varint(Field::Other, frames.len() as u64);
                let mut prev = 0u64;
                for &ip in frames {
                    self.w.svarint(Field::Other, ip.wrapping_sub(prev) as i64);
                    prev = ip;
                }
            }
            Record::Stats { source, ref values } => {
                let values = &values[..values.len().min(255)];
                self.w
                    .u8(Field::Tag, KIND_STATS)
                    .u8(Field::Other, source.to_u8())
                    .u8(Field::Other, values.len() as u8);
                for (name, v) in values {
                    let name = &name.as_bytes()[..name.len().min(255)];
                    self.w.u8(Field::Other, name.len() as u8);
                    self.w.raw(Field::Other, name);
                    self.w.varint(Field::Other, *v);
                }
            }
            Record::Lost { count } => {
                self.w.u8(Field::Tag, KIND_LOST).varint(Field::Other, count);
            }
            Record::Joined { tid } => {
                self.w
                    .u8(Field::Tag, KIND_LOST | FLAG_JOINED)
                    .varint(Field::Other, tid.into());
            }
            Record::Forked { mark } => {
                self.w
                    .u8(Field::Tag, KIND_LOST | FLAG_FORKED)
                    .varint(Field::Other, mark.into());
            }
            Record::Summed {
                stack,
                size,
                allocations,
                temporaries,
            } => {
                self.w
                    .u8(Field::Tag, KIND_LOST | FLAG_SUMMED)
                    .varint(Field::Other, stack.into())
                    .varint(Field::Other, size)
                    .varint(Field::Other, allocations)
                    .varint(Field::Other, temporaries);
            }
            Record::Live {
                live,
                usable,
                peak,
                peak_age,
                calls,
            } => {
                self.w
                    .u8(Field::Tag, KIND_LOST | FLAG_LIVE)
                    .varint(Field::Other, live)
                    .varint(Field::Other, usable)
                    .varint(Field::Other, peak)
                    .varint(Field::Other, peak_age)
                    .varint(Field::Other, calls);
            }
            Record::OwnMemory { bytes } => {
                self.w
                    .u8(Field::Tag, KIND_OWN_MEMORY)
                    .varint(Field::Other, bytes);
            }
            Record::Tick { delta } => {
                self.w.u8(Field::Tag, KIND_TICK).varint(Field::Other, delta);
            }
            Record::Order { delta } => {
                self.w
                    .u8(Field::Tag, KIND_TICK | FLAG_ORDER)
                    .varint(Field::Other, delta);
            }
            Record::Released { ticks_back, value } => {
                self.w
                    .u8(Field::Tag, KIND_TICK | FLAG_ANCHOR | FLAG_RELEASED)
                    .varint(Field::Other, value << 8 | ticks_back);
            }
            Record::Usable { size, usable } => {
                self.tables.set_usable(size, usable);
                self.w
                    .u8(Field::Tag, KIND_USABLE)
                    .varint(Field::Other, size)
                    .varint(Field::Other, usable);
            }
        }
    }

    #[allow(clippy::too_many_arguments)]
    #[inline(always)]
    fn alloc(
        &mut self,
        func: Func,
        addr: u64,
        old_addr: u64,
        size: u64,
        align: u64,
        usable: Option<u64>,
        stack: u32,
    ) {
        let small = matches!(func, Func::Malloc | Func::Calloc);
        let from_table = if addr != 0 && small {
            self.tables.table_usable(size)
        } else {
            None
        };
        // The usable size is written unless the reader's table gives it (as the raw form).
        let explicit = usable.filter(|&u| from_table != Some(u) && u >= size);
        let usable = explicit.or(from_table);
        // The tables change in the reader's order: the old block ends, then the new one
        // is claimed from the thread's frees and takes a slot.
        let old_slot = if func.takes_old_block() && old_addr != 0 {
            self.tables.end_block(old_addr, self.tid, false)
        } else {
            None
        };
        let depth = match (explicit, from_table) {
            (None, Some(u)) => self.tables.take_if_freed(self.tid, u, addr),
            _ => None,
        };
        let mut tag = func as u8;
        if stack != 0 {
            tag |= FLAG_STACK;
        }
        if explicit.is_some() || depth.is_some_and(|d| d > 0) {
            tag |= FLAG_USABLE;
        }
        let tag_at = self.w.tags_len();
        self.w.u8(Field::Tag, tag);
        if func.takes_old_block() {
            if old_addr == 0 {
                self.w.u8(Field::Tag, REALLOC_OLD_NULL);
            } else if let Some(slot) = old_slot {
                self.prev_addr = old_addr;
                self.w
                    .u8(Field::Tag, REALLOC_OLD_SLOT)
                    .varint(Field::Slot, slot.into());
            } else {
                let (unaligned, d) = self.delta(old_addr);
                let flag = if unaligned { REALLOC_OLD_UNALIGNED } else { 0 };
                self.w.u8(Field::Tag, flag).svarint(Field::Addr, d);
            }
        }
        if addr == 0 {
            self.w.amend_tag(tag_at, FLAG_NULL);
        } else if depth.is_some() {
            self.w.amend_tag(tag_at, FLAG_PREDICTED);
            self.prev_addr = addr;
        } else {
            let (unaligned, d) = write_delta(&mut self.prev_alloc, addr);
            if unaligned {
                self.w.amend_tag(tag_at, FLAG_UNALIGNED);
            }
            self.w.svarint(Field::Addr, d);
        }
        self.w.varint(Field::Size, size);
        if func.takes_alignment() {
            self.w.varint(Field::Other, align);
        }
        if let Some(u) = explicit {
            self.w.varint(Field::Other, u - size);
        }
        if let Some(d) = depth.filter(|&d| d > 0) {
            self.w.varint(Field::Other, d);
        }
        if stack != 0 {
            self.w.varint(Field::Other, stack.into());
        }
        if addr != 0 {
            self.tables.allocated(addr, usable);
        }
    }
}
