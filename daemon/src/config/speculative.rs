//! `[speculative]`: speculative decoding (drafts verified by the target model in one
//! forward pass; see `crate::scheduler::speculative`).

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use super::{whole_number, ConfigError};

/// Where drafts come from (`speculative.method`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SpecMethod {
    /// No speculation: one token per sequence per step.
    Off,
    /// Prompt lookup (n-gram): the longest suffix of prompt + output that occurred
    /// earlier proposes the tokens that followed it (vLLM's `ngram` method, llama.cpp's
    /// `--spec-type ngram-*`).
    Ngram,
    /// A draft model (`speculative.draft_model`) with the target's vocabulary proposes
    /// greedily (llama.cpp's `-md`, vLLM's draft models).
    Draft,
}

/// Most drafts one verification may carry.
pub const MAX_SPEC_K: usize = 32;
/// Longest n-gram the lookup may match.
pub const MAX_NGRAM: usize = 64;

/// `[speculative]` settings.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct SpeculativeConfig {
    /// `"ngram"` (default), `"draft"` or `"off"`.
    pub method: SpecMethod,
    /// The draft model of `method = "draft"`: a GGUF file or Hugging Face directory
    /// whose vocabulary equals the target's (checked at start-up).
    pub draft_model: PathBuf,
    /// Most draft tokens per sequence per step, in `[1, 32]`; the adaptive controller
    /// uses fewer (or none) when drafts are seldom accepted.
    #[serde(deserialize_with = "whole_number")]
    pub k: usize,
    /// Shortest suffix the n-gram lookup matches, tokens, in `[1, ngram_max]`.
    #[serde(deserialize_with = "whole_number")]
    pub ngram_min: usize,
    /// Longest suffix the n-gram lookup matches (tried first), tokens, in `[1, 64]`.
    #[serde(deserialize_with = "whole_number")]
    pub ngram_max: usize,
    /// Drafts are proposed only while at most this many sequences decode in a step;
    /// above it a step is compute-bound and extra rows cost more than they save. In
    /// `[0, 65536]`; 0 turns speculation off.
    #[serde(deserialize_with = "whole_number")]
    pub max_running: usize,
    /// Cost of an extra verification row as a fraction of a one-row decode step, in
    /// `[0, 4]`; 0 (default) measures it at start-up and follows it online.
    pub row_cost: f64,
    /// Cost of a draft-model decode step as that fraction, in `[0, 4]`; 0 (default)
    /// measures it at start-up.
    pub draft_cost: f64,
}

impl Default for SpeculativeConfig {
    fn default() -> Self {
        Self {
            method: SpecMethod::Ngram,
            draft_model: PathBuf::new(),
            k: 8,
            ngram_min: 2,
            ngram_max: 4,
            max_running: 2,
            row_cost: 0.0,
            draft_cost: 0.0,
        }
    }
}

impl SpeculativeConfig {
    /// Checks the bounds, naming the key, the bound and the value.
    ///
    /// # Errors
    /// The first value out of its bounds.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let bad = |m: String| Err(ConfigError(m));
        if !(1..=MAX_SPEC_K).contains(&self.k) {
            return bad(format!(
                "speculative.k must be in [1, {MAX_SPEC_K}] (got {})",
                self.k
            ));
        }
        if !(1..=MAX_NGRAM).contains(&self.ngram_max) {
            return bad(format!(
                "speculative.ngram_max must be in [1, {MAX_NGRAM}] (got {})",
                self.ngram_max
            ));
        }
        if !(1..=self.ngram_max).contains(&self.ngram_min) {
            return bad(format!(
                "speculative.ngram_min must be in [1, speculative.ngram_max = {}] (got {})",
                self.ngram_max, self.ngram_min
            ));
        }
        if self.method == SpecMethod::Draft && self.draft_model.as_os_str().is_empty() {
            return bad(
                "speculative.draft_model must name a model file or directory when \
                 speculative.method = \"draft\" (got nothing)"
                    .into(),
            );
        }
        for (key, v) in [("row_cost", self.row_cost), ("draft_cost", self.draft_cost)] {
            if !(0.0..=4.0).contains(&v) {
                return bad(format!("speculative.{key} must be in [0, 4] (got {v})"));
            }
        }
        if self.max_running > 65536 {
            return bad(format!(
                "speculative.max_running must be in [0, 65536] (got {})",
                self.max_running
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_valid_and_bounds_name_the_key() {
        assert!(SpeculativeConfig::default().validate().is_ok());
        let msg = |c: SpeculativeConfig| c.validate().err().map(|e| e.0).unwrap_or_default();
        let d = SpeculativeConfig::default;
        assert_eq!(
            msg(SpeculativeConfig { k: 0, ..d() }),
            "speculative.k must be in [1, 32] (got 0)"
        );
        assert_eq!(
            msg(SpeculativeConfig { k: 33, ..d() }),
            "speculative.k must be in [1, 32] (got 33)"
        );
        assert_eq!(
            msg(SpeculativeConfig {
                ngram_min: 5,
                ngram_max: 4,
                ..d()
            }),
            "speculative.ngram_min must be in [1, speculative.ngram_max = 4] (got 5)"
        );
        assert_eq!(
            msg(SpeculativeConfig {
                ngram_max: 65,
                ..d()
            }),
            "speculative.ngram_max must be in [1, 64] (got 65)"
        );
        assert_eq!(
            msg(SpeculativeConfig {
                row_cost: 5.0,
                ..d()
            }),
            "speculative.row_cost must be in [0, 4] (got 5)"
        );
        assert_eq!(
            msg(SpeculativeConfig {
                method: SpecMethod::Draft,
                ..d()
            }),
            "speculative.draft_model must name a model file or directory when \
             speculative.method = \"draft\" (got nothing)"
        );
    }
}
