//! Sampling: turns one sequence's logits row into the next token id.
//!
//! - [`processors`]: native truncation processors (top-k, top-p, min-p, temperature)
//!   and the inverse-CDF draw, in llama.cpp's semantics.
//! - [`sampler`]: [`Sampler`], one per sequence, with its own seeded RNG.
//! - [`wasm_plugin`]: user logits processors and samplers as sandboxed WebAssembly
//!   components (applied after the native logit processing, before truncation).

pub mod processors;
pub mod sampler;
pub mod wasm_plugin;

pub use sampler::{argmax, Sampler};
