//! Verification of speculative drafts: which of them the target model accepts.
//!
//! A sequence's step ran its pending token and drafts `d₁ … d_m`; row `i` of its logits
//! is the target's distribution `p_i` for the token after `d_i` (row 0: after the
//! pending token). Leviathan et al. 2023 ("Fast Inference from Transformers via
//! Speculative Decoding", Algorithm 1) and Chen et al. 2023 accept `d_{i+1}` with
//! probability `min(1, p_i(d) / q_i(d))` and on rejection draw from
//! `norm(max(0, p_i − q_i))`, which makes every emitted token distributed as `p_i`.
//!
//! Our drafts are deterministic (prompt lookup proposes one continuation), so `q_i` is a
//! point mass at `d`: the rule accepts `d` with probability `p_i(d)` and otherwise draws
//! from `p_i` without `d`, renormalised. Drawing `t ~ p_i` and accepting when `t = d`
//! is the same rule: `P(t = d) = p_i(d)`, and given `t ≠ d`, `P(t = x) = p_i(x) /
//! (1 − p_i(d))`. We sample that way, through the request's own [`super::SamplerChain`]
//! (penalties, bias, plugins, constraint, truncation, its seeded RNG) one row after the
//! other, so each row is processed and drawn exactly as a plain decode step at that
//! position would be: greedy output is identical with and without speculation, and so
//! is seeded sampled output (one uniform per token, in the same order), given rows
//! equal bit for bit to one-row decode steps (`model_runner` batch tests).

/// What [`verify`] decided.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Verdict<F, E> {
    /// Drafts accepted (the first `accepted` of them).
    pub accepted: usize,
    /// `Ok(None)`: generation goes on after the tokens sampled; `Ok(Some(f))`: it ended
    /// with `f` at the last token sampled; `Err`: sampling failed.
    pub outcome: Result<Option<F>, E>,
}

/// Samples `rows` in order (`rows.len() == drafts.len() + 1`) with `sample`, which
/// draws the next token from a row, appends it to the sequence and says whether that
/// ended generation; stops at the first token that is not its row's draft (or after
/// the last row), or when generation ends. A token that ends generation counts as
/// accepted when it equals its draft.
pub fn verify<F, E>(
    drafts: &[u32],
    rows: &mut [Vec<f32>],
    mut sample: impl FnMut(&mut [f32]) -> Result<(u32, Option<F>), E>,
) -> Verdict<F, E> {
    let mut accepted = 0;
    for (i, row) in rows.iter_mut().enumerate() {
        let (token, end) = match sample(row) {
            Ok(r) => r,
            Err(e) => {
                return Verdict {
                    accepted,
                    outcome: Err(e),
                }
            }
        };
        let matched = drafts.get(i) == Some(&token);
        accepted += usize::from(matched);
        if end.is_some() || !matched {
            return Verdict {
                accepted,
                outcome: Ok(end),
            };
        }
    }
    Verdict {
        accepted,
        outcome: Ok(None),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::InferError;
    use crate::request::SamplingParams;
    use crate::sampling::{SamplerChain, StepContext};

    /// Runs `rows` through a chain with `drafts`, as the engine does; returns the tokens.
    fn run(chain: &mut SamplerChain, drafts: &[u32], rows: &[Vec<f32>]) -> (Vec<u32>, usize) {
        let mut generated = Vec::new();
        let mut rows = rows.to_vec();
        let v: Verdict<(), InferError> = verify(drafts, &mut rows, |row| {
            let ctx = StepContext {
                sequence_id: 1,
                prompt: &[0],
                generated: &generated,
            };
            let t = chain.step(&ctx, row)?.token;
            chain.accept(t)?;
            generated.push(t);
            Ok((t, None))
        });
        assert!(v.outcome.is_ok());
        (generated, v.accepted)
    }

    fn sampled(seed: u64) -> SamplingParams {
        SamplingParams {
            temperature: 1.0,
            top_k: 0,
            top_p: 1.0,
            min_p: 0.0,
            seed,
            ..SamplingParams::default()
        }
    }

    const LOGITS: [f32; 4] = [1.0, 0.0, 2.0, -1.0];

    fn softmax(l: &[f32]) -> Vec<f64> {
        let e: Vec<f64> = l.iter().map(|&x| f64::from(x).exp()).collect();
        let s: f64 = e.iter().sum();
        e.iter().map(|x| x / s).collect()
    }

    /// Pearson's χ² of `counts` against `probs` over `n` draws.
    fn chi_square(counts: &[usize], probs: &[f64], n: usize) -> f64 {
        counts
            .iter()
            .zip(probs)
            .map(|(&c, &p)| {
                let e = p * n as f64;
                (c as f64 - e).powi(2) / e
            })
            .sum()
    }

    /// Accepted and corrected tokens together follow the target's distribution, and the
    /// draft is accepted with probability p(d): χ² on 4 tokens (3 degrees of freedom;
    /// 16.27 is the 0.001 critical value) over 20 000 seeded verifications.
    #[test]
    fn emitted_tokens_follow_the_target_distribution() {
        let p = softmax(&LOGITS);
        let rows = vec![LOGITS.to_vec(), LOGITS.to_vec()];
        for draft in [0u32, 1, 2, 3] {
            let n = 20_000;
            let mut counts = [0usize; 4];
            let mut second = [0usize; 4];
            let mut accepted = 0;
            for seed in 0..n as u64 {
                let mut chain = SamplerChain::new(&sampled(seed), &[]);
                let (tokens, a) = run(&mut chain, &[draft], &rows);
                counts[tokens[0] as usize] += 1;
                accepted += a;
                if a == 1 {
                    // The row after an accepted draft is the target's distribution too.
                    second[tokens[1] as usize] += 1;
                }
            }
            let chi = chi_square(&counts, &p, n);
            assert!(chi < 16.27, "draft {draft}: χ² = {chi} for {counts:?}");
            let chi2 = chi_square(&second, &p, accepted);
            assert!(chi2 < 16.27, "draft {draft}: second row χ² = {chi2}");
            let rate = accepted as f64 / n as f64;
            let want = p[draft as usize];
            // Binomial standard deviation at n = 20 000 is under 0.0036: 5σ.
            assert!(
                (rate - want).abs() < 0.018,
                "draft {draft}: {rate} vs {want}"
            );
        }
    }

    /// With the same seed, the tokens are those of plain one-row steps: drafts change
    /// how many rows a step verifies, never what is drawn.
    #[test]
    fn seeded_tokens_equal_plain_decoding() {
        let rows: Vec<Vec<f32>> = (0..6)
            .map(|i| LOGITS.iter().map(|&l| l + (i as f32 * 0.7).sin()).collect())
            .collect();
        for seed in 0..50 {
            let mut plain = SamplerChain::new(&sampled(seed), &[]);
            let mut want = Vec::new();
            for row in &rows {
                let (t, _) = run(&mut plain, &[], std::slice::from_ref(row));
                want.extend(t);
            }
            let mut spec = SamplerChain::new(&sampled(seed), &[]);
            let mut got = Vec::new();
            let mut at = 0;
            while at < rows.len() {
                // Draft the plain run's own next tokens, the last one wrong on purpose.
                let m = (rows.len() - at - 1).min(3);
                let mut drafts: Vec<u32> = want[at..at + m].to_vec();
                if let Some(last) = drafts.last_mut() {
                    *last = (*last + 1) % 4;
                }
                let (t, a) = run(&mut spec, &drafts, &rows[at..at + m + 1]);
                assert_eq!(a, m.saturating_sub(1));
                at += t.len();
                got.extend(t);
            }
            assert_eq!(got, want, "seed {seed}");
        }
    }

    #[test]
    fn a_run_ends_at_the_first_mismatch_or_at_the_end() {
        let greedy = SamplingParams {
            temperature: 0.0,
            ..SamplingParams::default()
        };
        let rows = vec![LOGITS.to_vec(); 4];
        let mut c = SamplerChain::new(&greedy, &[]);
        assert_eq!(run(&mut c, &[2, 2, 2], &rows), (vec![2, 2, 2, 2], 3));
        let mut c = SamplerChain::new(&greedy, &[]);
        assert_eq!(run(&mut c, &[2, 0, 2], &rows), (vec![2, 2], 1));
        let mut c = SamplerChain::new(&greedy, &[]);
        assert_eq!(run(&mut c, &[1, 2, 2], &rows), (vec![2], 0));
        // Generation ending at an accepted draft counts it and stops.
        let mut rows = rows;
        let v: Verdict<&str, ()> = verify(&[2, 2, 2], &mut rows, |_| Ok((2, Some("stop"))));
        assert_eq!(
            v,
            Verdict {
                accepted: 1,
                outcome: Ok(Some("stop"))
            }
        );
        let v: Verdict<&str, &str> = verify(&[2], &mut rows[..2], |_| Err("trap"));
        assert_eq!(
            v,
            Verdict {
                accepted: 0,
                outcome: Err("trap")
            }
        );
    }
}
