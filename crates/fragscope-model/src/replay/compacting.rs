//! Size classes plus a periodic packing (seed 002's plan: "a periodic reshuffling of
//! memory, to move objects to tightly pack spans and free the rest up for release"):
//! every `period_ms` of trace time, each class's live objects in partly used spans are
//! moved into the fewest spans (the fullest are kept and filled, the others emptied and
//! returned). Costs: bytes and objects moved, and when.
//!
//! Settings: those of `sizeclass`, plus `period_ms=1000` and `min_free_spans=1` (a class
//! is packed only if that frees at least this many spans).

use std::collections::BTreeMap;

use super::sizeclass::{Moving, Pass, PassResult, SizeClassConfig, Slabs, SIZECLASS_KEYS};
use super::{parse_u64, unknown_key};

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

/// Size classes packed every `period_ms`.
pub(crate) type Compacting = Moving<Packing>;

impl Compacting {
    pub fn new(cfg: CompactingConfig) -> Self {
        let slabs = Slabs::new(cfg.classes.clone());
        Moving::with(Packing { cfg }, slabs)
    }
}

/// The packing pass.
pub(crate) struct Packing {
    cfg: CompactingConfig,
}

impl Pass for Packing {
    fn period_ms(&self) -> Option<u64> {
        Some(self.cfg.period_ms)
    }

    /// Packs every class.
    fn run(&mut self, slabs: &mut Slabs) -> PassResult {
        let (mut bytes, mut objects, mut freed) = (0, 0, 0);
        for class in 0..slabs.classes.len() {
            let spans: Vec<u32> = slabs.classes[class].nonfull.iter().copied().collect();
            if spans.len() < 2 {
                continue;
            }
            let nregs = u64::from(slabs.spans[spans[0] as usize].nregs);
            let live: u64 = spans
                .iter()
                .map(|&s| {
                    let s = &slabs.spans[s as usize];
                    u64::from(s.nregs - s.nfree)
                })
                .sum();
            let needed = live.div_ceil(nregs);
            if (spans.len() as u64) < needed + self.cfg.min_free_spans {
                continue;
            }
            // Keep the fullest spans (lowest numbers first among equals), empty the rest.
            let mut order = spans;
            order.sort_by_key(|&s| (slabs.spans[s as usize].nfree, s));
            let (targets, sources) = order.split_at(needed as usize);
            let csize = u64::from(slabs.cfg.table.sizes[class]);
            let mut t = 0;
            for &src in sources {
                for slot in slabs.used_slots(src) {
                    while slabs.spans[targets[t] as usize].nfree == 0 {
                        t += 1;
                    }
                    slabs.move_block(src, slot, targets[t], None);
                    bytes += csize;
                    objects += 1;
                }
                slabs.retire(src);
                freed += 1;
            }
            for &tg in targets {
                if slabs.spans[tg as usize].nfree == 0 {
                    slabs.remove_nonfull(class, tg);
                }
            }
        }
        PassResult {
            bytes,
            objects,
            spans_freed: freed,
            meshes: 0,
        }
    }

    fn describe(&self, out: &mut BTreeMap<String, String>) {
        out.insert("period_ms".into(), self.cfg.period_ms.to_string());
        out.insert("min_free_spans".into(), self.cfg.min_free_spans.to_string());
    }
}

#[cfg(test)]
mod tests {
    use super::super::testing::*;
    use super::super::{Model, Op};
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
