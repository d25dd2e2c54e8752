//! What one engine's scheduler loop reports to the placer of several engines
//! ([`super::placement`]): the KV blocks its sequences hold or wait for, and the block
//! hashes of its
//! memory tier, followed from the policy's KV-cache events (`BlockStored` adds,
//! `BlockRemoved` removes, `AllBlocksCleared` empties), the events a router reads.

use std::collections::HashSet;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Mutex, MutexGuard};

use crate::kv_events::KvEvent;

/// What one engine's scheduler loop tells the placer.
#[derive(Debug, Default)]
pub struct EngineLoad {
    /// KV blocks its sequences own or their prompts will need (waiting ones), as of
    /// its last step.
    active: AtomicUsize,
    /// Prompt blocks of the requests placed on it that its loop has not taken yet.
    in_flight: AtomicUsize,
    /// Requests placed on the engine since start.
    placed: AtomicU64,
    /// Hashes (64-bit, as the events carry them) of the blocks its memory tier holds.
    cached: Mutex<HashSet<u64>>,
}

impl EngineLoad {
    /// The loop's sequences hold or need `blocks` KV blocks now.
    pub fn set_active(&self, blocks: usize) {
        self.active.store(blocks, Ordering::Relaxed);
    }

    /// The loop has taken a placed request of `blocks` prompt blocks (counted in
    /// `active` from now on).
    pub fn taken(&self, blocks: usize) {
        let _ = self
            .in_flight
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| {
                Some(n.saturating_sub(blocks))
            });
    }

    /// Follows the memory tier's events (those of the engine's policy, in order).
    pub fn apply(&self, events: &[KvEvent]) {
        if events.is_empty() {
            return;
        }
        let mut cached = self.cached();
        for e in events {
            match e {
                KvEvent::BlockStored { block_hashes, .. } => cached.extend(block_hashes),
                KvEvent::BlockRemoved { block_hashes, .. } => {
                    for h in block_hashes {
                        cached.remove(h);
                    }
                }
                KvEvent::AllBlocksCleared => cached.clear(),
            }
        }
    }

    /// KV blocks held, needed or on their way.
    pub fn load(&self) -> usize {
        self.active.load(Ordering::Relaxed) + self.in_flight.load(Ordering::Relaxed)
    }

    /// Requests placed here since start.
    pub fn placed(&self) -> u64 {
        self.placed.load(Ordering::Relaxed)
    }

    /// A request of `blocks` prompt blocks was placed on the engine.
    pub fn placed_one(&self, blocks: usize) {
        self.in_flight.fetch_add(blocks, Ordering::Relaxed);
        self.placed.fetch_add(1, Ordering::Relaxed);
    }

    /// How many of `hashes` (a prompt's chain, in order) the engine holds from the
    /// start, and how many blocks it holds in all.
    pub fn overlap(&self, hashes: &[u64]) -> (usize, usize) {
        let cached = self.cached();
        let n = hashes.iter().take_while(|h| cached.contains(h)).count();
        (n, cached.len())
    }

    fn cached(&self) -> MutexGuard<'_, HashSet<u64>> {
        // Plain data: a panic elsewhere while holding it leaves it usable.
        self.cached
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kv_events::Medium;

    #[test]
    fn the_load_follows_events_placements_and_steps() {
        let l = EngineLoad::default();
        let stored = |hashes: &[u64]| KvEvent::BlockStored {
            block_hashes: hashes.to_vec(),
            parent_block_hash: None,
            token_ids: vec![],
            block_size: 16,
            medium: Medium::Cpu,
            lora_name: None,
            extra_keys: vec![],
        };
        l.apply(&[stored(&[1, 2, 3]), stored(&[7])]);
        assert_eq!(l.overlap(&[1, 2, 3, 4]), (3, 4));
        l.apply(&[KvEvent::BlockRemoved {
            block_hashes: vec![2],
            medium: Medium::Cpu,
        }]);
        // A chain stops at its first missing block.
        assert_eq!(l.overlap(&[1, 2, 3]), (1, 3));
        l.apply(&[KvEvent::AllBlocksCleared]);
        assert_eq!(l.overlap(&[1]), (0, 0));
        l.placed_one(2);
        l.placed_one(4);
        l.set_active(3);
        assert_eq!(l.load(), 9);
        l.taken(4);
        l.taken(4);
        assert_eq!(l.load(), 3, "taken never goes below zero");
        assert_eq!(l.placed(), 2);
    }
}
