//! `n` choices and `echo` in the scheduler, driven without actix or a model: the
//! choices fork from the first once its prompt is computed, share its full blocks,
//! copy its partly filled last block (a copy that lost its destination is dropped),
//! wait for a block when none is free; the prompt is prefilled once; a scored prompt
//! asks for every row, chunk by chunk, and reads nothing from the prefix cache.

use std::sync::Arc;
use std::time::Instant;

use tokio::sync::mpsc;

use super::block_manager::BlockManager;
use super::policy::{PrefixCaching, Scheduler, SchedulerLimits};
use super::sequence::Prepared;
use crate::prefix_store::{DiskCounters, ModelFingerprint};
use crate::request::{CancelFlag, EventReceiver, SamplingParams, SeqId, StreamEvent};
use crate::sampling::{Sampled, SamplerChain};

const BS: usize = 4;
/// Ids of the first sequences, far from those [`SeqId::next`] hands to forked choices.
const P: SeqId = SeqId(1 << 40);
const Q: SeqId = SeqId((1 << 40) + 1);

fn sched(blocks: usize, max_batch_tokens: usize) -> Scheduler {
    let limits = SchedulerLimits {
        max_running: 8,
        max_waiting: 8,
        context_length: 1000,
        max_batch_tokens,
        attention_cost_tokens: usize::MAX / 2,
    };
    Scheduler::new(limits, BlockManager::new(blocks, BS))
}

fn params(n: usize, echo: bool) -> SamplingParams {
    SamplingParams {
        temperature: 0.0,
        max_tokens: 4,
        n,
        echo,
        logprobs: echo.then_some(1),
        ..SamplingParams::default()
    }
}

fn request(id: SeqId, prompt_len: u32, p: SamplingParams) -> (Prepared, EventReceiver) {
    let (tx, rx) = mpsc::unbounded_channel();
    let forks = (1..p.n).map(|_| SamplerChain::new(&p, &[])).collect();
    let req = Prepared {
        channels: Default::default(),
        seq: id,
        client_id: format!("r{}", id.0),
        prompt: (100..100 + prompt_len).collect(),
        chain: SamplerChain::new(&p, &[]),
        sampling: p,
        events: tx,
        cancel: CancelFlag::new(),
        received_at: Instant::now(),
        cache: Default::default(),
        disk_hit: None,
        forks,
        adapter: None,
        images: Vec::new(),
    };
    (req, rx)
}

/// Runs the step for `id` (all its in-flight tokens computed).
fn commit(s: &mut Scheduler, id: SeqId) {
    s.commit_step(id);
}

/// A 10-token prompt (blocks of 4: two full, one partly filled) with `n = 3`: one
/// prefill, then two forks sharing the full blocks, each with its own copy of the
/// third; the next batch carries the copies and the three decodes.
#[test]
fn choices_fork_after_one_prefill_sharing_full_blocks() {
    let mut s = sched(64, 64);
    let (req, mut rx) = request(P, 10, params(3, false));
    s.submit(req).expect("submit");
    let (b, admitted) = s.schedule();
    assert_eq!(admitted, vec![P]);
    assert_eq!(b.items.len(), 1);
    assert_eq!(b.items[0].tokens.len(), 10);
    commit(&mut s, P);
    let forked = s.fork_choices(P);
    assert_eq!(forked.len(), 2);
    assert!(s.fork_choices(P).is_empty(), "forks once");
    let parent = s.blocks().table(P).to_vec();
    for (k, &c) in forked.iter().enumerate() {
        let t = s.blocks().table(c).to_vec();
        assert_eq!(t.len(), 3);
        assert_eq!(t[..2], parent[..2], "full blocks shared");
        assert_ne!(t[2], parent[2], "own last block");
        let q = s.running_mut(c).expect("running");
        assert_eq!((q.computed, q.choice, q.started), (10, k + 1, true));
    }
    for &b in &parent[..2] {
        assert_eq!(s.blocks().ref_count(b), 3);
    }
    // Every choice samples its first token; the next step decodes all three.
    for id in std::iter::once(P).chain(forked.iter().copied()) {
        let q = s.running_mut(id).expect("running");
        let sampled = Sampled {
            token: 7,
            logprobs: None,
        };
        q.accept_token(sampled, b"x", false).expect("accept");
    }
    let (b, _) = s.schedule();
    assert_eq!(b.items.len(), 3);
    assert!(b.items.iter().all(|i| i.tokens == [7] && i.start_pos == 10));
    let copies: Vec<(u32, u32)> = b.copies.iter().map(|c| (c.src, c.dst)).collect();
    let want: Vec<(u32, u32)> = forked
        .iter()
        .map(|&c| (parent[2], s.blocks().table(c)[2]))
        .collect();
    assert_eq!(copies, want);
    assert_eq!(s.stats().prompt_tokens_computed, 10, "prefilled once");
    // Each choice's delta comes with its index (`started` is the actor's to send).
    let mut seen = Vec::new();
    while let Ok(e) = rx.try_recv() {
        match e {
            StreamEvent::Choice { index, event } => {
                assert!(matches!(*event, StreamEvent::Delta { .. }));
                seen.push(index);
            }
            other => panic!("unexpected {other:?}"),
        }
    }
    assert_eq!(seen, vec![0, 1, 2]);
}

/// A prompt that fills its blocks needs no copy; a choice cancelled before the next
/// step loses its copy; with no free block a choice waits and prefills itself.
#[test]
fn copies_only_for_owned_partial_blocks_and_waiting_without_blocks() {
    let mut s = sched(64, 64);
    let (req, _rx) = request(P, 8, params(2, false));
    s.submit(req).expect("submit");
    s.schedule();
    commit(&mut s, P);
    let forked = s.fork_choices(P);
    assert_eq!(forked.len(), 1);
    assert_eq!(s.blocks().table(forked[0]), s.blocks().table(P));
    let (b, _) = s.schedule();
    assert!(b.copies.is_empty());

    let mut s = sched(64, 64);
    let (req, _rx) = request(P, 6, params(2, false));
    s.submit(req).expect("submit");
    s.schedule();
    commit(&mut s, P);
    let forked = s.fork_choices(P);
    let child = s.remove_running(forked[0]).expect("child");
    drop(child);
    let (b, _) = s.schedule();
    assert!(
        b.copies.is_empty(),
        "the copy's destination went back to the pool"
    );

    // Three blocks: the parent's two, one left; the first fork takes it, the second
    // waits (at the front of the queue) with nothing computed.
    let mut s = sched(3, 64);
    let (req, _rx) = request(P, 6, params(3, false));
    s.submit(req).expect("submit");
    s.schedule();
    commit(&mut s, P);
    let forked = s.fork_choices(P);
    assert_eq!(forked.len(), 1);
    assert_eq!(s.waiting_len(), 1);
    assert_eq!(s.running_len(), 2);
}

/// A scored prompt asks for the rows of every position, chunk by chunk (the budget is
/// 4 tokens a step), its last chunk's last row included; nothing is read from the
/// prefix cache even when its blocks are there.
#[test]
fn a_scored_prompt_wants_every_row_and_no_cache_hit() {
    let mut s = sched(64, 4).with_prefix_caching(PrefixCaching {
        fingerprint: ModelFingerprint([1; 32]),
        disk: Some(Arc::new(DiskCounters::default())),
        block_bytes: 8,
    });
    // A plain request caches the prompt's first block.
    let (plain, _rx0) = request(P, 10, params(1, false));
    s.submit(plain).expect("submit");
    let mut rows = Vec::new();
    for _ in 0..3 {
        let (b, _) = s.schedule();
        rows.push(b.items[0].logit_rows);
        commit(&mut s, P);
    }
    assert_eq!(rows, vec![0, 0, 1]);
    s.remove_running(P).expect("done");

    let (scored, _rx) = request(Q, 10, params(1, true));
    s.submit(scored).expect("submit");
    let mut chunks = Vec::new();
    for _ in 0..3 {
        let (b, _) = s.schedule();
        let item = &b.items[0];
        chunks.push((item.start_pos, item.tokens.len(), item.logit_rows));
        commit(&mut s, Q);
    }
    // Positions 0..10 in chunks of 4, 4, 2: every row (9 scores + the next token's).
    assert_eq!(chunks, vec![(0, 4, 4), (4, 4, 4), (8, 2, 2)]);
    assert_eq!(s.running_mut(Q).expect("running").cached_tokens, 0);
}
