//! The encoder cache: an item's encoder outputs kept under its content digest (the item's bytes
//! under the encoder identity: plugin library, parsed configuration, preprocessing options,
//! checkpoint weights), in a least-recently-used map bounded in bytes. A hit skips the item's
//! decoding, preprocessing and encoder; a multi-turn conversation resends its image every turn.
//!
//! Shared by the HTTP side (which looks items up before preprocessing them) and the engine
//! thread (which inserts what it encoded), behind one mutex held only to look up or insert.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use mlxcel_plugin_api::MediaGrid;

use crate::multimodal::Digest;

/// One item's encoder outputs, with the grid its preprocessing gave (what the prompt layout
/// and the prefill contract need of the item).
#[derive(Debug)]
pub(crate) struct Encoded {
    pub(crate) grid: MediaGrid,
    /// Every encoder output's rows that belong to the item, in the graph's order.
    pub(crate) outputs: Vec<(String, Vec<f32>)>,
}

impl Encoded {
    /// What the entry costs the budget: its feature bytes.
    fn bytes(&self) -> u64 {
        self.outputs.iter().map(|(name, rows)| (name.len() + rows.len() * 4) as u64).sum()
    }
}

#[derive(Debug, Default)]
struct Lru {
    entries: HashMap<Digest, (Arc<Encoded>, u64)>,
    /// Last use -> digest, oldest first.
    order: BTreeMap<u64, Digest>,
    tick: u64,
    bytes: u64,
}

/// See the module documentation.
#[derive(Debug)]
pub(crate) struct EncoderCache {
    budget: u64,
    lru: Mutex<Lru>,
    hits: AtomicU64,
    misses: AtomicU64,
    evictions: AtomicU64,
}

/// The cache's counters, for `/metrics`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct CacheStats {
    pub(crate) hits: u64,
    pub(crate) misses: u64,
    pub(crate) evictions: u64,
    pub(crate) entries: u64,
    pub(crate) bytes: u64,
    pub(crate) budget: u64,
}

impl EncoderCache {
    /// A cache holding at most `budget` bytes of features (0 keeps nothing).
    pub(crate) fn new(budget: u64) -> Self {
        EncoderCache {
            budget,
            lru: Mutex::new(Lru::default()),
            hits: AtomicU64::new(0),
            misses: AtomicU64::new(0),
            evictions: AtomicU64::new(0),
        }
    }

    /// The item under `digest`, now the most recently used; counts a hit or a miss.
    pub(crate) fn get(&self, digest: &Digest) -> Option<Arc<Encoded>> {
        let found = self.lru.lock().ok().and_then(|mut lru| {
            let Lru { entries, order, tick, .. } = &mut *lru;
            let (encoded, used) = entries.get_mut(digest)?;
            order.remove(used);
            *tick += 1;
            *used = *tick;
            order.insert(*tick, *digest);
            Some(Arc::clone(encoded))
        });
        let counter = if found.is_some() { &self.hits } else { &self.misses };
        counter.fetch_add(1, Ordering::Relaxed);
        found
    }

    /// Keeps `encoded` under `digest`, evicting the least recently used entries until it fits.
    /// An item larger than the whole budget is not kept.
    pub(crate) fn insert(&self, digest: Digest, encoded: Arc<Encoded>) {
        let size = encoded.bytes();
        if size > self.budget {
            return;
        }
        let Ok(mut lru) = self.lru.lock() else { return };
        if let Some((old, used)) = lru.entries.remove(&digest) {
            lru.order.remove(&used);
            lru.bytes -= old.bytes();
        }
        while lru.bytes + size > self.budget {
            let Some((_, oldest)) = lru.order.pop_first() else { break };
            if let Some((old, _)) = lru.entries.remove(&oldest) {
                lru.bytes -= old.bytes();
                self.evictions.fetch_add(1, Ordering::Relaxed);
            }
        }
        lru.tick += 1;
        let tick = lru.tick;
        lru.order.insert(tick, digest);
        lru.entries.insert(digest, (encoded, tick));
        lru.bytes += size;
    }

    pub(crate) fn stats(&self) -> CacheStats {
        let (entries, bytes) = self.lru.lock().map_or((0, 0), |lru| (lru.entries.len() as u64, lru.bytes));
        CacheStats {
            hits: self.hits.load(Ordering::Relaxed),
            misses: self.misses.load(Ordering::Relaxed),
            evictions: self.evictions.load(Ordering::Relaxed),
            entries,
            bytes,
            budget: self.budget,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An item of `rows` feature values (4 bytes each, plus the output's name: 3 bytes).
    fn item(rows: usize) -> Arc<Encoded> {
        let grid = MediaGrid { dims: Default::default(), feature_tokens: rows as u32 };
        Arc::new(Encoded { grid, outputs: vec![("out".to_owned(), vec![1.0; rows])] })
    }

    fn digest(n: u8) -> Digest {
        [n; 16]
    }

    #[test]
    fn eviction_keeps_the_bytes_within_the_budget_dropping_the_least_recently_used() {
        // Room for two items of 10 values (43 bytes each), not three.
        let cache = EncoderCache::new(100);
        cache.insert(digest(1), item(10));
        cache.insert(digest(2), item(10));
        assert!(cache.get(&digest(1)).is_some(), "1 is now the most recently used");
        cache.insert(digest(3), item(10));
        assert!(cache.get(&digest(2)).is_none(), "2 was the least recently used");
        assert!(cache.get(&digest(1)).is_some() && cache.get(&digest(3)).is_some());
        let stats = cache.stats();
        assert_eq!((stats.entries, stats.bytes, stats.evictions), (2, 86, 1));
        assert_eq!((stats.hits, stats.misses), (3, 1));

        // One item larger than the budget is not kept and evicts nothing.
        cache.insert(digest(4), item(30));
        assert!(cache.get(&digest(4)).is_none());
        assert_eq!(cache.stats().entries, 2);
        // Replacing an entry counts its bytes once.
        cache.insert(digest(1), item(5));
        assert_eq!(cache.stats().bytes, 43 + 23);

        let off = EncoderCache::new(0);
        off.insert(digest(1), item(1));
        assert!(off.get(&digest(1)).is_none(), "a zero budget keeps nothing");
    }
}
