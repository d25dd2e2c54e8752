//! Server frames as JSON text. This is the one place that maps [`InferError`] to the
//! wire: `{"type":"error","id":...,"error":{"type":TAG,"message":...}}`.

use serde::Serialize;

use crate::error::{ErrorKind, InferError};
use crate::request::{EngineStats, TokenLogprobs, TopLogprob};
use crate::request::{FinishReason, StreamEvent, Timings, ToolCallDelta, Usage};
use crate::sampling::wasm_plugin::PluginDescription;

/// Sent in the unlikely case a frame fails to serialize (it cannot with these types).
const SERIALIZE_FAILED: &str = r#"{"type":"error","id":null,"error":{"type":"internal","message":"failed to serialize a server frame"}}"#;

/// Every frame the server sends, tagged by `type`.
#[derive(Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
enum Frame<'a> {
    Started {
        id: &'a str,
        prompt_tokens: usize,
        cached_tokens: usize,
    },
    Delta {
        id: &'a str,
        text: &'a str,
        token_ids: &'a [u32],
        #[serde(skip_serializing_if = "Vec::is_empty")]
        logprobs: Vec<LogprobEntry>,
        #[serde(skip_serializing_if = "str::is_empty")]
        reasoning: &'a str,
        #[serde(skip_serializing_if = "<[_]>::is_empty")]
        tool_calls: &'a [ToolCallDelta],
    },
    Done {
        id: &'a str,
        finish_reason: FinishReason,
        usage: Usage,
        timings: Timings,
    },
    Error {
        id: Option<&'a str>,
        error: ErrorBody<'a>,
    },
    Tokens {
        id: &'a str,
        token_ids: &'a [u32],
    },
    Text {
        id: &'a str,
        text: &'a str,
    },
}

/// The `error` object of an error frame.
#[derive(Serialize)]
struct ErrorBody<'a> {
    #[serde(rename = "type")]
    kind: ErrorKind,
    message: &'a str,
}

/// What a `−∞` log-probability is written as (JSON has no infinity; OpenAI's value).
pub const LOGPROB_FLOOR: f32 = -9999.0;

/// One token of a delta's `logprobs`: `{token_id, token, bytes, logprob}`.
#[derive(Serialize)]
struct LogprobToken {
    token_id: u32,
    /// The token's bytes as lossy UTF-8 (a token may hold part of a character).
    token: String,
    bytes: Vec<u8>,
    logprob: f32,
}

/// A sampled token's entry, with its `top_logprobs` alternatives.
#[derive(Serialize)]
struct LogprobEntry {
    #[serde(flatten)]
    chosen: LogprobToken,
    top_logprobs: Vec<LogprobToken>,
}

fn logprob_token(t: &TopLogprob) -> LogprobToken {
    LogprobToken {
        token_id: t.token,
        token: String::from_utf8_lossy(&t.bytes).into_owned(),
        bytes: t.bytes.clone(),
        logprob: if t.logprob.is_finite() {
            t.logprob
        } else {
            LOGPROB_FLOOR
        },
    }
}

fn logprob_entries(entries: &[TokenLogprobs]) -> Vec<LogprobEntry> {
    entries
        .iter()
        .map(|e| LogprobEntry {
            chosen: logprob_token(&e.chosen),
            top_logprobs: e.top.iter().map(logprob_token).collect(),
        })
        .collect()
}

fn render(frame: &Frame<'_>) -> String {
    serde_json::to_string(frame).unwrap_or_else(|_| SERIALIZE_FAILED.to_owned())
}

/// Non-finite floats would serialize as `null`; the protocol promises numbers.
fn finite(x: f64) -> f64 {
    if x.is_finite() {
        x
    } else {
        0.0
    }
}

/// The JSON text of a request's event: a `started`, `echo`, `delta`, `done` or `error`
/// frame (a choice's `delta` and `done` with its `index`).
pub fn event_frame(id: &str, event: &StreamEvent) -> String {
    match event {
        StreamEvent::Started {
            prompt_tokens,
            cached_tokens,
        } => render(&Frame::Started {
            id,
            prompt_tokens: *prompt_tokens,
            cached_tokens: *cached_tokens,
        }),
        StreamEvent::Delta {
            text,
            token_ids,
            logprobs,
            reasoning,
            tool_calls,
        } => render(&Frame::Delta {
            id,
            text,
            token_ids,
            logprobs: logprob_entries(logprobs),
            reasoning,
            tool_calls,
        }),
        StreamEvent::Done {
            finish_reason,
            usage,
            timings,
        } => render(&Frame::Done {
            id,
            finish_reason: *finish_reason,
            usage: *usage,
            timings: Timings {
                ttft_ms: finite(timings.ttft_ms),
                decode_tokens_per_s: finite(timings.decode_tokens_per_s),
            },
        }),
        StreamEvent::Error(error) => error_frame(Some(id), error),
        StreamEvent::Echo {
            text,
            token_ids,
            logprobs,
        } => choices::echo_frame(id, text, token_ids, logprobs),
        StreamEvent::Choice { index, event } => choices::choice_frame(id, *index, event),
    }
}

/// The JSON text of an `error` frame; `id` is `null` when the request's id is unknown
/// (e.g. the frame was not valid JSON).
pub fn error_frame(id: Option<&str>, error: &InferError) -> String {
    render(&Frame::Error {
        id,
        error: ErrorBody {
            kind: error.kind,
            message: &error.message,
        },
    })
}

/// The JSON text of a `tokens` frame (answer to `tokenize`).
pub fn tokens_frame(id: &str, token_ids: &[u32]) -> String {
    render(&Frame::Tokens { id, token_ids })
}

/// The JSON text of a `text` frame (answer to `detokenize`).
pub fn text_frame(id: &str, text: &str) -> String {
    render(&Frame::Text { id, text })
}

/// The JSON text of a `stats` frame: `{"type":"stats","id":…,` then every field of
/// [`EngineStats`] (counts of sequences and KV blocks, tokens generated, steps)`}`.
pub fn stats_frame(id: Option<&str>, stats: &EngineStats) -> String {
    let mut v = serde_json::to_value(stats).unwrap_or_else(|_| serde_json::json!({}));
    if let serde_json::Value::Object(map) = &mut v {
        map.insert("type".into(), "stats".into());
        map.insert("id".into(), id.map_or(serde_json::Value::Null, Into::into));
    }
    v.to_string()
}

/// The JSON text of a `plugins` frame:
/// `{"type":"plugins","id":…,"interface":"inferd:plugin@0.1.1","plugins":[{name, world,
/// version, description, interface, file, limits, cost}, …]}` (sorted by name).
pub fn plugins_frame(id: Option<&str>, plugins: &[PluginDescription]) -> String {
    serde_json::json!({
        "type": "plugins",
        "id": id,
        "interface": crate::sampling::wasm_plugin::INTERFACE,
        "plugins": plugins,
    })
    .to_string()
}

mod choices;

#[cfg(test)]
mod tests {
    use serde_json::{json, Value};

    use super::*;

    fn parse(frame: &str) -> Value {
        serde_json::from_str(frame).expect("frame is JSON")
    }

    #[test]
    fn started_frame() {
        let event = StreamEvent::Started {
            prompt_tokens: 12,
            cached_tokens: 8,
        };
        assert_eq!(
            parse(&event_frame("r1", &event)),
            json!({"type": "started", "id": "r1", "prompt_tokens": 12, "cached_tokens": 8})
        );
    }

    #[test]
    fn delta_frame() {
        let event = StreamEvent::Delta {
            text: "héllo \"q\"\n".into(),
            token_ids: vec![1, 2, 4_000_000_000],
            logprobs: vec![],
            reasoning: String::new(),
            tool_calls: Vec::new(),
        };
        assert_eq!(
            parse(&event_frame("r1", &event)),
            json!({"type": "delta", "id": "r1", "text": "héllo \"q\"\n", "token_ids": [1, 2, 4_000_000_000u32]})
        );
        let empty = StreamEvent::Delta {
            text: String::new(),
            token_ids: vec![],
            logprobs: vec![],
            reasoning: String::new(),
            tool_calls: Vec::new(),
        };
        assert_eq!(
            parse(&event_frame("r1", &empty)),
            json!({"type": "delta", "id": "r1", "text": "", "token_ids": []})
        );
    }

    #[test]
    fn delta_frame_with_logprobs() {
        let tok = |token, logprob, bytes: &[u8]| TopLogprob {
            token,
            logprob,
            bytes: bytes.to_vec(),
        };
        let event = StreamEvent::Delta {
            text: "hi".into(),
            token_ids: vec![7],
            logprobs: vec![TokenLogprobs {
                chosen: tok(7, -0.5, b"hi"),
                top: vec![
                    tok(7, -0.5, b"hi"),
                    tok(9, f32::NEG_INFINITY, &[0xe2, 0x82]),
                ],
            }],
            reasoning: String::new(),
            tool_calls: Vec::new(),
        };
        assert_eq!(
            parse(&event_frame("r1", &event)),
            json!({"type": "delta", "id": "r1", "text": "hi", "token_ids": [7], "logprobs": [
                {"token_id": 7, "token": "hi", "bytes": [104, 105], "logprob": -0.5, "top_logprobs": [
                    {"token_id": 7, "token": "hi", "bytes": [104, 105], "logprob": -0.5},
                    {"token_id": 9, "token": "\u{fffd}", "bytes": [226, 130], "logprob": -9999.0}
                ]}
            ]})
        );
    }

    #[test]
    fn done_frame_each_finish_reason() {
        for (reason, tag) in [
            (FinishReason::Stop, "stop"),
            (FinishReason::Length, "length"),
            (FinishReason::Cancelled, "cancelled"),
        ] {
            let event = StreamEvent::Done {
                finish_reason: reason,
                usage: Usage {
                    prompt_tokens: 10,
                    completion_tokens: 5,
                    cached_tokens: 3,
                    ..Usage::default()
                },
                timings: Timings {
                    ttft_ms: 12.5,
                    decode_tokens_per_s: 40.25,
                },
            };
            assert_eq!(
                parse(&event_frame("r9", &event)),
                json!({
                    "type": "done",
                    "id": "r9",
                    "finish_reason": tag,
                    "usage": {"prompt_tokens": 10, "completion_tokens": 5, "cached_tokens": 3,
                              "draft_tokens": 0, "accepted_draft_tokens": 0},
                    "timings": {"ttft_ms": 12.5, "decode_tokens_per_s": 40.25}
                })
            );
        }
    }

    #[test]
    fn done_frame_non_finite_timings_become_zero() {
        let event = StreamEvent::Done {
            finish_reason: FinishReason::Length,
            usage: Usage {
                prompt_tokens: 1,
                completion_tokens: 1,
                cached_tokens: 0,
                ..Usage::default()
            },
            timings: Timings {
                ttft_ms: f64::NAN,
                decode_tokens_per_s: f64::INFINITY,
            },
        };
        let v = parse(&event_frame("r", &event));
        assert_eq!(
            v["timings"],
            json!({"ttft_ms": 0.0, "decode_tokens_per_s": 0.0})
        );
    }

    #[test]
    fn error_frames_carry_stable_tags() {
        for (kind, tag) in [
            (ErrorKind::Validation, "validation"),
            (ErrorKind::ContextLengthExceeded, "context_length_exceeded"),
            (ErrorKind::Overloaded, "overloaded"),
            (ErrorKind::PluginTrap, "plugin_trap"),
            (ErrorKind::Cancelled, "cancelled"),
            (ErrorKind::Internal, "internal"),
        ] {
            let err = InferError::new(kind, "boom");
            assert_eq!(
                parse(&error_frame(Some("r1"), &err)),
                json!({"type": "error", "id": "r1", "error": {"type": tag, "message": "boom"}})
            );
            assert_eq!(kind.as_str(), tag);
        }
    }

    #[test]
    fn error_frame_without_id_is_null() {
        let err = InferError::validation("malformed JSON: x");
        assert_eq!(
            parse(&error_frame(None, &err)),
            json!({"type": "error", "id": null, "error": {"type": "validation", "message": "malformed JSON: x"}})
        );
    }

    #[test]
    fn error_event_is_an_error_frame() {
        let err = InferError::new(ErrorKind::Overloaded, "queue full");
        assert_eq!(
            event_frame("r2", &StreamEvent::Error(err.clone())),
            error_frame(Some("r2"), &err)
        );
    }

    #[test]
    fn tokens_and_text_frames() {
        assert_eq!(
            parse(&tokens_frame("t1", &[5, 6, 7])),
            json!({"type": "tokens", "id": "t1", "token_ids": [5, 6, 7]})
        );
        assert_eq!(
            parse(&text_frame("t2", "a\u{0}b")),
            json!({"type": "text", "id": "t2", "text": "a\u{0}b"})
        );
    }

    #[test]
    fn fallback_frame_is_valid_json() {
        assert_eq!(
            parse(SERIALIZE_FAILED),
            json!({"type": "error", "id": null, "error": {"type": "internal", "message": "failed to serialize a server frame"}})
        );
    }
}
