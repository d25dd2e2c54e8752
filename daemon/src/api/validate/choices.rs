//! `n` (how many choices) and `echo` (the prompt back, with its log-probabilities) of a
//! `generate`, with the same rules and messages as the rest of the frame.

use super::{unsigned, VResult};
use crate::api::body::{GenerateBody, Int};
use crate::error::InferError;
use crate::request::MAX_CHOICES;

/// `n` (integer in `[1, MAX_CHOICES]`, default 1) and `echo` (default false).
pub(super) fn parse_choices(body: &GenerateBody) -> VResult<(usize, bool)> {
    let n = match &body.n {
        None => 1,
        Some(v) => {
            let n = unsigned("n", v, 1, MAX_CHOICES as u64, "")?;
            usize::try_from(n).unwrap_or(1)
        }
    };
    Ok((n, body.echo.unwrap_or(false)))
}

/// `max_tokens` (or its OpenAI alias `field`): at least 1, or 0 with `echo` (score the
/// prompt, generate nothing); `echo_possible`: the request has a `prompt`, so the
/// refusal of 0 may point at `echo`.
pub(super) fn parse_max_tokens(
    field: &str,
    v: &Int,
    echo: bool,
    max: u64,
    echo_possible: bool,
) -> VResult<u64> {
    let min = u64::from(!echo);
    unsigned(field, v, min, max, "").map_err(|e| {
        if !echo && v.0.as_u64() == Some(0) && echo_possible {
            InferError::validation(format!(
                "{field} must be >= 1 (got 0); 0 is allowed only with echo: true \
                 (score the prompt without generating)"
            ))
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
