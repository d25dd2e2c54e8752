//! Scheduler policy and sequence state, driven without actix.

use std::time::Instant;

use tokio::sync::mpsc;

use super::block_manager::{BlockManager, OutOfBlocks};
use super::policy::{Scheduler, SchedulerLimits};
use super::sequence::{Prepared, TokenOutcome};
use crate::error::ErrorKind;
use crate::request::{CancelFlag, EventReceiver, FinishReason, SamplingParams, SeqId, StreamEvent};
use crate::sampling::{Sampled, SamplerChain};

fn params(max_tokens: usize, stop: &[&str]) -> SamplingParams {
    SamplingParams {
        temperature: 0.0,
        top_k: 0,
        top_p: 1.0,
        min_p: 0.0,
        seed: 0,
        max_tokens,
        stop: stop.iter().map(|s| s.to_string()).collect(),
        ..SamplingParams::default()
    }
}

/// `accept_token` without log-probabilities, for tests whose chain cannot fail.
trait PushToken {
    fn push_token(&mut self, token: u32, bytes: &[u8], is_eog: bool) -> TokenOutcome;
}

impl PushToken for super::sequence::Sequence {
    fn push_token(&mut self, token: u32, bytes: &[u8], is_eog: bool) -> TokenOutcome {
        let sampled = Sampled {
            token,
            logprobs: None,
        };
        self.accept_token(sampled, bytes, is_eog)
            .expect("native chains accept every token")
    }
}

pub(super) fn request(
    id: u64,
    prompt_len: usize,
    max_tokens: usize,
) -> (Prepared, EventReceiver, CancelFlag) {
    let (tx, rx) = mpsc::unbounded_channel();
    let cancel = CancelFlag::new();
    let req = Prepared {
        channels: Default::default(),
        seq: SeqId(id),
        client_id: format!("r{id}"),
        prompt: (0..prompt_len as u32).map(|i| 100 + i).collect(),
        chain: SamplerChain::new(&params(max_tokens, &[]), &[]),
        sampling: params(max_tokens, &[]),
        events: tx,
        cancel: cancel.clone(),
        received_at: Instant::now(),
        cache: Default::default(),
        disk_hit: None,
        forks: Vec::new(),
        adapter: None,
        images: Vec::new(),
    };
    (req, rx, cancel)
}

fn limits(max_running: usize, max_waiting: usize, ctx: usize) -> SchedulerLimits {
    SchedulerLimits {
        max_running,
        max_waiting,
        context_length: ctx,
        max_batch_tokens: 9,
        attention_cost_tokens: usize::MAX / 2,
    }
}

/// A scheduler over a roomy pool (1,000 blocks of 4 tokens).
pub(super) fn sched(max_running: usize, max_waiting: usize, ctx: usize) -> Scheduler {
    Scheduler::new(
        limits(max_running, max_waiting, ctx),
        BlockManager::new(1000, 4),
    )
}

/// Marks the step as run for every running sequence; those with all tokens computed
/// accept `token`.
fn complete_step(s: &mut Scheduler, ids: &[u64], token: u32) {
    for &id in ids {
        if let Some(q) = s.running_mut(SeqId(id)) {
            let ran = std::mem::take(&mut q.in_flight);
            q.computed += ran;
            if ran > 0 && q.pending_len() == 0 {
                q.push_token(token, b"t", false);
            }
        }
    }
}

#[test]
fn admits_in_arrival_order_up_to_max_running() {
    let mut s = sched(2, 10, 100);
    let mut keep = Vec::new();
    for id in 1..=3 {
        let (r, rx, c) = request(id, 5, 10);
        s.submit(r).expect("submit");
        keep.push((rx, c));
    }
    let (batch, admitted) = s.schedule();
    assert_eq!(admitted, vec![SeqId(1), SeqId(2)]);
    assert_eq!(batch.items.len(), 2);
    assert_eq!(batch.items[0].tokens, vec![100, 101, 102, 103, 104]);
    assert_eq!(s.waiting_len(), 1);
    assert_eq!(s.running_len(), 2);
}

#[test]
fn prefill_then_one_token_per_step() {
    let mut s = sched(4, 10, 100);
    let (r, _rx, _c) = request(1, 3, 10);
    s.submit(r).expect("submit");
    let (batch, _) = s.schedule();
    assert_eq!(batch.items[0].tokens, vec![100, 101, 102]);
    let seq = s.running_mut(SeqId(1)).expect("running");
    assert_eq!(seq.in_flight, 3);
    seq.computed = 3;
    assert_eq!(seq.push_token(7, b"x", false), TokenOutcome::Continue);
    let (batch, _) = s.schedule();
    assert_eq!(batch.items[0].tokens, vec![7]);
}

#[test]
fn overload_and_context_errors_name_the_numbers() {
    let mut s = sched(1, 1, 50);
    let (r, _rx1, _c1) = request(1, 5, 10);
    s.submit(r).expect("first waits");
    let (r, _rx2, _c2) = request(2, 5, 10);
    let e = s.submit(r).expect_err("queue full");
    assert_eq!(e.1.kind, ErrorKind::Overloaded);
    assert!(e.1.message.contains("max_waiting = 1"), "{}", e.1.message);
    let (r, _rx3, _c3) = request(3, 50, 10);
    let e = s.submit(r).expect_err("too long");
    assert_eq!(e.1.kind, ErrorKind::ContextLengthExceeded);
    assert!(e.1.message.contains("50 tokens") && e.1.message.contains("context window is 50"));
}

#[test]
fn generation_budget_is_capped_by_the_context_window() {
    let mut s = sched(1, 1, 20);
    let (r, _rx, _c) = request(1, 15, 1000);
    s.submit(r).expect("submit");
    s.schedule();
    let seq = s.running_mut(SeqId(1)).expect("running");
    assert_eq!(seq.max_new_tokens, 5);
    for i in 0..4 {
        assert_eq!(seq.push_token(i, b"a", false), TokenOutcome::Continue);
    }
    assert_eq!(
        seq.push_token(9, b"a", false),
        TokenOutcome::Finished(FinishReason::Length)
    );
}

#[test]
fn cancelled_sequences_leave_and_running_ones_are_freed_next_step() {
    let mut s = sched(1, 10, 100);
    let (r1, _rx1, c1) = request(1, 4, 10);
    let (r2, _rx2, c2) = request(2, 4, 10);
    s.submit(r1).expect("submit");
    s.submit(r2).expect("submit");
    s.schedule(); // 1 runs, 2 waits
    c1.cancel();
    c2.cancel();
    assert_eq!(
        s.blocks().used_blocks(),
        1,
        "seq 1 holds its prompt's block"
    );
    let gone: Vec<SeqId> = s.take_cancelled().iter().map(|q| q.id).collect();
    assert_eq!(gone.len(), 2);
    assert!(gone.contains(&SeqId(1)) && gone.contains(&SeqId(2)));
    assert_eq!(s.blocks().used_blocks(), 0, "blocks are freed at once");
    let (batch, admitted) = s.schedule();
    assert!(batch.items.is_empty() && admitted.is_empty());
    assert!(s.is_idle());
}

#[test]
fn finishing_streams_the_rest_and_reports_usage() {
    let mut s = sched(1, 10, 100);
    let (tx, mut rx) = mpsc::unbounded_channel();
    let req = Prepared {
        channels: Default::default(),
        seq: SeqId(1),
        client_id: "r".into(),
        prompt: vec![1, 2],
        sampling: params(10, &["STOP"]),
        chain: SamplerChain::new(&SamplingParams::default(), &[]),
        events: tx,
        cancel: CancelFlag::new(),
        received_at: Instant::now(),
        cache: Default::default(),
        disk_hit: None,
        forks: Vec::new(),
        adapter: None,
        images: Vec::new(),
    };
    s.submit(req).expect("submit");
    s.schedule();
    let seq = s.running_mut(SeqId(1)).expect("running");
    assert_eq!(
        seq.push_token(10, "héllo ".as_bytes(), false),
        TokenOutcome::Continue
    );
    // "ST" may start the stop string: held back.
    assert_eq!(seq.push_token(11, b"ST", false), TokenOutcome::Continue);
    // EOS: the held text is flushed with the remaining ids, then done.
    assert_eq!(
        seq.push_token(2, b"", true),
        TokenOutcome::Finished(FinishReason::Stop)
    );
    let mut seq = s.remove_running(SeqId(1)).expect("remove");
    seq.finish(FinishReason::Stop);
    let mut events = Vec::new();
    while let Ok(e) = rx.try_recv() {
        events.push(e);
    }
    assert_eq!(
        events[0],
        StreamEvent::Delta {
            text: "héllo ".into(),
            token_ids: vec![10],
            logprobs: vec![],
            reasoning: String::new(),
            tool_calls: Vec::new(),
        }
    );
    assert_eq!(
        events[1],
        StreamEvent::Delta {
            text: "ST".into(),
            token_ids: vec![11, 2],
            logprobs: vec![],
            reasoning: String::new(),
            tool_calls: Vec::new(),
        }
    );
    match &events[2] {
        StreamEvent::Done {
            finish_reason,
            usage,
            ..
        } => {
            assert_eq!(*finish_reason, FinishReason::Stop);
            assert_eq!(usage.prompt_tokens, 2);
            assert_eq!(usage.completion_tokens, 3);
        }
        other => panic!("expected done, got {other:?}"),
    }
    assert_eq!(s.blocks().used_blocks(), 0);
}

#[test]
fn long_prompts_are_prefilled_in_chunks_within_a_step_budget() {
    // Budget 9 tokens per step; decodes are always included, prefill gets the rest.
    let mut s = sched(4, 10, 100);
    let (r1, _rx1, _c1) = request(1, 3, 10);
    s.submit(r1).expect("submit");
    let (b, _) = s.schedule();
    assert_eq!(b.items[0].tokens.len(), 3);
    let seq = s.running_mut(SeqId(1)).expect("running");
    seq.computed += std::mem::take(&mut seq.in_flight);
    seq.push_token(50, b"a", false);
    let (r2, _rx2, _c2) = request(2, 20, 10);
    let (r3, _rx3, _c3) = request(3, 5, 10);
    s.submit(r2).expect("submit");
    s.submit(r3).expect("submit");
    let mut chunks = Vec::new();
    for step in 0..4u32 {
        let (b, _) = s.schedule();
        let sizes: Vec<(u64, usize)> = b.items.iter().map(|i| (i.seq.0, i.tokens.len())).collect();
        chunks.push(sizes);
        for id in [1, 2, 3] {
            if let Some(q) = s.running_mut(SeqId(id)) {
                let ran = std::mem::take(&mut q.in_flight);
                q.computed += ran;
                if ran > 0 && q.pending_len() == 0 {
                    q.push_token(60 + step, b"b", false);
                }
            }
        }
    }
    // Seq 1 decodes every step. The budget goes shortest-remaining-first: seq 3's
    // 5-token prompt before seq 2's 20-token one, which takes the rest: 3 + 7 + 7 + 3.
    assert_eq!(
        chunks,
        vec![
            vec![(1, 1), (2, 3), (3, 5)],
            vec![(1, 1), (2, 7), (3, 1)],
            vec![(1, 1), (2, 7), (3, 1)],
            vec![(1, 1), (2, 3), (3, 1)],
        ]
    );
    // The chunks are the prompt in order, then the sampled token.
    let seq2 = s.running_mut(SeqId(2)).expect("running");
    assert_eq!(seq2.computed, 20);
    assert_eq!(seq2.pending_tokens(5), vec![63]);
}

#[test]
fn chunks_shrink_as_the_context_gets_deeper() {
    let l = SchedulerLimits {
        max_running: 1,
        max_waiting: 1,
        context_length: 10_000,
        max_batch_tokens: 256,
        attention_cost_tokens: 1024,
    };
    assert_eq!(l.chunk_at(0, 256), 256);
    assert_eq!(l.chunk_at(1024, 256), 128);
    assert_eq!(l.chunk_at(8000, 256), 30);
    assert_eq!(l.chunk_at(1_000_000, 256), 1, "always progresses");
    assert_eq!(l.chunk_at(0, 10), 10, "never above the remaining budget");
}

#[test]
fn block_manager_allocates_all_or_nothing_and_counts_references() {
    let mut m = BlockManager::new(4, 16);
    assert_eq!(
        (m.total_blocks(), m.free_blocks(), m.capacity_tokens()),
        (4, 4, 64)
    );
    m.ensure(SeqId(1), 17).expect("2 blocks");
    assert_eq!(m.table(SeqId(1)), &[0, 1]);
    m.ensure(SeqId(1), 32).expect("still 2 blocks");
    assert_eq!(m.table(SeqId(1)).len(), 2);
    assert_eq!(
        m.ensure(SeqId(2), 49),
        Err(OutOfBlocks { needed: 4, free: 2 })
    );
    assert!(m.table(SeqId(2)).is_empty(), "nothing allocated on failure");
    // Seq 3 shares seq 1's first block (a common prefix), then grows on its own.
    assert_eq!(m.share_prefix(SeqId(1), SeqId(3), 1), 1);
    assert_eq!(m.ref_count(0), 2);
    m.ensure(SeqId(3), 20).expect("one more block");
    assert_eq!(m.table(SeqId(3)), &[0, 2]);
    assert_eq!(m.used_blocks(), 3);
    // Freeing seq 1 frees only its unshared block.
    assert_eq!(m.free(SeqId(1)), 1);
    assert_eq!(m.ref_count(0), 1);
    assert_eq!(m.ref_count(1), 0);
    assert_eq!(m.free(SeqId(3)), 2);
    assert_eq!(m.free_blocks(), 4);
    assert_eq!(m.free(SeqId(3)), 0, "double free is a no-op");
}

#[test]
fn admission_waits_for_free_blocks() {
    // 4 blocks of 4 tokens. Seq 1's 10-token prompt takes 3; seq 2's 6-token prompt
    // needs 2 (+ 1 watermark block) and must wait even though max_running allows it.
    let mut s = Scheduler::new(limits(4, 10, 100), BlockManager::new(4, 4));
    let (r1, _rx1, _c1) = request(1, 10, 2);
    let (r2, _rx2, _c2) = request(2, 6, 2);
    s.submit(r1).expect("submit");
    s.submit(r2).expect("submit");
    let (b, admitted) = s.schedule();
    assert_eq!(admitted, vec![SeqId(1)]);
    assert_eq!(b.items.len(), 1);
    assert_eq!(b.items[0].block_table, vec![0, 1, 2]);
    assert_eq!((s.running_len(), s.waiting_len()), (1, 1));
    assert_eq!(s.stats().kv_blocks_used, 3);
    s.remove_running(SeqId(1)).expect("finish");
    let (b, admitted) = s.schedule();
    assert_eq!(admitted, vec![SeqId(2)]);
    assert_eq!(b.items[0].tokens.len(), 6);
    assert_eq!(s.stats().kv_blocks_used, 2);
}

#[test]
fn prompts_beyond_the_kv_budget_are_refused_and_budgets_capped() {
    let mut s = Scheduler::new(limits(4, 10, 1000), BlockManager::new(4, 4));
    let (r, _rx, _c) = request(1, 16, 5);
    let e = s
        .submit(r)
        .expect_err("16 tokens leave no room in a 16-token cache");
    assert_eq!(e.1.kind, ErrorKind::ContextLengthExceeded);
    assert!(
        e.1.message.contains("KV cache holds 16 tokens") && e.1.message.contains("kv_cache_bytes"),
        "{}",
        e.1.message
    );
    let (r, _rx, _c) = request(2, 10, 100);
    s.submit(r).expect("fits");
    s.schedule();
    assert_eq!(s.running_mut(SeqId(2)).expect("running").max_new_tokens, 6);
}

#[test]
fn out_of_blocks_preempts_the_newest_and_recomputes_it_later() {
    // 6 blocks of 4 tokens; two 8-token prompts (2 blocks each) both fit at first.
    let lim = SchedulerLimits {
        max_batch_tokens: 16,
        ..limits(4, 10, 100)
    };
    let mut s = Scheduler::new(lim, BlockManager::new(6, 4));
    let (r1, mut rx1, _c1) = request(1, 8, 20);
    let (r2, mut rx2, _c2) = request(2, 8, 20);
    s.submit(r1).expect("submit");
    s.submit(r2).expect("submit");
    let (b, admitted) = s.schedule();
    assert_eq!(admitted, vec![SeqId(1), SeqId(2)]);
    assert_eq!(b.items.len(), 2);
    for id in admitted {
        s.running_mut(id).expect("running").send_started(); // as the engine loop does
    }
    complete_step(&mut s, &[1, 2], 500); // both sampled their first token (position 8)
                                         // Position 8 needs a third block each: 6 used, 0 free.
    let (b, _) = s.schedule();
    assert_eq!(b.items.len(), 2);
    assert_eq!(s.blocks().free_blocks(), 0);
    for _ in 0..3 {
        complete_step(&mut s, &[1, 2], 501);
        let (b, _) = s.schedule();
        assert_eq!(b.items.len(), 2, "positions 9..11 fit in the third blocks");
    }
    complete_step(&mut s, &[1, 2], 502);
    // Position 12 needs a fourth block: seq 2 (newest) is preempted, seq 1 continues.
    let (b, admitted) = s.schedule();
    assert!(admitted.is_empty());
    assert_eq!(b.items.len(), 1);
    assert_eq!(b.items[0].seq, SeqId(1));
    assert_eq!(b.items[0].start_pos, 12);
    let st = s.stats();
    assert_eq!(
        (st.running, st.waiting, st.preempted, st.preemptions_total),
        (1, 1, 1, 1)
    );
    assert_eq!(st.kv_blocks_used, 4);
    // Seq 1 finishes; seq 2 comes back and recomputes prompt + its 5 generated tokens
    // in one 13-token chunk, without a second `started`.
    complete_step(&mut s, &[1], 503);
    s.remove_running(SeqId(1)).expect("finish");
    let (b, admitted) = s.schedule();
    assert!(
        admitted.is_empty(),
        "a resumed sequence is not started again"
    );
    assert_eq!(b.items.len(), 1);
    let item = &b.items[0];
    assert_eq!(
        (item.seq, item.start_pos, item.tokens.len()),
        (SeqId(2), 0, 13)
    );
    assert_eq!(item.logit_rows, 1);
    assert_eq!(&item.tokens[8..], &[500, 501, 501, 501, 502]);
    complete_step(&mut s, &[2], 504);
    let (b, _) = s.schedule();
    assert_eq!(
        (b.items[0].start_pos, b.items[0].tokens.clone()),
        (13, vec![504])
    );
    // Recomputing streamed nothing: seq 2's events are its 5 deltas from before
    // preemption and the one token sampled after recomputing.
    let mut ids = Vec::new();
    while let Ok(e) = rx2.try_recv() {
        match e {
            StreamEvent::Delta { token_ids, .. } => ids.extend(token_ids),
            StreamEvent::Started { .. } => assert!(ids.is_empty(), "started comes first, once"),
            other => panic!("unexpected event {other:?}"),
        }
    }
    assert_eq!(ids, vec![500, 501, 501, 501, 502, 504]);
    assert!(rx1.try_recv().is_ok());
}

/// A request whose LoRA adapter is not resident waits (its load asked for) while the
/// requests behind it are admitted; once loaded it is admitted with the weights; an
/// adapter unregistered meanwhile fails its waiting requests.
#[test]
fn requests_wait_for_their_adapter_while_others_run() {
    use crate::adapters::AdapterRegistry;
    use crate::model::lora::tests::peft_dir;
    use crate::model::lora::LoraBase;
    use crate::model::reference_tests::{load_model, tiny_dir};
    let model = load_model(&tiny_dir("llama"));
    let reg = std::sync::Arc::new(AdapterRegistry::new(LoraBase::of(&model), 1, 64));
    reg.register("a", &peft_dir("llama")).expect("a");
    reg.register("b", &peft_dir("llama-rslora")).expect("b");
    reg.register("c", &peft_dir("llama-layers")).expect("c");
    let mut s = sched(8, 10, 100).with_adapters(reg.clone());
    let mut keep = Vec::new();
    for (id, adapter) in [(1, Some("a")), (2, Some("b")), (3, None), (4, Some("c"))] {
        let (mut r, rx, c) = request(id, 5, 10);
        r.adapter = adapter.map(|n| reg.lease(n, 1.0).expect("lease"));
        s.submit(r).expect("submit");
        keep.push((rx, c));
    }
    // a is resident (the one slot); b waits for it, and so does c; the base runs.
    let (batch, admitted) = s.schedule();
    assert_eq!(admitted, vec![SeqId(1), SeqId(3)]);
    let with_adapter: Vec<bool> = batch.items.iter().map(|i| i.adapter.is_some()).collect();
    assert_eq!(with_adapter, [true, false]);
    assert!(s.take_adapter_loads().is_none(), "a runs: nothing to evict");
    assert_eq!(s.stats().lora.running, ["a"]);
    assert_eq!(s.stats().lora.waiting, ["b", "c"]);
    // a's sequence ends: b's request evicts it and asks for b's load.
    complete_step(&mut s, &[1, 3], 7);
    drop(s.remove_running(SeqId(1)));
    s.schedule();
    let (r2, loads) = s.take_adapter_loads().expect("b's load");
    assert_eq!(
        loads.iter().map(|l| l.0.as_str()).collect::<Vec<_>>(),
        ["b"]
    );
    r2.load_resident(&loads[0].0, &loads[0].1).expect("load b");
    let (batch, admitted) = s.schedule();
    assert_eq!(admitted, vec![SeqId(2)]);
    assert!(batch
        .items
        .iter()
        .any(|i| i.seq == SeqId(2) && i.adapter.is_some()));
    // c is unloaded before its turn: its request fails, naming why.
    drop(s.remove_running(SeqId(2)));
    s.schedule();
    let (r3, loads) = s.take_adapter_loads().expect("c's load");
    // The file fails to load (here: a path that is no adapter under c's name).
    let err = r3
        .load_resident(&loads[0].0, &tiny_dir("llama"))
        .expect_err("not an adapter");
    assert!(err.to_string().contains("LoRA adapter `c`"), "{err}");
    s.schedule();
    let gone = s.take_gone();
    assert_eq!(gone.len(), 1);
    assert_eq!(gone[0].0.id, SeqId(4));
    assert!(gone[0].1.contains("LoRA adapter `c`"), "{}", gone[0].1);
}
