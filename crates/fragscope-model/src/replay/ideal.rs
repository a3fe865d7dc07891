//! The lower bound: the live (requested) bytes packed into whole pages, at every moment,
//! as if an allocator had no rounding, no headers and could move objects for free.

use std::collections::BTreeMap;

use super::{parse_u64, unknown_key, Costs, Model};

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IdealConfig {
    pub page: u64,
}

impl IdealConfig {
    pub fn from_settings(settings: &[(String, String)], page: u64) -> Result<Self, String> {
        let mut c = Self { page };
        for (k, v) in settings {
            match k.as_str() {
                "page" => c.page = parse_u64(k, v)?,
                _ => return Err(unknown_key(k, &["page"])),
            }
        }
        if c.page == 0 {
            return Err("page must be more than 0".into());
        }
        Ok(c)
    }
}

pub struct Ideal {
    cfg: IdealConfig,
    live: u64,
}

impl Ideal {
    pub fn new(cfg: IdealConfig) -> Self {
        Self { cfg, live: 0 }
    }
}

impl Model for Ideal {
    fn alloc(&mut self, _id: u32, size: u64, _tid: u32) {
        self.live += size;
    }
    fn free(&mut self, _id: u32, size: u64, _tid: u32) {
        self.live -= size;
    }
    fn advance(&mut self, _ms: u64) {}
    fn rss(&self) -> u64 {
        self.live.div_ceil(self.cfg.page) * self.cfg.page
    }
    fn costs(&self) -> Costs {
        Costs::default()
    }
    fn config(&self) -> BTreeMap<String, String> {
        BTreeMap::from([("page".to_string(), self.cfg.page.to_string())])
    }
}

#[cfg(test)]
mod tests {
    use super::super::testing::*;
    use super::*;

    #[test]
    fn live_bytes_in_whole_pages() {
        let mut m = Ideal::new(IdealConfig::from_settings(&[], 4096).unwrap());
        let mut ops = allocs(100, 100);
        play(&mut m, &ops);
        assert_eq!(m.rss(), 12288); // 10 000 bytes: 3 pages
        ops.clear();
        ops.extend((0..60).map(|i| free(i, 100)));
        play(&mut m, &ops);
        assert_eq!(m.rss(), 4096);
    }
}
