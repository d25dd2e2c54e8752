//! The post-step driven without actix: a step's logits into sampled tokens, streamed
//! events, finished and failed sequences (the default model's tokenizer for bytes).

use std::sync::OnceLock;

use candle_core::quantized::gguf_file::Content;

use super::post_step::PostStep;
use super::tests::{request, sched};
use crate::error::{ErrorKind, InferError};
use crate::model_runner::{ItemOutput, StepOutput};
use crate::request::{EventReceiver, FinishReason, SeqId, StreamEvent};
use crate::tokenizer::TextTokenizer;

fn tokenizer() -> &'static TextTokenizer {
    static TOK: OnceLock<TextTokenizer> = OnceLock::new();
    TOK.get_or_init(|| {
        let path = crate::test_support::default_model_path();
        let mut file = std::fs::File::open(&path).expect("open default model");
        let md = Content::read(&mut file).expect("read GGUF").metadata;
        TextTokenizer::from_gguf(&md).expect("tokenizer from GGUF")
    })
}

/// A logits row over the default model's vocabulary whose greedy choice is `token`.
fn row_for(token: u32) -> Vec<f32> {
    let mut row = vec![0.0; tokenizer().vocab_size()];
    row[token as usize] = 5.0;
    row
}

fn output(seq: u64, logits: Result<Vec<Vec<f32>>, InferError>) -> StepOutput {
    StepOutput {
        items: vec![ItemOutput {
            seq: SeqId(seq),
            logits,
            drafts: Vec::new(),
        }],
    }
}

fn events(rx: &mut EventReceiver) -> Vec<StreamEvent> {
    std::iter::from_fn(|| rx.try_recv().ok()).collect()
}

fn sampled_ids(events: &[StreamEvent]) -> Vec<u32> {
    events
        .iter()
        .flat_map(|e| match e {
            StreamEvent::Delta { token_ids, .. } => token_ids.clone(),
            _ => Vec::new(),
        })
        .collect()
}

#[test]
fn greedy_tokens_stream_and_the_budget_finishes_the_sequence() {
    let tok = tokenizer();
    let mut s = sched(4, 10, 100);
    let (r, mut rx, _c) = request(1, 3, 2);
    s.submit(r).expect("submit");
    s.schedule();
    let mut post = PostStep {
        scheduler: &mut s,
        vocab: tok,
        load: None,
    };
    post.on_step(output(1, Ok(vec![row_for(1234)])));
    assert_eq!(post.scheduler.running_len(), 1);
    assert_eq!(sampled_ids(&events(&mut rx)), vec![1234]);
    post.scheduler.schedule();
    let mut post = PostStep {
        scheduler: &mut s,
        vocab: tok,
        load: None,
    };
    post.on_step(output(1, Ok(vec![row_for(77)])));
    assert_eq!(post.scheduler.running_len(), 0, "max_tokens = 2 reached");
    let ev = events(&mut rx);
    assert_eq!(sampled_ids(&ev), vec![77]);
    match ev.last() {
        Some(StreamEvent::Done {
            finish_reason,
            usage,
            ..
        }) => {
            assert_eq!(*finish_reason, FinishReason::Length);
            assert_eq!((usage.prompt_tokens, usage.completion_tokens), (3, 2));
        }
        other => panic!("expected done, got {other:?}"),
    }
}

#[test]
fn a_failed_step_ends_only_its_sequence_with_the_runner_error() {
    let mut s = sched(4, 10, 100);
    let (r1, mut rx1, _c1) = request(1, 3, 5);
    let (r2, mut rx2, _c2) = request(2, 3, 5);
    s.submit(r1).expect("submit");
    s.submit(r2).expect("submit");
    s.schedule();
    let mut post = PostStep {
        scheduler: &mut s,
        vocab: tokenizer(),
        load: None,
    };
    let mut out = output(1, Err(InferError::internal("forward pass failed: oom")));
    out.items.push(ItemOutput {
        seq: SeqId(2),
        logits: Ok(vec![row_for(4321)]),
        drafts: Vec::new(),
    });
    post.on_step(out);
    match events(&mut rx1).last() {
        Some(StreamEvent::Error(e)) => {
            assert_eq!(e.kind, ErrorKind::Internal);
            assert_eq!(e.message, "forward pass failed: oom");
        }
        other => panic!("expected the runner's error, got {other:?}"),
    }
    assert_eq!(sampled_ids(&events(&mut rx2)), vec![4321]);
    assert_eq!(s.running_len(), 1);
}

#[test]
fn missing_logits_fail_the_sequence_as_internal() {
    let mut s = sched(4, 10, 100);
    let (r, mut rx, _c) = request(1, 3, 5);
    s.submit(r).expect("submit");
    s.schedule();
    PostStep {
        scheduler: &mut s,
        vocab: tokenizer(),
        load: None,
    }
    .on_step(output(1, Ok(Vec::new())));
    match events(&mut rx).last() {
        Some(StreamEvent::Error(e)) => {
            assert_eq!(e.kind, ErrorKind::Internal);
            assert!(e.message.contains("no logits"), "{}", e.message);
        }
        other => panic!("expected an internal error, got {other:?}"),
    }
    assert_eq!(s.running_len(), 0);
}

#[test]
fn fail_all_ends_running_and_waiting_sequences() {
    let mut s = sched(1, 10, 100);
    let (r1, mut rx1, _c1) = request(1, 3, 5);
    let (r2, mut rx2, _c2) = request(2, 3, 5);
    s.submit(r1).expect("submit");
    s.submit(r2).expect("submit");
    s.schedule();
    assert_eq!((s.running_len(), s.waiting_len()), (1, 1));
    PostStep {
        scheduler: &mut s,
        vocab: tokenizer(),
        load: None,
    }
    .fail_all(InferError::internal("model runner unavailable"));
    assert_eq!((s.running_len(), s.waiting_len()), (0, 0));
    for rx in [&mut rx1, &mut rx2] {
        assert!(
            matches!(events(rx).last(), Some(StreamEvent::Error(e)) if e.message == "model runner unavailable")
        );
    }
}

/// With several engines, a finishing sequence's blocks leave the load the placer reads
/// before its client sees `done`, so the client's next turn is placed against the
/// engine's real load (not the finished request's blocks).
#[test]
fn a_finished_sequence_leaves_the_reported_load_before_its_done_event() {
    let tok = tokenizer();
    let load = super::EngineLoad::default();
    let mut s = sched(4, 10, 100);
    let (r, mut rx, _c) = request(1, 7, 1);
    s.submit(r).expect("submit");
    s.schedule();
    load.set_active(s.load_blocks());
    assert_eq!(load.load(), 2, "7 prompt tokens in blocks of 4");
    let mut post = PostStep {
        scheduler: &mut s,
        vocab: tok,
        load: Some(&load),
    };
    post.on_step(output(1, Ok(vec![row_for(1234)])));
    assert!(matches!(
        events(&mut rx).last(),
        Some(StreamEvent::Done { .. })
    ));
    assert_eq!(load.load(), 0);
}
