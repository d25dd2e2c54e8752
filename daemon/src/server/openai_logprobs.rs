//! Log-probabilities in OpenAI's two shapes: chat's `logprobs.content` list
//! (`{token, logprob, bytes, top_logprobs}` per token) and the legacy completions object
//! (`tokens`, `token_logprobs`, `top_logprobs`, `text_offset` in characters of the
//! generated text).

use serde_json::{json, Map, Value};

use crate::api::wire::LOGPROB_FLOOR;
use crate::request::{TokenLogprobs, TopLogprob};

/// A log-probability as a JSON number (`−∞` as [`LOGPROB_FLOOR`]): the shortest
/// decimal that reads back as the f32, as the WebSocket writes it (`json!` would widen
/// the f32 to f64 and print all of that f64's digits).
fn logprob_number(x: f32) -> f64 {
    let x = if x.is_finite() { x } else { LOGPROB_FLOOR };
    x.to_string().parse().unwrap_or(f64::from(x))
}

fn token_string(t: &TopLogprob) -> String {
    String::from_utf8_lossy(&t.bytes).into_owned()
}

fn chat_entry(t: &TopLogprob) -> Map<String, Value> {
    let mut m = Map::new();
    m.insert("token".into(), json!(token_string(t)));
    m.insert("logprob".into(), json!(logprob_number(t.logprob)));
    m.insert("bytes".into(), json!(t.bytes));
    m
}

pub(super) fn chat_logprobs(entries: &[TokenLogprobs]) -> Value {
    let content: Vec<Value> = entries
        .iter()
        .map(|e| {
            let mut m = chat_entry(&e.chosen);
            let top: Vec<Value> = e.top.iter().map(|t| Value::Object(chat_entry(t))).collect();
            m.insert("top_logprobs".into(), Value::Array(top));
            Value::Object(m)
        })
        .collect();
    json!({ "content": content, "refusal": null })
}

/// A token in the completions shape: its text, or, when its bytes are not whole UTF-8
/// characters, `bytes:` and each byte as `\xNN` (OpenAI's legacy convention), so
/// that distinct partial-character tokens stay distinct keys of `top_logprobs`.
fn completion_token(t: &TopLogprob) -> String {
    match std::str::from_utf8(&t.bytes) {
        Ok(s) => s.to_owned(),
        Err(_) => {
            let hex: String = t.bytes.iter().map(|b| format!("\\x{b:02x}")).collect();
            format!("bytes:{hex}")
        }
    }
}

/// Characters of the whole UTF-8 characters at the start of `bytes` (an unfinished
/// character at the end is not counted yet).
fn whole_chars(bytes: &[u8]) -> usize {
    let valid = match std::str::from_utf8(bytes) {
        Ok(s) => s,
        Err(e) => std::str::from_utf8(&bytes[..e.valid_up_to()]).unwrap_or_default(),
    };
    valid.chars().count()
}

/// The completions shape; `emitted` holds the bytes of the tokens before these (for
/// `text_offset`, in characters of the text) and is extended by them. An entry
/// without a log-probability (NaN: the first token of an echoed prompt) has `null`
/// for its `token_logprobs` and `top_logprobs`, as OpenAI writes it.
pub(super) fn completion_logprobs(entries: &[TokenLogprobs], emitted: &mut Vec<u8>) -> Value {
    let mut tokens = Vec::new();
    let mut token_logprobs = Vec::new();
    let mut top_logprobs = Vec::new();
    let mut text_offset = Vec::new();
    for e in entries {
        text_offset.push(whole_chars(emitted));
        emitted.extend_from_slice(&e.chosen.bytes);
        tokens.push(completion_token(&e.chosen));
        if e.chosen.logprob.is_nan() {
            token_logprobs.push(Value::Null);
            top_logprobs.push(Value::Null);
            continue;
        }
        token_logprobs.push(json!(logprob_number(e.chosen.logprob)));
        let top: Map<String, Value> = e
            .top
            .iter()
            .map(|t| (completion_token(t), json!(logprob_number(t.logprob))))
            .collect();
        top_logprobs.push(Value::Object(top));
    }
    json!({
        "tokens": tokens,
        "token_logprobs": token_logprobs,
        "top_logprobs": top_logprobs,
        "text_offset": text_offset,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Partial-character tokens keep distinct keys, and offsets count characters.
    #[test]
    fn completion_logprobs_of_partial_characters() {
        let tok = |token, bytes: &[u8]| TopLogprob {
            token,
            logprob: -1.0,
            bytes: bytes.to_vec(),
        };
        // "aé" then "b": é (c3 a9) split over two tokens.
        let entries: Vec<TokenLogprobs> = [
            (1, &b"a"[..]),
            (2, &[0xc3][..]),
            (3, &[0xa9][..]),
            (4, &b"b"[..]),
        ]
        .iter()
        .map(|&(t, b)| TokenLogprobs {
            chosen: tok(t, b),
            top: vec![tok(t, b), tok(9, &[0xe3, 0x82])],
        })
        .collect();
        let v = completion_logprobs(&entries, &mut Vec::new());
        assert_eq!(v["text_offset"], json!([0, 1, 1, 2]));
        assert_eq!(v["tokens"], json!(["a", "bytes:\\xc3", "bytes:\\xa9", "b"]));
        assert_eq!(v["top_logprobs"][1].as_object().map(Map::len), Some(2));
    }

    /// An echoed prompt's first token has no log-probability: `null`, as OpenAI.
    #[test]
    fn a_token_without_context_is_null() {
        let entry = |logprob: f32| TokenLogprobs {
            chosen: TopLogprob {
                token: 1,
                logprob,
                bytes: b"a".to_vec(),
            },
            top: Vec::new(),
        };
        let v = completion_logprobs(&[entry(f32::NAN), entry(-0.5)], &mut Vec::new());
        assert_eq!(v["token_logprobs"], json!([null, -0.5]));
        assert_eq!(v["top_logprobs"], json!([null, {}]));
        assert_eq!(v["text_offset"], json!([0, 1]));
    }
}
