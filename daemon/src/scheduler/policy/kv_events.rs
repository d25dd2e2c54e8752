//! The memory tier's KV-cache events: every full block registered under its hash
//! (`BlockStored`, consecutive blocks of one sequence in one event) and every hash the
//! allocator evicts (`BlockRemoved`), in the order they happened, for the scheduler
//! loop to hand to [`crate::kv_events::KvEventSink`] after each step.

use super::Scheduler;
use crate::kv_events::{external_hash, BlockKeys, KvEvent, Medium};
use crate::prefix_store::BlockHash;
use crate::request::SeqId;

/// The events recorded since the last [`Scheduler::take_kv_events`].
#[derive(Debug)]
pub(super) struct KvEventLog {
    medium: Medium,
    events: Vec<KvEvent>,
}

/// One block newly registered in the memory tier.
pub(super) struct Registered {
    /// Its index in the sequence's chain.
    pub index: usize,
    pub hash: BlockHash,
    pub tokens: Vec<u32>,
}

impl Scheduler {
    /// Records KV-cache events of the memory tier, whose blocks are in `medium`.
    pub fn with_kv_events(mut self, medium: Medium) -> Self {
        self.blocks.record_evictions();
        self.kv_events = Some(KvEventLog {
            medium,
            events: Vec::new(),
        });
        self
    }

    /// Registers block `index` of sequence `id` in the memory tier; when it is newly
    /// held, notes it in `stored` (for [`Self::record_stored`]).
    pub(super) fn register_block(
        &mut self,
        id: SeqId,
        index: usize,
        hash: BlockHash,
        tokens: Vec<u32>,
        stored: &mut Vec<Registered>,
    ) {
        if self.blocks.register(id, index, hash, &tokens) {
            stored.push(Registered {
                index,
                hash,
                tokens,
            });
        }
    }

    /// The events since the last call, oldest first (empty when not recording).
    pub fn take_kv_events(&mut self) -> Vec<KvEvent> {
        self.flush_evictions();
        self.kv_events
            .as_mut()
            .map(|l| std::mem::take(&mut l.events))
            .unwrap_or_default()
    }

    /// Moves the allocator's evictions into the log (before anything stored after).
    fn flush_evictions(&mut self) {
        let Some(log) = self.kv_events.as_mut() else {
            return;
        };
        let evicted = self.blocks.take_evicted();
        if !evicted.is_empty() {
            log.events.push(KvEvent::BlockRemoved {
                block_hashes: evicted.iter().map(external_hash).collect(),
                medium: log.medium,
            });
        }
    }

    /// Records `blocks` (in chain order) as stored; `chain` is the sequence's hash
    /// chain so far (for the parents), `keys` what else entered the hashes. Each run of
    /// consecutive indices becomes one `BlockStored`.
    pub(super) fn record_stored(
        &mut self,
        blocks: Vec<Registered>,
        chain: &[BlockHash],
        keys: &BlockKeys,
    ) {
        if self.kv_events.is_none() || blocks.is_empty() {
            return;
        }
        self.flush_evictions();
        let block_size = self.blocks.block_size();
        let Some(log) = self.kv_events.as_mut() else {
            return;
        };
        let mut runs: Vec<Vec<Registered>> = Vec::new();
        for b in blocks {
            match runs.last_mut() {
                Some(run) if run.last().is_some_and(|l| l.index + 1 == b.index) => run.push(b),
                _ => runs.push(vec![b]),
            }
        }
        for run in runs {
            let first = run[0].index;
            log.events.push(KvEvent::BlockStored {
                block_hashes: run.iter().map(|b| external_hash(&b.hash)).collect(),
                parent_block_hash: first
                    .checked_sub(1)
                    .and_then(|p| chain.get(p))
                    .map(external_hash),
                token_ids: run.iter().flat_map(|b| b.tokens.iter().copied()).collect(),
                block_size,
                medium: log.medium,
                lora_name: keys.lora_name.clone(),
                extra_keys: keys.extra_keys(first, run.len()),
            });
        }
    }
}
