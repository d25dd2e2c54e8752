//! Log-probabilities of the model's raw distribution: the sampled token's and the
//! most likely alternatives'.
//!
//! Computed on the raw logits, before penalties, bias, plugins or truncation — what
//! OpenAI's `logprobs` return (the model's distribution, not the sampler's), and
//! vLLM's default (`logprobs_mode = raw_logprobs`).

use inferd_kernels::expf::exp_sum;

pub use crate::request::{TokenLogprobs, TopLogprob};

/// `max + ln Σ exp(l − max)` of a logits row (NaN counts as −∞), the terms by ggml's
/// vectorized `expf` (≤ 1.5 ulp each, [`inferd_kernels::expf::exp_sum`]) in 16 lanes
/// and summed in f64: a 262,144-token row costs tens of µs instead of the
/// milliseconds of a scalar f64 `exp` per token. Returns `None` when no logit is finite.
fn log_normalizer(logits: &[f32]) -> Option<f64> {
    let max = super::sampler::row_max(logits);
    if !max.is_finite() {
        return None;
    }
    let sum = exp_sum(logits, max);
    Some(f64::from(max) + sum.ln())
}

/// The `n` largest logits as `(id, logit)`, largest first, ties by lower id; NaN and
/// −∞ never listed. O(vocab · n) worst case, one comparison per token in practice.
fn top_n(logits: &[f32], n: usize) -> Vec<(u32, f32)> {
    let mut top: Vec<(u32, f32)> = Vec::with_capacity(n + 1);
    if n == 0 {
        return top;
    }
    for (i, &l) in logits.iter().enumerate() {
        if l.is_nan() || l == f32::NEG_INFINITY {
            continue;
        }
        if top.len() == n && l <= top[n - 1].1 {
            continue; // not above the smallest kept (an equal one has a lower id)
        }
        let at = top.partition_point(|&(_, t)| t >= l);
        top.insert(at, (i as u32, l));
        top.truncate(n);
    }
    top
}

/// Log-probabilities for one step: `ln softmax(logits)` of `chosen` and of the `n` most
/// likely tokens, from the raw logits row `(vocab_size,)`. Bytes are left empty.
/// `None` when the row has no finite logit.
pub fn step_logprobs(logits: &[f32], chosen: u32, n: usize) -> Option<TokenLogprobs> {
    let norm = log_normalizer(logits)?;
    let lp = |l: f32| {
        if l.is_nan() {
            f32::NEG_INFINITY
        } else {
            (f64::from(l) - norm) as f32
        }
    };
    let entry = |token: u32, l: f32| TopLogprob {
        token,
        logprob: lp(l),
        bytes: Vec::new(),
    };
    let chosen_logit = logits
        .get(chosen as usize)
        .copied()
        .unwrap_or(f32::NEG_INFINITY);
    Some(TokenLogprobs {
        chosen: entry(chosen, chosen_logit),
        top: top_n(logits, n)
            .into_iter()
            .map(|(t, l)| entry(t, l))
            .collect(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn log_softmax_of_a_small_row() {
        // p = 0.5, 0.25, 0.125, 0.125.
        let logits = [2.0f32.ln() + 3.0, 3.0, 0.5f32.ln() + 3.0, 0.5f32.ln() + 3.0];
        let s = step_logprobs(&logits, 2, 3).expect("finite");
        assert!((s.chosen.logprob - 0.125f32.ln()).abs() < 1e-6);
        let ids: Vec<u32> = s.top.iter().map(|t| t.token).collect();
        assert_eq!(ids, vec![0, 1, 2]); // the 0.125 tie goes to the lower id
        let expect = [0.5f32, 0.25, 0.125];
        for (t, p) in s.top.iter().zip(expect) {
            assert!((t.logprob - p.ln()).abs() < 1e-6, "{t:?}");
        }
    }

    #[test]
    fn probabilities_of_a_full_top_sum_to_one() {
        let logits: Vec<f32> = (0..20)
            .map(|i| ((i * 37) % 11) as f32 * 0.7 - 3.0)
            .collect();
        let s = step_logprobs(&logits, 0, 20).expect("finite");
        let total: f64 = s.top.iter().map(|t| f64::from(t.logprob).exp()).sum();
        assert!((total - 1.0).abs() < 1e-6, "{total}");
        assert!(s.top.windows(2).all(|w| w[0].logprob >= w[1].logprob));
    }

    #[test]
    fn ruled_out_tokens_are_never_listed() {
        let logits = [f32::NEG_INFINITY, 1.0, f32::NAN, 0.0];
        let s = step_logprobs(&logits, 0, 4).expect("finite");
        assert_eq!(s.chosen.logprob, f32::NEG_INFINITY);
        let ids: Vec<u32> = s.top.iter().map(|t| t.token).collect();
        assert_eq!(ids, vec![1, 3]);
        assert!(step_logprobs(&[f32::NAN, f32::NEG_INFINITY], 0, 1).is_none());
    }
}
