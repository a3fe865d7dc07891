//! What glibc keeps no list of, found by the chunk headers it wrote in the anonymous
//! mappings' resident pages: chunks mmapped alone, and the segments of a main arena that
//! grew by mmap. Only pages the snapshot found resident are read, many at once.

use fragscope_trace::Mapping;

use super::{
    le, CensusError, Region, Walk, ALIGN, FENCEPOST, IS_MMAPPED, MINSIZE, MMAPPED_SCAN_BATCH,
    NON_MAIN_ARENA, PREV_INUSE, SIZE_BITS, SIZE_SZ,
};

/// An anonymous, writable mapping: where glibc's mmapped chunks and a main arena's mmapped
/// segments are (never fragscope's own).
pub(super) fn anonymous(m: &Mapping) -> bool {
    m.inode == 0
        && m.perms.starts_with("rw")
        && (m.path.is_empty() || m.path.starts_with("[anon:"))
        && m.path != "[anon:fragscope]"
}

impl Walk<'_> {
    /// Chunks mmapped alone: in anonymous writable mappings outside the arenas' heaps,
    /// page-aligned chunk headers marked IS_MMAPPED. The kernel merges neighbouring
    /// anonymous mappings, so a mapping may hold other memory before, between or after
    /// them (a runtime's own arenas, such as CPython's pymalloc): past the last chunk the
    /// next one is looked for page by page, in batches. Returns how many, and their
    /// mappings' bytes (as glibc's `mp_.mmapped_mem` counts them).
    pub(super) fn mmapped(&mut self, maps: &[Mapping]) -> Result<(u64, u64), CensusError> {
        let page = self.page;
        let heaps = self.heap_ranges();
        let layout = self.release.mmapped;
        // The bytes of a chunk's mapping after the end its size gives.
        let tail = layout.tail();
        let (mut chunks, mut bytes) = (0, 0);
        for m in maps.iter().filter(|m| anonymous(m)) {
            if !self.mapping_readable(m) {
                continue;
            }
            // Runs of chunks (where, their size) one after another: each becomes a region
            // of counted pages.
            let mut runs: Vec<(u64, Vec<(u64, u64)>)> = Vec::new();
            let mut p = m.start;
            while p + 2 * SIZE_SZ <= m.end {
                // A main arena's segment or a thread arena's heap inside the mapping.
                if let Some(&(_, hi)) = heaps.iter().find(|&&(lo, hi)| lo <= p && p < hi) {
                    p = hi;
                    continue;
                }
                // Mmapped chunks may run into an arena's heap, where they end.
                let end = (heaps.iter().map(|&(lo, _)| lo))
                    .filter(|&lo| lo > p)
                    .min()
                    .unwrap_or(m.end)
                    .min(m.end);
                // A chunk at the start of its mapping, which is whole pages.
                let chunk_at = |h: &[u8], p: u64| {
                    let (prev, size) = (le(h, 0), le(h, 8));
                    let csize = size & !SIZE_BITS;
                    (size & IS_MMAPPED != 0
                        && prev == 0
                        && csize != 0
                        && (csize + tail).is_multiple_of(page)
                        && p + csize + tail <= end)
                        .then_some(csize)
                };
                let Some((at, header)) =
                    self.next_page_header(p, end, |h, a| chunk_at(h, a).is_some())?
                else {
                    p = end;
                    continue;
                };
                let csize = chunk_at(&header, at).expect("the header found");
                match runs.last_mut() {
                    Some((_, run)) if run.last().is_some_and(|&(a, c)| a + c + tail == at) => {
                        run.push((at, csize))
                    }
                    _ => runs.push((at, vec![(at, csize)])),
                }
                chunks += 1;
                bytes += csize + tail;
                p = at + csize + tail;
            }
            for (start, run) in runs {
                let (a, c) = *run.last().unwrap();
                let mut r = Region::new(start, a + c + tail, None, page);
                for &(lo, csize) in &run {
                    let mapped = csize + tail;
                    // Its header is the allocator's, and what its mapping holds after the
                    // program's bytes; it lends no bytes to the next chunk.
                    let user = lo + 2 * SIZE_SZ;
                    let user_end = user + layout.usable(csize);
                    r.add(lo, user, page, 1, true);
                    r.add(user, user_end, page, 1, false);
                    r.add(user_end, lo + mapped, page, 1, true);
                    self.classes.in_use(lo, mapped, page, 1);
                    if let Some(b) = &mut self.blocks {
                        b.push((lo, csize, true));
                    }
                }
                self.regions.push(r);
            }
        }
        Ok((chunks, bytes))
    }

    /// The address ranges of the arenas' heaps walked so far.
    fn heap_ranges(&self) -> Vec<(u64, u64)> {
        (self.regions.iter())
            .map(|r| (r.start, r.start + r.in_use.len() as u64 * self.page))
            .collect()
    }

    /// Whether a page may be read: only pages the snapshot found resident are. Reading a
    /// page never touched would map the kernel's zero page there, which pagemap then shows
    /// present (a JVM's committed, untouched heap regions and thread stacks looked
    /// resident after a snapshot read them). A header glibc wrote is on a resident page.
    pub(super) fn readable(&self, at: u64) -> bool {
        !self.residency.covers(at) || self.residency.resident(at)
    }

    /// Whether the memory read has mapping `m`: a forked copy lacks those marked
    /// MADV_DONTFORK, as Node's V8 marks its heap. Such a mapping holds nothing of glibc's,
    /// which never marks its own; glibc's own counts, checked after, still catch a chunk
    /// or segment missed.
    fn mapping_readable(&mut self, m: &Mapping) -> bool {
        let mut first = [0u8; 16];
        m.start + 2 * SIZE_SZ > m.end
            || !self.readable(m.start)
            || self.mem.read(m.start, &mut first).is_ok()
    }

    /// The first page from `from` (a page's start) whose first 16 bytes, `wanted` at
    /// their address, start within `end`, with those bytes; resident pages only, read
    /// many at once: one page first (what is looked for often follows what was found),
    /// then batches growing to MMAPPED_SCAN_BATCH pages.
    fn next_page_header(
        &mut self,
        from: u64,
        end: u64,
        wanted: impl Fn(&[u8], u64) -> bool,
    ) -> Result<Option<(u64, [u8; 16])>, CensusError> {
        let page = self.page;
        let mut headers = Vec::new();
        let mut p = from;
        let mut batch_pages = 1;
        while p + 2 * SIZE_SZ <= end {
            let pages = (0..batch_pages)
                .map(|i| p + i * page)
                .take_while(|&a| a + 2 * SIZE_SZ <= end);
            let batch: Vec<(u64, usize)> = pages
                .filter(|&a| self.readable(a))
                .map(|a| (a, 16))
                .collect();
            self.mem.read_ranges(&batch, &mut headers)?;
            let found = batch.iter().enumerate().find_map(|(i, &(a, _))| {
                let h = &headers[i * 16..][..16];
                wanted(h, a).then(|| (a, h.try_into().expect("16 bytes")))
            });
            if found.is_some() {
                return Ok(found);
            }
            p += batch_pages * page;
            batch_pages = (batch_pages * 16).min(MMAPPED_SCAN_BATCH);
        }
        Ok(None)
    }

    /// The segments of a main arena that grew by mmap once its brk heap could not grow
    /// (sysmalloc then sets NONCONTIGUOUS_BIT and never relies on contiguity again): the
    /// brk heap from `brk_start`, and each mapping glibc took for the arena, found by the
    /// chunk it begins with; every segment but the top's ends with two fenceposts. glibc
    /// keeps no list of them; their sizes are checked against the arena's count after.
    /// The top's segment comes last.
    pub(super) fn main_arena_segments(
        &mut self,
        maps: &[Mapping],
        brk_start: Option<u64>,
        top: u64,
        top_end: u64,
    ) -> Result<Vec<(u64, u64)>, CensusError> {
        let page = self.page;
        let mut found = Vec::new();
        let brk_heap = maps.iter().find(|m| m.path == "[heap]");
        if let (Some(start), Some(heap)) = (brk_start, brk_heap) {
            if heap.start <= start && start < heap.end {
                let end =
                    self.segment_end(start.next_multiple_of(ALIGN), heap.end, top, top_end)?;
                found.push((
                    start,
                    end.ok_or_else(|| {
                        CensusError::Inconsistent(
                            "the brk heap of a main arena that also grew by mmap does not end as \
                         glibc ends it (two fenceposts or the top chunk)"
                                .into(),
                        )
                    })?,
                ));
            }
        }
        // A segment's first chunk: prev_size never written, nothing in use before it,
        // the main arena's.
        let first_chunk = |h: &[u8], _: u64| {
            let (prev, size) = (le(h, 0), le(h, 8));
            let csize = size & !SIZE_BITS;
            prev == 0
                && size & (PREV_INUSE | IS_MMAPPED | NON_MAIN_ARENA) == PREV_INUSE
                && csize >= MINSIZE
                && csize.is_multiple_of(ALIGN)
        };
        for m in maps.iter().filter(|m| anonymous(m)) {
            if !self.mapping_readable(m) {
                continue;
            }
            let mut p = m.start;
            while let Some((at, _)) = self.next_page_header(p, m.end, first_chunk)? {
                match self.segment_end(at, m.end, top, top_end)? {
                    Some(end) => {
                        found.push((at, end));
                        p = end.next_multiple_of(page);
                    }
                    None => p = at + page,
                }
            }
        }
        found.sort_by_key(|&(lo, hi)| (hi == top_end, lo));
        if found.iter().filter(|&&(_, hi)| hi == top_end).count() != 1 {
            return Err(CensusError::Inconsistent(format!(
                "the main arena grew by mmap, and its top chunk ({top:#x}) is not in exactly one \
                 of the {} segments found",
                found.len()
            )));
        }
        Ok(found)
    }

    /// Where the segment of the main arena whose first chunk is at `first` ends, walking
    /// its chunk headers no further than `bound`: after two fenceposts, or at the end of
    /// the top chunk. None: the chunks there do not hold together as such a segment (or
    /// lie on pages not resident, which are not read).
    fn segment_end(
        &mut self,
        first: u64,
        bound: u64,
        top: u64,
        top_end: u64,
    ) -> Result<Option<u64>, CensusError> {
        let mut p = first;
        loop {
            if p == top {
                return Ok((top_end <= bound).then_some(top_end));
            }
            if p + 2 * SIZE_SZ > bound || !self.readable(p + SIZE_SZ) {
                return Ok(None);
            }
            let size = self.size_at(p, bound)?;
            // Fenceposts, after what was the top, freed when the segment ended (a top
            // of 48 bytes became one more 16-byte chunk before them). The next segment
            // cannot start with one: its first chunk was a top.
            if size & !PREV_INUSE == FENCEPOST & !PREV_INUSE {
                let (mut at, mut last, mut count) = (p + 2 * SIZE_SZ, size, 1);
                while at + 2 * SIZE_SZ <= bound && self.readable(at + SIZE_SZ) {
                    let next = self.size_at(at, bound)?;
                    if next & !PREV_INUSE != FENCEPOST & !PREV_INUSE {
                        break;
                    }
                    (at, last, count) = (at + 2 * SIZE_SZ, next, count + 1);
                }
                return Ok((count >= 2 && last == FENCEPOST).then_some(at));
            }
            let csize = size & !SIZE_BITS;
            if size & (IS_MMAPPED | NON_MAIN_ARENA) != 0
                || csize < MINSIZE
                || !csize.is_multiple_of(ALIGN)
                || p + csize > bound
            {
                return Ok(None);
            }
            p += csize;
        }
    }
}
