//! The WebSocket protocol v1 at the edge of the daemon (see `docs/protocol.md`).
//!
//! - [`body`] reads a `generate` from either edge into one typed serde struct,
//!   [`body::GenerateBody`] (every field optional; a value of the wrong JSON type is
//!   refused there, naming the field).
//! - [`validate`] turns one client text frame into a validated [`ClientMessage`] (or an
//!   [`ApiError`]), and a [`body::GenerateBody`] into a
//!   [`crate::request::GenerateRequest`] (`validate::generate_request`): this is the
//!   only place client input is checked; everything after it works on concrete,
//!   in-range values.
//! - [`openai`] reads the OpenAI-compatible bodies (`/v1/chat/completions`,
//!   `/v1/completions`): the keys each endpoint accepts, its own fields (`model`,
//!   `stream`, `stream_options`, the completions' integer `logprobs`, ...) and the
//!   forms it normalises, then the same validation as a WebSocket frame.
//! - [`wire`] renders server frames, and is the one place that maps
//!   [`InferError`] to the wire (`{"type":"error","id":...,"error":{"type":TAG,"message":...}}`).
//!
//! Fuzzed: `fuzz/` and `fuzz_tests` (test-only) hold structure-aware proptest
//! generators of valid WebSocket frames and OpenAI bodies, their mutations, and the
//! checks that nothing panics, every refusal is a `validation` error naming the field,
//! and valid input round-trips; `cargo test` runs 2,000 cases per property, and
//! `cargo bench -p inferd --bench fuzz_edge` a million inputs per target (figures in
//! `docs/performance.md`, "Fuzzing the edge").

pub mod body;
pub mod openai;
pub mod validate;
pub mod wire;

#[cfg(test)]
mod fuzz;
#[cfg(test)]
mod fuzz_tests;

use crate::error::InferError;
use crate::request::GenerateRequest;

pub use validate::parse_client_message;
pub use wire::{error_frame, event_frame, plugins_frame, stats_frame, text_frame, tokens_frame};

/// Sampling values applied when a `generate` message leaves a field out (from the
/// daemon config, section `[sampling]` or similar).
#[derive(Debug, Clone, PartialEq, serde::Deserialize, serde::Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct SamplingDefaults {
    /// Default softmax temperature (`0.8`). Bound: `[0, 100]`.
    pub temperature: f32,
    /// Default top-k (`40`); `0` disables. Bound: `[0, vocab size]`.
    pub top_k: usize,
    /// Default nucleus threshold (`0.95`). Bound: `(0, 1]`.
    pub top_p: f32,
    /// Default min-p (`0.05`). Bound: `[0, 1]`.
    pub min_p: f32,
    /// Default maximum number of generated tokens (`256`). Bound: `[1, 1000000]`.
    pub max_tokens: usize,
}

impl Default for SamplingDefaults {
    /// The built-in values of [`crate::request::SamplingParams::default`].
    fn default() -> Self {
        let p = crate::request::SamplingParams::default();
        Self {
            temperature: p.temperature,
            top_k: p.top_k,
            top_p: p.top_p,
            min_p: p.min_p,
            max_tokens: p.max_tokens,
        }
    }
}

impl SamplingDefaults {
    /// Checks the defaults against the same bounds a client value must meet, so a bad
    /// config fails at startup instead of on every request. Messages are prefixed
    /// with `default `.
    pub fn check(&self, vocab_size: usize) -> Result<(), InferError> {
        validate::check_defaults(self, vocab_size)
    }
}

/// A validated client frame.
#[derive(Debug, Clone, PartialEq)]
pub enum ClientMessage {
    /// `generate`: start a new request (defaults applied, seed chosen; boxed: it is
    /// far larger than the other messages).
    Generate(Box<GenerateRequest>),
    /// `cancel`: stop the active request with this id.
    Cancel {
        /// The id of the request to cancel.
        id: String,
    },
    /// `tokenize`: encode `text` and answer with a `tokens` frame.
    Tokenize {
        /// The client's id for this call, echoed in the answer.
        id: String,
        /// Text to encode.
        text: String,
        /// Whether special-token text (e.g. `<|eot_id|>`) maps to its control id
        /// (default `false`: it is encoded as plain text).
        special: bool,
    },
    /// `detokenize`: decode `token_ids` and answer with a `text` frame.
    Detokenize {
        /// The client's id for this call, echoed in the answer.
        id: String,
        /// Token ids, each below the vocabulary size.
        token_ids: Vec<u32>,
    },
    /// `stats`: answer with the engine counters in a `stats` frame.
    Stats {
        /// Optional client id, echoed in the answer.
        id: Option<String>,
    },
    /// `plugins`: answer with the loaded Wasm plugins in a `plugins` frame.
    Plugins {
        /// Optional client id, echoed in the answer.
        id: Option<String>,
    },
}

impl ClientMessage {
    /// The client-chosen id of this message (`stats` may have none).
    pub fn id(&self) -> Option<&str> {
        match self {
            ClientMessage::Generate(req) => Some(&req.client_id),
            ClientMessage::Cancel { id }
            | ClientMessage::Tokenize { id, .. }
            | ClientMessage::Detokenize { id, .. } => Some(id),
            ClientMessage::Stats { id } | ClientMessage::Plugins { id } => id.as_deref(),
        }
    }
}

/// A client frame that failed to parse or validate.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{error}")]
pub struct ApiError {
    /// The frame's `id` when it could be read (a valid id string), else `None`.
    pub id: Option<String>,
    /// What was wrong (always [`crate::error::ErrorKind::Validation`] from the parser).
    pub error: InferError,
}

impl ApiError {
    /// The `error` frame to send back for this failure.
    pub fn to_frame(&self) -> String {
        error_frame(self.id.as_deref(), &self.error)
    }
}
