//! One moment of a GHC program split into the parts of the model.

use super::{GhcDecomposition, GhcPoint};

/// Splits one moment into the parts of the model (see [`GhcDecomposition`]): the heap's
/// parts need its size, the split of blocks in use needs live data, and the parts
/// outside the heap need RSS too.
pub fn decompose(p: &GhcPoint) -> GhcDecomposition {
    // Blocks handed out by the block allocator: reported on 9.2+, else heap size minus
    // the free blocks the last collection counted.
    let blocks_in_use = p.heap_size.map(|heap| match (p.blocks_size, p.gc_frag) {
        (Some(b), _) => b.min(heap),
        (None, Some(frag)) => heap.saturating_sub(frag),
        (None, None) => heap,
    });
    let live = p.live.map(|l| blocks_in_use.map_or(l, |b| l.min(b)));
    let mut d = GhcDecomposition {
        t_ms: p.t_ms,
        rss: p.rss,
        live,
        copy_reserve_and_slop: blocks_in_use.zip(live).map(|(b, l)| b - l),
        free_resident_pages: p.heap_size.zip(blocks_in_use).map(|(h, b)| h - b),
        lazy_free: p.lazy_free,
        heap_size: p.heap_size,
        blocks_size: p.blocks_size,
        gc_frag: p.gc_frag,
        gc_slop: p.gc_slop,
        rss_minus_lazy_free: p.rss_minus_lazy_free,
        outside_live: p.heap_size.zip(p.live).map(|(h, l)| h.saturating_sub(l)),
        ..Default::default()
    };
    let (Some(rss), Some(anon), Some(file), Some(lazy)) =
        (p.rss, p.rss_anon, p.rss_file, p.lazy_free)
    else {
        return d;
    };
    d.file = Some(file);
    d.outside_live = p.live.map(|l| rss.saturating_sub(lazy).saturating_sub(l));
    // Without a heap size every byte of RSS would look outside the heap.
    let Some(heap_size) = p.heap_size else {
        return d;
    };
    let to_space = p.to_space.unwrap_or(0);
    let non_heap = rss as i64 - heap_size as i64 - lazy as i64 - to_space as i64;
    let other_anon = (anon as i64 - heap_size as i64 - lazy as i64 - to_space as i64).max(0) as u64;
    // The heap's parts add up to heap size plus to-space whether or not live data is
    // known.
    let explained = heap_size + to_space + lazy + other_anon + file;
    d.copy_reserve_and_slop = d.copy_reserve_and_slop.map(|c| c + to_space);
    d.to_space = p.to_space;
    d.other_anon = Some(other_anon);
    d.unexplained = Some(rss as i64 - explained as i64);
    d.non_heap = Some(non_heap);
    d
}
