//! `mirostat`: a sampler implementing Mirostat 2.0 (Basu et al. 2020, "Mirostat: a
//! neural text decoding algorithm that directly controls perplexity"), following
//! llama.cpp's `llama_sampler_mirostat_v2`.
//!
//! Config: `{"tau": 5.0, "eta": 0.1, "temperature": 1.0}`, all optional with these
//! defaults; `tau` (target surprise, bits) in (0, 100], `eta` (learning rate) in (0, 1],
//! `temperature` in (0, 100]. The state `mu` starts at `2 * tau`.
//!
//! Each step: scale the logits by `1 / temperature`, softmax over the finite ones, keep
//! the candidates whose surprise `-log2(p)` is at most `mu` (at least the most likely
//! one), renormalise, pick by inverse CDF with the host's `random`, then
//! `mu -= eta * (observed surprise - tau)`. Deterministic given the logits and randoms.
#![no_std]

extern crate alloc;

use alloc::string::String;
use alloc::vec::Vec;
use core::f64::consts::LN_2;
use guest_support::{Config, Global};

wit_bindgen::generate!({ path: "../../wit", world: "sampler-plugin" });

use exports::inferd::plugin::sampler::{Guest, PluginInfo, StepContext};

/// Mirostat parameters and state.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Mirostat {
    /// Target surprise, in bits.
    pub tau: f64,
    /// Learning rate of `mu`.
    pub eta: f64,
    /// Logits are divided by this before the softmax.
    pub temperature: f64,
    /// Maximum surprise (bits) a candidate may have; starts at `2 * tau`.
    pub mu: f64,
}

impl Mirostat {
    /// Validates the config; `mu` starts at `2 * tau`.
    pub fn from_config(config: &str) -> Result<Self, String> {
        let config = Config::parse(config, &["tau", "eta", "temperature"])?;
        let tau = config.number("tau", 0.0, 100.0)?.unwrap_or(5.0);
        let eta = config.number("eta", 0.0, 1.0)?.unwrap_or(0.1);
        let temperature = config.number("temperature", 0.0, 100.0)?.unwrap_or(1.0);
        Ok(Self {
            tau,
            eta,
            temperature,
            mu: 2.0 * tau,
        })
    }

    /// Chooses a token from `logits` with `random` in [0, 1) and updates `mu`.
    /// Returns the token and its observed surprise in bits.
    pub fn step(&mut self, logits: &[f32], random: f64) -> Result<(u32, f64), String> {
        let (token, surprise) = choose(logits, self.temperature, self.mu, random)?;
        self.mu -= self.eta * (surprise - self.tau);
        Ok((token, surprise))
    }
}

/// One Mirostat 2.0 choice, without the `mu` update: the token and its surprise
/// `-log2(p)` (in bits) under the truncated, renormalised distribution.
///
/// Non-finite logits (negative infinity = removed) are never chosen. Works in the log
/// domain: with `x = logit / temperature - max`, `Z = sum(exp(x))`, a candidate's
/// surprise is `(ln Z - x) / ln 2`, so the truncation is one comparison per token and
/// only the kept candidates are sorted.
pub fn choose(
    logits: &[f32],
    temperature: f64,
    mu: f64,
    random: f64,
) -> Result<(u32, f64), String> {
    let max = logits
        .iter()
        .filter(|l| l.is_finite())
        .fold(f64::NEG_INFINITY, |m, &l| m.max(f64::from(l)));
    if max == f64::NEG_INFINITY {
        return Err("mirostat: no token has a finite logit".into());
    }
    let scaled = |l: f32| (f64::from(l) - max) / temperature;
    let z: f64 = logits
        .iter()
        .filter(|l| l.is_finite())
        .map(|&l| libm::exp(scaled(l)))
        .sum();
    // surprise(x) <= mu  <=>  x >= ln Z - mu * ln 2.
    let threshold = libm::log(z) - mu * LN_2;
    let mut candidates: Vec<(u32, f64)> = logits
        .iter()
        .enumerate()
        .filter(|(_, l)| l.is_finite())
        .map(|(i, &l)| (i as u32, scaled(l)))
        .filter(|&(_, x)| x >= threshold)
        .collect();
    if candidates.is_empty() {
        // Keep at least the most likely token (the first with the largest logit).
        let top = logits
            .iter()
            .position(|&l| f64::from(l) == max)
            .unwrap_or(0);
        candidates.push((top as u32, 0.0));
    }
    // Most likely first; ties by token id, so the order (and the pick) is deterministic.
    candidates.sort_unstable_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
    let weights: Vec<f64> = candidates.iter().map(|&(_, x)| libm::exp(x)).collect();
    let total: f64 = weights.iter().sum();
    let target = random.clamp(0.0, 1.0) * total;
    let mut cumulative = 0.0;
    let mut pick = candidates.len() - 1;
    for (i, w) in weights.iter().enumerate() {
        cumulative += w;
        if cumulative > target {
            pick = i;
            break;
        }
    }
    let (token, x) = candidates[pick];
    let surprise = (libm::log(total) - x) / LN_2;
    Ok((token, surprise))
}

/// The state of this instance (one request), set by `configure`.
static STATE: Global<Option<Mirostat>> = Global::new(None);

/// The exported component.
struct MirostatSampler;

impl Guest for MirostatSampler {
    /// Name, version and description of the plugin.
    fn info() -> PluginInfo {
        PluginInfo {
            name: "mirostat".into(),
            version: env!("CARGO_PKG_VERSION").into(),
            description: "Mirostat 2.0 sampling: keeps the surprise of the text near tau".into(),
        }
    }

    /// Validates `config` and sets up the per-request state.
    fn configure(config: String, _seed: u64) -> Result<(), String> {
        let mirostat = Mirostat::from_config(&config)?;
        STATE.with(|s| *s = Some(mirostat));
        Ok(())
    }

    /// One decode step: chooses the token.
    fn sample(_ctx: StepContext, logits: Vec<f32>, random: f64) -> Result<u32, String> {
        STATE.with(|s| {
            let mirostat = s
                .as_mut()
                .ok_or("mirostat: sample called before configure")?;
            mirostat.step(&logits, random).map(|(token, _)| token)
        })
    }
}

export!(MirostatSampler);

#[cfg(test)]
mod tests {
    extern crate std;
    use super::*;

    #[test]
    fn defaults_and_validation() {
        let m = Mirostat::from_config("{}").unwrap();
        assert_eq!((m.tau, m.eta, m.temperature, m.mu), (5.0, 0.1, 1.0, 10.0));
        assert_eq!(
            Mirostat::from_config(r#"{"eta": 0}"#).unwrap_err(),
            "eta: must be a number in (0, 1], got 0"
        );
        assert_eq!(
            Mirostat::from_config(r#"{"tau": 101}"#).unwrap_err(),
            "tau: must be a number in (0, 100], got 101"
        );
        assert!(Mirostat::from_config(r#"{"top_k": 1}"#).is_err());
    }

    #[test]
    fn truncates_by_surprise_and_picks_by_cdf() {
        // p = 0.5, 0.25, 0.125, 0.125 (surprise 1, 2, 3, 3 bits); token 4 removed.
        let ln = |p: f64| libm::log(p) as f32;
        let logits = [ln(0.125), ln(0.5), ln(0.25), ln(0.125), f32::NEG_INFINITY];
        // mu = 2.5: keeps tokens 1 and 2, renormalised to 2/3 and 1/3.
        let (t, s) = choose(&logits, 1.0, 2.5, 0.0).unwrap();
        assert_eq!(t, 1);
        assert!((s - libm::log2(1.5)).abs() < 1e-6);
        assert_eq!(choose(&logits, 1.0, 2.5, 0.7).unwrap().0, 2);
        // mu = 10 keeps all four; ties (tokens 0 and 3) in id order.
        assert_eq!(choose(&logits, 1.0, 10.0, 0.8).unwrap().0, 0);
        assert_eq!(choose(&logits, 1.0, 10.0, 0.99).unwrap().0, 3);
        // mu below every surprise keeps only the top token.
        let (t, s) = choose(&logits, 1.0, 0.1, 0.99).unwrap();
        assert_eq!((t, s), (1, 0.0));
        assert!(choose(&[f32::NEG_INFINITY, f32::NAN], 1.0, 10.0, 0.5).is_err());
    }

    #[test]
    fn mu_follows_the_observed_surprise() {
        let mut m = Mirostat::from_config(r#"{"tau": 2, "eta": 0.5}"#).unwrap();
        let logits = [0.0f32, 0.0, 0.0, 0.0];
        // Uniform over 4: surprise 2 bits = tau, so mu stays at 4.
        let (_, s) = m.step(&logits, 0.3).unwrap();
        assert!((s - 2.0).abs() < 1e-9);
        assert!((m.mu - 4.0).abs() < 1e-9);
    }
}
