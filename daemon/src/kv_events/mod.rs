//! KV-cache events for prefix-aware routers (llm-d's precise prefix-cache scorer,
//! NVIDIA Dynamo's KV router): every full KV block the prefix cache stores or drops,
//! published in vLLM's format (`vllm/distributed/kv_events.py`: ZeroMQ PUB of
//! msgpack `EventBatch`es, a sequence number per message, a ROUTER socket replaying
//! missed ones). `[kv_events]` turns it on (off by default).
//!
//! - [`wire`]: the msgpack encoding of a batch.
//! - [`publisher`]: the replay buffer the engine pushes into (never blocking on a
//!   socket) and the thread that owns the sockets.
//!
//! Block hashes are ours ([`crate::prefix_store::hash`], a SHA-256 chain over the
//! fingerprint, the adapter and `cache_salt`), cut to their first 8 bytes read
//! big-endian ([`external_hash`]): vLLM's `ExternalBlockHash` is an int or bytes and
//! Dynamo's decoder takes a 64-bit int.

pub mod publisher;
pub mod wire;

use crate::prefix_store::BlockHash;

pub use publisher::{Bound, KvEventSink};

/// Where a block's K/V sit: vLLM's `medium` (`GPU` for device memory, `CPU` for host
/// memory, `DISK` for the prefix store's disk tier, as Dynamo's `StorageTier` reads
/// them).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Medium {
    /// Device memory (the CUDA runner's KV pool).
    Gpu,
    /// Host memory (the CPU runner's KV pool).
    Cpu,
    /// The disk tier (`prefix_store`).
    Disk,
}

impl Medium {
    /// The wire string.
    pub fn as_str(self) -> &'static str {
        match self {
            Medium::Gpu => "GPU",
            Medium::Cpu => "CPU",
            Medium::Disk => "DISK",
        }
    }
}

/// One event (vLLM's `BlockStored`, `BlockRemoved`, `AllBlocksCleared`).
#[derive(Debug, Clone, PartialEq)]
pub enum KvEvent {
    /// Consecutive full blocks of one chain were stored.
    BlockStored {
        /// Their hashes, in chain order ([`external_hash`]).
        block_hashes: Vec<u64>,
        /// The hash of the block before the first (`None` for a prompt's first block).
        parent_block_hash: Option<u64>,
        /// The blocks' token ids, `block_size` per block, in order.
        token_ids: Vec<u32>,
        /// Tokens per block.
        block_size: usize,
        /// Where they are stored.
        medium: Medium,
        /// The LoRA adapter whose K/V they are (`None` for the base model).
        lora_name: Option<String>,
        /// Per block, what else entered its hash besides tokens (vLLM's
        /// `extra_keys`): the adapter's name, and on a chain's first block the
        /// request's `cache_salt`; `None` where nothing did. Empty when unknown
        /// (disk-tier blocks announced at start).
        extra_keys: Vec<Option<Vec<String>>>,
    },
    /// Blocks were dropped from a medium.
    BlockRemoved {
        /// Their hashes.
        block_hashes: Vec<u64>,
        /// Where they were.
        medium: Medium,
    },
    /// Every block was dropped (sent first by every start: nothing this replica said
    /// before holds).
    AllBlocksCleared,
}

/// A block hash as the events carry it: the first 8 bytes of the SHA-256 chain hash,
/// big-endian.
pub fn external_hash(h: &BlockHash) -> u64 {
    let mut b = [0u8; 8];
    b.copy_from_slice(&h.0[..8]);
    u64::from_be_bytes(b)
}

/// What entered the hash of a request's blocks besides tokens: its adapter and
/// `cache_salt` (see [`crate::prefix_store::hash::root_hash_with`]).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct BlockKeys {
    /// The adapter's name.
    pub lora_name: Option<String>,
    /// The request's `cache_salt` (empty for none).
    pub cache_salt: String,
}

/// One block's share of [`BlockKeys`], as a stored block carries it to the disk tier.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct OneBlockKeys {
    /// The adapter's name.
    pub lora_name: Option<String>,
    /// The block's `extra_keys` entry.
    pub extra_keys: Option<Vec<String>>,
}

impl BlockKeys {
    /// Block `index`'s keys.
    pub fn of_block(&self, index: usize) -> OneBlockKeys {
        OneBlockKeys {
            lora_name: self.lora_name.clone(),
            extra_keys: self.extra_keys(index, 1).pop().flatten(),
        }
    }

    /// vLLM's `extra_keys` for blocks `first..first + n` of a chain: the adapter's
    /// name on every block, the salt on block 0 only.
    pub fn extra_keys(&self, first: usize, n: usize) -> Vec<Option<Vec<String>>> {
        (first..first + n)
            .map(|b| {
                let mut keys: Vec<String> = self.lora_name.iter().cloned().collect();
                if b == 0 && !self.cache_salt.is_empty() {
                    keys.push(self.cache_salt.clone());
                }
                (!keys.is_empty()).then_some(keys)
            })
            .collect()
    }
}
