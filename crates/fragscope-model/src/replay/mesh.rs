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

use super::sizeclass::{Moving, Pass, PassResult, Rng, SizeClassConfig, Slabs, SIZECLASS_KEYS};
use super::{parse_u64, unknown_key};

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

/// Size classes with spans meshed every `period_ms`.
pub(crate) type Mesh = Moving<Meshing>;

impl Mesh {
    pub fn new(cfg: MeshConfig) -> Self {
        let mut slabs = Slabs::new(cfg.classes.clone());
        slabs.random = Some(Rng::new(cfg.seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ 7));
        let rng = Rng::new(cfg.seed ^ 0xD1B5_4A32_D192_ED03);
        Moving::with(Meshing { cfg, rng }, slabs)
    }
}

/// The meshing pass.
pub(crate) struct Meshing {
    cfg: MeshConfig,
    rng: Rng,
}

impl Meshing {
    /// The used-slot bitmaps of `spans` (bits past the last slot cleared), one after
    /// another, and their used counts: the probes then read contiguous memory instead of
    /// chasing each span.
    fn bitmaps(slabs: &Slabs, spans: &[u32], words: usize) -> (Vec<u64>, Vec<u32>) {
        let mut bits = Vec::with_capacity(spans.len() * words);
        let mut used = Vec::with_capacity(spans.len());
        for &sp in spans {
            let s = &slabs.spans[sp as usize];
            bits.extend_from_slice(&s.used);
            if !s.nregs.is_multiple_of(64) {
                let last = bits.len() - 1;
                bits[last] &= (1u64 << (s.nregs % 64)) - 1;
            }
            used.push(s.nregs - s.nfree);
        }
        (bits, used)
    }
}

impl Pass for Meshing {
    fn period_ms(&self) -> Option<u64> {
        Some(self.cfg.period_ms)
    }

    /// One meshing pass over every class.
    fn run(&mut self, slabs: &mut Slabs) -> PassResult {
        let (mut bytes, mut objects, mut meshes) = (0, 0, 0);
        for class in 0..slabs.classes.len() {
            let mut cand: Vec<u32> = slabs.classes[class]
                .nonfull
                .iter()
                .copied()
                .filter(|&s| {
                    let s = &slabs.spans[s as usize];
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
            let csize = u64::from(slabs.cfg.table.sizes[class]);
            let nregs = slabs.spans[left[0] as usize].nregs;
            let words = slabs.spans[left[0] as usize].used.len();
            let (lbits, lused) = Self::bitmaps(slabs, left, words);
            let (rbits, rused) = Self::bitmaps(slabs, right, words);
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
                    let (nl, nr) = (slabs.spans[l as usize].nfree, slabs.spans[r as usize].nfree);
                    let (keep, go) = if nl <= nr { (l, r) } else { (r, l) };
                    for slot in slabs.used_slots(go) {
                        slabs.move_block(go, slot, keep, Some(slot));
                        bytes += csize;
                        objects += 1;
                    }
                    slabs.retire(go);
                    if slabs.spans[keep as usize].nfree == 0 {
                        slabs.remove_nonfull(class, keep);
                    }
                    right_used[j] = true;
                    meshes += 1;
                    break;
                }
            }
        }
        PassResult {
            bytes,
            objects,
            spans_freed: meshes,
            meshes,
        }
    }

    fn describe(&self, out: &mut BTreeMap<String, String>) {
        out.insert("period_ms".into(), self.cfg.period_ms.to_string());
        out.insert("probes".into(), self.cfg.probes.to_string());
        out.insert("occupancy_max".into(), self.cfg.occupancy_max.to_string());
        out.insert("seed".into(), self.cfg.seed.to_string());
    }
}

#[cfg(test)]
mod tests {
    use super::super::testing::*;
    use super::super::{Model, Op};
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
