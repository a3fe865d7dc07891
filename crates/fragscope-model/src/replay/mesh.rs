//! Size classes with randomized placement and meshing (Mesh, Powers et al., PLDI 2019):
//! an allocation takes a random free slot of its span, so the live slots of two spans of
//! a class are likely to be disjoint; every `period_ms` of trace time, spans of each
//! class that are at most `occupancy_max` full are split into two random halves and each
//! span of one half is tried against `probes` spans of the other (SplitMesher); a pair
//! whose occupancy bitmaps are disjoint is meshed: the objects of one are copied into the
//! same offsets of the other's physical pages, and its pages are returned. Costs: meshes
//! and bytes copied.
//!
//! Settings: those of `sizeclass`, plus `period_ms=100`, `probes=64`,
//! `occupancy_max=0.8` and `seed=1`.

use std::collections::BTreeMap;

use super::sizeclass::{Rng, SizeClassConfig, Slabs, SIZECLASS_KEYS};
use super::{parse_u64, unknown_key, Costs, Model, MoveEvent, Op, MAX_EVENTS};

#[derive(Debug, Clone, PartialEq)]
pub struct MeshConfig {
    pub classes: SizeClassConfig,
    pub period_ms: u64,
    pub probes: u64,
    pub occupancy_max: f64,
    pub seed: u64,
}

impl MeshConfig {
    pub fn from_settings(settings: &[(String, String)], page: u64) -> Result<Self, String> {
        let (classes, rest) = SizeClassConfig::from_settings_partial(settings, page)?;
        let mut c = Self {
            classes,
            period_ms: 100,
            probes: 64,
            occupancy_max: 0.8,
            seed: 1,
        };
        for (k, v) in rest {
            match k.as_str() {
                "period_ms" => c.period_ms = parse_u64(&k, &v)?,
                "probes" => c.probes = parse_u64(&k, &v)?.max(1),
                "seed" => c.seed = parse_u64(&k, &v)?,
                "occupancy_max" => {
                    c.occupancy_max = v
                        .parse::<f64>()
                        .ok()
                        .filter(|x| (0.0..=1.0).contains(x))
                        .ok_or_else(|| format!("occupancy_max={v}: expected 0 to 1"))?
                }
                _ => {
                    let mut known = SIZECLASS_KEYS.to_vec();
                    known.extend(["period_ms", "probes", "occupancy_max", "seed"]);
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

pub struct Mesh {
    cfg: MeshConfig,
    slabs: Slabs,
    rng: Rng,
    next_ms: u64,
    costs: Costs,
}

impl Mesh {
    pub fn new(cfg: MeshConfig) -> Self {
        let mut slabs = Slabs::new(cfg.classes.clone());
        slabs.random = Some(Rng::new(cfg.seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ 7));
        Self {
            rng: Rng::new(cfg.seed ^ 0xD1B5_4A32_D192_ED03),
            slabs,
            next_ms: cfg.period_ms,
            cfg,
            costs: Costs::default(),
        }
    }

    /// The used-slot bitmaps of `spans` (bits past the last slot cleared), one after
    /// another, and their used counts: the probes then read contiguous memory instead of
    /// chasing each span.
    fn bitmaps(&self, spans: &[u32], words: usize) -> (Vec<u64>, Vec<u32>) {
        let mut bits = Vec::with_capacity(spans.len() * words);
        let mut used = Vec::with_capacity(spans.len());
        for &sp in spans {
            let s = &self.slabs.spans[sp as usize];
            bits.extend_from_slice(&s.used);
            if !s.nregs.is_multiple_of(64) {
                let last = bits.len() - 1;
                bits[last] &= (1u64 << (s.nregs % 64)) - 1;
            }
            used.push(s.nregs - s.nfree);
        }
        (bits, used)
    }

    /// One meshing pass over every class; returns (bytes, objects, meshes).
    fn mesh_all(&mut self) -> (u64, u64, u64) {
        let (mut bytes, mut objects, mut meshes) = (0, 0, 0);
        for class in 0..self.slabs.classes.len() {
            let mut cand: Vec<u32> = self.slabs.classes[class]
                .nonfull
                .iter()
                .copied()
                .filter(|&s| {
                    let s = &self.slabs.spans[s as usize];
                    let used = f64::from(s.nregs - s.nfree);
                    s.nfree < s.nregs && used <= self.cfg.occupancy_max * f64::from(s.nregs)
                })
                .collect();
            if cand.len() < 2 {
                continue;
            }
            for i in (1..cand.len()).rev() {
                let j = self.rng.below(i as u64 + 1) as usize;
                cand.swap(i, j);
            }
            let half = cand.len() / 2;
            let (left, right) = cand.split_at(half);
            let mut right_used = vec![false; right.len()];
            let csize = u64::from(self.slabs.cfg.table.sizes[class]);
            let nregs = self.slabs.spans[left[0] as usize].nregs;
            let words = self.slabs.spans[left[0] as usize].used.len();
            let (lbits, lused) = self.bitmaps(left, words);
            let (rbits, rused) = self.bitmaps(right, words);
            for (i, &l) in left.iter().enumerate() {
                let lb = &lbits[i * words..(i + 1) * words];
                for k in 0..(self.cfg.probes as usize).min(right.len()) {
                    let j = (i + k) % right.len();
                    if right_used[j] || lused[i] + rused[j] > nregs {
                        continue;
                    }
                    let rb = &rbits[j * words..(j + 1) * words];
                    if lb.iter().zip(rb).any(|(p, q)| p & q != 0) {
                        continue;
                    }
                    let r = right[j];
                    // The fuller span keeps its pages; the other's objects move.
                    let (nl, nr) = (
                        self.slabs.spans[l as usize].nfree,
                        self.slabs.spans[r as usize].nfree,
                    );
                    let (keep, go) = if nl <= nr { (l, r) } else { (r, l) };
                    for slot in self.slabs.used_slots(go) {
                        self.slabs.move_block(go, slot, keep, Some(slot));
                        bytes += csize;
                        objects += 1;
                    }
                    self.slabs.retire(go);
                    if self.slabs.spans[keep as usize].nfree == 0 {
                        self.slabs.remove_nonfull(class, keep);
                    }
                    right_used[j] = true;
                    meshes += 1;
                    break;
                }
            }
        }
        (bytes, objects, meshes)
    }
}

impl Model for Mesh {
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
            let (bytes, objects, meshes) = self.mesh_all();
            self.costs.passes += 1;
            self.costs.bytes_moved += bytes;
            self.costs.objects_moved += objects;
            self.costs.meshes += meshes;
            if meshes > 0 && self.costs.events.len() < MAX_EVENTS {
                self.costs.events.push(MoveEvent {
                    t_ms: at as f64,
                    bytes,
                    objects,
                    spans_freed: meshes,
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
        m.insert("probes".into(), self.cfg.probes.to_string());
        m.insert("occupancy_max".into(), self.cfg.occupancy_max.to_string());
        m.insert("seed".into(), self.cfg.seed.to_string());
        m
    }
}

#[cfg(test)]
mod tests {
    use super::super::testing::*;
    use super::super::Op;
    use super::*;

    #[test]
    fn disjoint_spans_mesh_into_one() {
        let mut m = Mesh::new(MeshConfig::from_settings(&[], 4096).unwrap());
        play(&mut m, &allocs(64 * 100, 64));
        assert_eq!(m.rss(), 100 * 4096);
        // Keep 4 random objects of each span.
        let ops: Vec<Op> = (0..6400)
            .filter(|i| i % 16 != 0)
            .map(|i| free(i, 64))
            .collect();
        play(&mut m, &ops);
        assert_eq!(m.rss(), 100 * 4096);
        let mut t = 0;
        for _ in 0..20 {
            t += 100;
            play(&mut m, &[Op::Time { ms: t }]);
        }
        let c = m.costs();
        assert!(
            m.rss() <= 30 * 4096,
            "{} pages after meshing",
            m.rss() / 4096
        );
        assert!(c.meshes >= 70, "{c:?}");
        assert_eq!(c.bytes_moved, c.objects_moved * 64);
        // Every block is still where the model put it: freeing all empties the heap.
        let ops: Vec<Op> = (0..6400)
            .filter(|i| i % 16 == 0)
            .map(|i| free(i, 64))
            .collect();
        play(&mut m, &ops);
        assert_eq!(m.rss(), 0);
    }
}
