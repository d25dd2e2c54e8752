//! [`LogitsProcessor`]: the one seam every logits edit goes through (native
//! penalties and logit bias, the Wasm plugin chain, constraints).

use super::context::StepContext;
use crate::error::InferError;

/// Edits one sequence's logits row before a token is drawn, and follows the tokens
/// that are accepted or taken back.
///
/// The chain ([`super::SamplerChain`]) calls, per step: `apply` on every processor in
/// order (penalties → logit bias → plugins → constraint, ../shared/DESIGN.md §4), then
/// the sampler draws, then `accept(token)` on every processor. Speculative decoding
/// calls `rollback(n)` when the last `n` accepted tokens are discarded; a processor
/// that keeps state derived from accepted tokens must restore it exactly.
pub trait LogitsProcessor: Send {
    /// A short name for errors and logs (`logit_bias`, `penalties`, a plugin's name).
    fn name(&self) -> &str;

    /// Edits `logits` `(vocab_size,)` raw f32 logits in place; `−∞` removes a token.
    ///
    /// # Errors
    /// The processor's own failure (`plugin_trap` for a plugin); it fails only this
    /// request.
    fn apply(&mut self, ctx: &StepContext<'_>, logits: &mut [f32]) -> Result<(), InferError>;

    /// `token` was chosen and appended to the sequence.
    ///
    /// # Errors
    /// A processor that cannot follow the token (a constraint the token violates).
    fn accept(&mut self, _token: u32) -> Result<(), InferError> {
        Ok(())
    }

    /// The last `n` accepted tokens were taken back (never more than were accepted).
    fn rollback(&mut self, _n: usize) {}
}
