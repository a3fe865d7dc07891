//! Size classes plus a periodic packing (seed 002's plan: "a periodic reshuffling of
//! memory, to move objects to tightly pack spans and free the rest up for release"):
//! every `period_ms` of trace time, each class's live objects in partly used spans are
//! moved into the fewest spans (the fullest are kept and filled, the others emptied and
//! returned). Costs: bytes and objects moved, and when.
//!
//! Settings: those of `sizeclass`, plus `period_ms=1000` and `min_free_spans=1` (a class
//! is packed only if that frees at least this many spans).

use std::collections::BTreeMap;

use super::sizeclass::{SizeClassConfig, Slabs, SIZECLASS_KEYS};
use super::{parse_u64, unknown_key, Costs, Model, MoveEvent, Op, MAX_EVENTS};

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CompactingConfig {
    pub classes: SizeClassConfig,
    pub period_ms: u64,
    pub min_free_spans: u64,
}

impl CompactingConfig {
    pub fn from_settings(settings: &[(String, String)], page: u64) -> Result<Self, String> {
        let (classes, rest) = SizeClassConfig::from_settings_partial(settings, page)?;
        let mut c = Self {
            classes,
            period_ms: 1000,
            min_free_spans: 1,
        };
        for (k, v) in rest {
            match k.as_str() {
                "period_ms" => c.period_ms = parse_u64(&k, &v)?,
                "min_free_spans" => c.min_free_spans = parse_u64(&k, &v)?.max(1),
                _ => {
                    let mut known = SIZECLASS_KEYS.to_vec();
                    known.extend(["period_ms", "min_free_spans"]);
                    return Err(unknown_key(&k, &known));
                }
            }
        }
        if c.period_ms == 0 {
            return Err("period_ms must be more than 0".into());
        }
        Ok(c)
    }
}

pub struct Compacting {
    cfg: CompactingConfig,
    slabs: Slabs,
    next_ms: u64,
    costs: Costs,
}

impl Compacting {
    pub fn new(cfg: CompactingConfig) -> Self {
        Self {
            slabs: Slabs::new(cfg.classes.clone()),
            next_ms: cfg.period_ms,
            cfg,
            costs: Costs::default(),
        }
    }

    /// Packs every class; returns (bytes, objects, spans freed).
    fn pack(&mut self) -> (u64, u64, u64) {
        let (mut bytes, mut objects, mut freed) = (0, 0, 0);
        for class in 0..self.slabs.classes.len() {
            let spans: Vec<u32> = self.slabs.classes[class].nonfull.iter().copied().collect();
            if spans.len() < 2 {
                continue;
            }
            let nregs = u64::from(self.slabs.spans[spans[0] as usize].nregs);
            let live: u64 = spans
                .iter()
                .map(|&s| {
                    let s = &self.slabs.spans[s as usize];
                    u64::from(s.nregs - s.nfree)
                })
                .sum();
            let needed = live.div_ceil(nregs);
            if (spans.len() as u64) < needed + self.cfg.min_free_spans {
                continue;
            }
            // Keep the fullest spans (lowest numbers first among equals), empty the rest.
            let mut order = spans;
            order.sort_by_key(|&s| (self.slabs.spans[s as usize].nfree, s));
            let (targets, sources) = order.split_at(needed as usize);
            let csize = u64::from(self.slabs.cfg.table.sizes[class]);
            let mut t = 0;
            for &src in sources {
                for slot in self.slabs.used_slots(src) {
                    while self.slabs.spans[targets[t] as usize].nfree == 0 {
                        t += 1;
                    }
                    self.slabs.move_block(src, slot, targets[t], None);
                    bytes += csize;
                    objects += 1;
                }
                self.slabs.retire(src);
                freed += 1;
            }
            for &tg in targets {
                if self.slabs.spans[tg as usize].nfree == 0 {
                    self.slabs.remove_nonfull(class, tg);
                }
            }
        }
        (bytes, objects, freed)
    }
}

impl Model for Compacting {
    fn alloc(&mut self, id: u32, size: u64, _tid: u32) {
        self.slabs.alloc(id, size);
    }
    fn free(&mut self, id: u32, _size: u64, _tid: u32) {
        self.slabs.free(id);
    }
    fn advance(&mut self, ms: u64) {
        while self.next_ms <= ms {
            let at = self.next_ms;
            self.slabs.advance(at);
            let (bytes, objects, freed) = self.pack();
            self.costs.passes += 1;
            self.costs.bytes_moved += bytes;
            self.costs.objects_moved += objects;
            if objects > 0 && self.costs.events.len() < MAX_EVENTS {
                self.costs.events.push(MoveEvent {
                    t_ms: at as f64,
                    bytes,
                    objects,
                    spans_freed: freed,
                });
            }
            self.next_ms += self.cfg.period_ms;
        }
        self.slabs.advance(ms);
    }
    fn prefetch(&self, op: &Op, stage: u8) {
        self.slabs.prefetch(op, stage);
    }
    fn rss(&self) -> u64 {
        self.slabs.rss()
    }
    fn costs(&self) -> Costs {
        let mut c = self.costs.clone();
        self.slabs.counters(&mut c.counters);
        c
    }
    fn config(&self) -> BTreeMap<String, String> {
        let mut m = BTreeMap::new();
        self.cfg.classes.describe(&mut m);
        m.insert("period_ms".into(), self.cfg.period_ms.to_string());
        m.insert("min_free_spans".into(), self.cfg.min_free_spans.to_string());
        m
    }
}

#[cfg(test)]
mod tests {
    use super::super::testing::*;
    use super::super::Op;
    use super::*;

    #[test]
    fn packing_frees_the_spans_that_survivors_pin() {
        let mut m = Compacting::new(CompactingConfig::from_settings(&[], 4096).unwrap());
        play(&mut m, &allocs(640, 64));
        let mut ops: Vec<Op> = (0..640)
            .filter(|i| i % 10 != 0)
            .map(|i| free(i, 64))
            .collect();
        ops.push(Op::Time { ms: 999 });
        play(&mut m, &ops);
        assert_eq!(m.rss(), 10 * 4096, "nothing moves before the first pass");
        play(&mut m, &[Op::Time { ms: 1000 }]);
        assert_eq!(m.rss(), 4096, "64 survivors fit one span");
        let c = m.costs();
        assert_eq!(c.objects_moved, 64 - 7);
        assert_eq!(c.bytes_moved, 57 * 64);
        assert_eq!(c.events.len(), 1);
        assert_eq!(c.events[0].spans_freed, 9);
        // Moved blocks are still found by their ids.
        let ops: Vec<Op> = (0..640)
            .filter(|i| i % 10 == 0)
            .map(|i| free(i, 64))
            .collect();
        play(&mut m, &ops);
        assert_eq!(m.rss(), 0);
    }

    #[test]
    fn settings() {
        let s = |k: &str, v: &str| vec![(k.to_string(), v.to_string())];
        assert!(CompactingConfig::from_settings(&s("period_ms", "0"), 4096).is_err());
        let e = CompactingConfig::from_settings(&s("perio", "5"), 4096).unwrap_err();
        assert!(e.contains("period_ms"), "{e}");
        let c = CompactingConfig::from_settings(&s("purge", "decay:50"), 4096).unwrap();
        assert_eq!(c.classes.purge, super::super::sizeclass::Purge::Decay(50));
    }
}
