//! `repetition_guard`: a logits processor that blocks repeated n-grams, like Hugging
//! Face's `no_repeat_ngram_size`: it bans every token `x` such that the last `n - 1`
//! generated tokens followed by `x` already occur in the generated tokens.
//!
//! Config: `{"ngram": n}`, 2 to 32 (default 3). Only generated tokens count, not the
//! prompt.
#![no_std]

extern crate alloc;

use alloc::string::String;
use alloc::vec::Vec;
use guest_support::{Config, Global};

wit_bindgen::generate!({ path: "../../wit", world: "logits-processor-plugin" });

use exports::inferd::plugin::logits_processor::{Guest, LogitsEdit, PluginInfo, StepContext};

/// Default n-gram size.
const DEFAULT_NGRAM: usize = 3;
/// Smallest n-gram size.
const MIN_NGRAM: u64 = 2;
/// Largest n-gram size.
const MAX_NGRAM: u64 = 32;

/// Every token that would complete an n-gram already present in `generated`, sorted and
/// without duplicates: the tokens that followed earlier occurrences of the last `n - 1`
/// tokens. Empty when fewer than `n` tokens exist.
pub fn banned_tokens(generated: &[u32], n: usize) -> Vec<u32> {
    if n < 2 || generated.len() < n {
        return Vec::new();
    }
    let prefix = &generated[generated.len() - (n - 1)..];
    let mut banned: Vec<u32> = generated
        .windows(n)
        .filter(|gram| &gram[..n - 1] == prefix)
        .map(|gram| gram[n - 1])
        .collect();
    banned.sort_unstable();
    banned.dedup();
    banned
}

/// Validates the config and returns the n-gram size.
pub fn parse_ngram(config: &str) -> Result<usize, String> {
    let config = Config::parse(config, &["ngram"])?;
    Ok(config
        .integer("ngram", MIN_NGRAM, MAX_NGRAM)?
        .map_or(DEFAULT_NGRAM, |n| n as usize))
}

/// The n-gram size of this instance (one request), set by `configure`.
static NGRAM: Global<usize> = Global::new(DEFAULT_NGRAM);

/// The exported component.
struct RepetitionGuard;

impl Guest for RepetitionGuard {
    /// Name, version and description of the plugin.
    fn info() -> PluginInfo {
        PluginInfo {
            name: "repetition_guard".into(),
            version: env!("CARGO_PKG_VERSION").into(),
            description: "Bans tokens that would repeat an n-gram of the generated text".into(),
        }
    }

    /// Validates `config` and sets up the per-request state.
    fn configure(config: String, _seed: u64) -> Result<(), String> {
        let n = parse_ngram(&config)?;
        NGRAM.with(|ngram| *ngram = n);
        Ok(())
    }

    /// One decode step.
    fn process(ctx: StepContext, _logits: Vec<f32>) -> Result<LogitsEdit, String> {
        let banned = banned_tokens(&ctx.generated, NGRAM.with(|n| *n));
        Ok(if banned.is_empty() {
            LogitsEdit::Keep
        } else {
            LogitsEdit::Ban(banned)
        })
    }
}

export!(RepetitionGuard);

#[cfg(test)]
mod tests {
    extern crate std;
    use super::*;
    use alloc::vec;

    #[test]
    fn bans_completions_of_seen_ngrams() {
        // Trigrams: (1,2,3) (2,3,1) (3,1,2) (1,2,4) (2,4,1) (4,1,2); the last two
        // tokens (1,2) were followed by 3 and 4.
        assert_eq!(banned_tokens(&[1, 2, 3, 1, 2, 4, 1, 2], 3), vec![3, 4]);
        assert_eq!(banned_tokens(&[1, 2, 3, 1, 2, 4, 1, 2], 2), vec![3, 4]);
        assert_eq!(banned_tokens(&[5, 5, 5], 2), vec![5]);
        assert!(banned_tokens(&[1, 2, 3], 3).is_empty());
        assert!(banned_tokens(&[1, 2], 3).is_empty());
        assert!(banned_tokens(&[], 2).is_empty());
    }

    #[test]
    fn config_validation() {
        assert_eq!(parse_ngram("{}"), Ok(3));
        assert_eq!(parse_ngram(r#"{"ngram": 32}"#), Ok(32));
        assert_eq!(
            parse_ngram(r#"{"ngram": 1}"#).unwrap_err(),
            "ngram: must be an integer from 2 to 32, got 1"
        );
        assert!(parse_ngram(r#"{"n": 3}"#)
            .unwrap_err()
            .starts_with("n: unknown field"));
    }
}
