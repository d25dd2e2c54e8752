//! The disk tier's two actors, each on a `SyncArbiter` thread of its own so sled never
//! runs on the engine loop or the model runner:
//! - [`PrefixStoreActor`] owns the [`DiskStore`] and writes (in Linux's `SCHED_IDLE`
//!   class: it only gets CPU time nobody else wants);
//! - [`PrefixReadActor`] answers lookups at normal priority through a [`DiskReader`], so
//!   a disk hit never waits behind writes or for idle CPU, and tells the writer which
//!   blocks it used (LRU) or found corrupt (delete).

use std::sync::atomic::Ordering;
use std::sync::Arc;

use actix::{Actor, Handler, Message, MessageResult, SyncContext};

use super::disk::{DiskCounters, DiskReader, DiskStore};
use super::hash::BlockHash;

/// Read the longest stored run of blocks (reply: their K/V payloads, in order; empty on
/// a miss). Sent by the scheduler before a request is queued.
#[derive(Debug, Message)]
#[rtype(result = "Vec<Vec<u8>>")]
pub struct LookupRun {
    /// Hashes of consecutive full blocks of the prompt.
    pub hashes: Vec<BlockHash>,
    /// Token ids of each of those blocks (verified against the entries).
    pub tokens: Vec<Vec<u32>>,
}

/// Blocks a lookup used (most recently used now) and an entry it found bad (delete).
#[derive(Debug, Message)]
#[rtype(result = "()")]
pub struct ApplyRead {
    /// Blocks served.
    pub used: Vec<BlockHash>,
    /// An entry that failed verification.
    pub bad: Option<BlockHash>,
}

/// Store one computed block (written behind generation; see [`PersistSink`]).
#[derive(Debug, Message)]
#[rtype(result = "()")]
pub struct StoreBlock {
    /// The block's hash.
    pub hash: BlockHash,
    /// The hash of the block before it (`None` for a prompt's first block): the store
    /// evicts a chain's tail before its head.
    pub parent: Option<BlockHash>,
    /// Its token ids.
    pub tokens: Vec<u32>,
    /// K/V bytes ([`crate::model::KvBlockPool::read_block`] layout).
    pub kv: Vec<u8>,
    /// What else entered its hash (the KV-cache events' `lora_name`, `extra_keys`).
    pub keys: crate::kv_events::OneBlockKeys,
}

/// Flush sled to disk (at shutdown, after every queued write).
#[derive(Debug, Message)]
#[rtype(result = "()")]
pub struct Flush;

/// Owns the [`DiskStore`]. Start with `SyncArbiter::start(1, ..)`.
pub struct PrefixStoreActor {
    store: Option<DiskStore>,
    counters: Arc<DiskCounters>,
}

impl PrefixStoreActor {
    /// Wraps an opened store.
    pub fn new(store: DiskStore, counters: Arc<DiskCounters>) -> Self {
        Self {
            store: Some(store),
            counters,
        }
    }
}

impl Actor for PrefixStoreActor {
    type Context = SyncContext<Self>;

    fn started(&mut self, _ctx: &mut SyncContext<Self>) {
        lower_thread_priority();
    }
}

/// Puts the calling thread in Linux's `SCHED_IDLE` class: it runs only on CPU time no
/// normal thread wants, so writing the store never preempts the model's compute threads
/// (which spin at their barriers: a preempted one stalls the whole step).
pub fn lower_thread_priority() {
    #[cfg(target_os = "linux")]
    {
        let param = libc::sched_param { sched_priority: 0 };
        // SAFETY: sched_setscheduler reads `param` only; pid 0 is the calling thread.
        let rc = unsafe { libc::sched_setscheduler(0, libc::SCHED_IDLE, &param) };
        if rc != 0 {
            tracing::warn!(
                error = %std::io::Error::last_os_error(),
                "prefix store: could not lower the writer thread's priority"
            );
        }
    }
}

impl Handler<ApplyRead> for PrefixStoreActor {
    type Result = ();

    fn handle(&mut self, msg: ApplyRead, _ctx: &mut SyncContext<Self>) {
        if let Some(s) = self.store.as_mut() {
            s.apply_read(&msg.used, msg.bad);
            s.flush_kv_events();
        }
    }
}

/// Answers [`LookupRun`] through a [`DiskReader`]. Start with `SyncArbiter::start(1, ..)`.
pub struct PrefixReadActor {
    reader: DiskReader,
    writer: actix::Addr<PrefixStoreActor>,
}

impl PrefixReadActor {
    /// A reader reporting to `writer`.
    pub fn new(reader: DiskReader, writer: actix::Addr<PrefixStoreActor>) -> Self {
        Self { reader, writer }
    }
}

impl Actor for PrefixReadActor {
    type Context = SyncContext<Self>;
}

impl Handler<LookupRun> for PrefixReadActor {
    type Result = MessageResult<LookupRun>;

    fn handle(&mut self, msg: LookupRun, _ctx: &mut SyncContext<Self>) -> Self::Result {
        let read = self.reader.read_run(&msg.hashes, &msg.tokens);
        if !read.used.is_empty() || read.bad.is_some() {
            self.writer.do_send(ApplyRead {
                used: read.used,
                bad: read.bad,
            });
        }
        MessageResult(read.blocks)
    }
}

impl Handler<StoreBlock> for PrefixStoreActor {
    type Result = ();

    fn handle(&mut self, msg: StoreBlock, _ctx: &mut SyncContext<Self>) {
        self.counters
            .queued_bytes
            .fetch_sub(msg.kv.len() as u64, Ordering::Relaxed);
        if let Some(s) = self.store.as_mut() {
            s.put_keyed(
                &msg.hash,
                msg.parent.as_ref(),
                &msg.tokens,
                &msg.kv,
                &msg.keys,
            );
            s.flush_kv_events();
        }
    }
}

impl Handler<Flush> for PrefixStoreActor {
    type Result = ();

    fn handle(&mut self, _msg: Flush, _ctx: &mut SyncContext<Self>) {
        if let Some(s) = self.store.as_ref() {
            match s.flush() {
                Ok(n) => {
                    tracing::info!(bytes = n, path = %s.path().display(), "prefix store flushed")
                }
                Err(e) => tracing::error!(error = %e, "prefix store flush failed"),
            }
        }
    }
}

/// Where the model runner sends computed blocks: the store actor plus a bound on the
/// bytes queued for it. A block offered while more than `max_queued_bytes` wait is
/// dropped (and counted) instead of growing the queue: writing never slows a step.
#[derive(Clone)]
pub struct PersistSink {
    /// The store.
    pub recipient: actix::Recipient<StoreBlock>,
    /// Shared counters (`queued_bytes`, `dropped_writes`).
    pub counters: Arc<DiskCounters>,
    /// Bound on queued K/V bytes.
    pub max_queued_bytes: u64,
}

impl std::fmt::Debug for PersistSink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PersistSink")
            .field("max_queued_bytes", &self.max_queued_bytes)
            .finish_non_exhaustive()
    }
}

impl PersistSink {
    /// Queues one block for writing, or drops it when the queue is full.
    pub fn offer(&self, block: StoreBlock) {
        let n = block.kv.len() as u64;
        let queued = self.counters.queued_bytes.fetch_add(n, Ordering::Relaxed);
        if queued + n > self.max_queued_bytes {
            self.counters.queued_bytes.fetch_sub(n, Ordering::Relaxed);
            self.counters.dropped_writes.fetch_add(1, Ordering::Relaxed);
            return;
        }
        self.recipient.do_send(block);
    }
}
