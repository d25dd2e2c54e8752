//! [`Sampler`]: the native per-sequence sampler (truncation, temperature, seeded draw).

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use super::processors::{self, Candidate};
use crate::error::InferError;
use crate::request::SamplingParams;

/// Greedy decoding: the index of the largest logit; ties go to the lowest token id.
/// NaN counts as −∞.
///
/// # Errors
/// `internal` when `logits` is empty or every logit is −∞ or NaN (the model produced
/// no usable distribution).
pub fn argmax(logits: &[f32]) -> Result<u32, InferError> {
    // Two branch-free passes that the compiler vectorizes (a 262k vocabulary at 16
    // streams made the one-pass scalar loop 5 % of a step): the maximum, then the
    // first logit equal to it.
    const LANES: usize = 16;
    let max = row_max(logits);
    if max == f32::NEG_INFINITY || max.is_nan() {
        return Err(no_distribution(logits.len()));
    }
    // The first (lowest id) of equal maxima wins.
    let mut start = 0;
    for c in logits.chunks(LANES) {
        if c.iter().fold(false, |hit, &l| hit | (l == max)) {
            if let Some(j) = c.iter().position(|&l| l == max) {
                return Ok((start + j) as u32);
            }
        }
        start += c.len();
    }
    Err(no_distribution(logits.len()))
}

/// The largest logit of a row, NaN skipped (`f32::max`); −∞ for an empty or all-NaN
/// row. Sixteen lanes, so the loop vectorizes.
pub fn row_max(logits: &[f32]) -> f32 {
    const LANES: usize = 16;
    let mut lanes = [f32::NEG_INFINITY; LANES];
    let chunks = logits.chunks_exact(LANES);
    let tail = chunks.remainder();
    for c in chunks {
        for (m, &l) in lanes.iter_mut().zip(c) {
            *m = m.max(l);
        }
    }
    tail.iter()
        .chain(&lanes)
        .fold(f32::NEG_INFINITY, |m, &l| m.max(l))
}

fn no_distribution(vocab: usize) -> InferError {
    if vocab == 0 {
        InferError::internal("sampling: the logits row is empty (vocabulary size 0)")
    } else {
        InferError::internal(format!(
            "sampling: all {vocab} logits are -inf or NaN; no token can be sampled"
        ))
    }
}

/// Samples one sequence's tokens (one `Sampler` per sequence).
///
/// Owns a [`ChaCha8Rng`] seeded with `params.seed` (`seed_from_u64`): the sampled
/// tokens depend only on the seed and the logits of this sequence, never on which
/// other sequences share the batch. Greedy steps draw nothing from the RNG; every
/// other step draws exactly one `f64`.
///
/// Processing order is llama.cpp's default chain (`common/common.h` default
/// `samplers`, built in `common/sampling.cpp`; penalties, DRY, typical-p and XTC are
/// not applied here): top-k → top-p → min-p → temperature → softmax → draw
/// (`llama_sampler_dist`). So top-p and min-p see the untempered distribution.
///
/// Scratch buffers (the candidate list and weights) are kept across calls: after the
/// first step, sampling allocates nothing vocabulary-sized.
#[derive(Debug, Clone)]
pub struct Sampler {
    rng: ChaCha8Rng,
    /// `temperature == 0` (or not a positive number) or `top_k == 1`.
    greedy: bool,
    temperature: f32,
    top_k: usize,
    top_p: f32,
    min_p: f32,
    cands: Vec<Candidate>,
    weights: Vec<f64>,
}

impl Sampler {
    /// A sampler for `params` with its own RNG seeded by `params.seed`.
    ///
    /// Expects validated parameters (see [`SamplingParams`]); out-of-range values are
    /// handled defensively: temperature ≤ 0 or NaN → greedy, `top_p ≥ 1` → off,
    /// `top_p ≤ 0` → only the most likely token, `min_p ≤ 0` → off, `top_k ≥ vocab` → off.
    pub fn new(params: &SamplingParams) -> Self {
        let t = params.temperature;
        Self {
            rng: ChaCha8Rng::seed_from_u64(params.seed),
            greedy: params.is_greedy() || t.is_nan() || t <= 0.0,
            temperature: t,
            top_k: params.top_k,
            top_p: params.top_p,
            min_p: params.min_p,
            cands: Vec::new(),
            weights: Vec::new(),
        }
    }

    /// Whether every step is an argmax (no randomness).
    pub fn is_greedy(&self) -> bool {
        self.greedy
    }

    /// One uniform draw in `[0, 1)` from this sequence's RNG (the draw a sampler plugin
    /// receives each step, in place of the native draw).
    pub fn next_uniform(&mut self) -> f64 {
        self.rng.random()
    }

    /// Samples the next token id from one full logits row (`len` = vocabulary size,
    /// raw unnormalised f32 logits). NaN logits count as −∞ (never sampled); `+∞`
    /// logits are treated as the largest finite value.
    ///
    /// Deterministic: the same seed and the same sequence of logits rows give the
    /// same tokens.
    ///
    /// # Errors
    /// `internal` when the row is empty or every logit is −∞ or NaN.
    pub fn sample(&mut self, logits: &[f32]) -> Result<u32, InferError> {
        if self.greedy {
            return argmax(logits);
        }
        if processors::collect_candidates(logits, &mut self.cands) == 0 {
            return Err(no_distribution(logits.len()));
        }
        let sorted = processors::top_k(&mut self.cands, self.top_k);
        processors::top_p(&mut self.cands, self.top_p, sorted);
        processors::min_p(&mut self.cands, self.min_p);
        processors::temperature(&mut self.cands, self.temperature);
        let u: f64 = self.rng.random();
        processors::draw(&self.cands, u, &mut self.weights)
            .ok_or_else(|| no_distribution(logits.len()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::ErrorKind;

    fn params(temperature: f32, top_k: usize, top_p: f32, min_p: f32, seed: u64) -> SamplingParams {
        SamplingParams {
            temperature,
            top_k,
            top_p,
            min_p,
            seed,
            max_tokens: 16,
            stop: Vec::new(),
            ..SamplingParams::default()
        }
    }

    fn draws(s: &mut Sampler, logits: &[f32], n: usize) -> Vec<u32> {
        (0..n).map(|_| s.sample(logits).expect("sample")).collect()
    }

    fn frequencies(tokens: &[u32], vocab: usize) -> Vec<f64> {
        let mut f = vec![0.0; vocab];
        for &t in tokens {
            f[t as usize] += 1.0 / tokens.len() as f64;
        }
        f
    }

    fn softmax(logits: &[f32], t: f32) -> Vec<f64> {
        let e: Vec<f64> = logits
            .iter()
            .map(|&l| (f64::from(l) / f64::from(t)).exp())
            .collect();
        let s: f64 = e.iter().sum();
        e.iter().map(|x| x / s).collect()
    }

    #[test]
    fn argmax_ties_go_to_lowest_id() {
        assert_eq!(argmax(&[0.1, 3.0, -2.0, 3.0, 2.9]), Ok(1));
        assert_eq!(argmax(&[-1.0, -1.0]), Ok(0));
        let mut s = Sampler::new(&params(0.0, 0, 1.0, 0.0, 1));
        assert!(s.is_greedy());
        assert_eq!(s.sample(&[0.5, 7.25, 7.25, -3.0]), Ok(1));
    }

    /// The vectorized argmax against the plain definition (first of the largest
    /// non-NaN, non-−∞ logits) on vocabularies around the lane width, with NaN, ±∞ and
    /// ties placed across chunk boundaries.
    #[test]
    fn argmax_equals_the_scalar_definition() {
        fn scalar(l: &[f32]) -> Option<u32> {
            let mut best: Option<(usize, f32)> = None;
            for (i, &x) in l.iter().enumerate() {
                if !x.is_nan() && x != f32::NEG_INFINITY && best.is_none_or(|(_, b)| x > b) {
                    best = Some((i, x));
                }
            }
            best.map(|(i, _)| i as u32)
        }
        let mut rng = ChaCha8Rng::seed_from_u64(11);
        for len in [1usize, 15, 16, 17, 33, 100, 1000] {
            for _ in 0..50 {
                let mut l: Vec<f32> = (0..len).map(|_| rng.random_range(-4.0..4.0)).collect();
                for _ in 0..len / 8 + 1 {
                    let i = rng.random_range(0..len);
                    l[i] = match rng.random_range(0..5) {
                        0 => f32::NAN,
                        1 => f32::NEG_INFINITY,
                        2 => 4.0, // a tie with any other 4.0 placed
                        3 => -0.0,
                        _ => l[i],
                    };
                }
                assert_eq!(argmax(&l).ok(), scalar(&l), "{l:?}");
            }
        }
        let mut l = vec![1.0f32; 40];
        l[35] = f32::INFINITY;
        l[17] = f32::INFINITY;
        assert_eq!(argmax(&l), Ok(17));
        assert!(argmax(&[f32::NAN; 20]).is_err());
        assert!(argmax(&[]).is_err());
    }

    #[test]
    fn top_k_one_is_greedy_even_with_temperature() {
        let mut s = Sampler::new(&params(1.5, 1, 1.0, 0.0, 42));
        assert!(s.is_greedy());
        let mut rng = ChaCha8Rng::seed_from_u64(3);
        for _ in 0..100 {
            let logits: Vec<f32> = (0..50).map(|_| rng.random_range(-5.0..5.0)).collect();
            assert_eq!(s.sample(&logits), argmax(&logits));
        }
    }

    #[test]
    fn same_seed_same_tokens_different_seed_different() {
        let logits = [0.0f32, 0.2, 0.4, 0.1, -0.3, 0.05, 0.3, -0.1];
        let p = |seed| params(1.0, 0, 1.0, 0.0, seed);
        let a = draws(&mut Sampler::new(&p(1234)), &logits, 200);
        let b = draws(&mut Sampler::new(&p(1234)), &logits, 200);
        let c = draws(&mut Sampler::new(&p(1235)), &logits, 200);
        assert_eq!(a, b);
        assert_ne!(a, c);
        // Also with every truncation on (exercises the partial sorts).
        let q = |seed| params(0.8, 6, 0.9, 0.05, seed);
        let a = draws(&mut Sampler::new(&q(9)), &logits, 200);
        let b = draws(&mut Sampler::new(&q(9)), &logits, 200);
        assert_eq!(a, b);
    }

    #[test]
    fn tiny_top_p_always_argmax() {
        let logits = [1.0f32, 1.2, 0.9, 1.1];
        let mut s = Sampler::new(&params(1.0, 0, 1e-6, 0.0, 5));
        assert!(draws(&mut s, &logits, 500).iter().all(|&t| t == 1));
    }

    #[test]
    fn min_p_removes_tokens_below_threshold() {
        // p = 0.5, 0.3, 0.15, 0.05; min_p 0.2 → threshold 0.1: token 3 (0.05) never drawn.
        let logits = [0.5f32.ln(), 0.3f32.ln(), 0.15f32.ln(), 0.05f32.ln()];
        let mut s = Sampler::new(&params(1.0, 0, 1.0, 0.2, 77));
        let t = draws(&mut s, &logits, 1000);
        assert!(!t.contains(&3));
        for id in 0..3 {
            assert!(t.contains(&id), "token {id} should still be sampled");
        }
    }

    #[test]
    fn empirical_frequencies_match_softmax_over_temperature() {
        let logits = [1.0f32, 2.0, 0.5, -1.0];
        for (t, seed) in [(1.0f32, 11u64), (0.5, 12)] {
            let mut s = Sampler::new(&params(t, 0, 1.0, 0.0, seed));
            let f = frequencies(&draws(&mut s, &logits, 20_000), 4);
            let expected = softmax(&logits, t);
            for i in 0..4 {
                assert!(
                    (f[i] - expected[i]).abs() < 0.02,
                    "T={t} token {i}: freq {} expected {}",
                    f[i],
                    expected[i]
                );
            }
        }
    }

    #[test]
    fn top_k_renormalises_over_kept_tokens() {
        // top_k 2 keeps tokens 1 and 0: p = softmax([2, 1]) = 0.731, 0.269.
        let logits = [1.0f32, 2.0, 0.5, -1.0];
        let mut s = Sampler::new(&params(1.0, 2, 1.0, 0.0, 21));
        let f = frequencies(&draws(&mut s, &logits, 20_000), 4);
        assert_eq!((f[2], f[3]), (0.0, 0.0));
        assert!((f[1] - 0.731_058_6).abs() < 0.02, "freq {}", f[1]);
    }

    #[test]
    fn top_p_sees_untempered_distribution() {
        // p = 0.5, 0.3, 0.2 at T=1: top_p 0.75 keeps {0, 1}. Tempering first (T=3 →
        // 0.388, 0.327, 0.286) would keep all three; llama.cpp's order never draws 2.
        let logits = [0.5f32.ln(), 0.3f32.ln(), 0.2f32.ln()];
        let mut s = Sampler::new(&params(3.0, 0, 0.75, 0.0, 8));
        let t = draws(&mut s, &logits, 2000);
        assert!(!t.contains(&2));
        assert!(t.contains(&0) && t.contains(&1));
    }

    #[test]
    fn nan_logits_count_as_neg_inf() {
        let logits = [f32::NAN, 0.0, f32::NAN, 0.0];
        assert_eq!(argmax(&logits), Ok(1));
        let mut s = Sampler::new(&params(1.0, 0, 1.0, 0.0, 3));
        let t = draws(&mut s, &logits, 1000);
        assert!(t.iter().all(|&id| id == 1 || id == 3));
        let mut s = Sampler::new(&params(0.7, 2, 0.9, 0.1, 3));
        assert!(draws(&mut s, &logits, 200)
            .iter()
            .all(|&id| id == 1 || id == 3));
    }

    #[test]
    fn positive_infinity_wins() {
        let logits = [0.0f32, f32::INFINITY, 1e30];
        let mut s = Sampler::new(&params(1.0, 0, 1.0, 0.0, 3));
        assert!(draws(&mut s, &logits, 100).iter().all(|&id| id == 1));
        assert_eq!(argmax(&logits), Ok(1));
    }

    #[test]
    fn no_usable_logit_is_internal_error() {
        let rows: [&[f32]; 3] = [
            &[f32::NEG_INFINITY, f32::NEG_INFINITY],
            &[f32::NAN, f32::NEG_INFINITY, f32::NAN],
            &[],
        ];
        for greedy in [true, false] {
            let t = if greedy { 0.0 } else { 1.0 };
            let mut s = Sampler::new(&params(t, 0, 0.9, 0.05, 1));
            for row in rows {
                let e = s.sample(row).expect_err("no distribution");
                assert_eq!(e.kind, ErrorKind::Internal);
                assert!(e.message.contains("logits"), "{}", e.message);
            }
        }
        let e = argmax(&[f32::NEG_INFINITY; 3]).expect_err("all -inf");
        assert!(
            e.message.contains("all 3 logits are -inf or NaN"),
            "{}",
            e.message
        );
    }

    #[test]
    fn scratch_buffers_are_reused() {
        let logits: Vec<f32> = (0..49_152).map(|i| (i % 97) as f32 * 0.01).collect();
        let mut s = Sampler::new(&params(0.9, 0, 0.95, 0.0, 4));
        s.sample(&logits).expect("sample");
        let (ptr, cap) = (s.cands.as_ptr(), s.cands.capacity());
        for _ in 0..5 {
            s.sample(&logits).expect("sample");
        }
        assert_eq!((s.cands.as_ptr(), s.cands.capacity()), (ptr, cap));
    }
}
