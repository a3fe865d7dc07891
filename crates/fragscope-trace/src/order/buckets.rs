//! What a bucket of the live blocks' table ([`crate::order::blocks`]) holds: a block
//! packed with its key into 20, 16, 8 or 6 bytes (see that module's comment), and the
//! [`Packing`] each kind of bucket gives the table.

use crate::format::hash::AddressWindows;
use crate::order::live::LiveBlock;

/// A live block as its bucket holds it, with its address (see the module's comment),
/// without its birth tick.
#[derive(Clone, Copy, Debug)]
#[repr(C, packed(4))]
pub(crate) struct Untimed {
    /// The address in the low 48 bits, above them the rounding (usable minus requested
    /// bytes) and [`Untimed::INHERITED`].
    addr_rounding: u64,
    /// Requested bytes; [`Untimed::WIDE`]: the block is in `Table::wide`.
    size: u32,
    stack: u32,
}

/// A live block as its bucket holds it, with its birth tick.
#[derive(Clone, Copy, Debug)]
#[repr(C, packed(4))]
pub(crate) struct Timed {
    block: Untimed,
    born_tick: u32,
}

/// A live block with no stack as its bucket holds it, without its birth tick, in 8
/// bytes: its address in 32 bits ([`AddressWindows`]: a block at another address is
/// kept beside the table with the far ones), the rounding, whether it is inherited and
/// the requested bytes. One with a stack, of [`Unstacked::WIDE`] bytes or more or rounded
/// up by 4 KiB or more is kept whole beside the table. (A heap of millions of blocks is
/// nearly all small ones; each of a redis-server's 2^23 buckets took 12 bytes, 32 MiB
/// more.)
#[derive(Clone, Copy, Debug)]
#[repr(C, packed(4))]
pub(crate) struct Unstacked {
    /// The address's 32 bits (the key), then the rounding, [`Unstacked::INHERITED`] and
    /// the requested bytes.
    word: u64,
}

/// A live block with no stack, as small as nearly all of a big heap's are, in 6 bytes:
/// its key as [`Unstacked`]'s, then the rounding (under 32 bytes), whether it is
/// inherited and the requested bytes (under [`Small::WIDE`]). A table of blocks without
/// stacks takes these buckets as it grows while nearly all its blocks fit them
/// (`Blocks::grow_unstacked`).
#[derive(Clone, Copy, Debug)]
#[repr(C, packed(2))]
pub(crate) struct Small {
    key: u32,
    /// The rounding, [`Small::INHERITED`], then the requested bytes.
    rest: u16,
}

const _: () = assert!(
    size_of::<Small>() == 6
        && size_of::<Unstacked>() == 8
        && size_of::<Untimed>() == 16
        && size_of::<Timed>() == 20
);

/// The bits of a bucket's first word that hold the address.
pub(crate) const ADDR_BITS: u32 = 48;
pub(crate) const ADDR_MASK: u64 = (1 << ADDR_BITS) - 1;

/// Whether a block at `addr` is kept apart from the table (its address does not fit a
/// bucket of 48-bit addresses).
#[inline(always)]
fn far(addr: u64) -> bool {
    addr > ADDR_MASK
}

impl Untimed {
    const WIDE: u32 = u32::MAX;
    /// Roundings below this fit a bucket.
    const ROUNDING_FITS: u32 = 1 << 15;
    const INHERITED: u64 = 1 << 63;

    /// Block `b` at `addr` (which is not far) packed, or `None` when it does not fit.
    #[inline(always)]
    fn packed(addr: u64, b: &LiveBlock) -> Option<Self> {
        let fits = b.size < u64::from(Self::WIDE) && b.rounding < Self::ROUNDING_FITS;
        let inherited = if b.inherited { Self::INHERITED } else { 0 };
        fits.then_some(Self {
            addr_rounding: addr | u64::from(b.rounding) << ADDR_BITS | inherited,
            size: b.size as u32,
            stack: b.stack,
        })
    }

    /// The block, with a birth tick of 0, when it is not wide.
    #[inline(always)]
    fn block(self) -> LiveBlock {
        let above = self.addr_rounding >> ADDR_BITS;
        LiveBlock {
            size: u64::from(self.size),
            rounding: (above as u32) & (Self::ROUNDING_FITS - 1),
            stack: self.stack,
            born_tick: 0,
            inherited: self.addr_rounding & Self::INHERITED != 0,
        }
    }
}

/// What a bucket holds: [`Small`], [`Unstacked`], [`Untimed`] or [`Timed`], each an
/// [`Untimed`] bucket with a tick added or its stack (and for [`Small`], high bits of its
/// size and rounding) left out. A bucket holds its block's key: its address, or for
/// [`Unstacked`] and [`Small`] the address in 32 bits; an [`Untimed`] made for another
/// kind carries the key where the address would be.
pub(crate) trait Packing: Copy + std::fmt::Debug {
    /// Whether the table keeps its blocks' birth ticks (else every block reads back with
    /// a tick of 0, kept beside the table or not).
    const TICKS: bool = false;

    /// The key of a block at `addr` in a bucket of this kind, or `None` when no bucket
    /// holds one there (it is far: kept beside the table with no bucket).
    #[inline(always)]
    fn key_of(addr: u64, _windows: &AddressWindows) -> Option<u64> {
        (!far(addr)).then_some(addr)
    }

    /// [`Packing::key_of`] for a block made live at `addr`, which may take a window.
    #[inline(always)]
    fn new_key(addr: u64, windows: &mut AddressWindows) -> Option<u64> {
        Self::key_of(addr, windows)
    }

    /// The address of key `key`.
    #[inline(always)]
    fn addr_of(key: u64, _windows: &AddressWindows) -> u64 {
        key
    }

    /// Bucket `u` with birth tick `born_tick`, as this kind holds it.
    fn from_untimed(u: Untimed, born_tick: u32) -> Self;

    /// The bucket less its birth tick.
    fn untimed(&self) -> Untimed;

    fn born_tick(&self) -> u32 {
        0
    }

    /// Whether a bucket of this kind can hold block `b` (given it fits an [`Untimed`]).
    fn holds(_b: &LiveBlock) -> bool {
        true
    }

    /// Block `b` of key `key` packed, or `None` when it does not fit.
    #[inline(always)]
    fn of(key: u64, b: &LiveBlock) -> Option<Self> {
        if !Self::holds(b) {
            return None;
        }
        Some(Self::from_untimed(Untimed::packed(key, b)?, b.born_tick))
    }

    /// The marker of a block of key `key` kept whole beside the table.
    fn wide(key: u64) -> Self {
        let marker = Untimed {
            addr_rounding: key,
            size: Untimed::WIDE,
            stack: 0,
        };
        Self::from_untimed(marker, 0)
    }

    /// The block, when it is not wide.
    #[inline(always)]
    fn unpacked(self) -> LiveBlock {
        LiveBlock {
            born_tick: self.born_tick(),
            ..self.untimed().block()
        }
    }

    #[inline(always)]
    fn key(&self) -> u64 {
        self.untimed().addr_rounding & ADDR_MASK
    }

    fn is_wide(&self) -> bool {
        self.untimed().size == Untimed::WIDE
    }
}

impl Packing for Untimed {
    #[inline(always)]
    fn from_untimed(u: Untimed, _born_tick: u32) -> Self {
        u
    }

    #[inline(always)]
    fn untimed(&self) -> Untimed {
        *self
    }
}

impl Unstacked {
    const KEY_BITS: u32 = 32;
    const ROUNDING_BITS: u32 = 12;
    const INHERITED: u64 = 1 << (Self::KEY_BITS + Self::ROUNDING_BITS);
    /// Where the requested bytes start in `word`.
    const SIZE_AT: u32 = Self::KEY_BITS + Self::ROUNDING_BITS + 1;
    /// Requested bytes below this fit; this is the mark of a block kept beside.
    pub(crate) const WIDE: u64 = (1 << (64 - Self::SIZE_AT)) - 1;
}

impl Packing for Unstacked {
    #[inline(always)]
    fn key_of(addr: u64, windows: &AddressWindows) -> Option<u64> {
        windows.short(addr).map(u64::from)
    }

    #[inline(always)]
    fn new_key(addr: u64, windows: &mut AddressWindows) -> Option<u64> {
        windows.short_or_add(addr).map(u64::from)
    }

    #[inline(always)]
    fn addr_of(key: u64, windows: &AddressWindows) -> u64 {
        windows.addr(key as u32)
    }

    #[inline(always)]
    fn from_untimed(u: Untimed, _born_tick: u32) -> Self {
        let key = u.addr_rounding & ((1 << Self::KEY_BITS) - 1);
        let rounding = (u.addr_rounding >> ADDR_BITS) & u64::from(Untimed::ROUNDING_FITS - 1);
        let inherited = u.addr_rounding & Untimed::INHERITED != 0;
        let size = if u.size == Untimed::WIDE {
            Self::WIDE
        } else {
            u64::from(u.size)
        };
        debug_assert!(size <= Self::WIDE && rounding >> Self::ROUNDING_BITS == 0);
        Self {
            word: key
                | rounding << Self::KEY_BITS
                | if inherited { Self::INHERITED } else { 0 }
                | size << Self::SIZE_AT,
        }
    }

    #[inline(always)]
    fn untimed(&self) -> Untimed {
        let word = self.word;
        let size = word >> Self::SIZE_AT;
        let rounding = (word >> Self::KEY_BITS) & ((1 << Self::ROUNDING_BITS) - 1);
        let inherited = if word & Self::INHERITED != 0 {
            Untimed::INHERITED
        } else {
            0
        };
        Untimed {
            addr_rounding: (word & ((1 << Self::KEY_BITS) - 1)) | rounding << ADDR_BITS | inherited,
            size: if size == Self::WIDE {
                Untimed::WIDE
            } else {
                size as u32
            },
            stack: 0,
        }
    }

    /// A block with a stack, or too big or too rounded for the bucket, is kept whole
    /// beside the table.
    #[inline(always)]
    fn holds(b: &LiveBlock) -> bool {
        b.stack == 0 && b.size < Self::WIDE && b.rounding >> Self::ROUNDING_BITS == 0
    }

    #[inline(always)]
    fn key(&self) -> u64 {
        self.word & ((1 << Self::KEY_BITS) - 1)
    }

    #[inline(always)]
    fn is_wide(&self) -> bool {
        self.word >> Self::SIZE_AT == Self::WIDE
    }
}

impl Small {
    const ROUNDING_BITS: u32 = 5;
    const INHERITED: u16 = 1 << Self::ROUNDING_BITS;
    /// Where the requested bytes start in `rest`.
    const SIZE_AT: u32 = Self::ROUNDING_BITS + 1;
    /// Requested bytes below this fit; this is the mark of a block kept beside.
    pub(crate) const WIDE: u16 = (1 << (16 - Self::SIZE_AT)) - 1;
}

impl Packing for Small {
    #[inline(always)]
    fn key_of(addr: u64, windows: &AddressWindows) -> Option<u64> {
        Unstacked::key_of(addr, windows)
    }

    #[inline(always)]
    fn new_key(addr: u64, windows: &mut AddressWindows) -> Option<u64> {
        Unstacked::new_key(addr, windows)
    }

    #[inline(always)]
    fn addr_of(key: u64, windows: &AddressWindows) -> u64 {
        Unstacked::addr_of(key, windows)
    }

    #[inline(always)]
    fn from_untimed(u: Untimed, _born_tick: u32) -> Self {
        let rounding = (u.addr_rounding >> ADDR_BITS) as u16 & ((1 << Self::ROUNDING_BITS) - 1);
        let inherited = if u.addr_rounding & Untimed::INHERITED != 0 {
            Self::INHERITED
        } else {
            0
        };
        let size = if u.size == Untimed::WIDE {
            Self::WIDE
        } else {
            u.size as u16
        };
        debug_assert!(u.size == Untimed::WIDE || u.size < u32::from(Self::WIDE));
        Self {
            key: u.addr_rounding as u32,
            rest: rounding | inherited | size << Self::SIZE_AT,
        }
    }

    #[inline(always)]
    fn untimed(&self) -> Untimed {
        let rest = self.rest;
        let size = rest >> Self::SIZE_AT;
        let rounding = u64::from(rest & ((1 << Self::ROUNDING_BITS) - 1));
        let inherited = if rest & Self::INHERITED != 0 {
            Untimed::INHERITED
        } else {
            0
        };
        Untimed {
            addr_rounding: u64::from(self.key) | rounding << ADDR_BITS | inherited,
            size: if size == Self::WIDE {
                Untimed::WIDE
            } else {
                u32::from(size)
            },
            stack: 0,
        }
    }

    /// A block with a stack, of [`Small::WIDE`] bytes or more or rounded up by 32 or
    /// more, is kept whole beside the table.
    #[inline(always)]
    fn holds(b: &LiveBlock) -> bool {
        b.stack == 0 && b.size < u64::from(Self::WIDE) && b.rounding >> Self::ROUNDING_BITS == 0
    }

    #[inline(always)]
    fn key(&self) -> u64 {
        u64::from(self.key)
    }

    #[inline(always)]
    fn is_wide(&self) -> bool {
        self.rest >> Self::SIZE_AT == Self::WIDE
    }
}

impl Packing for Timed {
    const TICKS: bool = true;

    #[inline(always)]
    fn from_untimed(block: Untimed, born_tick: u32) -> Self {
        Self { block, born_tick }
    }

    #[inline(always)]
    fn untimed(&self) -> Untimed {
        self.block
    }

    #[inline(always)]
    fn born_tick(&self) -> u32 {
        self.born_tick
    }
}
