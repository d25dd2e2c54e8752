//! Structure-aware fuzzing of the edge: generators of valid client input for each
//! entry point, mutations of it that say what each must come to, and the check of one
//! input against its entry point.
//!
//! - [`gen`]: proptest strategies of a valid `generate` (messages or a prompt, every
//!   sampling, steering, tool and HTTP field, within its bounds and the rules between
//!   fields) for each edge, and the WebSocket's other messages. A generated [`Body`] is
//!   both the input and the oracle: what the parsed request must hold.
//! - [`json`]: the generated input as the JSON each edge takes.
//! - [`values`] and [`mutate`]: mutations of a valid input, each with the outcome it
//!   must have (a wrong type or a value out of bound, top level and nested; an unknown
//!   field; deep nesting; truncation, trailing bytes, number tokens JSON lacks, lone
//!   surrogate escapes, invalid UTF-8, random bytes).
//! - [`oracle`] and [`check`]: one input through `api::parse_client_message` or
//!   `api::openai::parse_body`, checked: a refusal is a `validation` error whose
//!   message names the field, an accepted input holds every field as generated.
//! - `api::fuzz_tests`: bounded runs in `cargo test`, tests that each property can
//!   fail, and the inputs the fuzzer found.
//!
//! `benches/fuzz_edge.rs` includes this module with `#[path]` and runs a million
//! inputs per target. So that the same text compiles there, crate items are named
//! `crate::api::…` / `crate::request::…` / `crate::error::…` (the bench imports those
//! names from the library) and siblings `super::…`.

use std::collections::BTreeMap;

use serde_json::{Map, Value};

pub mod check;
pub mod gen;
pub mod json;
pub mod mutate;
pub mod oracle;
pub mod values;

/// Vocabulary size the targets validate against (the default model's).
pub const VOCAB: usize = 49_152;
/// The model the HTTP target serves.
pub const MODEL: &str = "fuzz-model";
/// The request id the HTTP target assigns.
pub const HTTP_ID: &str = "chatcmpl-fuzz";

/// Which edge an input is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Edge {
    /// A WebSocket text frame (`api::parse_client_message`).
    Ws,
    /// `POST /v1/chat/completions` (`api::openai::parse_body`).
    Chat,
    /// `POST /v1/completions`.
    Completion,
}

/// One history turn; `content: None` only beside tool calls.
#[derive(Debug, Clone)]
pub struct Msg {
    pub role: String,
    /// `Err(parts)`: an array of text parts, concatenated by the parser.
    pub content: Option<Result<String, Vec<String>>>,
    /// `(id, name, arguments)`; an absent id reads `call_{i}_{j}`, absent arguments `{}`.
    pub calls: Vec<(Option<String>, String, Option<String>)>,
    pub tool_call_id: Option<String>,
    pub name: Option<String>,
}

/// What to generate from.
#[derive(Debug, Clone)]
pub enum Input {
    Messages(Vec<Msg>),
    Text(String),
    Tokens(Vec<u32>),
}

/// `response_format`.
#[derive(Debug, Clone)]
pub enum Format {
    Text,
    JsonObject,
    /// `(name, strict, schema)`.
    JsonSchema(Option<String>, Option<bool>, Value),
    Regex(String),
    Grammar(String),
}

/// A function tool: `(name, description, parameters, strict)`.
pub type Tool = (String, Option<String>, Option<Value>, Option<bool>);

/// `tool_choice`: `Named(i)` names `tools[i]`.
#[derive(Debug, Clone, PartialEq)]
pub enum Choice {
    None,
    Auto,
    Required,
    Named(usize),
}

/// A valid `generate` on some edge; `None` fields are left out (or written as `null`
/// when named in `nulls`).
#[derive(Debug, Clone, Default)]
pub struct Body {
    pub id: String,
    pub input: Option<Input>,
    /// Completions: the prompt wrapped in a one-item array.
    pub wrap_prompt: bool,
    pub max_tokens: Option<u64>,
    pub max_completion_tokens: Option<u64>,
    pub temperature: Option<f64>,
    pub top_k: Option<u64>,
    pub top_p: Option<f64>,
    pub min_p: Option<f64>,
    pub seed: Option<u64>,
    /// `Ok(s)`: one string; `Err(v)`: an array.
    pub stop: Option<Result<String, Vec<String>>>,
    pub n: Option<u64>,
    pub echo: Option<bool>,
    pub cache: Option<bool>,
    pub cache_salt: Option<String>,
    pub speculative: Option<bool>,
    pub presence_penalty: Option<f64>,
    pub frequency_penalty: Option<f64>,
    pub repetition_penalty: Option<f64>,
    pub repeat_last_n: Option<i64>,
    pub min_tokens: Option<u64>,
    pub logit_bias: Option<BTreeMap<u32, f64>>,
    /// Completions write `logprobs: top_logprobs` (an integer) for `Some(true)`.
    pub logprobs: Option<bool>,
    pub top_logprobs: Option<u64>,
    pub response_format: Option<Format>,
    pub plugins: Option<Vec<(String, Option<Value>)>>,
    pub tools: Option<Vec<Tool>>,
    pub tool_choice: Option<Choice>,
    pub parallel_tool_calls: Option<bool>,
    pub kwargs: Option<Map<String, Value>>,
    pub model: bool,
    pub stream: Option<bool>,
    /// `stream_options.include_usage` (`Some(None)`: an empty object).
    pub include_usage: Option<Option<bool>>,
    pub user: Option<String>,
    pub suffix: bool,
    pub best_of: bool,
    pub nulls: Vec<&'static str>,
}

/// A valid WebSocket client message.
#[derive(Debug, Clone)]
pub enum WsMsg {
    Generate(Box<Body>),
    Cancel(String),
    Tokenize(String, String, Option<bool>),
    Detokenize(String, Vec<u32>),
    Stats(Option<String>),
    Plugins(Option<String>),
}

impl Body {
    /// Whether the input is chat messages.
    pub fn is_chat(&self) -> bool {
        matches!(self.input, Some(Input::Messages(_)))
    }

    /// `max_tokens` as the validator reads it: chat's `max_completion_tokens` wins.
    pub fn effective_max_tokens(&self) -> Option<u64> {
        self.max_completion_tokens.or(self.max_tokens)
    }

    /// The names of `tools`, in order.
    pub fn tool_names(&self) -> Vec<&str> {
        self.tools.iter().flatten().map(|t| t.0.as_str()).collect()
    }
}
