//! Which pages of a process are resident, from the pagemap ranges read with the census
//! (`snapshot` reads them with the process held, before the heap).

use fragscope_trace::ResidentRange;

/// Page residency by address, from pagemap ranges.
pub(crate) struct Residency<'a> {
    ranges: Vec<&'a ResidentRange>,
    page: u64,
}

impl<'a> Residency<'a> {
    pub fn new(ranges: &'a [ResidentRange], page: u64) -> Self {
        let mut ranges: Vec<&ResidentRange> = ranges.iter().collect();
        ranges.sort_by_key(|r| r.start);
        Self { ranges, page }
    }
    pub fn resident(&self, addr: u64) -> bool {
        let i = self.ranges.partition_point(|r| r.start <= addr);
        i.checked_sub(1).is_some_and(|i| {
            let r = self.ranges[i];
            r.is_resident((addr - r.start) / self.page)
        })
    }
    /// Resident bytes of the whole pages in [lo, hi).
    pub fn resident_bytes(&self, lo: u64, hi: u64) -> u64 {
        let lo = lo.next_multiple_of(self.page);
        let hi = hi / self.page * self.page;
        (lo..hi.max(lo))
            .step_by(self.page as usize)
            .filter(|&p| self.resident(p))
            .count() as u64
            * self.page
    }
}
