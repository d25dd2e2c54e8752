//! Speculative decoding in the scheduling policy, driven without actix or a model:
//! drafts in the batch, KV blocks after acceptance and rejection, budgets, the
//! compute-bound switch, and cancellation mid-verification.

use std::time::Instant;

use tokio::sync::mpsc;

use super::block_manager::BlockManager;
use super::policy::{Scheduler, SchedulerLimits};
use super::sequence::Prepared;
use super::speculative::Speculation;
use crate::model_runner::RunBatch;
use crate::request::{CancelFlag, EventReceiver, SamplingParams, SeqId};
use crate::sampling::{Sampled, SamplerChain};

const SPEC: Speculation = Speculation {
    k: 4,
    draft_cost: None,
    row_cost: 0.15,
    follow_row_cost: false,
    ngram_min: 1,
    ngram_max: 3,
    max_running: 2,
};

fn params(max_tokens: usize) -> SamplingParams {
    SamplingParams {
        temperature: 0.0,
        max_tokens,
        ..SamplingParams::default()
    }
}

/// A request whose prompt repeats `1 2 3 4 5 6 7 8` (so the lookup always matches).
fn request(id: u64, prompt_len: usize, max_tokens: usize) -> (Prepared, EventReceiver) {
    let (tx, rx) = mpsc::unbounded_channel();
    let req = Prepared {
        channels: Default::default(),
        seq: SeqId(id),
        client_id: format!("r{id}"),
        prompt: (0..prompt_len as u32).map(|i| 1 + i % 8).collect(),
        chain: SamplerChain::new(&params(max_tokens), &[]),
        sampling: params(max_tokens),
        events: tx,
        cancel: CancelFlag::new(),
        received_at: Instant::now(),
        cache: Default::default(),
        disk_hit: None,
        forks: Vec::new(),
        adapter: None,
        images: Vec::new(),
    };
    (req, rx)
}

/// 100 blocks of 4 tokens, a budget of 32 tokens per step.
fn sched() -> Scheduler {
    sched_with(SPEC)
}

fn sched_with(spec: Speculation) -> Scheduler {
    let limits = SchedulerLimits {
        max_running: 8,
        max_waiting: 8,
        context_length: 1000,
        max_batch_tokens: 32,
        attention_cost_tokens: usize::MAX / 2,
    };
    Scheduler::new(limits, BlockManager::new(100, 4)).with_speculation(spec)
}

/// Runs the step's items as the engine would up to sampling: every item's in-flight
/// tokens count as computed; a sequence whose prompt is done accepts `token`.
fn prefill_and_sample(s: &mut Scheduler, batch: &RunBatch, token: u32) {
    for item in &batch.items {
        s.commit_step(item.seq);
        if let Some(q) = s.running_mut(item.seq) {
            if q.pending_len() == 0 {
                push(q, token);
            }
        }
    }
}

fn push(q: &mut super::sequence::Sequence, token: u32) {
    let sampled = Sampled {
        token,
        logprobs: None,
    };
    q.accept_token(sampled, b"t", false).expect("accept");
}

/// Admits and prefills one 10-token prompt (`1 … 8 1 2`), then samples `3`: the
/// history ends `… 1 2 3`, which the lookup finds at the start.
fn decoding_one(max_tokens: usize) -> (Scheduler, EventReceiver) {
    let mut s = sched();
    let (req, rx) = request(1, 10, max_tokens);
    s.submit(req).expect("submit");
    let (batch, _) = s.schedule();
    assert_eq!(
        batch.items[0].tokens.len(),
        10,
        "the whole prompt in one chunk"
    );
    prefill_and_sample(&mut s, &batch, 3);
    (s, rx)
}

#[test]
fn a_decoding_sequence_runs_its_drafts_with_one_logits_row_each() {
    let (mut s, _rx) = decoding_one(50);
    let (batch, _) = s.schedule();
    let item = &batch.items[0];
    // Pending token 3, then the lookup's "4 5" (the prior acceptance picks 2 drafts).
    assert_eq!(item.tokens, vec![3, 4, 5]);
    assert_eq!((item.start_pos, item.logit_rows), (10, 3));
    // Positions 10..13 need 4 blocks of 4.
    assert_eq!(item.block_table.len(), 4);
    let q = s.running_mut(SeqId(1)).expect("running");
    assert_eq!(q.drafts, vec![4, 5]);
}

#[test]
fn rejected_drafts_release_their_blocks_and_accepted_ones_count_as_computed() {
    let (mut s, _rx) = decoding_one(50);
    trust_drafts(&mut s);
    let (batch, _) = s.schedule();
    assert_eq!(batch.items[0].tokens, vec![3, 4, 5, 6, 7]);
    // Positions 10..=14: blocks 0-3 (prompt and 12..16), all owned by this sequence.
    let table = batch.items[0].block_table.clone();
    assert_eq!(table.len(), 4);
    assert!(table.iter().all(|&b| s.blocks().ref_count(b) == 1));
    s.commit_step(SeqId(1));
    // The model accepted "4" then sampled 9 instead of "5".
    let q = s.running_mut(SeqId(1)).expect("running");
    push(q, 4);
    push(q, 9);
    s.commit_drafts(SeqId(1), 4, 1);
    let q = s.running_mut(SeqId(1)).expect("running");
    assert_eq!(q.generated, vec![3, 4, 9]);
    assert_eq!((q.computed, q.pending_len()), (12, 1));
    // 13 tokens need the same 4 blocks the step used: none to release here.
    assert_eq!(s.blocks().table(SeqId(1)).len(), 4);
    let st = s.stats().speculative;
    assert_eq!(
        (st.draft_tokens, st.accepted_tokens, st.verification_steps),
        (4, 1, 1)
    );
    assert_eq!(st.tokens_per_verification, 2.0);
}

/// Makes sequence 1's acceptance estimate near 1, so steps carry all `k` drafts.
fn trust_drafts(s: &mut Scheduler) {
    for _ in 0..30 {
        s.running_mut(SeqId(1))
            .and_then(|q| q.spec.as_mut())
            .expect("spec")
            .observe_verification(4, 4);
    }
}

/// Takes the step's drafts as the engine does, then pushes `sampled` and commits.
fn verify(s: &mut Scheduler, sampled: &[u32], accepted: usize) -> Vec<u32> {
    s.commit_step(SeqId(1));
    let q = s.running_mut(SeqId(1)).expect("running");
    let drafts = std::mem::take(&mut q.drafts);
    for &t in sampled {
        push(q, t);
    }
    s.commit_drafts(SeqId(1), drafts.len(), accepted);
    drafts
}

#[test]
fn a_run_rejected_at_its_first_draft_frees_the_blocks_past_the_end() {
    let (mut s, _rx) = decoding_one(50);
    trust_drafts(&mut s);
    let _ = s.schedule();
    // "4" accepted, then 1 instead of "5": the pending token 1 sits at position 12.
    assert_eq!(verify(&mut s, &[4, 1], 1), vec![4, 5, 6, 7]);
    assert_eq!(s.running_mut(SeqId(1)).expect("q").computed, 12);
    let used_before = s.blocks().used_blocks();
    assert_eq!(used_before, 4);
    // History "… 8 1 2 3 4 1": the 1-gram "1" last occurred at index 8, followed by
    // 2 3 4 1. Positions 12..=16 need a fifth block.
    let (batch, _) = s.schedule();
    assert_eq!(batch.items[0].tokens, vec![1, 2, 3, 4, 1]);
    assert_eq!(s.blocks().table(SeqId(1)).len(), 5);
    let fifth = s.blocks().table(SeqId(1))[4];
    assert_eq!(s.blocks().ref_count(fifth), 1);
    // The model sampled 7, not "2": nothing accepted, 14 tokens fit in 4 blocks.
    verify(&mut s, &[7], 0);
    assert_eq!(s.blocks().table(SeqId(1)).len(), 4);
    assert_eq!(
        s.blocks().ref_count(fifth),
        0,
        "the fifth block is free again"
    );
    assert_eq!(s.blocks().used_blocks(), used_before);
    let q = s.running_mut(SeqId(1)).expect("q");
    assert_eq!((q.computed, q.total_len()), (13, 14));
}

#[test]
fn drafts_never_exceed_the_generation_budget() {
    // 3 tokens allowed: 3 is generated, so the step may yield 2 more: 1 draft.
    let (mut s, _rx) = decoding_one(3);
    trust_drafts(&mut s);
    let (batch, _) = s.schedule();
    assert_eq!(batch.items[0].tokens, vec![3, 4]);
}

#[test]
fn a_request_with_speculation_off_gets_no_drafts() {
    let mut s = sched();
    let (mut req, _rx) = request(1, 10, 50);
    req.sampling.speculative = false;
    s.submit(req).expect("submit");
    let (batch, _) = s.schedule();
    prefill_and_sample(&mut s, &batch, 3);
    let (batch, _) = s.schedule();
    assert_eq!(batch.items[0].tokens, vec![3]);
    assert_eq!(batch.items[0].logit_rows, 1);
}

#[test]
fn no_drafts_when_more_sequences_decode_than_speculative_max_running() {
    let mut s = sched();
    let mut rxs = Vec::new();
    for id in 1..=3 {
        let (req, rx) = request(id, 10, 50);
        s.submit(req).expect("submit");
        rxs.push(rx);
    }
    let (batch, _) = s.schedule();
    prefill_and_sample(&mut s, &batch, 3);
    let (batch, _) = s.schedule();
    // 3 decoding > max_running 2: one token each.
    assert!(batch.items.iter().all(|i| i.tokens.len() == 1), "{batch:?}");
}

#[test]
fn cancelling_mid_verification_returns_every_block() {
    let (mut s, _rx) = decoding_one(50);
    let (batch, _) = s.schedule();
    assert!(batch.items[0].tokens.len() > 1, "drafts in flight");
    s.running_mut(SeqId(1)).expect("q").cancel.cancel();
    // The step returns while cancelled: the engine skips sampling; the sweep frees.
    s.commit_step(SeqId(1));
    let gone = s.take_cancelled();
    assert_eq!(gone.len(), 1);
    assert_eq!(s.blocks().used_blocks(), 0);
    assert_eq!(s.blocks().free_blocks(), 100);
}

/// The draft method: the item asks the runner's draft model for drafts, catching up
/// from what the draft model holds; after the verification the draft model holds the
/// pending token and the accepted drafts it ran (not the last draft it proposed).
#[test]
fn a_draft_model_item_catches_up_and_tracks_what_the_draft_holds() {
    let mut s = sched_with(Speculation {
        draft_cost: Some(0.2),
        ..SPEC
    });
    let (req, _rx) = request(1, 10, 50);
    s.submit(req).expect("submit");
    let (batch, _) = s.schedule();
    assert!(batch.items[0].draft.is_none(), "no drafts while prefilling");
    prefill_and_sample(&mut s, &batch, 3);
    let (batch, _) = s.schedule();
    let item = &batch.items[0];
    let work = item.draft.as_ref().expect("draft work");
    // Prior 0.9 at cost 0.2 + 0.15 per draft: 4 drafts (the whole k).
    assert_eq!(work.k, 4);
    assert_eq!(
        work.start_pos, 0,
        "the draft model has computed nothing yet"
    );
    assert_eq!(work.tokens.len(), 11, "prompt and the pending token");
    assert_eq!(item.tokens, vec![3], "the runner appends the drafts");
    assert_eq!(item.logit_rows, 5);
    assert_eq!(item.block_table.len(), 4, "positions 10..15");
    // The runner proposed 4 drafts; the first 2 were accepted, then 9 was sampled.
    s.commit_step(SeqId(1));
    let q = s.running_mut(SeqId(1)).expect("running");
    for t in [7, 8, 9] {
        push(q, t);
    }
    s.commit_drafts(SeqId(1), 4, 2);
    let q = s.running_mut(SeqId(1)).expect("running");
    assert_eq!((q.computed, q.total_len()), (13, 14));
    assert_eq!(q.spec.as_ref().map(|st| st.draft_computed), Some(13));
    let (batch, _) = s.schedule();
    let work = batch.items[0].draft.as_ref().expect("draft work");
    assert_eq!((work.start_pos, work.tokens.clone()), (13, vec![9]));
    // All 4 accepted: the draft model never ran the last one.
    s.commit_step(SeqId(1));
    let q = s.running_mut(SeqId(1)).expect("running");
    for t in [1, 2, 3, 4, 5] {
        push(q, t);
    }
    s.commit_drafts(SeqId(1), 4, 4);
    let q = s.running_mut(SeqId(1)).expect("running");
    assert_eq!((q.computed, q.total_len()), (18, 19));
    assert_eq!(q.spec.as_ref().map(|st| st.draft_computed), Some(17));
    assert_eq!(s.stats().speculative.method, "draft");
}
