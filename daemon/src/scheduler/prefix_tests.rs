//! Prefix caching in the scheduler, driven without actix or a model: memory hits share
//! blocks and skip their positions, at least one token is always computed, the salt
//! and `cache: false` isolate, LRU eviction takes a prefix's tail first, disk hits
//! become block loads, and completed blocks are handed to the disk tier once.

use std::sync::Arc;
use std::time::Instant;

use tokio::sync::mpsc;

use super::block_manager::BlockManager;
use super::policy::{PrefixCaching, Scheduler, SchedulerLimits};
use super::sequence::Prepared;
use crate::prefix_store::{DiskCounters, ModelFingerprint};
use crate::request::DiskHit;
use crate::request::{CacheOptions, CancelFlag, EventReceiver, SamplingParams, SeqId};
use crate::sampling::SamplerChain;

const BS: usize = 4;

pub(super) fn sched(blocks: usize) -> Scheduler {
    let limits = SchedulerLimits {
        max_running: 8,
        max_waiting: 8,
        context_length: 1000,
        max_batch_tokens: 256,
        attention_cost_tokens: usize::MAX / 2,
    };
    Scheduler::new(limits, BlockManager::new(blocks, BS)).with_prefix_caching(PrefixCaching {
        fingerprint: ModelFingerprint([1; 32]),
        disk: Some(Arc::new(DiskCounters::default())),
        block_bytes: 8,
    })
}

pub(super) fn request(id: u64, prompt: Vec<u32>, cache: CacheOptions) -> (Prepared, EventReceiver) {
    let (tx, rx) = mpsc::unbounded_channel();
    let req = Prepared {
        channels: Default::default(),
        seq: SeqId(id),
        client_id: format!("r{id}"),
        prompt,
        sampling: SamplingParams {
            temperature: 0.0,
            top_k: 0,
            top_p: 1.0,
            min_p: 0.0,
            seed: 0,
            max_tokens: 4,
            stop: Vec::new(),
            ..SamplingParams::default()
        },
        chain: SamplerChain::new(&SamplingParams::default(), &[]),
        events: tx,
        cancel: CancelFlag::new(),
        received_at: Instant::now(),
        cache,
        disk_hit: None,
        forks: Vec::new(),
        adapter: None,
        images: Vec::new(),
    };
    (req, rx)
}

pub(super) fn prompt(n: u32) -> Vec<u32> {
    (100..100 + n).collect()
}

/// Submits, schedules one step and commits it; returns (start_pos, tokens run,
/// block table, blocks handed to the disk tier, cached_tokens).
#[allow(clippy::type_complexity)]
pub(super) fn admit(s: &mut Scheduler, req: Prepared) -> (usize, usize, Vec<u32>, Vec<u32>, usize) {
    let id = req.seq;
    s.submit(req).expect("submit");
    let (batch, _) = s.schedule();
    let item = batch.items.iter().find(|i| i.seq == id).expect("scheduled");
    let out = (
        item.start_pos,
        item.tokens.len(),
        item.block_table.clone(),
        item.persist.iter().map(|p| p.block).collect(),
        s.running_mut(id).expect("running").cached_tokens,
    );
    s.commit_step(id);
    out
}

#[test]
fn memory_hits_share_blocks_and_skip_positions() {
    let mut s = sched(20);
    let (r1, _k1) = request(1, prompt(10), CacheOptions::default());
    let (start, ran, t1, persisted, cached) = admit(&mut s, r1);
    assert_eq!((start, ran, cached), (0, 10, 0));
    assert_eq!(persisted, t1[..2].to_vec(), "two full blocks go to disk");
    assert_eq!(s.stats().prefix_cache.memory_blocks, 2);

    // Same prompt: blocks 0 and 1 are shared, positions 8 and 9 computed.
    let (r2, _k2) = request(2, prompt(10), CacheOptions::default());
    let (start, ran, t2, persisted, cached) = admit(&mut s, r2);
    assert_eq!((start, ran, cached), (8, 2, 8));
    assert_eq!(t2[..2], t1[..2]);
    assert_ne!(t2[2], t1[2]);
    assert!(persisted.is_empty());
    assert_eq!(s.blocks().ref_count(t1[0]), 2);

    // Finished: the hashed blocks stay cached but count as free.
    s.remove_running(SeqId(1));
    s.remove_running(SeqId(2));
    assert_eq!(s.blocks().free_blocks(), 20);
    assert_eq!(s.stats().prefix_cache.memory_evictable_blocks, 2);

    // A prompt of exactly two blocks: the last block is recomputed (its last token's
    // logits are needed and a shared block is never written).
    let (r3, _k3) = request(3, prompt(8), CacheOptions::default());
    let (start, ran, t3, _, cached) = admit(&mut s, r3);
    assert_eq!((start, ran, cached), (4, 4, 4));
    assert_eq!(t3[0], t1[0]);
    s.remove_running(SeqId(3));

    // A salt or `cache: false` shares nothing.
    let salted = CacheOptions {
        enabled: true,
        salt: "b".into(),
    };
    let (r4, _k4) = request(4, prompt(10), salted);
    assert_eq!(admit(&mut s, r4).4, 0);
    let off = CacheOptions {
        enabled: false,
        salt: String::new(),
    };
    let (r5, _k5) = request(5, prompt(10), off);
    let (start, _, _, persisted, cached) = admit(&mut s, r5);
    assert_eq!((start, cached), (0, 0));
    assert!(persisted.is_empty(), "cache: false writes nothing");

    let st = s.stats().prefix_cache;
    // Counted: r1, r2, r3, r4 (10 + 10 + 8 + 10 prompt tokens), hits 8 + 4.
    assert_eq!(
        (st.prompt_tokens, st.hit_tokens, st.memory_hit_tokens),
        (38, 12, 12)
    );
    assert!((st.hit_rate - 12.0 / 38.0).abs() < 1e-12);
}

#[test]
fn lru_eviction_takes_a_prefix_tail_first_so_its_head_stays_usable() {
    let mut s = sched(6);
    let (r1, _k1) = request(1, prompt(9), CacheOptions::default());
    let t1 = admit(&mut s, r1).2;
    s.remove_running(SeqId(1)); // blocks t1[0], t1[1] cached; t1[2] free
                                // 20 other tokens need 5 blocks: 4 never-hashed ones, then one cached block: the
                                // tail t1[1] (released before the head), not t1[0].
    let other: Vec<u32> = (500..520).collect();
    let (r2, _k2) = request(2, other, CacheOptions::default());
    let t2 = admit(&mut s, r2).2;
    assert!(t2.contains(&t1[1]) && !t2.contains(&t1[0]));
    s.remove_running(SeqId(2));
    // The head is still cached and reachable: a one-block hit.
    let (r3, _k3) = request(3, prompt(9), CacheOptions::default());
    let (start, _, t3, _, cached) = admit(&mut s, r3);
    assert_eq!((start, cached), (4, 4));
    assert_eq!(t3[0], t1[0]);
}

#[test]
fn disk_hits_become_block_loads_and_join_the_memory_tier() {
    let mut s = sched(20);
    let (mut r1, _k1) = request(1, prompt(14), CacheOptions::default());
    r1.disk_hit = Some(DiskHit {
        first_block: 0,
        blocks: vec![vec![7u8; 8], vec![8u8; 8], vec![9u8; 8]],
    });
    s.submit(r1).expect("submit");
    assert_eq!(s.disk_hit_bytes_waiting(), 24, "held while queued");
    let (batch, _) = s.schedule();
    assert_eq!(s.disk_hit_bytes_waiting(), 0, "released at admission");
    let item = &batch.items[0];
    assert_eq!(item.start_pos, 12);
    assert_eq!(
        batch
            .loads
            .iter()
            .map(|l| (l.block, l.kv[0]))
            .collect::<Vec<_>>(),
        vec![
            (item.block_table[0], 7),
            (item.block_table[1], 8),
            (item.block_table[2], 9)
        ]
    );
    assert!(
        item.persist.is_empty(),
        "loaded blocks are not written back"
    );
    s.commit_step(SeqId(1));
    let table = item.block_table.clone();
    // A second request finds them in memory.
    let (r2, _k2) = request(2, prompt(14), CacheOptions::default());
    let (start, _, t2, _, cached) = admit(&mut s, r2);
    assert_eq!((start, cached), (12, 12));
    assert_eq!(t2[..3], table[..3]);
    let st = s.stats().prefix_cache;
    assert_eq!((st.disk_hit_tokens, st.memory_hit_tokens), (12, 12));

    // A disk run that starts after a gap in memory is not used.
    let (mut r3, _k3) = request(3, (900..914).collect(), CacheOptions::default());
    r3.disk_hit = Some(DiskHit {
        first_block: 1,
        blocks: vec![vec![1u8; 8]],
    });
    s.submit(r3).expect("submit");
    let (batch, _) = s.schedule();
    assert!(batch.loads.is_empty());
    let item = batch
        .items
        .iter()
        .find(|i| i.seq == SeqId(3))
        .expect("item");
    assert_eq!(item.start_pos, 0);
}
