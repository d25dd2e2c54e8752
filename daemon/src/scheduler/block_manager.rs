//! [`BlockManager`]: allocation of KV cache blocks to sequences, with reference counts.
//!
//! The model runner's [`crate::model::KvBlockPool`] stores values; this decides which
//! block holds which positions. Each sequence has a block table (position `p` lives in
//! `table[p / block_size]`), blocks carry reference counts so several sequences can
//! share one (a common prefix: vLLM's `BlockSpaceManager` and copy-on-write forks), and
//! a block returns to the free list when its count drops to zero.

use std::collections::{HashMap, VecDeque};

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
}

impl BlockManager {
    /// A manager for `num_blocks` blocks of `block_size` tokens, all free.
    pub fn new(num_blocks: usize, block_size: usize) -> Self {
        Self {
            block_size: block_size.max(1),
            ref_counts: vec![0; num_blocks],
            free: (0..num_blocks as BlockId).collect(),
            tables: HashMap::new(),
        }
    }

    /// Tokens per block.
    pub fn block_size(&self) -> usize {
        self.block_size
    }

    /// Blocks in the pool.
    pub fn total_blocks(&self) -> usize {
        self.ref_counts.len()
    }

    /// Blocks with no owner.
    pub fn free_blocks(&self) -> usize {
        self.free.len()
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
        if needed > self.free.len() {
            return Err(OutOfBlocks {
                needed,
                free: self.free.len(),
            });
        }
        let table = self.tables.entry(seq).or_default();
        for _ in 0..needed {
            let Some(b) = self.free.pop_front() else {
                break; // unreachable: checked above
            };
            self.ref_counts[b as usize] = 1;
            table.push(b);
        }
        Ok(())
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

    /// Reference count of block `b` (0 = free).
    pub fn ref_count(&self, b: BlockId) -> u32 {
        self.ref_counts.get(b as usize).copied().unwrap_or(0)
    }

    /// Releases every block of `seq`; blocks no other sequence holds become free.
    /// Returns how many blocks became free.
    pub fn free(&mut self, seq: SeqId) -> usize {
        let Some(table) = self.tables.remove(&seq) else {
            return 0;
        };
        let mut freed = 0;
        for b in table {
            let rc = &mut self.ref_counts[b as usize];
            *rc = rc.saturating_sub(1);
            if *rc == 0 {
                self.free.push_back(b);
                freed += 1;
            }
        }
        freed
    }
}
