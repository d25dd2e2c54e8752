//! [`SamplerChain`]: one request's whole sampling stage, built once before the request
//! is queued, stepped once per generated token.

use super::constraint::Constraint;
use super::context::StepContext;
use super::logit_bias::LogitBias;
use super::logprobs::{step_logprobs, TokenLogprobs};
use super::penalties::{MinTokens, Penalties};
use super::processor::LogitsProcessor;
use super::reasoning_gate::ReasoningGate;
use super::sampler::Sampler;
use super::wasm_plugin::{PluginChain, StepView};
use crate::error::InferError;
use crate::request::SamplingParams;

/// What one step chose.
#[derive(Debug, Clone, PartialEq)]
pub struct Sampled {
    /// The next token id.
    pub token: u32,
    /// Its log-probability and the top alternatives under the raw logits, when the
    /// request asked for `logprobs`.
    pub logprobs: Option<TokenLogprobs>,
}

/// The processors of one request in ../shared/DESIGN.md's order — penalties, logit
/// bias, the `min_tokens` ban, Wasm logits processors, the structured-output
/// constraint — then the draw: a sampler
/// plugin with one uniform from the request's seeded RNG, or the native [`Sampler`]
/// (top-k → top-p → min-p → temperature → draw).
pub struct SamplerChain {
    native: Vec<Box<dyn LogitsProcessor>>,
    plugins: Option<PluginChain>,
    constraint: Option<Constraint>,
    /// Holds the constraint back while the model reasons (`None`: it always applies).
    gate: Option<ReasoningGate>,
    sampler: Sampler,
    /// `Some(n)`: log-probabilities with the `n` most likely alternatives.
    logprobs: Option<usize>,
    /// The raw row, kept for log-probabilities while the processors edit the logits.
    raw: Vec<f32>,
}

impl std::fmt::Debug for SamplerChain {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SamplerChain")
            .field(
                "native",
                &self.native.iter().map(|p| p.name()).collect::<Vec<_>>(),
            )
            .field("plugins", &self.plugins)
            .field("constraint", &self.constraint)
            .field("sampler", &self.sampler)
            .field("logprobs", &self.logprobs)
            .finish_non_exhaustive()
    }
}

impl SamplerChain {
    /// The native part of the chain for validated `params`; `eog` are the model's
    /// end-of-generation token ids (for `min_tokens`). Neutral options add nothing, so a
    /// plain request pays for no processor.
    pub fn new(params: &SamplingParams, eog: &[u32]) -> Self {
        let mut native: Vec<Box<dyn LogitsProcessor>> = Vec::new();
        if let Some(p) = Penalties::from_params(params) {
            native.push(Box::new(p));
        }
        if !params.logit_bias.is_empty() {
            native.push(Box::new(LogitBias::new(params.logit_bias.clone())));
        }
        if let Some(m) = MinTokens::from_params(params, eog) {
            native.push(Box::new(m));
        }
        Self {
            native,
            plugins: None,
            constraint: None,
            gate: None,
            sampler: Sampler::new(params),
            logprobs: params.logprobs,
            raw: Vec::new(),
        }
    }

    /// Adds the request's Wasm plugins (instantiated and configured off the engine loop).
    pub fn set_plugins(&mut self, plugins: Option<PluginChain>) {
        self.plugins = plugins;
    }

    /// Adds the request's compiled `response_format` constraint.
    pub fn set_constraint(&mut self, constraint: Constraint) {
        self.constraint = Some(constraint);
    }

    /// Holds the constraint back while the model reasons (see [`ReasoningGate`]).
    pub fn set_reasoning_gate(&mut self, gate: ReasoningGate) {
        self.gate = Some(gate);
    }

    /// The model's reasoning ended: a gated constraint applies from the next token.
    pub fn reasoning_ended(&mut self) {
        if let Some(g) = self.gate.as_mut() {
            g.open();
        }
    }

    /// Computes the constraint's next mask ahead of [`Self::step`] (see
    /// [`Constraint::prepare`]); nothing without a constraint or while it is held back.
    pub fn prepare(&mut self) {
        if let Some(c) = self.constraint.as_mut() {
            if self.gate.as_ref().is_none_or(ReasoningGate::masks) {
                c.prepare();
            }
        }
    }

    /// Whether the chain has any processor or sampler plugin (a bare chain only draws).
    pub fn is_bare(&self) -> bool {
        self.native.is_empty() && self.plugins.is_none() && self.constraint.is_none()
    }

    /// Chooses the next token from `logits` `(vocab_size,)` raw f32 logits, which the
    /// processors edit in place.
    ///
    /// # Errors
    /// A processor's error (`plugin_trap` for a plugin), or the sampler's (`internal`
    /// when every logit is −∞ or NaN).
    pub fn step(
        &mut self,
        ctx: &StepContext<'_>,
        logits: &mut [f32],
    ) -> Result<Sampled, InferError> {
        if self.logprobs.is_some() {
            self.raw.clear();
            self.raw.extend_from_slice(logits);
        }
        for p in &mut self.native {
            p.apply(ctx, logits)?;
        }
        if let Some(chain) = self.plugins.as_mut() {
            chain.apply(ctx, logits)?;
        }
        if let Some(c) = self.constraint.as_mut() {
            match self.gate.as_mut() {
                Some(g) => g.apply(logits, |l| c.apply(ctx, l))?,
                None => c.apply(ctx, logits)?,
            }
        }
        let token = match self.plugins.as_mut() {
            Some(chain) if chain.has_sampler() => {
                let u = self.sampler.next_uniform();
                chain.sample(&view(ctx), logits, u)?
            }
            _ => self.sampler.sample(logits)?,
        };
        let logprobs = self
            .logprobs
            .and_then(|n| step_logprobs(&self.raw, token, n));
        Ok(Sampled { token, logprobs })
    }

    /// `token` was appended to the sequence: every processor follows it.
    ///
    /// # Errors
    /// A processor that cannot follow the token.
    pub fn accept(&mut self, token: u32) -> Result<(), InferError> {
        for p in &mut self.native {
            p.accept(token)?;
        }
        if let Some(chain) = self.plugins.as_mut() {
            chain.accept(token)?;
        }
        let feed = self.gate.as_mut().is_none_or(|g| g.accept(token));
        if let (Some(c), true) = (self.constraint.as_mut(), feed) {
            c.accept(token)?;
        }
        Ok(())
    }

    /// The last `n` accepted tokens were taken back.
    pub fn rollback(&mut self, n: usize) {
        for p in &mut self.native {
            p.rollback(n);
        }
        if let Some(chain) = self.plugins.as_mut() {
            chain.rollback(n);
        }
        let fed = self.gate.as_mut().map_or(n, |g| g.rollback(n));
        if let Some(c) = self.constraint.as_mut() {
            c.rollback(fed);
        }
    }
}

fn view<'a>(ctx: &StepContext<'a>) -> StepView<'a> {
    StepView {
        sequence_id: ctx.sequence_id,
        prompt_tokens: ctx.prompt.len(),
        generated: ctx.generated,
    }
}

impl LogitsProcessor for PluginChain {
    fn name(&self) -> &str {
        "plugins"
    }

    /// Runs the request's Wasm logits processors in order (see [`PluginChain::process`]).
    /// Plugins see the accepted tokens in each step's context, so they keep no state
    /// that `accept` or `rollback` must follow here.
    fn apply(&mut self, ctx: &StepContext<'_>, logits: &mut [f32]) -> Result<(), InferError> {
        self.process(&view(ctx), logits)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ctx<'a>(generated: &'a [u32]) -> StepContext<'a> {
        StepContext {
            sequence_id: 1,
            prompt: &[0, 1],
            generated,
        }
    }

    fn greedy() -> SamplingParams {
        SamplingParams {
            temperature: 0.0,
            ..SamplingParams::default()
        }
    }

    #[test]
    fn plain_params_build_a_bare_chain() {
        assert!(SamplerChain::new(&SamplingParams::default(), &[2]).is_bare());
        let biased = SamplingParams {
            logit_bias: vec![(1, 1.0)],
            ..greedy()
        };
        assert!(!SamplerChain::new(&biased, &[2]).is_bare());
    }

    /// −100 on the greedy token moves the argmax; +100 forces a token.
    #[test]
    fn logit_bias_moves_the_greedy_token() {
        let logits = [0.5f32, 3.0, 2.0, -1.0];
        let mut plain = SamplerChain::new(&greedy(), &[]);
        assert_eq!(
            plain.step(&ctx(&[]), &mut logits.clone()).map(|s| s.token),
            Ok(1)
        );
        let ban = SamplingParams {
            logit_bias: vec![(1, -100.0)],
            ..greedy()
        };
        let mut c = SamplerChain::new(&ban, &[]);
        assert_eq!(
            c.step(&ctx(&[]), &mut logits.clone()).map(|s| s.token),
            Ok(2)
        );
        let force = SamplingParams {
            logit_bias: vec![(3, 100.0)],
            ..greedy()
        };
        let mut c = SamplerChain::new(&force, &[]);
        assert_eq!(
            c.step(&ctx(&[]), &mut logits.clone()).map(|s| s.token),
            Ok(3)
        );
    }

    /// Log-probabilities come from the raw row even when the bias chose the token.
    #[test]
    fn logprobs_are_of_the_raw_logits() {
        let logits = [0.0f32, 1.0, 2.0];
        let p = SamplingParams {
            logit_bias: vec![(0, 100.0)],
            logprobs: Some(1),
            ..greedy()
        };
        let mut c = SamplerChain::new(&p, &[]);
        let s = c.step(&ctx(&[]), &mut logits.clone()).expect("step");
        assert_eq!(s.token, 0);
        let lse = (0f64.exp() + 1f64.exp() + 2f64.exp()).ln();
        let lp = s.logprobs.expect("asked");
        assert!((f64::from(lp.chosen.logprob) + lse).abs() < 1e-6);
        assert_eq!(lp.top.len(), 1);
        assert_eq!(lp.top[0].token, 2);
        assert!((f64::from(lp.top[0].logprob) - (2.0 - lse)).abs() < 1e-6);
    }

    /// The frequency penalty follows accepted tokens and forgets rolled-back ones.
    #[test]
    fn accept_and_rollback_reach_the_penalties() {
        let p = SamplingParams {
            frequency_penalty: 2.0,
            ..greedy()
        };
        let mut c = SamplerChain::new(&p, &[]);
        let logits = [0.0f32, 3.0, 2.0];
        assert_eq!(
            c.step(&ctx(&[]), &mut logits.clone()).map(|s| s.token),
            Ok(1)
        );
        c.accept(1).expect("accept");
        // 3 − 2 = 1 < 2: token 2 wins now.
        assert_eq!(
            c.step(&ctx(&[1]), &mut logits.clone()).map(|s| s.token),
            Ok(2)
        );
        c.rollback(1);
        assert_eq!(
            c.step(&ctx(&[]), &mut logits.clone()).map(|s| s.token),
            Ok(1)
        );
    }

    #[test]
    fn min_tokens_holds_back_end_of_generation() {
        let p = SamplingParams {
            min_tokens: 1,
            ..greedy()
        };
        let mut c = SamplerChain::new(&p, &[2]);
        let logits = [0.0f32, 1.0, 5.0];
        assert_eq!(
            c.step(&ctx(&[]), &mut logits.clone()).map(|s| s.token),
            Ok(1)
        );
        assert_eq!(
            c.step(&ctx(&[1]), &mut logits.clone()).map(|s| s.token),
            Ok(2)
        );
    }
}
