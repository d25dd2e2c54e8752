//! The frames of `echo` and of `n > 1` choices: an `echo` frame with the prompt (and
//! its log-probabilities), and the `delta` / `done` frames of each choice with its
//! `index`.

use serde::Serialize;

use super::{event_frame, logprob_token, LogprobToken, LOGPROB_FLOOR, SERIALIZE_FAILED};
use crate::request::StreamEvent;
use crate::request::TokenLogprobs;

/// A prompt token's entry: `logprob` is `null` for the first token (it has no context).
#[derive(Serialize)]
struct EchoEntry {
    token_id: u32,
    token: String,
    bytes: Vec<u8>,
    logprob: Option<f32>,
    top_logprobs: Vec<LogprobToken>,
}

#[derive(Serialize)]
#[serde(tag = "type", rename = "echo")]
struct EchoFrame<'a> {
    id: &'a str,
    text: &'a str,
    token_ids: &'a [u32],
    #[serde(skip_serializing_if = "Vec::is_empty")]
    logprobs: Vec<EchoEntry>,
}

/// `{"type":"echo","id",text,token_ids[,logprobs]}`.
pub(super) fn echo_frame(
    id: &str,
    text: &str,
    token_ids: &[u32],
    logprobs: &[TokenLogprobs],
) -> String {
    let logprobs = logprobs
        .iter()
        .map(|e| {
            let t = logprob_token(&e.chosen);
            let lp = e.chosen.logprob;
            EchoEntry {
                token_id: t.token_id,
                token: t.token,
                bytes: t.bytes,
                logprob: (!lp.is_nan()).then_some(if lp.is_finite() { lp } else { LOGPROB_FLOOR }),
                top_logprobs: e.top.iter().map(logprob_token).collect(),
            }
        })
        .collect();
    let frame = EchoFrame {
        id,
        text,
        token_ids,
        logprobs,
    };
    serde_json::to_string(&frame).unwrap_or_else(|_| SERIALIZE_FAILED.to_owned())
}

/// The frame of `event` (a delta or `done` of choice `index`) with `"index"` added.
pub(super) fn choice_frame(id: &str, index: usize, event: &StreamEvent) -> String {
    let inner = event_frame(id, event);
    // Every frame renders as a non-empty JSON object, `{"type":…`.
    match inner.strip_prefix('{') {
        Some(rest) if rest.starts_with('"') => format!("{{\"index\":{index},{rest}"),
        _ => inner,
    }
}

#[cfg(test)]
mod tests {
    use serde_json::{json, Value};

    use super::*;
    use crate::request::TopLogprob;
    use crate::request::{FinishReason, Timings, Usage};

    fn parse(frame: &str) -> Value {
        serde_json::from_str(frame).expect("frame is JSON")
    }

    #[test]
    fn echo_frame_has_a_null_first_logprob() {
        let tok = |token, logprob| TopLogprob {
            token,
            logprob,
            bytes: b"a".to_vec(),
        };
        let event = StreamEvent::Echo {
            text: "aa".into(),
            token_ids: vec![3, 4],
            logprobs: vec![
                TokenLogprobs {
                    chosen: tok(3, f32::NAN),
                    top: vec![],
                },
                TokenLogprobs {
                    chosen: tok(4, -0.25),
                    top: vec![tok(4, -0.25)],
                },
            ],
        };
        assert_eq!(
            parse(&event_frame("r", &event)),
            json!({"type": "echo", "id": "r", "text": "aa", "token_ids": [3, 4], "logprobs": [
                {"token_id": 3, "token": "a", "bytes": [97], "logprob": null, "top_logprobs": []},
                {"token_id": 4, "token": "a", "bytes": [97], "logprob": -0.25, "top_logprobs": [
                    {"token_id": 4, "token": "a", "bytes": [97], "logprob": -0.25}]}
            ]})
        );
        let bare = StreamEvent::Echo {
            text: "x".into(),
            token_ids: vec![1],
            logprobs: vec![],
        };
        assert_eq!(
            parse(&event_frame("r", &bare)),
            json!({"type": "echo", "id": "r", "text": "x", "token_ids": [1]})
        );
    }

    #[test]
    fn choice_frames_carry_their_index() {
        let delta = StreamEvent::Choice {
            index: 2,
            event: Box::new(StreamEvent::Delta {
                text: "hi".into(),
                token_ids: vec![7],
                logprobs: vec![],
                reasoning: String::new(),
                tool_calls: Vec::new(),
            }),
        };
        assert_eq!(
            parse(&event_frame("r", &delta)),
            json!({"type": "delta", "id": "r", "index": 2, "text": "hi", "token_ids": [7]})
        );
        let done = StreamEvent::Choice {
            index: 0,
            event: Box::new(StreamEvent::Done {
                finish_reason: FinishReason::Stop,
                usage: Usage {
                    prompt_tokens: 3,
                    completion_tokens: 1,
                    cached_tokens: 0,
                    ..Usage::default()
                },
                timings: Timings {
                    ttft_ms: 1.0,
                    decode_tokens_per_s: 0.0,
                },
            }),
        };
        let v = parse(&event_frame("r", &done));
        assert_eq!((&v["type"], &v["index"]), (&json!("done"), &json!(0)));
    }
}
