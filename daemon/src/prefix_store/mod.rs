//! The prefix KV store: reuse of the K/V of a prompt prefix computed before, in memory
//! and on disk, across requests and restarts.
//!
//! - [`hash`]: chained SHA-256 block hashes and the model fingerprint.
//! - [`memory`]: [`MemoryIndex`], the memory tier: hashed blocks of the KV pool,
//!   reference-counted while used and LRU-evictable when not (used by the
//!   scheduler's [`crate::scheduler::BlockManager`]).
//! - [`entry`]: the checksummed on-disk value of one block.
//! - [`disk`]: [`DiskStore`], the sled tier with its byte budget and LRU.
//! - [`actor`]: [`PrefixStoreActor`], the disk tier's writer on its own low-priority
//!   thread (the model runner hands it computed blocks behind generation through a
//!   [`PersistSink`]), and [`PrefixReadActor`], which reads runs of blocks for the
//!   scheduler before a request is queued.
//!
//! The store knows neither the scheduler nor the runner: both use it.

pub mod actor;
pub mod disk;
pub mod entry;
pub mod hash;
pub mod memory;

pub use actor::{
    ApplyRead, Flush, LookupRun, PersistSink, PrefixReadActor, PrefixStoreActor, StoreBlock,
};
pub use disk::{DiskCounters, DiskReader, DiskStore, RunRead, StoreError};
pub use hash::{
    chain_hash, chain_hash_with, root_hash, root_hash_with, BlockHash, FingerprintParts,
    ModelFingerprint,
};
pub use memory::MemoryIndex;
