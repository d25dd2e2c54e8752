//! Scheduler policy and sequence state, driven without actix.

use std::time::Instant;

use tokio::sync::mpsc;

use super::policy::{Scheduler, SchedulerLimits};
use super::sequence::{TokenOutcome, TokenizedRequest};
use crate::error::ErrorKind;
use crate::request::{CancelFlag, EventReceiver, FinishReason, SamplingParams, SeqId, StreamEvent};

fn params(max_tokens: usize, stop: &[&str]) -> SamplingParams {
    SamplingParams {
        temperature: 0.0,
        top_k: 0,
        top_p: 1.0,
        min_p: 0.0,
        seed: 0,
        max_tokens,
        stop: stop.iter().map(|s| s.to_string()).collect(),
    }
}

fn request(
    id: u64,
    prompt_len: usize,
    max_tokens: usize,
) -> (TokenizedRequest, EventReceiver, CancelFlag) {
    let (tx, rx) = mpsc::unbounded_channel();
    let cancel = CancelFlag::new();
    let req = TokenizedRequest {
        seq: SeqId(id),
        client_id: format!("r{id}"),
        prompt: (0..prompt_len as u32).map(|i| 100 + i).collect(),
        sampling: params(max_tokens, &[]),
        events: tx,
        cancel: cancel.clone(),
        received_at: Instant::now(),
    };
    (req, rx, cancel)
}

fn limits(max_running: usize, max_waiting: usize, ctx: usize) -> SchedulerLimits {
    SchedulerLimits {
        max_running,
        max_waiting,
        context_length: ctx,
        prefill_chunk_tokens: 8,
        attention_cost_tokens: usize::MAX / 2,
    }
}

#[test]
fn admits_in_arrival_order_up_to_max_running() {
    let mut s = Scheduler::new(limits(2, 10, 100));
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
    let mut s = Scheduler::new(limits(4, 10, 100));
    let (r, _rx, _c) = request(1, 3, 10);
    s.submit(r).expect("submit");
    let (batch, _) = s.schedule();
    assert_eq!(batch.items[0].tokens, vec![100, 101, 102]);
    let seq = s.running_mut(SeqId(1)).expect("running");
    assert_eq!(seq.in_flight, 3);
    seq.computed = 3;
    assert_eq!(seq.accept_token(7, b"x", false), TokenOutcome::Continue);
    let (batch, _) = s.schedule();
    assert_eq!(batch.items[0].tokens, vec![7]);
}

#[test]
fn overload_and_context_errors_name_the_numbers() {
    let mut s = Scheduler::new(limits(1, 1, 50));
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
    let mut s = Scheduler::new(limits(1, 1, 20));
    let (r, _rx, _c) = request(1, 15, 1000);
    s.submit(r).expect("submit");
    s.schedule();
    let seq = s.running_mut(SeqId(1)).expect("running");
    assert_eq!(seq.max_new_tokens, 5);
    for i in 0..4 {
        assert_eq!(seq.accept_token(i, b"a", false), TokenOutcome::Continue);
    }
    assert_eq!(
        seq.accept_token(9, b"a", false),
        TokenOutcome::Finished(FinishReason::Length)
    );
}

#[test]
fn cancelled_sequences_leave_and_running_ones_are_freed_next_step() {
    let mut s = Scheduler::new(limits(1, 10, 100));
    let (r1, _rx1, c1) = request(1, 4, 10);
    let (r2, _rx2, c2) = request(2, 4, 10);
    s.submit(r1).expect("submit");
    s.submit(r2).expect("submit");
    s.schedule(); // 1 runs, 2 waits
    c1.cancel();
    c2.cancel();
    let gone: Vec<SeqId> = s.take_cancelled().iter().map(|q| q.id).collect();
    assert_eq!(gone.len(), 2);
    assert!(gone.contains(&SeqId(1)) && gone.contains(&SeqId(2)));
    assert_eq!(
        s.pending_frees(),
        &[SeqId(1)],
        "only the running one holds KV"
    );
    let (batch, admitted) = s.schedule();
    assert_eq!(batch.free, vec![SeqId(1)]);
    assert!(batch.items.is_empty() && admitted.is_empty());
    assert!(s.is_idle());
}

#[test]
fn finishing_streams_the_rest_and_reports_usage() {
    let mut s = Scheduler::new(limits(1, 10, 100));
    let (tx, mut rx) = mpsc::unbounded_channel();
    let req = TokenizedRequest {
        seq: SeqId(1),
        client_id: "r".into(),
        prompt: vec![1, 2],
        sampling: params(10, &["STOP"]),
        events: tx,
        cancel: CancelFlag::new(),
        received_at: Instant::now(),
    };
    s.submit(req).expect("submit");
    s.schedule();
    let seq = s.running_mut(SeqId(1)).expect("running");
    assert_eq!(
        seq.accept_token(10, "héllo ".as_bytes(), false),
        TokenOutcome::Continue
    );
    // "ST" may start the stop string: held back.
    assert_eq!(seq.accept_token(11, b"ST", false), TokenOutcome::Continue);
    // EOS: the held text is flushed with the remaining ids, then done.
    assert_eq!(
        seq.accept_token(2, b"", true),
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
            token_ids: vec![10]
        }
    );
    assert_eq!(
        events[1],
        StreamEvent::Delta {
            text: "ST".into(),
            token_ids: vec![11, 2]
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
    assert_eq!(s.schedule().0.free, vec![SeqId(1)]);
}

#[test]
fn long_prompts_are_prefilled_in_chunks_within_a_step_budget() {
    // Budget 8 prompt tokens per step; decodes are always included.
    let mut s = Scheduler::new(limits(4, 10, 100));
    let (r1, _rx1, _c1) = request(1, 3, 10);
    s.submit(r1).expect("submit");
    let (b, _) = s.schedule();
    assert_eq!(b.items[0].tokens.len(), 3);
    let seq = s.running_mut(SeqId(1)).expect("running");
    seq.computed += std::mem::take(&mut seq.in_flight);
    seq.accept_token(50, b"a", false);
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
                if ran > 0 && !q.is_prefilling() {
                    q.accept_token(60 + step, b"b", false);
                }
            }
        }
    }
    // Seq 1 decodes every step. The budget goes shortest-remaining-first: seq 3's
    // 5-token prompt before seq 2's 20-token one, which takes the rest: 3 + 8 + 8 + 1.
    assert_eq!(
        chunks,
        vec![
            vec![(1, 1), (2, 3), (3, 5)],
            vec![(1, 1), (2, 8), (3, 1)],
            vec![(1, 1), (2, 8), (3, 1)],
            vec![(1, 1), (2, 1), (3, 1)],
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
        prefill_chunk_tokens: 256,
        attention_cost_tokens: 1024,
    };
    assert_eq!(l.chunk_at(0, 256), 256);
    assert_eq!(l.chunk_at(1024, 256), 128);
    assert_eq!(l.chunk_at(8000, 256), 30);
    assert_eq!(l.chunk_at(1_000_000, 256), 1, "always progresses");
    assert_eq!(l.chunk_at(0, 10), 10, "never above the remaining budget");
}
