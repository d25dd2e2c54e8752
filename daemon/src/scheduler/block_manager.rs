//! [`BlockManager`]: allocation of KV cache blocks to sequences, with reference counts.
//!
//! The model runner's [`crate::model::KvBlockPool`] stores values; this decides which
//! block holds which positions. Each sequence has a block table (position `p` lives in
//! `table[p / block_size]`), blocks carry reference counts so several sequences can
//! share one (a common prefix: vLLM's `BlockSpaceManager` and copy-on-write forks), and
//! a block returns to the free list when its count drops to zero.
//!
//! With prefix caching, full blocks are registered in a [`MemoryIndex`] under their
//! chained hash: such a block, when its count drops to zero, stays cached (evictable,
//! LRU) instead of joining the free list, and a later sequence with the same prefix
//! takes it back with [`BlockManager::admit_with_prefix`]. Allocation uses never-hashed
//! free blocks first and evicts the least recently released cached block only when
//! none is left.

use std::collections::{HashMap, VecDeque};

use crate::prefix_store::{BlockHash, MemoryIndex};
use crate::request::SeqId;

/// Index of a block in the KV pool.
pub type BlockId = u32;

/// Not enough free blocks for an allocation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("KV cache out of blocks: {needed} needed, {free} free")]
pub struct OutOfBlocks {
    /// Blocks the request needed.
    pub needed: usize,
    /// Blocks free at the time.
    pub free: usize,
}

/// Block allocator and per-sequence block tables.
#[derive(Debug)]
pub struct BlockManager {
    block_size: usize,
    /// Reference count per block; 0 = free.
    ref_counts: Vec<u32>,
    /// Free blocks, lowest id first when the pool is fresh (FIFO reuse).
    free: VecDeque<BlockId>,
    tables: HashMap<SeqId, Vec<BlockId>>,
    /// Hashed (prefix-cached) blocks, owned or evictable.
    cached: MemoryIndex,
    /// Hashes evicted since [`BlockManager::take_evicted`], while recording (the
    /// KV-cache events' `BlockRemoved`).
    evicted: Option<Vec<BlockHash>>,
}

impl BlockManager {
    /// A manager for `num_blocks` blocks of `block_size` tokens, all free.
    pub fn new(num_blocks: usize, block_size: usize) -> Self {
        Self {
            block_size: block_size.max(1),
            ref_counts: vec![0; num_blocks],
            free: (0..num_blocks as BlockId).collect(),
            tables: HashMap::new(),
            cached: MemoryIndex::new(),
            evicted: None,
        }
    }

    /// Records the hashes the allocator evicts from now on (see
    /// [`BlockManager::take_evicted`]).
    pub fn record_evictions(&mut self) {
        self.evicted.get_or_insert_with(Vec::new);
    }

    /// The hashes evicted since the last call, oldest first (empty when not
    /// recording).
    pub fn take_evicted(&mut self) -> Vec<BlockHash> {
        self.evicted
            .as_mut()
            .map(std::mem::take)
            .unwrap_or_default()
    }

    /// Tokens per block.
    pub fn block_size(&self) -> usize {
        self.block_size
    }

    /// Blocks in the pool.
    pub fn total_blocks(&self) -> usize {
        self.ref_counts.len()
    }

    /// Blocks with no owner: never-hashed free blocks plus evictable cached ones.
    pub fn free_blocks(&self) -> usize {
        self.free.len() + self.cached.evictable_blocks()
    }

    /// The memory tier of the prefix cache (read only).
    pub fn cache(&self) -> &MemoryIndex {
        &self.cached
    }

    /// Takes a block for a new owner: a never-hashed free block, else the least
    /// recently released cached one (its hash is dropped).
    fn take_block(&mut self) -> Option<BlockId> {
        if let Some(b) = self.free.pop_front() {
            return Some(b);
        }
        let (b, hash) = self.cached.evict_lru()?;
        if let Some(e) = self.evicted.as_mut() {
            e.push(hash);
        }
        Some(b)
    }

    /// Blocks owned by at least one sequence.
    pub fn used_blocks(&self) -> usize {
        self.total_blocks() - self.free_blocks()
    }

    /// Blocks needed to hold `tokens` positions.
    pub fn blocks_for(&self, tokens: usize) -> usize {
        tokens.div_ceil(self.block_size)
    }

    /// Tokens the whole pool holds.
    pub fn capacity_tokens(&self) -> usize {
        self.total_blocks() * self.block_size
    }

    /// The block table of `seq` (empty when it owns nothing).
    pub fn table(&self, seq: SeqId) -> &[BlockId] {
        self.tables.get(&seq).map_or(&[], |t| t.as_slice())
    }

    /// Extra blocks `seq` needs so that its table covers `tokens` positions.
    pub fn blocks_missing(&self, seq: SeqId, tokens: usize) -> usize {
        self.blocks_for(tokens)
            .saturating_sub(self.table(seq).len())
    }

    /// Grows the table of `seq` to cover `tokens` positions. All or nothing.
    ///
    /// # Errors
    /// [`OutOfBlocks`] when fewer blocks are free than needed; nothing is allocated then.
    pub fn ensure(&mut self, seq: SeqId, tokens: usize) -> Result<(), OutOfBlocks> {
        let needed = self.blocks_missing(seq, tokens);
        if needed == 0 {
            return Ok(());
        }
        let free = self.free_blocks();
        if needed > free {
            return Err(OutOfBlocks { needed, free });
        }
        let mut new = Vec::with_capacity(needed);
        for _ in 0..needed {
            let Some(b) = self.take_block() else {
                break; // unreachable: checked above
            };
            self.ref_counts[b as usize] = 1;
            new.push(b);
        }
        self.tables.entry(seq).or_default().extend(new);
        Ok(())
    }

    /// The longest run of cached blocks holding the prefix blocks `hashes[0..]` (whose
    /// token ids `block_tokens(i)` gives; verified, not only the hash).
    pub fn match_prefix(
        &self,
        hashes: &[BlockHash],
        mut block_tokens: impl FnMut(usize) -> Vec<u32>,
    ) -> Vec<BlockId> {
        let mut out = Vec::new();
        for (i, h) in hashes.iter().enumerate() {
            match self.cached.lookup(h, &block_tokens(i)) {
                Some(b) => out.push(b),
                None => break,
            }
        }
        out
    }

    /// How many of `blocks` (cached) are evictable now: taking them for a prefix hit
    /// removes them from [`Self::free_blocks`].
    pub fn evictable_among(&self, blocks: &[BlockId]) -> usize {
        blocks
            .iter()
            .filter(|&&b| self.cached.is_evictable(b))
            .count()
    }

    /// Gives `seq` (owning nothing yet) the cached blocks `hit` as the start of its
    /// table, then new blocks up to `tokens` positions. All or nothing.
    ///
    /// # Errors
    /// [`OutOfBlocks`] when the new blocks do not fit besides the hits.
    pub fn admit_with_prefix(
        &mut self,
        seq: SeqId,
        hit: &[BlockId],
        tokens: usize,
    ) -> Result<(), OutOfBlocks> {
        let needed = self.blocks_for(tokens).saturating_sub(hit.len());
        let free = self.free_blocks() - self.evictable_among(hit);
        if needed > free {
            return Err(OutOfBlocks { needed, free });
        }
        for &b in hit {
            self.cached.acquire(b);
            self.ref_counts[b as usize] += 1;
        }
        self.tables.entry(seq).or_default().extend_from_slice(hit);
        self.ensure(seq, tokens)
    }

    /// Registers `seq`'s block at table index `index` (fully computed) as holding the
    /// prefix block `hash` / `tokens`. Returns false when the hash is already cached in
    /// another block or the block already holds a hash.
    pub fn register(&mut self, seq: SeqId, index: usize, hash: BlockHash, tokens: &[u32]) -> bool {
        let Some(&b) = self.table(seq).get(index) else {
            return false;
        };
        self.cached.register(b, hash, tokens)
    }

    /// Makes `dst` share the first `n_blocks` blocks of `src` (reference counts go up);
    /// `dst` must own nothing yet. Returns how many blocks were shared.
    pub fn share_prefix(&mut self, src: SeqId, dst: SeqId, n_blocks: usize) -> usize {
        let shared: Vec<BlockId> = self.table(src).iter().take(n_blocks).copied().collect();
        for &b in &shared {
            self.ref_counts[b as usize] += 1;
        }
        let n = shared.len();
        self.tables.entry(dst).or_default().extend(shared);
        n
    }

    /// Shrinks the table of `seq` to the blocks that hold its first `tokens` positions,
    /// releasing the rest last first (as [`Self::free`] does): the blocks a rejected
    /// speculative run wrote past the sequence's end. Returns how many blocks became
    /// free.
    pub fn truncate(&mut self, seq: SeqId, tokens: usize) -> usize {
        let keep = self.blocks_for(tokens);
        let Some(table) = self.tables.get_mut(&seq) else {
            return 0;
        };
        if table.len() <= keep {
            return 0;
        }
        let dropped = table.split_off(keep);
        dropped
            .into_iter()
            .rev()
            .filter(|&b| self.release(b))
            .count()
    }

    /// Drops one reference to `b`; at zero it becomes free (a cached block evictable).
    /// Returns whether it did.
    fn release(&mut self, b: BlockId) -> bool {
        let rc = &mut self.ref_counts[b as usize];
        *rc = rc.saturating_sub(1);
        if *rc > 0 {
            return false;
        }
        if self.cached.is_cached(b) {
            self.cached.release(b);
        } else {
            self.free.push_back(b);
        }
        true
    }

    /// Reference count of block `b` (0 = free).
    pub fn ref_count(&self, b: BlockId) -> u32 {
        self.ref_counts.get(b as usize).copied().unwrap_or(0)
    }

    /// Releases every block of `seq`; blocks no other sequence holds become free
    /// (cached ones evictable). Returns how many blocks became free. Blocks are
    /// released last first, so the LRU evicts a prefix's tail before its head: a
    /// lookup matches from the first block, and a chain cut at its head would strand
    /// every block after it (vLLM's free order).
    pub fn free(&mut self, seq: SeqId) -> usize {
        let Some(table) = self.tables.remove(&seq) else {
            return 0;
        };
        table.into_iter().rev().filter(|&b| self.release(b)).count()
    }
}
