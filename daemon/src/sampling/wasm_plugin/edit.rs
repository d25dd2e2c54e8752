//! Applying a plugin's [`LogitsEdit`] to one logits row, with the checks the WIT
//! contract promises (token ids in range, no NaN, no positive infinity, at least one
//! token left). Pure code: unit-tested without a Wasm engine.

use super::bindings::LogitsEdit;

/// Applies `edit` to `logits` (`(vocab_size,)` f32, natural-log units) in place.
///
/// - `keep`: nothing.
/// - `bias`: `logits[t] += b` for each entry (duplicates add up); `b` may be −∞ (a ban).
/// - `allow-only`: every token not listed becomes −∞.
/// - `ban`: every listed token becomes −∞.
/// - `replace`: the row is overwritten; exactly `vocab_size` values.
///
/// # Errors
/// A message for the client (the caller prefixes the plugin's name) when a token id is
/// `>= vocab_size`, a bias or replacement value is NaN or +∞, a replacement has the wrong
/// length, or the edit leaves no token with a finite logit. The row may be partly edited
/// when an error is returned; the request fails, so it is never sampled.
pub fn apply_edit(edit: &LogitsEdit, logits: &mut [f32]) -> Result<(), String> {
    let vocab = logits.len();
    let check_id = |what: &str, t: u32| -> Result<usize, String> {
        let i = t as usize;
        if i < vocab {
            Ok(i)
        } else {
            Err(format!(
                "{what}: token id {t} is out of range (vocabulary size {vocab})"
            ))
        }
    };
    match edit {
        LogitsEdit::Keep => return Ok(()),
        LogitsEdit::Bias(entries) => {
            for e in entries {
                let i = check_id("bias", e.token)?;
                if e.bias.is_nan() || e.bias == f32::INFINITY {
                    return Err(format!(
                        "bias: value for token {} must be finite or -inf, got {}",
                        e.token, e.bias
                    ));
                }
                logits[i] += e.bias;
                if logits[i].is_nan() || logits[i] == f32::INFINITY {
                    return Err(format!(
                        "bias: token {}'s logit became {} (the biases overflow or cancel an \
                         infinity)",
                        e.token, logits[i]
                    ));
                }
            }
        }
        LogitsEdit::AllowOnly(ids) => {
            let mut keep = vec![false; vocab];
            for &t in ids {
                keep[check_id("allow-only", t)?] = true;
            }
            for (l, k) in logits.iter_mut().zip(keep) {
                if !k {
                    *l = f32::NEG_INFINITY;
                }
            }
        }
        LogitsEdit::Ban(ids) => {
            for &t in ids {
                logits[check_id("ban", t)?] = f32::NEG_INFINITY;
            }
        }
        LogitsEdit::Replace(values) => {
            if values.len() != vocab {
                return Err(format!(
                    "replace: must have exactly {vocab} values (the vocabulary size), got {}",
                    values.len()
                ));
            }
            if let Some((i, v)) = values
                .iter()
                .enumerate()
                .find(|(_, v)| v.is_nan() || **v == f32::INFINITY)
            {
                return Err(format!(
                    "replace: value for token {i} must be finite or -inf, got {v}"
                ));
            }
            logits.copy_from_slice(values);
        }
    }
    if logits.iter().any(|l| l.is_finite()) {
        Ok(())
    } else {
        Err(format!(
            "the edit left no token with a finite logit (all {vocab} are -inf or NaN)"
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sampling::wasm_plugin::bindings::processor::inferd::plugin::types::TokenBias;

    const NEG: f32 = f32::NEG_INFINITY;

    #[test]
    fn each_edit_kind_changes_exactly_what_it_names() {
        let base = [0.5f32, -1.0, 2.0, 0.0];
        let mut l = base;
        apply_edit(&LogitsEdit::Keep, &mut l).expect("keep");
        assert_eq!(l, base);

        let bias = LogitsEdit::Bias(vec![
            TokenBias {
                token: 1,
                bias: 1.5,
            },
            TokenBias {
                token: 1,
                bias: 0.25,
            },
            TokenBias {
                token: 3,
                bias: NEG,
            },
        ]);
        let mut l = base;
        apply_edit(&bias, &mut l).expect("bias");
        assert_eq!(l, [0.5, 0.75, 2.0, NEG]);

        let mut l = base;
        apply_edit(&LogitsEdit::AllowOnly(vec![2, 0, 2]), &mut l).expect("allow");
        assert_eq!(l, [0.5, NEG, 2.0, NEG]);

        let mut l = base;
        apply_edit(&LogitsEdit::Ban(vec![2, 2, 0]), &mut l).expect("ban");
        assert_eq!(l, [NEG, -1.0, NEG, 0.0]);

        let mut l = base;
        apply_edit(&LogitsEdit::Replace(vec![1.0, NEG, 3.0, -2.0]), &mut l).expect("replace");
        assert_eq!(l, [1.0, NEG, 3.0, -2.0]);
    }

    #[test]
    fn invalid_edits_are_rejected_with_the_offending_value() {
        let cases: Vec<(LogitsEdit, &str)> = vec![
            (
                LogitsEdit::Ban(vec![4]),
                "ban: token id 4 is out of range (vocabulary size 4)",
            ),
            (
                LogitsEdit::AllowOnly(vec![u32::MAX]),
                "allow-only: token id 4294967295 is out of range (vocabulary size 4)",
            ),
            (
                LogitsEdit::Bias(vec![TokenBias {
                    token: 0,
                    bias: f32::NAN,
                }]),
                "bias: value for token 0 must be finite or -inf, got NaN",
            ),
            (
                LogitsEdit::Bias(vec![TokenBias {
                    token: 2,
                    bias: f32::INFINITY,
                }]),
                "bias: value for token 2 must be finite or -inf, got inf",
            ),
            (
                LogitsEdit::Replace(vec![0.0; 3]),
                "replace: must have exactly 4 values (the vocabulary size), got 3",
            ),
            (
                LogitsEdit::Replace(vec![0.0, 0.0, f32::NAN, 0.0]),
                "replace: value for token 2 must be finite or -inf, got NaN",
            ),
            (
                LogitsEdit::Bias(vec![
                    TokenBias {
                        token: 1,
                        bias: 3e38,
                    },
                    TokenBias {
                        token: 1,
                        bias: 3e38,
                    },
                ]),
                "bias: token 1's logit became inf (the biases overflow or cancel an infinity)",
            ),
            (
                LogitsEdit::Ban(vec![0, 1, 2, 3]),
                "the edit left no token with a finite logit (all 4 are -inf or NaN)",
            ),
            (
                LogitsEdit::AllowOnly(vec![]),
                "the edit left no token with a finite logit (all 4 are -inf or NaN)",
            ),
        ];
        for (edit, want) in cases {
            let mut l = [0.5f32, -1.0, 2.0, 0.0];
            assert_eq!(apply_edit(&edit, &mut l), Err(want.to_string()), "{edit:?}");
        }
    }
}
