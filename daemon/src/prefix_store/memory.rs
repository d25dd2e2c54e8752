//! The memory tier: which KV pool blocks hold which full, hashed prefix blocks.
//!
//! A block whose positions are all computed is registered under its [`BlockHash`]
//! (with its token ids, checked on every hit). When the last sequence using it lets go,
//! the block keeps its hash and joins an LRU list of evictable blocks instead of the
//! free list; a later prompt with the same prefix takes it back (reference counts go
//! up again), and the allocator only reuses it, dropping its hash, when no never-hashed
//! block is free (lazy eviction, as vLLM's prefix caching block allocator).

use std::collections::{BTreeMap, HashMap};

use super::hash::BlockHash;

/// Index of a block in the KV pool (as [`crate::scheduler::BlockId`]).
pub type PoolBlock = u32;

#[derive(Debug, Clone)]
struct Slot {
    hash: BlockHash,
    tokens: Box<[u32]>,
    /// LRU tick while the block is evictable (no owner).
    evictable_since: Option<u64>,
}

/// Hash ↔ block map plus the LRU order of cached blocks nobody owns.
#[derive(Debug, Default)]
pub struct MemoryIndex {
    by_hash: HashMap<BlockHash, PoolBlock>,
    slots: HashMap<PoolBlock, Slot>,
    /// Evictable blocks by the tick at which they were released (oldest first).
    lru: BTreeMap<u64, PoolBlock>,
    tick: u64,
}

impl MemoryIndex {
    /// An empty index.
    pub fn new() -> Self {
        Self::default()
    }

    /// Blocks holding a registered prefix block (owned or evictable).
    pub fn cached_blocks(&self) -> usize {
        self.slots.len()
    }

    /// Cached blocks no sequence owns (reusable by the allocator).
    pub fn evictable_blocks(&self) -> usize {
        self.lru.len()
    }

    /// Whether `block` is cached and owned by nobody.
    pub fn is_evictable(&self, block: PoolBlock) -> bool {
        self.slots
            .get(&block)
            .is_some_and(|s| s.evictable_since.is_some())
    }

    /// Whether `block` holds a registered prefix block.
    pub fn is_cached(&self, block: PoolBlock) -> bool {
        self.slots.contains_key(&block)
    }

    /// Whether some block holds `hash`.
    pub fn contains(&self, hash: &BlockHash) -> bool {
        self.by_hash.contains_key(hash)
    }

    /// The block holding `hash` if its token ids equal `tokens`.
    pub fn lookup(&self, hash: &BlockHash, tokens: &[u32]) -> Option<PoolBlock> {
        let &b = self.by_hash.get(hash)?;
        let slot = self.slots.get(&b)?;
        (*slot.tokens == *tokens).then_some(b)
    }

    /// Registers `block` (owned, fully computed) as holding `hash` / `tokens`. Returns
    /// false, changing nothing, when the hash is already held by a block or `block`
    /// already holds one.
    pub fn register(&mut self, block: PoolBlock, hash: BlockHash, tokens: &[u32]) -> bool {
        if self.by_hash.contains_key(&hash) || self.slots.contains_key(&block) {
            return false;
        }
        self.by_hash.insert(hash, block);
        self.slots.insert(
            block,
            Slot {
                hash,
                tokens: tokens.into(),
                evictable_since: None,
            },
        );
        true
    }

    /// Marks the cached `block` as owned by nobody (most recently used end of the LRU).
    pub fn release(&mut self, block: PoolBlock) {
        if let Some(slot) = self.slots.get_mut(&block) {
            if slot.evictable_since.is_none() {
                self.tick += 1;
                slot.evictable_since = Some(self.tick);
                self.lru.insert(self.tick, block);
            }
        }
    }

    /// Takes the evictable `block` back into use (a prefix hit).
    pub fn acquire(&mut self, block: PoolBlock) {
        if let Some(slot) = self.slots.get_mut(&block) {
            if let Some(t) = slot.evictable_since.take() {
                self.lru.remove(&t);
            }
        }
    }

    /// Evicts the least recently released block: drops its hash and returns the block
    /// for reuse with the hash it held.
    pub fn evict_lru(&mut self) -> Option<(PoolBlock, BlockHash)> {
        let (_, block) = self.lru.pop_first()?;
        let slot = self.slots.remove(&block)?;
        self.by_hash.remove(&slot.hash);
        Some((block, slot.hash))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn register_lookup_verify_tokens_and_lru() {
        let mut m = MemoryIndex::new();
        let (h1, h2, h3) = (BlockHash([1; 32]), BlockHash([2; 32]), BlockHash([3; 32]));
        assert!(m.register(10, h1, &[1, 2]));
        assert!(!m.register(11, h1, &[1, 2]), "hash already held");
        assert!(!m.register(10, h2, &[3, 4]), "block already holds a hash");
        assert!(m.register(11, h2, &[3, 4]));
        assert!(m.register(12, h3, &[5, 6]));
        assert_eq!(m.lookup(&h1, &[1, 2]), Some(10));
        assert_eq!(m.lookup(&h1, &[1, 3]), None, "token ids are verified");
        assert_eq!(m.evict_lru(), None, "owned blocks are not evictable");
        m.release(11);
        m.release(10);
        m.release(12);
        assert_eq!(m.evictable_blocks(), 3);
        m.acquire(10); // a hit takes it back
        assert!(!m.is_evictable(10));
        assert_eq!(
            m.evict_lru().map(|e| e.0),
            Some(11),
            "least recently released first"
        );
        assert!(!m.contains(&h2));
        assert_eq!(m.lookup(&h2, &[3, 4]), None);
        assert_eq!(m.evict_lru().map(|e| e.0), Some(12));
        assert_eq!(m.evict_lru(), None);
        assert_eq!(m.cached_blocks(), 1);
    }
}
