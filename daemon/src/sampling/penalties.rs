//! Repetition control: [`Penalties`] (presence, frequency, repetition) and
//! [`MinTokens`] (no end of generation before a minimum length).

use std::collections::HashMap;

use super::context::StepContext;
use super::processor::LogitsProcessor;
use crate::error::InferError;
use crate::request::SamplingParams;

/// OpenAI's presence and frequency penalties over the generated tokens, and the
/// repetition penalty over a window of prompt and generated tokens.
///
/// Per token `j` with count `c_j` in the generated text (OpenAI API reference,
/// "Parameter details", frequency and presence penalties):
/// `logit_j −= c_j · frequency + [c_j > 0] · presence`.
/// Before that, for each distinct token in the last `repeat_last_n` tokens of prompt
/// and output (CTRL, Keskar et al. 2019; vLLM `apply_penalties`, llama.cpp
/// `llama_sampler_penalties_apply`): `logit_j = logit_j / r` when `logit_j > 0`, else
/// `logit_j · r`. The counts follow [`LogitsProcessor::accept`] and
/// [`LogitsProcessor::rollback`].
#[derive(Debug, Clone)]
pub struct Penalties {
    presence: f32,
    frequency: f32,
    repetition: f32,
    window: Option<usize>,
    /// Occurrences of each token among the accepted ones.
    counts: HashMap<u32, u32>,
    /// The accepted tokens, oldest first (for `rollback`).
    accepted: Vec<u32>,
    /// Reused: the distinct tokens of the repetition window.
    seen: Vec<u32>,
}

impl Penalties {
    /// The penalties of `params`, or `None` when all are neutral.
    pub fn from_params(params: &SamplingParams) -> Option<Self> {
        let active = params.presence_penalty != 0.0
            || params.frequency_penalty != 0.0
            || (params.repetition_penalty != 1.0 && params.repeat_last_n != Some(0));
        active.then(|| Self {
            presence: params.presence_penalty,
            frequency: params.frequency_penalty,
            repetition: params.repetition_penalty,
            window: params.repeat_last_n,
            counts: HashMap::new(),
            accepted: Vec::new(),
            seen: Vec::new(),
        })
    }

    fn apply_repetition(&mut self, ctx: &StepContext<'_>, logits: &mut [f32]) {
        if self.repetition == 1.0 {
            return;
        }
        let (prompt, generated) = ctx.last_tokens(self.window.unwrap_or(usize::MAX));
        self.seen.clear();
        self.seen.extend_from_slice(prompt);
        self.seen.extend_from_slice(generated);
        self.seen.sort_unstable();
        self.seen.dedup();
        let r = self.repetition;
        for &t in &self.seen {
            if let Some(l) = logits.get_mut(t as usize) {
                *l = if *l > 0.0 { *l / r } else { *l * r };
            }
        }
    }
}

impl LogitsProcessor for Penalties {
    fn name(&self) -> &str {
        "penalties"
    }

    fn apply(&mut self, ctx: &StepContext<'_>, logits: &mut [f32]) -> Result<(), InferError> {
        self.apply_repetition(ctx, logits);
        if self.presence != 0.0 || self.frequency != 0.0 {
            for (&t, &c) in &self.counts {
                if let Some(l) = logits.get_mut(t as usize) {
                    *l -= c as f32 * self.frequency + self.presence;
                }
            }
        }
        Ok(())
    }

    fn accept(&mut self, token: u32) -> Result<(), InferError> {
        *self.counts.entry(token).or_insert(0) += 1;
        self.accepted.push(token);
        Ok(())
    }

    fn rollback(&mut self, n: usize) {
        for _ in 0..n.min(self.accepted.len()) {
            let Some(t) = self.accepted.pop() else { break };
            if let Some(c) = self.counts.get_mut(&t) {
                *c -= 1;
                if *c == 0 {
                    self.counts.remove(&t);
                }
            }
        }
    }
}

/// Bans every end-of-generation token (`−∞`) while fewer than `min_tokens` tokens were
/// generated (vLLM `min_tokens`). Stop sequences are matched as usual.
#[derive(Debug, Clone)]
pub struct MinTokens {
    min_tokens: usize,
    eog: Vec<u32>,
}

impl MinTokens {
    /// The ban for `params.min_tokens` over the model's end-of-generation ids, or
    /// `None` when `min_tokens` is 0.
    pub fn from_params(params: &SamplingParams, eog: &[u32]) -> Option<Self> {
        (params.min_tokens > 0).then(|| Self {
            min_tokens: params.min_tokens,
            eog: eog.to_vec(),
        })
    }
}

impl LogitsProcessor for MinTokens {
    fn name(&self) -> &str {
        "min_tokens"
    }

    fn apply(&mut self, ctx: &StepContext<'_>, logits: &mut [f32]) -> Result<(), InferError> {
        if ctx.generated.len() < self.min_tokens {
            for &t in &self.eog {
                if let Some(l) = logits.get_mut(t as usize) {
                    *l = f32::NEG_INFINITY;
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params(
        presence: f32,
        frequency: f32,
        repetition: f32,
        last_n: Option<usize>,
    ) -> SamplingParams {
        SamplingParams {
            presence_penalty: presence,
            frequency_penalty: frequency,
            repetition_penalty: repetition,
            repeat_last_n: last_n,
            ..SamplingParams::default()
        }
    }

    fn ctx<'a>(prompt: &'a [u32], generated: &'a [u32]) -> StepContext<'a> {
        StepContext {
            sequence_id: 1,
            prompt,
            generated,
        }
    }

    #[test]
    fn neutral_values_build_nothing() {
        assert!(Penalties::from_params(&params(0.0, 0.0, 1.0, Some(64))).is_none());
        assert!(Penalties::from_params(&params(0.0, 0.0, 1.3, Some(0))).is_none());
        assert!(Penalties::from_params(&params(0.5, 0.0, 1.0, Some(64))).is_some());
    }

    /// OpenAI's formula on a small row: token 1 generated twice, token 3 once.
    #[test]
    fn presence_and_frequency_follow_openais_formula() {
        let mut p = Penalties::from_params(&params(0.5, 0.25, 1.0, Some(64))).expect("active");
        for t in [1, 3, 1] {
            p.accept(t).expect("accept");
        }
        let mut logits = [1.0f32, 1.0, 1.0, 1.0];
        p.apply(&ctx(&[0, 0], &[1, 3, 1]), &mut logits)
            .expect("apply");
        // token 0 only in the prompt: untouched.
        assert_eq!(logits, [1.0, 1.0 - 2.0 * 0.25 - 0.5, 1.0, 1.0 - 0.25 - 0.5]);
    }

    /// Divide positive, multiply negative, once per distinct token of the window.
    #[test]
    fn repetition_penalty_over_the_last_n_of_prompt_and_output() {
        let mut p = Penalties::from_params(&params(0.0, 0.0, 2.0, Some(3))).expect("active");
        let mut logits = [4.0f32, -4.0, 4.0, 4.0, -1.0];
        // Window of 3: prompt's last token 1, generated 2, 2. Token 0 is outside it.
        p.apply(&ctx(&[0, 1], &[2, 2]), &mut logits).expect("apply");
        assert_eq!(logits, [4.0, -8.0, 2.0, 4.0, -1.0]);
        let mut all = Penalties::from_params(&params(0.0, 0.0, 2.0, None)).expect("active");
        let mut logits = [4.0f32, -4.0, 4.0, 4.0, -1.0];
        all.apply(&ctx(&[0, 1], &[2, 2]), &mut logits)
            .expect("apply");
        assert_eq!(logits, [2.0, -8.0, 2.0, 4.0, -1.0]);
    }

    #[test]
    fn rollback_restores_the_counts() {
        let mut p = Penalties::from_params(&params(1.0, 1.0, 1.0, Some(64))).expect("active");
        for t in [5, 6, 5] {
            p.accept(t).expect("accept");
        }
        p.rollback(2);
        let mut logits = [0.0f32; 8];
        p.apply(&ctx(&[], &[5]), &mut logits).expect("apply");
        assert_eq!(logits, [0.0, 0.0, 0.0, 0.0, 0.0, -2.0, 0.0, 0.0]);
        p.rollback(10);
        let mut logits = [0.0f32; 8];
        p.apply(&ctx(&[], &[]), &mut logits).expect("apply");
        assert_eq!(logits, [0.0; 8]);
    }

    #[test]
    fn min_tokens_bans_end_of_generation_until_reached() {
        let p = SamplingParams {
            min_tokens: 2,
            ..SamplingParams::default()
        };
        assert!(MinTokens::from_params(&SamplingParams::default(), &[2]).is_none());
        let mut m = MinTokens::from_params(&p, &[2, 3]).expect("active");
        let mut logits = [1.0f32; 4];
        m.apply(&ctx(&[7], &[1]), &mut logits).expect("apply");
        assert_eq!(logits, [1.0, 1.0, f32::NEG_INFINITY, f32::NEG_INFINITY]);
        let mut logits = [1.0f32; 4];
        m.apply(&ctx(&[7], &[1, 1]), &mut logits).expect("apply");
        assert_eq!(logits, [1.0; 4]);
    }
}
