//! Detokenizer: turns the raw bytes of generated tokens into client text deltas.
//!
//! - [`utf8`]: incremental UTF-8 decoding that releases whole characters only and
//!   replaces invalid bytes exactly as [`String::from_utf8_lossy`] does.
//! - [`stop`]: stop-sequence matching across token boundaries with hold-back, so no
//!   part of a stop string is ever released.
//! - [`output_stream`]: [`OutputStream`], both combined; one per generated sequence.
//! - [`reasoning`]: `<think>…</think>` split from the answer.
//! - [`tool_calls`] (with [`json_scan`]): tool calls parsed from the answer.
//! - [`channels`]: [`Channels`], the two after the output stream.

pub mod channels;
pub mod json_scan;
pub mod output_stream;
pub mod reasoning;
pub mod stop;
pub mod tool_calls;
pub mod utf8;

pub use channels::{ChannelSpec, Channels};
pub use output_stream::{Emit, OutputStream};
pub use stop::StopMatcher;
pub use utf8::Utf8Decoder;
