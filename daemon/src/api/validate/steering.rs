//! The steering fields of a `generate`: penalties, `min_tokens`, `logit_bias`,
//! `logprobs` / `top_logprobs` and `response_format`, with the same rules and messages
//! as the rest of the frame.

use serde_json::Value;

use super::{
    check_fields, integer_number, number, number_value, quote, quote_str, unsigned, IntClass,
    VResult, MAX_ABS_LOGIT_BIAS, MAX_ABS_PENALTY, MAX_REPETITION_PENALTY, MAX_TOP_LOGPROBS,
};
use crate::api::body::{GenerateBody, LogprobsField, Num};
use crate::error::InferError;
use crate::request::{ConstraintSpec, SamplingParams};

/// A number in `[lo, hi]` (`lo_open`: `(lo, hi]`), or `default` when absent.
fn bounded(
    field: &str,
    v: Option<&Num>,
    (lo, lo_open, hi): (f64, bool, f64),
    default: f32,
) -> VResult<f32> {
    let Some(v) = v else {
        return Ok(default);
    };
    let (x, text) = number(v);
    let above_lo = if lo_open { x > lo } else { x >= lo };
    if !(above_lo && x <= hi) {
        let open = if lo_open { "(" } else { "[" };
        return Err(InferError::validation(format!(
            "{field} must be in {open}{lo}, {hi}] (got {text})"
        )));
    }
    Ok(x as f32)
}

/// Penalties, `min_tokens`, `logit_bias` and `logprobs` / `top_logprobs` (the
/// rest of [`SamplingParams`] is filled by the caller).
pub(super) fn parse_steering(
    body: &GenerateBody,
    max_tokens: usize,
    vocab_size: usize,
) -> VResult<SamplingParams> {
    let d = SamplingParams::default();
    let penalty = (-MAX_ABS_PENALTY, false, MAX_ABS_PENALTY);
    let presence_penalty = bounded(
        "presence_penalty",
        body.presence_penalty.as_ref(),
        penalty,
        0.0,
    )?;
    let frequency_penalty = bounded(
        "frequency_penalty",
        body.frequency_penalty.as_ref(),
        penalty,
        0.0,
    )?;
    let repetition_penalty = bounded(
        "repetition_penalty",
        body.repetition_penalty.as_ref(),
        (0.0, true, MAX_REPETITION_PENALTY),
        1.0,
    )?;
    let repeat_last_n = match &body.repeat_last_n {
        None => d.repeat_last_n,
        Some(v) => match integer_number("repeat_last_n", &v.0)? {
            IntClass::Negative if v.0.as_i64() == Some(-1) => None,
            IntClass::Unsigned(n) => Some(usize::try_from(n).unwrap_or(usize::MAX)),
            IntClass::Negative | IntClass::TooLarge => {
                return Err(InferError::validation(format!(
                    "repeat_last_n must be -1 (the whole sequence), 0 (off) or a window \
                     length (got {})",
                    v.0
                )))
            }
        },
    };
    let min_tokens = match &body.min_tokens {
        None => 0,
        Some(v) => {
            let n = unsigned("min_tokens", v, 0, max_tokens as u64, "max_tokens = ")?;
            usize::try_from(n).unwrap_or(max_tokens)
        }
    };
    let logit_bias = match &body.logit_bias {
        None => Vec::new(),
        Some(v) => parse_logit_bias(v, vocab_size)?,
    };
    let logprobs = match &body.logprobs {
        None | Some(LogprobsField::Flag(false)) => false,
        Some(LogprobsField::Flag(true)) => true,
        Some(LogprobsField::Count(n)) => {
            return Err(InferError::validation(format!(
                "logprobs must be a boolean (got {n})"
            )))
        }
        Some(LogprobsField::Other(v)) => {
            return Err(InferError::validation(format!(
                "logprobs must be a boolean (got {})",
                quote(v)
            )))
        }
    };
    let logprobs = match (&body.top_logprobs, logprobs) {
        (None, false) => None,
        (None, true) => Some(0),
        (Some(v), true) => {
            let n = unsigned("top_logprobs", v, 0, MAX_TOP_LOGPROBS, "")?;
            Some(usize::try_from(n).unwrap_or(0))
        }
        (Some(v), false) => {
            return Err(InferError::validation(format!(
                "top_logprobs needs logprobs: true (got top_logprobs {} without it)",
                v.0
            )))
        }
    };
    let constraint = match &body.response_format {
        None => None,
        Some(v) => parse_response_format(v)?,
    };
    Ok(SamplingParams {
        constraint,
        presence_penalty,
        frequency_penalty,
        repetition_penalty,
        repeat_last_n,
        min_tokens,
        logit_bias,
        logprobs,
        ..d
    })
}

/// `response_format`: OpenAI's `text`, `json_object` and `json_schema`
/// (`{"name", "schema", "strict", "description"}`), plus inferd's `regex` and
/// `grammar` (Lark). The grammar itself is compiled when the request is prepared.
fn parse_response_format(v: &Value) -> VResult<Option<ConstraintSpec>> {
    let Value::Object(obj) = v else {
        return Err(InferError::validation(format!(
            "response_format must be an object with a \"type\" (got {})",
            quote(v)
        )));
    };
    let kind = match obj.get("type") {
        Some(Value::String(t)) => t.as_str(),
        other => {
            return Err(InferError::validation(format!(
                "response_format.type must be one of text, json_object, json_schema, regex, \
                 grammar (got {})",
                other.map_or("nothing".into(), quote)
            )))
        }
    };
    let text_field = |field: &str| match obj.get(field) {
        Some(Value::String(s)) if !s.is_empty() => Ok(s.clone()),
        other => Err(InferError::validation(format!(
            "response_format.{field} must be a non-empty string for type {kind} (got {})",
            other.map_or("nothing".into(), quote)
        ))),
    };
    let spec = match kind {
        "text" => {
            check_fields(obj, &["type"], "response_format")?;
            None
        }
        "json_object" => {
            check_fields(obj, &["type"], "response_format")?;
            Some(ConstraintSpec::JsonObject)
        }
        "json_schema" => {
            check_fields(obj, &["type", "json_schema"], "response_format")?;
            let js = match obj.get("json_schema") {
                Some(Value::Object(js)) => js,
                other => {
                    return Err(InferError::validation(format!(
                        "response_format.json_schema must be an object with a \"schema\" for \
                         type json_schema (got {})",
                        other.map_or("nothing".into(), quote)
                    )))
                }
            };
            check_fields(
                js,
                &["name", "schema", "strict", "description"],
                "response_format.json_schema",
            )?;
            for (field, ok, expected) in [
                ("name", Value::is_string as fn(&Value) -> bool, "a string"),
                ("description", Value::is_string, "a string"),
                ("strict", Value::is_boolean, "a boolean"),
            ] {
                match js.get(field) {
                    Some(v) if !v.is_null() && !ok(v) => {
                        return Err(InferError::validation(format!(
                            "response_format.json_schema.{field} must be {expected} (got {})",
                            quote(v)
                        )))
                    }
                    _ => {}
                }
            }
            match js.get("schema") {
                Some(schema @ Value::Object(_)) => Some(ConstraintSpec::JsonSchema(schema.clone())),
                other => {
                    return Err(InferError::validation(format!(
                        "response_format.json_schema.schema must be a JSON Schema object (got {})",
                        other.map_or("nothing".into(), quote)
                    )))
                }
            }
        }
        "regex" => {
            check_fields(obj, &["type", "regex"], "response_format")?;
            let rx = text_field("regex")?;
            check_regex(&rx)?;
            Some(ConstraintSpec::Regex(rx))
        }
        "grammar" => {
            check_fields(obj, &["type", "grammar"], "response_format")?;
            Some(ConstraintSpec::Grammar(text_field("grammar")?))
        }
        other => {
            return Err(InferError::validation(format!(
                "response_format.type must be one of text, json_object, json_schema, regex, \
                 grammar (got {})",
                quote_str(other)
            )))
        }
    };
    Ok(spec)
}

/// `logit_bias`: `{"token id": bias}` with ids below the vocabulary size (special
/// and added tokens included) and biases in `[-100, 100]`; sorted by id.
fn parse_logit_bias(v: &Value, vocab_size: usize) -> VResult<Vec<(u32, f32)>> {
    let Value::Object(map) = v else {
        return Err(InferError::validation(format!(
            "logit_bias must be an object mapping token ids to biases (got {})",
            quote(v)
        )));
    };
    let mut out = Vec::with_capacity(map.len());
    for (key, bias) in map {
        let field = format!("logit_bias[{}]", quote_str(key));
        let id = match key.parse::<u64>() {
            // Canonical decimal only: "060" and "60" would be the same token.
            Ok(id) if key.bytes().all(|b| b.is_ascii_digit()) && id.to_string() == *key => id,
            _ => {
                return Err(InferError::validation(format!(
                    "logit_bias keys must be token ids, integers written as strings without \
                     leading zeros (got key {})",
                    quote_str(key)
                )))
            }
        };
        if id >= vocab_size as u64 {
            return Err(InferError::validation(format!(
                "{field} key must be a token id below the vocabulary size {vocab_size} \
                 (got {id})"
            )));
        }
        let (b, text) = number_value(&field, bias)?;
        if !(b.is_finite() && b.abs() <= MAX_ABS_LOGIT_BIAS) {
            return Err(InferError::validation(format!(
                "{field} must be in [-{MAX_ABS_LOGIT_BIAS}, {MAX_ABS_LOGIT_BIAS}] (got {text})"
            )));
        }
        out.push((u32::try_from(id).unwrap_or(u32::MAX), b as f32));
    }
    out.sort_unstable_by_key(|&(id, _)| id);
    Ok(out)
}

/// `response_format.regex` parsed as llguidance parses it when the request is prepared
/// (derivre on regex-syntax, the same parser and settings), so that a regex it cannot
/// take is refused here, in one line quoting the client's regex. Left to llguidance,
/// the error comes in several lines, about the grammar `start: /…/` it wraps the regex
/// in, with a position in that grammar rather than in the client's text.
fn check_regex(rx: &str) -> VResult<()> {
    match llguidance::derivre::RegexBuilder::new().mk_regex(rx) {
        Ok(_) => Ok(()),
        Err(e) => Err(InferError::validation(format!(
            "response_format.regex must be a valid regex: {} (got {})",
            regex_reason(&e.to_string()),
            quote_str(rx)
        ))),
    }
}

/// The reason of a derivre regex error on one line: regex-syntax's `error: …` line
/// (the last of its report, after the pattern and a caret under it), or derivre's own
/// reason without the ` in regex /…/` it appends.
fn regex_reason(report: &str) -> String {
    let reason = match report.lines().rev().find_map(|l| l.strip_prefix("error: ")) {
        Some(reason) => reason,
        None => report.split(" in regex /").next().unwrap_or(report),
    };
    reason.split_whitespace().collect::<Vec<_>>().join(" ")
}
