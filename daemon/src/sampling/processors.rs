//! Native logits processors over a candidate list, in llama.cpp's semantics.
//!
//! Each function mirrors one sampler of llama.cpp's `src/llama-sampling.cpp`
//! (`llama_sampler_top_k_impl`, `llama_sampler_top_p_apply`,
//! `llama_sampler_min_p_apply`, `llama_sampler_temp_impl`, `llama_sampler_dist_apply`)
//! with `min_keep = 1`. They work on a `Vec<Candidate>` the caller reuses across
//! steps, so no vocabulary-sized allocation happens after the first step.
//!
//! Candidate order is made total by [`cmp_desc`] (logit descending, then token id
//! ascending), so every partial sort gives the same result on every run and the
//! sampled token depends only on the logits and the RNG state.

use std::cmp::Ordering;

/// A token still in the running, with its current (possibly scaled) logit.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Candidate {
    /// Token id (index into the logits row).
    pub id: u32,
    /// Logit; never NaN (NaN inputs are mapped to −∞ and dropped before processing).
    pub logit: f32,
}

/// Total order for "most likely first": logit descending, ties by lower token id.
pub fn cmp_desc(a: &Candidate, b: &Candidate) -> Ordering {
    b.logit.total_cmp(&a.logit).then(a.id.cmp(&b.id))
}

/// Fills `out` with every token of `logits` whose logit is not −∞ or NaN, in id
/// order. `+∞` is clamped to `f32::MAX` so that softmax stays finite (the `+∞`
/// tokens then share the probability mass equally). Returns the number kept.
pub fn collect_candidates(logits: &[f32], out: &mut Vec<Candidate>) -> usize {
    out.clear();
    out.extend(
        logits
            .iter()
            .enumerate()
            .filter(|(_, l)| !l.is_nan() && **l != f32::NEG_INFINITY)
            .map(|(i, &l)| Candidate {
                id: i as u32,
                logit: l.min(f32::MAX),
            }),
    );
    out.len()
}

/// Top-k (Fan et al. 2018; llama.cpp `llama_sampler_top_k_impl`): keeps the `k`
/// most likely candidates, sorted by [`cmp_desc`]. `k == 0` disables; `k ≥ len`
/// only sorts. Cost: O(n) selection plus O(k log k) sort, no full sort of n.
/// Returns whether `cands` is now sorted (always `true` unless disabled).
pub fn top_k(cands: &mut Vec<Candidate>, k: usize) -> bool {
    if k == 0 {
        return false;
    }
    if k < cands.len() {
        cands.select_nth_unstable_by(k - 1, cmp_desc);
        cands.truncate(k);
    }
    cands.sort_unstable_by(cmp_desc);
    true
}

/// Largest logit among `cands` (−∞ when empty).
pub fn max_logit(cands: &[Candidate]) -> f32 {
    cands
        .iter()
        .map(|c| c.logit)
        .fold(f32::NEG_INFINITY, f32::max)
}

/// Softmax normaliser `Σ exp(logit − max)` in f64 (the max-subtraction keeps it finite).
fn exp_sum(cands: &[Candidate], max: f32) -> f64 {
    cands.iter().map(|c| f64::from((c.logit - max).exp())).sum()
}

/// Top-p / nucleus (Holtzman et al. 2019, "The Curious Case of Neural Text
/// Degeneration"; llama.cpp `llama_sampler_top_p_apply`): with `p_i = softmax(logits)`
/// over the current candidates sorted by probability, keeps the smallest prefix whose
/// cumulative probability is ≥ `p` (at least one candidate). `p ≥ 1` disables.
///
/// When `sorted` is false the candidates are sorted only as far as needed: the top
/// 64 are selected and sorted, then the next 128, and so on, so a peaked
/// distribution never pays for a full sort. Leaves `cands` sorted when it truncates
/// and returns whether `cands` is sorted.
pub fn top_p(cands: &mut Vec<Candidate>, p: f32, sorted: bool) -> bool {
    if p >= 1.0 || cands.is_empty() {
        return sorted;
    }
    let p = f64::from(p);
    let max = max_logit(cands);
    let total = exp_sum(cands, max);
    let n = cands.len();
    let mut done = 0; // cands[..done] is sorted and holds the most likely `done` tokens
    let mut chunk = 64;
    let mut cum = 0.0f64;
    while done < n {
        let end = if sorted { n } else { (done + chunk).min(n) };
        if !sorted {
            let rest = &mut cands[done..];
            if end < n {
                rest.select_nth_unstable_by(end - done - 1, cmp_desc);
            }
            rest[..end - done].sort_unstable_by(cmp_desc);
        }
        let hit = cands[done..end].iter().position(|c| {
            cum += f64::from((c.logit - max).exp()) / total;
            cum >= p
        });
        if let Some(pos) = hit {
            cands.truncate(done + pos + 1);
            return true;
        }
        done = end;
        chunk *= 2;
    }
    true
}

/// Min-p (Nguyen et al. 2024, "Turning Up the Heat: Min-p Sampling"; llama.cpp
/// `llama_sampler_min_p_apply`): keeps candidates with `p_i ≥ min_p · p_max`,
/// evaluated in logit space as `logit_i ≥ logit_max + ln(min_p)` (the softmax
/// normaliser cancels). `min_p ≤ 0` disables; the most likely token always stays.
/// Preserves the order of `cands`.
pub fn min_p(cands: &mut Vec<Candidate>, min_p: f32) {
    if min_p <= 0.0 || cands.is_empty() {
        return;
    }
    let threshold = max_logit(cands) + min_p.ln();
    cands.retain(|c| c.logit >= threshold);
}

/// Temperature (Ackley et al. 1985; llama.cpp `llama_sampler_temp_impl`): divides
/// every logit by `t > 0` (`t < 1` sharpens, `t > 1` flattens). The maximum is
/// subtracted first (`(logit − max) / t`), which leaves the softmax unchanged but
/// cannot overflow for tiny `t`. Callers handle `t == 0` as greedy.
pub fn temperature(cands: &mut [Candidate], t: f32) {
    if t == 1.0 {
        return;
    }
    let max = max_logit(cands);
    for c in cands.iter_mut() {
        c.logit = (c.logit - max) / t;
    }
}

/// Draws one candidate from `softmax(logits)` with a uniform `u ∈ [0, 1)` by inverse
/// CDF over `cands` in their current order (as llama.cpp `llama_sample_dist`):
/// the first candidate whose cumulative weight exceeds `u · Σ weights`. `weights` is
/// a reused scratch buffer. Returns `None` only when `cands` is empty.
pub fn draw(cands: &[Candidate], u: f64, weights: &mut Vec<f64>) -> Option<u32> {
    let last = cands.last()?;
    let max = max_logit(cands);
    weights.clear();
    weights.extend(cands.iter().map(|c| f64::from((c.logit - max).exp())));
    let target = u * weights.iter().sum::<f64>();
    let mut cum = 0.0;
    for (c, w) in cands.iter().zip(weights.iter()) {
        cum += w;
        if cum > target {
            return Some(c.id);
        }
    }
    // Rounding left `target` at the very top of the range: the last candidate.
    Some(last.id)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cands(logits: &[f32]) -> Vec<Candidate> {
        let mut v = Vec::new();
        collect_candidates(logits, &mut v);
        v
    }

    fn ids(c: &[Candidate]) -> Vec<u32> {
        c.iter().map(|c| c.id).collect()
    }

    #[test]
    fn collect_drops_nan_and_neg_inf_and_clamps_pos_inf() {
        let c = cands(&[1.0, f32::NAN, f32::NEG_INFINITY, f32::INFINITY]);
        assert_eq!(ids(&c), vec![0, 3]);
        assert_eq!(c[1].logit, f32::MAX);
    }

    #[test]
    fn top_k_keeps_k_best_sorted_ties_by_id() {
        let mut c = cands(&[0.5, 2.0, 1.0, 2.0, -1.0]);
        assert!(top_k(&mut c, 3));
        assert_eq!(ids(&c), vec![1, 3, 2]);
    }

    #[test]
    fn top_p_keeps_smallest_prefix_reaching_p() {
        // Probabilities 0.5, 0.25, 0.125, 0.125 (logits ln p).
        let logits = [0.125f32.ln(), 0.5f32.ln(), 0.125f32.ln(), 0.25f32.ln()];
        let mut c = cands(&logits);
        assert!(top_p(&mut c, 0.7, false));
        assert_eq!(ids(&c), vec![1, 3]);
        let mut c = cands(&logits);
        top_p(&mut c, 0.75, false);
        assert_eq!(ids(&c), vec![1, 3]); // 0.5 + 0.25 ≥ 0.75 exactly
        let mut c = cands(&logits);
        top_p(&mut c, 0.01, false);
        assert_eq!(ids(&c), vec![1]);
    }

    #[test]
    fn top_p_incremental_sort_matches_full_sort() {
        // 1000 nearly flat logits force several selection rounds.
        let logits: Vec<f32> = (0..1000)
            .map(|i| ((i * 7919) % 1000) as f32 * 1e-3)
            .collect();
        let mut a = cands(&logits);
        top_p(&mut a, 0.9, false);
        let mut b = cands(&logits);
        b.sort_unstable_by(cmp_desc);
        top_p(&mut b, 0.9, true);
        assert_eq!(ids(&a), ids(&b));
        assert!(a.len() > 500 && a.len() < 1000);
    }

    #[test]
    fn min_p_threshold_relative_to_max() {
        // p ∝ 1, 0.5, 0.09, 0.11 → with min_p 0.1 the 0.09 token goes.
        let logits = [0.0f32, 0.5f32.ln(), 0.09f32.ln(), 0.11f32.ln()];
        let mut c = cands(&logits);
        min_p(&mut c, 0.1);
        assert_eq!(ids(&c), vec![0, 1, 3]);
    }

    #[test]
    fn temperature_scales_and_stays_finite() {
        let mut c = cands(&[2.0, 1.0, f32::MAX]);
        temperature(&mut c, 1e-30);
        assert_eq!(c[2].logit, 0.0);
        assert!(c.iter().all(|c| !c.logit.is_nan()));
        let mut c = cands(&[2.0, 1.0]);
        temperature(&mut c, 0.5);
        assert_eq!((c[0].logit, c[1].logit), (0.0, -2.0));
    }

    #[test]
    fn draw_inverse_cdf() {
        let c = cands(&[0.0, 0.0, 0.0, 0.0]);
        let mut w = Vec::new();
        assert_eq!(draw(&c, 0.0, &mut w), Some(0));
        assert_eq!(draw(&c, 0.30, &mut w), Some(1));
        assert_eq!(draw(&c, 0.74, &mut w), Some(2));
        assert_eq!(draw(&c, 0.999_999, &mut w), Some(3));
        assert_eq!(draw(&[], 0.5, &mut w), None);
    }
}
