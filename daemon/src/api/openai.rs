//! The OpenAI-compatible request bodies (`POST /v1/chat/completions` and
//! `POST /v1/completions`, shapes of the OpenAI API reference,
//! <https://platform.openai.com/docs/api-reference/chat>): which keys each endpoint
//! accepts, the fields only HTTP has (`model`, `stream`, `stream_options`, `user`,
//! `suffix`, `best_of`), and the completions' own forms (integer `logprobs`, a prompt
//! wrapped in a one-item array), normalised on the typed [`GenerateBody`] before the one
//! validation every edge shares ([`super::validate::generate_request`]). OpenAI fields
//! inferd cannot honour (`best_of` > 1, a non-empty `suffix`, a batch of prompts) are
//! refused naming the field rather than silently ignored.

use serde_json::Value;

use super::body::{GenerateBody, Int, LogprobsField};
use super::validate::{generate_request, quote, SHARED_FIELDS, STEERING_FIELDS};
use super::SamplingDefaults;
use crate::error::InferError;
use crate::request::GenerateRequest;

/// Which endpoint a request came to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Endpoint {
    /// `/v1/chat/completions`: `messages` in, `message`/`delta` out.
    Chat,
    /// `/v1/completions`: `prompt` in, `text` out.
    Completion,
}

/// Keys only HTTP has, on both endpoints; besides them both take [`SHARED_FIELDS`] (the
/// extensions `top_k`, `min_p`, `plugins`, `cache`, `cache_salt` included) and
/// [`STEERING_FIELDS`]. (`echo` on the chat endpoint is refused by the validator,
/// naming it.)
const HTTP_ONLY: &[&str] = &["model", "stream", "stream_options", "user"];
const CHAT_ONLY: &[&str] = &[
    "messages",
    "max_completion_tokens",
    "top_logprobs",
    "tools",
    "tool_choice",
    "parallel_tool_calls",
    "chat_template_kwargs",
];
const COMPLETION_ONLY: &[&str] = &["prompt", "suffix", "best_of"];
/// The keys only the OpenAI endpoints take (for naming an error's `param`).
pub(super) const HTTP_FIELDS: [&[&str]; 3] = [HTTP_ONLY, CHAT_ONLY, COMPLETION_ONLY];
/// Most alternatives the completions endpoint's integer `logprobs` may ask for
/// (OpenAI's bound).
pub const MAX_COMPLETION_LOGPROBS: u64 = 5;

/// What the HTTP edge keeps for the response besides the validated request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ResponseOptions {
    /// Server-sent events instead of one JSON response.
    pub stream: bool,
    /// `stream_options.include_usage`: a last chunk with the usage.
    pub include_usage: bool,
    /// Whether the choices carry `logprobs`.
    pub logprobs: bool,
}

/// Why a body was refused.
#[derive(Debug, Clone, PartialEq)]
pub enum BodyError {
    /// A validation error (HTTP 400), naming the field, bound and value.
    Invalid(InferError),
}

impl From<InferError> for BodyError {
    fn from(e: InferError) -> Self {
        BodyError::Invalid(e)
    }
}

fn invalid(message: String) -> BodyError {
    BodyError::Invalid(InferError::validation(message))
}

/// Reads and validates an OpenAI request body sent to `endpoint` of a daemon serving
/// `model_id`, as request `id`.
///
/// # Errors
/// [`BodyError::Invalid`] for malformed JSON, a key the endpoint does not take or any
/// value out of its bounds.
pub fn parse_body(
    bytes: &[u8],
    endpoint: Endpoint,
    model_id: &str,
    id: String,
    defaults: &SamplingDefaults,
    vocab_size: usize,
) -> Result<(GenerateRequest, ResponseOptions), BodyError> {
    let value: Value = serde_json::from_slice(bytes).map_err(|e| {
        invalid(format!(
            "malformed JSON in the request body: {}",
            super::validate::json_error(&e)
        ))
    })?;
    let mut body = read_body(&value, endpoint)?;
    let options = http_options(&body, endpoint)?;
    // A `model` other than the base's names a LoRA adapter; whether one of that name
    // is loaded is decided when the request starts (404 `model_not_found` if not).
    if body.model.as_deref() == Some("") {
        return Err(invalid(
            "model must name the base model or a loaded LoRA adapter (got \"\")".into(),
        ));
    }
    body.adapter = body.model.clone().filter(|m| m != model_id);
    normalise(&mut body, endpoint)?;
    let mut request = generate_request(&body, id, defaults, vocab_size)?;
    if let Some(a) = request.adapter.as_mut() {
        a.field = "model";
    }
    Ok((request, options))
}

/// The body as a typed [`GenerateBody`], once its keys are the endpoint's.
fn read_body(value: &Value, endpoint: Endpoint) -> Result<GenerateBody, BodyError> {
    let Value::Object(obj) = value else {
        return Err(invalid("the request body must be a JSON object".into()));
    };
    let own = match endpoint {
        Endpoint::Chat => CHAT_ONLY,
        Endpoint::Completion => COMPLETION_ONLY,
    };
    let lists = [HTTP_ONLY, SHARED_FIELDS, STEERING_FIELDS, own];
    if let Some(k) = obj
        .keys()
        .find(|k| !lists.iter().any(|l| l.contains(&k.as_str())))
    {
        let mut known: Vec<&str> = lists.concat();
        known.sort_unstable();
        return Err(invalid(format!(
            "unknown field {k:?}; this endpoint accepts {}",
            known.join(", ")
        )));
    }
    Ok(GenerateBody::from_value(value)?)
}

/// The completions' `logprobs` out of its bound.
fn logprobs_bound(given: &str) -> BodyError {
    invalid(format!(
        "logprobs must be an integer in [0, {MAX_COMPLETION_LOGPROBS}] on /v1/completions \
         (got {given})"
    ))
}

/// `model`, the fields inferd takes only at their neutral value, `stream` and
/// `stream_options`, and whether the response carries `logprobs`.
fn http_options(body: &GenerateBody, endpoint: Endpoint) -> Result<ResponseOptions, BodyError> {
    if let Some(Int(n)) = &body.best_of {
        match n.as_u64() {
            Some(1) => {}
            _ if n.is_f64() => {
                return Err(invalid(format!("best_of must be an integer (got {n})")))
            }
            _ => return Err(invalid(format!("best_of must be 1 (got {n})"))),
        }
    }
    if let Some(s) = body.suffix.as_deref().filter(|s| !s.is_empty()) {
        return Err(invalid(format!(
            "suffix must be \"\" or null (got {})",
            quote(&Value::String(s.to_owned()))
        )));
    }
    let stream = body.stream.unwrap_or(false);
    let include_usage = match &body.stream_options {
        None => false,
        Some(_) if !stream => {
            let given = match body.stream {
                Some(_) => "stream: false",
                None => "no stream",
            };
            return Err(invalid(format!(
                "stream_options is only allowed with stream: true (got {given})"
            )));
        }
        Some(Value::Object(o)) => {
            if let Some(k) = o.keys().find(|k| *k != "include_usage") {
                return Err(invalid(format!(
                    "stream_options: unknown field {k:?}; it accepts include_usage"
                )));
            }
            match o.get("include_usage") {
                None | Some(Value::Null) => false,
                Some(Value::Bool(b)) => *b,
                Some(v) => {
                    return Err(invalid(format!(
                        "stream_options.include_usage must be a boolean (got {})",
                        quote(v)
                    )))
                }
            }
        }
        Some(v) => {
            return Err(invalid(format!(
                "stream_options must be an object (got {})",
                quote(v)
            )))
        }
    };
    let logprobs = match (endpoint, &body.logprobs) {
        (Endpoint::Chat, l) => l == &Some(LogprobsField::Flag(true)),
        // `logprobs: false` (or `null`) asks for none, as an absent field does.
        (Endpoint::Completion, l) => !matches!(l, None | Some(LogprobsField::Flag(false))),
    };
    Ok(ResponseOptions {
        stream,
        include_usage,
        logprobs,
    })
}

/// The completions endpoint's own forms onto the shared ones: a prompt wrapped in a
/// one-item array is unwrapped (a batch of prompts is refused), and the legacy integer
/// `logprobs` (that many alternatives, 0 for the sampled token's only) becomes
/// `logprobs: true` with `top_logprobs`.
fn normalise(body: &mut GenerateBody, endpoint: Endpoint) -> Result<(), BodyError> {
    if endpoint == Endpoint::Chat {
        return match body.messages {
            None => Err(invalid(
                "messages is required (a non-empty array of messages)".into(),
            )),
            Some(_) => Ok(()),
        };
    }
    if body.prompt.is_none() {
        return Err(invalid(
            "prompt is required (a string or an array of token ids)".into(),
        ));
    }
    if let Some(Value::Array(a)) = &body.prompt {
        let one = match a.as_slice() {
            [p @ (Value::String(_) | Value::Array(_))] => Some(p.clone()),
            // Token ids (validated as such later).
            items if items.iter().all(Value::is_number) => None,
            items => {
                return Err(invalid(format!(
                    "prompt must be a string, an array of token ids, or an array of one of \
                     those (batches of prompts are not supported; got an array of {} items)",
                    items.len()
                )))
            }
        };
        if one.is_some() {
            body.prompt = one;
        }
    }
    match body.logprobs.take() {
        None | Some(LogprobsField::Flag(false)) => {}
        Some(LogprobsField::Count(n))
            if n.as_u64().is_some_and(|n| n <= MAX_COMPLETION_LOGPROBS) =>
        {
            body.logprobs = Some(LogprobsField::Flag(true));
            body.top_logprobs = Some(Int(n));
        }
        Some(other) => {
            let given = match other {
                LogprobsField::Flag(b) => b.to_string(),
                LogprobsField::Count(n) => n.to_string(),
                LogprobsField::Other(v) => quote(&v),
            };
            return Err(logprobs_bound(&given));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests;
