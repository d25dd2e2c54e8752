//! `n` (how many choices) and `echo` (the prompt back, with its log-probabilities) of a
//! `generate`, with the same rules and messages as the rest of the frame.

use serde_json::{Map, Value};

use super::{optional, quote, unsigned, VResult};
use crate::error::InferError;
use crate::request::MAX_CHOICES;

/// `n` (integer in `[1, MAX_CHOICES]`, default 1) and `echo` (boolean, default false).
pub(super) fn parse_choices(obj: &Map<String, Value>) -> VResult<(usize, bool)> {
    let n = match optional(obj, "n") {
        None => 1,
        Some(v) => {
            let n = unsigned("n", v, 1, MAX_CHOICES as u64, "")?;
            usize::try_from(n).unwrap_or(1)
        }
    };
    let echo = match optional(obj, "echo") {
        None => false,
        Some(Value::Bool(b)) => *b,
        Some(v) => {
            return Err(InferError::validation(format!(
                "echo must be a boolean (got {})",
                quote(v)
            )))
        }
    };
    Ok((n, echo))
}

/// `max_tokens`: at least 1, or 0 with `echo` (score the prompt, generate nothing).
pub(super) fn parse_max_tokens(v: &Value, echo: bool, max: u64) -> VResult<u64> {
    let min = u64::from(!echo);
    unsigned("max_tokens", v, min, max, "").map_err(|e| {
        if !echo && v.as_u64() == Some(0) {
            InferError::validation(
                "max_tokens must be >= 1 (got 0); 0 is allowed only with echo: true \
                 (score the prompt without generating)",
            )
        } else {
            e
        }
    })
}

/// `echo` needs a `prompt`: a chat's prompt is the template's rendering, not the
/// client's text.
pub(super) fn check_echo_input(echo: bool, is_prompt: bool) -> VResult<()> {
    if echo && !is_prompt {
        return Err(InferError::validation(
            "echo must be false with messages (got true): echo returns a completion \
             prompt's tokens, so it needs prompt",
        ));
    }
    Ok(())
}
