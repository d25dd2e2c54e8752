//! A `generate` as it arrives, before validation: one typed serde struct,
//! [`GenerateBody`], for the WebSocket `generate` frame and both OpenAI-compatible
//! bodies (`/v1/chat/completions`, `/v1/completions`), every field optional.
//!
//! Scalars are typed here, so a value of the wrong JSON type is refused while the body
//! is read, with a message naming the field, the type expected and the value given
//! (`temperature must be a number (got "hot")`); their bounds are checked once, by
//! [`super::validate`], which turns the body into a [`crate::request::GenerateRequest`].
//! Structured fields whose rules depend on their content (`messages`, `prompt`, `stop`,
//! `plugins`, `logit_bias`, `response_format`, `tools`, `tool_choice`,
//! `chat_template_kwargs`, `stream_options`) stay JSON values here and are walked by the
//! validator, which names every path it refuses (`messages[2].content[0].type`).
//! Which fields an edge accepts is checked from the object's keys before it is read
//! (JSON `null` counts as absent everywhere).

use serde::de::{self, Deserializer, Unexpected, Visitor};
use serde::Deserialize;
use serde_json::{Number, Value};

use super::validate::quote;
use crate::error::InferError;

/// A JSON number field, as sent (integers beyond the 64-bit range arrive as `f64`);
/// the validator checks its range.
#[derive(Debug, Clone, PartialEq)]
pub struct Num(pub Number);

/// A JSON number field that must hold an integer: any number is read here, and the
/// validator refuses a fraction (`1.5`, `40.0`) naming the field.
#[derive(Debug, Clone, PartialEq)]
pub struct Int(pub Number);

/// Reads any JSON number; `expecting` is what the error message says is expected.
struct NumberVisitor(&'static str);

impl Visitor<'_> for NumberVisitor {
    type Value = Number;

    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str(self.0)
    }

    fn visit_u64<E: de::Error>(self, v: u64) -> Result<Number, E> {
        Ok(v.into())
    }

    fn visit_i64<E: de::Error>(self, v: i64) -> Result<Number, E> {
        Ok(v.into())
    }

    fn visit_f64<E: de::Error>(self, v: f64) -> Result<Number, E> {
        Number::from_f64(v).ok_or_else(|| E::invalid_value(Unexpected::Float(v), &self))
    }
}

impl<'de> Deserialize<'de> for Num {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(NumberVisitor("a number")).map(Num)
    }
}

impl<'de> Deserialize<'de> for Int {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(NumberVisitor("an integer")).map(Int)
    }
}

/// `logprobs`: a boolean on the WebSocket and chat edges, an integer (how many
/// alternatives, OpenAI's legacy form) on `/v1/completions`, which turns it into
/// `logprobs: true` plus `top_logprobs` before validation. Any JSON is read here, so
/// each edge refuses the other forms with its own bound.
#[derive(Debug, Clone, PartialEq)]
pub enum LogprobsField {
    /// `true` / `false`.
    Flag(bool),
    /// A number (the completions form).
    Count(Number),
    /// Anything else (a string, an array, an object): refused by every edge.
    Other(Value),
}

impl<'de> Deserialize<'de> for LogprobsField {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        Ok(match Value::deserialize(d)? {
            Value::Bool(b) => LogprobsField::Flag(b),
            Value::Number(n) => LogprobsField::Count(n),
            other => LogprobsField::Other(other),
        })
    }
}

/// Every field a `generate` may carry on any edge (field names are OpenAI's where
/// OpenAI has one; see `docs/protocol.md` and `docs/http-api.md` for each bound).
/// Keys an edge does not accept are refused before the body is read, so the struct
/// itself ignores unknown keys.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(default)]
pub struct GenerateBody {
    /// Chat history (chat and WebSocket): walked by the validator.
    pub messages: Option<Value>,
    /// Completion prompt: text or token ids (completions and WebSocket).
    pub prompt: Option<Value>,
    /// Most tokens to generate.
    pub max_tokens: Option<Int>,
    /// OpenAI chat's newer name for `max_tokens`; wins when both are given.
    pub max_completion_tokens: Option<Int>,
    /// Softmax temperature.
    pub temperature: Option<Num>,
    /// Top-k truncation (inferd extension on HTTP).
    pub top_k: Option<Int>,
    /// Nucleus (top-p) threshold.
    pub top_p: Option<Num>,
    /// Min-p truncation (inferd extension on HTTP).
    pub min_p: Option<Num>,
    /// Sampler seed.
    pub seed: Option<Int>,
    /// Stop sequences: a string or an array of strings.
    pub stop: Option<Value>,
    /// Wasm sampler plugins: `[{"name", "config"}]`.
    pub plugins: Option<Value>,
    /// Whether the prefix cache may serve and keep this request's blocks.
    pub cache: Option<bool>,
    /// Prefix-cache partition.
    pub cache_salt: Option<String>,
    /// The LoRA adapter (WebSocket; OpenAI names it in `model`).
    pub adapter: Option<String>,
    /// Scale of the adapter's delta (default 1).
    pub lora_scale: Option<Num>,
    /// Log-probabilities of the sampled tokens.
    pub logprobs: Option<LogprobsField>,
    /// Alternatives per position with `logprobs`.
    pub top_logprobs: Option<Int>,
    /// Choices per request.
    pub n: Option<Int>,
    /// Completions: the prompt back with its log-probabilities.
    pub echo: Option<bool>,
    /// Whether this request may use speculative decoding (the daemon's
    /// `[speculative]` setting when absent).
    pub speculative: Option<bool>,
    /// OpenAI presence penalty.
    pub presence_penalty: Option<Num>,
    /// OpenAI frequency penalty.
    pub frequency_penalty: Option<Num>,
    /// Multiplicative repetition penalty (vLLM, llama.cpp).
    pub repetition_penalty: Option<Num>,
    /// Window of the repetition penalty (llama.cpp's).
    pub repeat_last_n: Option<Int>,
    /// Tokens generated before end-of-generation is allowed.
    pub min_tokens: Option<Int>,
    /// Token id (a decimal string) → additive bias.
    pub logit_bias: Option<Value>,
    /// Structured output: `text`, `json_object`, `json_schema`, `regex`, `grammar`.
    pub response_format: Option<Value>,
    /// Function tools the model may call (chat).
    pub tools: Option<Value>,
    /// `none`, `auto`, `required` or a named function (chat).
    pub tool_choice: Option<Value>,
    /// Whether one turn may hold several calls (chat).
    pub parallel_tool_calls: Option<bool>,
    /// Extra chat-template variables (chat).
    pub chat_template_kwargs: Option<Value>,
    /// HTTP: the model asked for (must be the one served).
    pub model: Option<String>,
    /// HTTP: server-sent events instead of one JSON response.
    pub stream: Option<bool>,
    /// HTTP: `{"include_usage": bool}`, only with `stream`.
    pub stream_options: Option<Value>,
    /// HTTP: the end user's id (accepted, unused).
    pub user: Option<String>,
    /// Completions: text after the insertion point (only `""`).
    pub suffix: Option<String>,
    /// Completions: server-side best-of (only 1).
    pub best_of: Option<Int>,
}

impl GenerateBody {
    /// Reads the typed fields of a JSON object (`root`); a field of the wrong JSON type
    /// is a validation error naming it, the type expected and the value given.
    pub fn from_value(root: &Value) -> Result<Self, InferError> {
        serde_path_to_error::deserialize(root).map_err(|e| read_error(&e, root))
    }
}

/// A body that failed to read, as a validation error: `{path} must be {expected} (got
/// {value})` for a value of the wrong type, `{path}: {serde's message}` otherwise.
fn read_error(e: &serde_path_to_error::Error<serde_json::Error>, root: &Value) -> InferError {
    let path = e.path().to_string();
    let inner = e.inner().to_string();
    let is_type = inner.starts_with("invalid type:") || inner.starts_with("invalid value:");
    let given = value_at(root, e.path());
    match (is_type, inner.rsplit_once(", expected "), given) {
        (true, Some((_, expected)), Some(v)) => {
            InferError::validation(format!("{path} must be {expected} (got {})", quote(v)))
        }
        _ => InferError::validation(format!("{path}: {inner}")),
    }
}

/// The value at `path` inside `root`, when every segment names an existing place.
fn value_at<'a>(root: &'a Value, path: &serde_path_to_error::Path) -> Option<&'a Value> {
    use serde_path_to_error::Segment;
    path.iter().try_fold(root, |v, segment| match segment {
        Segment::Seq { index } => v.get(*index),
        Segment::Map { key } => v.get(key.as_str()),
        Segment::Enum { .. } | Segment::Unknown => None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn read(v: Value) -> Result<GenerateBody, String> {
        GenerateBody::from_value(&v).map_err(|e| e.message)
    }

    #[test]
    fn typed_fields_are_read_and_null_is_absent() {
        let b = read(
            json!({"temperature": 0.5, "top_k": 40, "cache": false, "seed": null,
                            "logprobs": true, "cache_salt": "a", "unknown": 1}),
        )
        .expect("valid");
        assert_eq!(
            b.temperature,
            Some(Num(Number::from_f64(0.5).expect("finite")))
        );
        assert_eq!(b.top_k, Some(Int(40.into())));
        assert_eq!(b.cache, Some(false));
        assert_eq!(b.seed, None);
        assert_eq!(b.logprobs, Some(LogprobsField::Flag(true)));
        assert_eq!(b.cache_salt.as_deref(), Some("a"));
        let b = read(json!({"logprobs": 3, "top_k": 1.5, "seed": 1e30})).expect("numbers");
        assert_eq!(b.logprobs, Some(LogprobsField::Count(3.into())));
        assert_eq!(b.top_k, Some(Int(Number::from_f64(1.5).expect("finite"))));
        assert!(b.seed.is_some(), "range is the validator's");
        let b = read(json!({"logprobs": "yes"})).expect("checked by each edge");
        assert_eq!(b.logprobs, Some(LogprobsField::Other(json!("yes"))));
    }

    #[test]
    fn wrong_types_name_field_expectation_and_value() {
        for (body, message) in [
            (
                json!({"temperature": "hot"}),
                "temperature must be a number (got \"hot\")",
            ),
            (json!({"top_k": [1]}), "top_k must be an integer (got [1])"),
            (json!({"cache": 1}), "cache must be a boolean (got 1)"),
            (
                json!({"cache_salt": 7}),
                "cache_salt must be a string (got 7)",
            ),
            (
                json!({"model": {"a": 1}}),
                "model must be a string (got {\"a\":1})",
            ),
        ] {
            assert_eq!(read(body).err().as_deref(), Some(message));
        }
    }
}
