//! Sampling: turns one sequence's logits row into the next token id.
//!
//! - [`processor`]: [`LogitsProcessor`], the one seam for every logits edit
//!   (`apply`, `accept`, `rollback`); [`context`]: the [`StepContext`] it sees.
//! - [`chain`]: [`SamplerChain`], one per request, built before it is queued: native
//!   processors ([`penalties`], [`logit_bias`]), then the Wasm plugins, then the draw;
//!   a step returns [`Sampled`] (the token, with [`logprobs`] when asked); [`build`]:
//!   `SamplerChain::build`, a request's chains (grammar, reasoning gate, plugins);
//!   [`constraint`]: structured output through llguidance.
//! - [`processors`]: native truncation (top-k, top-p, min-p, temperature) and the
//!   inverse-CDF draw, in llama.cpp's semantics; [`sampler`]: [`Sampler`], with its own
//!   seeded RNG.
//! - [`wasm_plugin`]: user logits processors and samplers as sandboxed WebAssembly
//!   components.

pub mod build;
pub mod chain;
pub mod constraint;
pub mod context;
pub mod logit_bias;
pub mod logprobs;
pub mod penalties;
pub mod processor;
pub mod processors;
pub mod reasoning_gate;
pub mod sampler;
pub mod speculative;
pub mod tool_grammar;
pub mod wasm_plugin;

pub use chain::{Sampled, SamplerChain};
pub use context::StepContext;
pub use logprobs::{TokenLogprobs, TopLogprob};
pub use processor::LogitsProcessor;
pub use sampler::{argmax, Sampler};
