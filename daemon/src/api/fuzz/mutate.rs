//! Mutations of the generated valid input, each with the outcome it must have: a
//! value of the wrong type or out of its bound (top level and inside `messages`,
//! `tools`, `plugins`, `stop`, `logit_bias`, `response_format`, ...), an unknown
//! field, deep nesting, and byte-level damage (truncation, trailing bytes, number
//! tokens JSON has no place for, lone surrogate escapes, invalid UTF-8, random bytes).

use proptest::prelude::*;
use serde_json::{json, Value};

use super::gen::{body, ws_message};
use super::values::{keys, out_of_bound, wrong_type};
use super::{Body, Edge, Input, WsMsg};

/// What a case must come to.
#[derive(Debug, Clone, PartialEq)]
pub enum Want {
    /// Accepted, holding what was generated (`Case::origin`).
    Accept,
    /// Refused with a message naming this field (or path root, or unknown key).
    Reject(String),
    /// Refused as malformed JSON.
    Malformed,
    /// Either; a refusal still needs a message.
    Any,
}

/// One fuzz input.
#[derive(Debug, Clone)]
pub struct Case {
    pub edge: Edge,
    /// The frame's text (WebSocket) or the request body (HTTP).
    pub bytes: Vec<u8>,
    pub want: Want,
    /// The valid message it was made from (for HTTP, a `Generate`), as it must be
    /// parsed when `want` is `Accept`.
    pub origin: WsMsg,
    /// The mutation's name (for the benchmark's tally).
    pub mutation: &'static str,
}

/// JSON nesting deeper than this is refused by serde_json (128 levels, the
/// outermost included).
pub const MAX_JSON_DEPTH: usize = 127;
const NUM_MARK: &str = "\"@@FUZZNUM@@\"";
const STR_MARK: &str = "@@FUZZSTR@@";

/// `leaf` inside `depth` arrays.
pub fn nest(depth: usize, leaf: Value) -> Value {
    (0..depth).fold(leaf, |v, _| Value::Array(vec![v]))
}

/// Containers on the deepest path of `v`, itself included.
pub fn depth(v: &Value) -> usize {
    match v {
        Value::Array(a) => 1 + a.iter().map(depth).max().unwrap_or(0),
        Value::Object(o) => 1 + o.values().map(depth).max().unwrap_or(0),
        _ => 0,
    }
}

fn case(edge: Edge, origin: &WsMsg, v: &Value, want: Want, mutation: &'static str) -> Case {
    let bytes = serde_json::to_vec(v).unwrap_or_default();
    let want = if depth(v) > MAX_JSON_DEPTH {
        Want::Malformed
    } else {
        want
    };
    Case {
        edge,
        bytes,
        want,
        origin: origin.clone(),
        mutation,
    }
}

fn with(v: &Value, key: &str, value: Value) -> Value {
    let mut v = v.clone();
    v[key] = value;
    v
}

/// Every mutation of `origin` (a valid message for `edge`), picked by `pick`.
fn mutate(edge: Edge, origin: &WsMsg, pick: (usize, usize, usize)) -> Case {
    let v = match origin {
        WsMsg::Generate(b) if edge != Edge::Ws => b.to_json(edge),
        m => m.to_json(),
    };
    let keys = keys(edge, origin);
    let key = keys[pick.1 % keys.len()];
    let empty = Body::default();
    let b = match origin {
        WsMsg::Generate(b) => b,
        _ => &empty,
    };
    let generate = matches!(origin, WsMsg::Generate(_));
    match pick.0 % 16 {
        0..=3 => case(edge, origin, &v, Want::Accept, "none"),
        4 | 5 => {
            let values = wrong_type(key, edge);
            let value = values[pick.2 % values.len()].clone();
            case(
                edge,
                origin,
                &with(&v, key, value),
                Want::Reject(key.into()),
                "wrong type",
            )
        }
        6..=8 => {
            let key = if generate { key } else { "id" };
            let values = out_of_bound(key, edge, b);
            let Some(value) = values.get(pick.2 % values.len().max(1)) else {
                return case(edge, origin, &v, Want::Accept, "none");
            };
            case(
                edge,
                origin,
                &with(&v, key, value.clone()),
                Want::Reject(key.into()),
                "out of bound",
            )
        }
        9 => {
            let foreign = [
                "model",
                "stream",
                "prompt",
                "type",
                "id",
                "suffix",
                "tools",
                "max_completion_tokens",
                "top_logprobs",
                "temprature",
                "",
                "Seed",
                "x\u{0}",
            ];
            let k = foreign[pick.2 % foreign.len()];
            if keys.contains(&k) {
                return case(edge, origin, &v, Want::Accept, "none");
            }
            case(
                edge,
                origin,
                &with(&v, k, json!(1)),
                Want::Reject(k.into()),
                "unknown field",
            )
        }
        10 => {
            let d = [2, 3, 10, 60, 100, 120, 124, 125, 126, 127, 200, 3000][pick.2 % 12];
            let (field, value, want) = match (pick.1 % 4, b.is_chat(), &b.input) {
                (0, true, _) => (
                    "messages",
                    json!([nest(d, json!({"role": "user", "content": "x"}))]),
                    Want::Reject("messages".into()),
                ),
                (0, false, Some(Input::Text(_) | Input::Tokens(_))) => (
                    "prompt",
                    json!([nest(d, json!(1))]),
                    Want::Reject("prompt".into()),
                ),
                (1, ..) => (
                    "stop",
                    json!([nest(d, json!("s"))]),
                    Want::Reject("stop".into()),
                ),
                (2, ..) => (
                    "logit_bias",
                    json!({"1": nest(d, json!(1))}),
                    Want::Reject("logit_bias".into()),
                ),
                _ => (
                    "plugins",
                    json!([{"name": "p", "config": nest(d, json!(0))}]),
                    Want::Accept,
                ),
            };
            if !generate {
                return case(
                    edge,
                    origin,
                    &with(&v, "id", nest(d, json!("i"))),
                    Want::Reject("id".into()),
                    "deep nesting",
                );
            }
            let mut deep = b.clone();
            if want == Want::Accept {
                deep.plugins = Some(vec![("p".into(), Some(nest(d, json!(0))))]);
            }
            let origin = WsMsg::Generate(Box::new(deep));
            case(edge, &origin, &with(&v, field, value), want, "deep nesting")
        }
        n => bytes_case(edge, origin, &v, n, pick),
    }
}

/// Byte-level damage of the frame's text.
fn bytes_case(
    edge: Edge,
    origin: &WsMsg,
    v: &Value,
    n: usize,
    pick: (usize, usize, usize),
) -> Case {
    let text = serde_json::to_string(v).unwrap_or_default();
    let mark =
        |key: &str, mark: Value| serde_json::to_string(&with(v, key, mark)).unwrap_or_default();
    let (bytes, want, mutation): (Vec<u8>, Want, &'static str) = match n {
        11 => {
            let mut cut = pick.2 % text.len().max(1);
            while !text.is_char_boundary(cut) {
                cut -= 1;
            }
            (
                text.as_bytes()[..cut].to_vec(),
                Want::Malformed,
                "truncated",
            )
        }
        12 => {
            let tail = [",", "}", "]", "x", "{}", "\u{0}", "\u{feff}", "//"][pick.2 % 8];
            (
                format!("{text}{tail}").into_bytes(),
                Want::Malformed,
                "trailing bytes",
            )
        }
        13 => {
            let token = [
                "NaN",
                "-NaN",
                "Infinity",
                "-Infinity",
                "1e400",
                "-1e400",
                "01",
                "+1",
                ".5",
                "1.",
                "0x10",
                "1e",
                "--1",
                "1_000",
                "tru",
                "nul",
                "'1'",
            ][pick.2 % 17];
            let key = ["temperature", "seed", "max_tokens", "n", "top_p", "id"][pick.1 % 6];
            (
                mark(key, json!("@@FUZZNUM@@"))
                    .replace(NUM_MARK, token)
                    .into_bytes(),
                Want::Malformed,
                "bad number",
            )
        }
        14 => {
            let escape = [
                r"\ud800",
                r"\udfff",
                r"\ud83d",
                r"\ud83dA",
                r"\ud83d\u0041",
                r"\udc00\ud800",
                r"\u12",
                r"\x41",
            ][pick.2 % 8];
            let marked = mark("id", json!(format!("a{STR_MARK}b")));
            (
                marked.replace(STR_MARK, escape).into_bytes(),
                Want::Malformed,
                "bad escape",
            )
        }
        _ if pick.1.is_multiple_of(2) => {
            let bad: &[u8] = [
                &[0xff][..],
                &[0xc3],
                &[0xed, 0xa0, 0x80],
                &[0xf4, 0x90, 0x80, 0x80],
                &[0xc0, 0x80],
                &[0x80],
                &[0xe2, 0x82],
            ][pick.2 % 7];
            let marked = mark("id", json!(format!("a{STR_MARK}b")));
            let (head, tail) = marked.split_once(STR_MARK).unwrap_or((&marked, ""));
            (
                [head.as_bytes(), bad, tail.as_bytes()].concat(),
                Want::Malformed,
                "invalid UTF-8",
            )
        }
        _ => {
            let mut bytes = text.into_bytes();
            let len = bytes.len().max(1);
            for i in 0..1 + pick.2 % 4 {
                let at = (pick.1 / (i + 1)).wrapping_add(pick.2.wrapping_mul(7919 * i)) % len;
                if let Some(b) = bytes.get_mut(at) {
                    *b = (pick.2 >> (i * 8)) as u8;
                }
            }
            (bytes, Want::Any, "random bytes")
        }
    };
    // A text frame is UTF-8 by construction (tungstenite refuses one that is not):
    // what a WebSocket client can send of damaged bytes is their lossy decoding.
    let (bytes, want) = match (edge, String::from_utf8(bytes)) {
        (_, Ok(s)) => (s.into_bytes(), want),
        (Edge::Ws, Err(e)) => (
            String::from_utf8_lossy(e.as_bytes())
                .into_owned()
                .into_bytes(),
            Want::Any,
        ),
        (_, Err(e)) => (e.into_bytes(), want),
    };
    Case {
        edge,
        bytes,
        want,
        origin: origin.clone(),
        mutation,
    }
}

fn origins(edge: Edge) -> BoxedStrategy<WsMsg> {
    match edge {
        Edge::Ws => ws_message(),
        _ => body(edge)
            .prop_map(|b| WsMsg::Generate(Box::new(b)))
            .boxed(),
    }
}

/// Valid and mutated inputs for `edge` (a quarter valid).
pub fn cases(edge: Edge) -> BoxedStrategy<Case> {
    (origins(edge), any::<(usize, usize, usize)>())
        .prop_map(move |(m, pick)| mutate(edge, &m, pick))
        .boxed()
}

/// Only valid inputs for `edge`.
pub fn valid_cases(edge: Edge) -> BoxedStrategy<Case> {
    origins(edge)
        .prop_map(move |m| mutate(edge, &m, (0, 0, 0)))
        .boxed()
}

/// The mutations' names, in the benchmark's order.
pub const MUTATIONS: &[&str] = &[
    "none",
    "wrong type",
    "out of bound",
    "unknown field",
    "deep nesting",
    "truncated",
    "trailing bytes",
    "bad number",
    "bad escape",
    "invalid UTF-8",
    "random bytes",
];
