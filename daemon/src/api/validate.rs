//! Parsing and validation of client frames: JSON text → [`ClientMessage`].
//!
//! The frame is parsed into a `serde_json::Value` and walked by hand so every error
//! names the field, the expected type or bound, and the value given. Unknown fields
//! are rejected everywhere. A JSON `null` counts as absent for optional fields.
//! Nothing here panics, whatever the input.

use serde_json::{Map, Number, Value};

use super::body::{GenerateBody, Int, Num};
use super::{ApiError, ClientMessage, SamplingDefaults};
use crate::error::InferError;
use crate::request::{
    AdapterChoice, CacheOptions, GenerateRequest, PluginSpec, PromptInput, SamplingParams,
};

/// Longest accepted `id`, in characters.
pub const MAX_ID_CHARS: usize = 256;
/// Upper bound of `max_tokens` (the context window caps it further, later).
pub const MAX_MAX_TOKENS: u64 = 1_000_000;
/// Upper bound of `temperature`.
pub const MAX_TEMPERATURE: f64 = 100.0;
/// Most stop sequences per request.
pub const MAX_STOP_SEQUENCES: usize = 16;
/// Longest stop sequence, in bytes of UTF-8.
pub const MAX_STOP_BYTES: usize = 512;

/// The fields of a `generate` that both OpenAI endpoints take as well (besides
/// [`STEERING_FIELDS`]).
pub const SHARED_FIELDS: &[&str] = &[
    "max_tokens",
    "temperature",
    "top_k",
    "top_p",
    "min_p",
    "seed",
    "stop",
    "plugins",
    "cache",
    "cache_salt",
    "lora_scale",
    "logprobs",
    "n",
    "echo",
    "speculative",
];
/// The fields of a WebSocket `generate` besides the shared, steering and tool ones.
const FRAME_FIELDS: &[&str] = &[
    "type",
    "id",
    "messages",
    "prompt",
    "top_logprobs",
    "adapter",
];
/// The steering fields, the same on every edge (the OpenAI endpoints pass them through
/// unchanged): validated in [`steering`].
pub const STEERING_FIELDS: &[&str] = &[
    "presence_penalty",
    "frequency_penalty",
    "repetition_penalty",
    "repeat_last_n",
    "min_tokens",
    "logit_bias",
    "response_format",
];
/// Bound of `presence_penalty` and `frequency_penalty` (OpenAI's): `[-2, 2]`.
pub const MAX_ABS_PENALTY: f64 = 2.0;
/// Upper bound of `repetition_penalty`.
pub const MAX_REPETITION_PENALTY: f64 = 10.0;
/// Bound of a `logit_bias` value (OpenAI's): `[-100, 100]`.
pub const MAX_ABS_LOGIT_BIAS: f64 = 100.0;
/// Most alternatives `top_logprobs` may ask for (OpenAI's bound).
pub const MAX_TOP_LOGPROBS: u64 = 20;
/// Longest `cache_salt`, bytes of UTF-8.
pub const MAX_CACHE_SALT_BYTES: usize = 256;
const PLUGIN_ENTRY_FIELDS: &[&str] = &["name", "config"];
/// Most plugins one request may name.
pub const MAX_PLUGINS_PER_REQUEST: usize = 8;
/// Longest `config` of one plugin entry, as JSON text, bytes.
pub const MAX_PLUGIN_CONFIG_BYTES: usize = 64 * 1024;
const CANCEL_FIELDS: &[&str] = &["type", "id"];
const STATS_FIELDS: &[&str] = &["type", "id"];
const TOKENIZE_FIELDS: &[&str] = &["type", "id", "text", "special"];
const DETOKENIZE_FIELDS: &[&str] = &["type", "id", "token_ids"];

type VResult<T> = Result<T, InferError>;

/// Whether `name` is a field of a `generate` (either edge's spelling) — for naming the
/// field of an error (OpenAI's `param`).
pub fn is_request_field(name: &str) -> bool {
    name != "type"
        && name != "id"
        && [
            FRAME_FIELDS,
            SHARED_FIELDS,
            STEERING_FIELDS,
            tools::TOOL_FIELDS,
        ]
        .iter()
        .chain(super::openai::HTTP_FIELDS.iter())
        .any(|l| l.contains(&name))
}

/// serde_json's parse error, with a hint where its own words mislead: a `\uD800`–`\uDFFF`
/// escape not followed by the other half of its UTF-16 surrogate pair (RFC 8259 §7;
/// Python's `json.dumps` writes such escapes for lone surrogates) is reported by
/// serde_json as a problem with the hex escape itself.
pub fn json_error(e: &serde_json::Error) -> String {
    let text = e.to_string();
    if text.contains("hex escape") || text.contains("surrogate") {
        format!(
            "{text} (a \\uD800-\\uDFFF escape must be one half of a UTF-16 surrogate \
             pair, followed or preceded by the other half)"
        )
    } else {
        text
    }
}

/// Parses and validates one client text frame.
///
/// `defaults` fill the sampling fields a `generate` leaves out; an absent `seed` is
/// drawn at random. `vocab_size` bounds `top_k` and detokenize ids. Every failure is
/// an [`ErrorKind::Validation`](crate::error::ErrorKind::Validation) error carrying the
/// frame's `id` when one could be read.
pub fn parse_client_message(
    frame: &str,
    defaults: &SamplingDefaults,
    vocab_size: usize,
) -> Result<ClientMessage, ApiError> {
    let value: Value = serde_json::from_str(frame).map_err(|e| ApiError {
        id: None,
        error: InferError::validation(format!("malformed JSON: {}", json_error(&e))),
    })?;
    let Value::Object(obj) = &value else {
        return Err(ApiError {
            id: None,
            error: InferError::validation(format!(
                "frame must be a JSON object (got {})",
                quote(&value)
            )),
        });
    };
    // Read the id first so that every later error can name the request it is about.
    let id = parse_id(obj);
    let readable_id = id.as_ref().ok().cloned();
    let with_id = |error: InferError| ApiError {
        id: readable_id.clone(),
        error,
    };
    let kind = message_type(obj).map_err(with_id)?;
    if let MessageType::Stats | MessageType::Plugins = kind {
        // `{"type":"stats"}` and `{"type":"plugins"}`: the id is optional and only echoed.
        let id = match obj.get("id") {
            None | Some(Value::Null) => None,
            Some(_) => Some(id.map_err(with_id)?),
        };
        return if let MessageType::Stats = kind {
            check_fields(obj, STATS_FIELDS, "stats message").map(|()| ClientMessage::Stats { id })
        } else {
            check_fields(obj, STATS_FIELDS, "plugins message")
                .map(|()| ClientMessage::Plugins { id })
        }
        .map_err(with_id);
    }
    let id = id.map_err(with_id)?;
    let result = match kind {
        MessageType::Generate => parse_generate(&value, obj, id, defaults, vocab_size),
        MessageType::Cancel => check_fields(obj, CANCEL_FIELDS, "cancel message")
            .map(|()| ClientMessage::Cancel { id }),
        MessageType::Tokenize => parse_tokenize(obj, id),
        MessageType::Detokenize => parse_detokenize(obj, id, vocab_size),
        MessageType::Stats => Ok(ClientMessage::Stats { id: Some(id) }),
        MessageType::Plugins => Ok(ClientMessage::Plugins { id: Some(id) }),
    };
    result.map_err(with_id)
}

/// Validates a [`GenerateBody`] read from either edge (a WebSocket `generate` frame or
/// an OpenAI-compatible body, whose edge-specific forms [`super::openai`] has already
/// normalised) into a request with concrete values: the one validation of a
/// `generate`. Which keys the edge accepts is checked before the body is read.
///
/// # Errors
/// A [`crate::error::ErrorKind::Validation`] error naming the field, bound and value.
pub fn generate_request(
    body: &GenerateBody,
    id: String,
    defaults: &SamplingDefaults,
    vocab_size: usize,
) -> Result<GenerateRequest, InferError> {
    let input = match (&body.messages, &body.prompt) {
        (Some(_), Some(_)) => {
            return Err(InferError::validation(
                "exactly one of messages or prompt is allowed (got both)",
            ))
        }
        (None, None) => {
            return Err(InferError::validation(
                "exactly one of messages or prompt is required (got neither)",
            ))
        }
        (Some(messages), None) => PromptInput::Messages(parse_messages(messages)?),
        (None, Some(Value::Array(ids))) => PromptInput::Tokens(parse_prompt_ids(ids, vocab_size)?),
        (None, Some(prompt)) => PromptInput::Text(parse_prompt(prompt)?),
    };
    let sampling = parse_sampling(body, defaults, vocab_size)?;
    choices::check_echo_input(sampling.echo, !matches!(input, PromptInput::Messages(_)))?;
    let plugins = match &body.plugins {
        None => Vec::new(),
        Some(v) => parse_plugins(v)?,
    };
    let cache = parse_cache(body)?;
    let is_chat = matches!(input, PromptInput::Messages(_));
    let tools = tools::parse_tool_options(body, is_chat)?;
    if let (Some(t), Some(_)) = (&tools, &sampling.constraint) {
        if t.forced().is_some() {
            return Err(InferError::validation(
                "response_format cannot be combined with tool_choice \"required\" or a named \
                 function (the call's arguments are already constrained)",
            ));
        }
    }
    let template_kwargs =
        tools::parse_template_kwargs(body.chat_template_kwargs.as_ref(), is_chat)?;
    let adapter = parse_adapter(body)?;
    Ok(GenerateRequest {
        client_id: id,
        input,
        sampling,
        plugins,
        cache,
        tools,
        template_kwargs,
        adapter,
    })
}

/// Checks configured defaults against the client bounds (see [`SamplingDefaults::check`]).
pub(super) fn check_defaults(d: &SamplingDefaults, vocab_size: usize) -> VResult<()> {
    let prefixed = |e: InferError| InferError::validation(format!("default {}", e.message));
    for (field, v) in [
        ("temperature", d.temperature),
        ("top_p", d.top_p),
        ("min_p", d.min_p),
    ] {
        if !v.is_finite() {
            return Err(InferError::validation(format!(
                "default {field} must be a finite number (got {v})"
            )));
        }
    }
    let float = |v: f32| Number::from_f64(f64::from(v)).map(Num);
    // The same validation as a client's body, with the defaults as its values.
    let body = GenerateBody {
        temperature: float(d.temperature),
        top_p: float(d.top_p),
        min_p: float(d.min_p),
        top_k: Some(Int((d.top_k as u64).into())),
        max_tokens: Some(Int((d.max_tokens as u64).into())),
        ..GenerateBody::default()
    };
    let fallback = SamplingDefaults::default();
    parse_sampling(&body, &fallback, vocab_size)
        .map(|_| ())
        .map_err(prefixed)
}

#[derive(Debug, Clone, Copy)]
enum MessageType {
    Plugins,
    Generate,
    Cancel,
    Tokenize,
    Detokenize,
    Stats,
}

fn message_type(obj: &Map<String, Value>) -> VResult<MessageType> {
    match obj.get("type") {
        None | Some(Value::Null) => Err(InferError::validation(
            "missing field \"type\" (expected one of generate, cancel, tokenize, detokenize, stats, plugins)",
        )),
        Some(Value::String(s)) => match s.as_str() {
            "generate" => Ok(MessageType::Generate),
            "cancel" => Ok(MessageType::Cancel),
            "tokenize" => Ok(MessageType::Tokenize),
            "detokenize" => Ok(MessageType::Detokenize),
            "stats" => Ok(MessageType::Stats),
            "plugins" => Ok(MessageType::Plugins),
            _ => Err(InferError::validation(format!(
                "unknown message type {} (expected one of generate, cancel, tokenize, detokenize, stats, plugins)",
                quote_str(s)
            ))),
        },
        Some(other) => Err(InferError::validation(format!(
            "type must be a string (got {})",
            quote(other)
        ))),
    }
}

fn parse_id(obj: &Map<String, Value>) -> VResult<String> {
    match obj.get("id") {
        None | Some(Value::Null) => Err(InferError::validation("missing field \"id\"")),
        Some(Value::String(s)) if s.is_empty() => {
            Err(InferError::validation("id must be a non-empty string"))
        }
        Some(Value::String(s)) => {
            let chars = s.chars().count();
            if chars > MAX_ID_CHARS {
                Err(InferError::validation(format!(
                    "id must be at most {MAX_ID_CHARS} characters (got {chars})"
                )))
            } else {
                Ok(s.clone())
            }
        }
        Some(other) => Err(InferError::validation(format!(
            "id must be a string (got {})",
            quote(other)
        ))),
    }
}

/// Rejects any key of `obj` not in `allowed`; `what` names the object in the message.
fn check_fields(obj: &Map<String, Value>, allowed: &[&str], what: &str) -> VResult<()> {
    match obj.keys().find(|k| !allowed.contains(&k.as_str())) {
        Some(key) => Err(InferError::validation(format!(
            "unknown field {} in {what} (allowed: {})",
            quote_str(key),
            allowed.join(", ")
        ))),
        None => Ok(()),
    }
}

/// An optional field: absent and `null` both read as `None`.
fn optional<'a>(obj: &'a Map<String, Value>, key: &str) -> Option<&'a Value> {
    obj.get(key).filter(|v| !v.is_null())
}

/// A `generate` frame: its keys checked, then read as a [`GenerateBody`] and validated.
fn parse_generate(
    value: &Value,
    obj: &Map<String, Value>,
    id: String,
    defaults: &SamplingDefaults,
    vocab_size: usize,
) -> VResult<ClientMessage> {
    check_fields(
        obj,
        &[
            FRAME_FIELDS,
            SHARED_FIELDS,
            STEERING_FIELDS,
            tools::TOOL_FIELDS,
        ]
        .concat(),
        "generate message",
    )?;
    let body = GenerateBody::from_value(value)?;
    generate_request(&body, id, defaults, vocab_size).map(|r| ClientMessage::Generate(Box::new(r)))
}

/// Bound of `lora_scale`: `[-16, 16]` (llama.cpp takes any scale; past 16 a rank-8
/// delta swamps the base model).
pub const MAX_ABS_LORA_SCALE: f64 = 16.0;

/// `adapter` (WebSocket; the OpenAI edge puts a `model` naming an adapter here) and
/// `lora_scale` (a number in `[-16, 16]`, default 1, only with an adapter). Whether the
/// adapter is loaded is decided when the request starts.
fn parse_adapter(body: &GenerateBody) -> VResult<Option<AdapterChoice>> {
    let scale = match &body.lora_scale {
        None => 1.0,
        Some(Num(n)) => match n.as_f64() {
            Some(v) if v.is_finite() && v.abs() <= MAX_ABS_LORA_SCALE => v as f32,
            _ => {
                return Err(InferError::validation(format!(
                    "lora_scale must be a number in [-{MAX_ABS_LORA_SCALE}, {MAX_ABS_LORA_SCALE}] (got {n})"
                )))
            }
        },
    };
    match &body.adapter {
        None if body.lora_scale.is_some() => Err(InferError::validation(
            "lora_scale needs an adapter (WebSocket \"adapter\", or an adapter's name as the \
             OpenAI \"model\")",
        )),
        None => Ok(None),
        Some(name) if name.is_empty() || name.chars().count() > 128 => {
            Err(InferError::validation(format!(
                "adapter must be the name of a loaded LoRA adapter, 1 to 128 characters (got {})",
                quote_str(name)
            )))
        }
        Some(name) => Ok(Some(AdapterChoice {
            name: name.clone(),
            scale,
            field: "adapter",
        })),
    }
}

/// `cache` (boolean, default true) and `cache_salt` (string of 1..=256 bytes).
fn parse_cache(body: &GenerateBody) -> VResult<CacheOptions> {
    let salt = match &body.cache_salt {
        None => String::new(),
        Some(s) if !s.is_empty() && s.len() <= MAX_CACHE_SALT_BYTES => s.clone(),
        Some(s) => {
            return Err(InferError::validation(format!(
                "cache_salt must be 1 to {MAX_CACHE_SALT_BYTES} bytes (got {} bytes)",
                s.len()
            )))
        }
    };
    Ok(CacheOptions {
        enabled: body.cache.unwrap_or(true),
        salt,
    })
}

/// `plugins`: an array of `{"name": string, "config": any JSON (default {})}`. Whether
/// the name is loaded and the config acceptable is decided by the plugin host when the
/// request is prepared (the plugin validates its own config).
fn parse_plugins(v: &Value) -> VResult<Vec<PluginSpec>> {
    let Value::Array(entries) = v else {
        return Err(InferError::validation(format!(
            "plugins must be an array of {{\"name\", \"config\"}} objects (got {})",
            quote(v)
        )));
    };
    if entries.len() > MAX_PLUGINS_PER_REQUEST {
        return Err(InferError::validation(format!(
            "plugins must have at most {MAX_PLUGINS_PER_REQUEST} entries (got {})",
            entries.len()
        )));
    }
    entries
        .iter()
        .enumerate()
        .map(|(i, e)| {
            let Value::Object(entry) = e else {
                return Err(InferError::validation(format!(
                    "plugins[{i}] must be an object with \"name\" and optional \"config\" (got {})",
                    quote(e)
                )));
            };
            check_fields(entry, PLUGIN_ENTRY_FIELDS, &format!("plugins[{i}]"))?;
            let name = match entry.get("name") {
                Some(Value::String(s)) if !s.is_empty() => s.clone(),
                Some(other) => {
                    return Err(InferError::validation(format!(
                        "plugins[{i}].name must be a non-empty string (got {})",
                        quote(other)
                    )))
                }
                None => {
                    return Err(InferError::validation(format!(
                        "plugins[{i}].name is required"
                    )))
                }
            };
            let config = match entry.get("config") {
                None | Some(Value::Null) => "{}".to_string(),
                Some(c) => c.to_string(),
            };
            if config.len() > MAX_PLUGIN_CONFIG_BYTES {
                return Err(InferError::validation(format!(
                    "plugins[{i}].config must be at most {MAX_PLUGIN_CONFIG_BYTES} bytes of JSON \
                     (got {})",
                    config.len()
                )));
            }
            Ok(PluginSpec { name, config })
        })
        .collect()
}

/// `prompt` as token ids: a non-empty array of integers below the vocabulary size.
fn parse_prompt_ids(items: &[Value], vocab_size: usize) -> VResult<Vec<u32>> {
    if items.is_empty() {
        return Err(InferError::validation(
            "prompt must be a non-empty string or a non-empty array of token ids (got [])",
        ));
    }
    token_ids("prompt", items, vocab_size)
}

fn parse_prompt(v: &Value) -> VResult<String> {
    match v {
        Value::String(s) if s.is_empty() => Err(InferError::validation(
            "prompt must be a non-empty string (got \"\")",
        )),
        Value::String(s) => Ok(s.clone()),
        other => Err(InferError::validation(format!(
            "prompt must be a string or an array of token ids (got {})",
            quote(other)
        ))),
    }
}

fn parse_sampling(
    body: &GenerateBody,
    defaults: &SamplingDefaults,
    vocab_size: usize,
) -> VResult<SamplingParams> {
    let temperature = match &body.temperature {
        None => defaults.temperature,
        Some(v) => {
            let (t, text) = number(v);
            if t.is_nan() || t < 0.0 {
                return Err(InferError::validation(format!(
                    "temperature must be >= 0 (got {text})"
                )));
            }
            if t > MAX_TEMPERATURE {
                return Err(InferError::validation(format!(
                    "temperature must be <= {MAX_TEMPERATURE} (got {text})"
                )));
            }
            t as f32
        }
    };
    let top_k = match &body.top_k {
        None => defaults.top_k,
        Some(v) => {
            let k = unsigned("top_k", v, 0, vocab_size as u64, "the vocabulary size ")?;
            // k <= vocab_size, which is a usize.
            usize::try_from(k).unwrap_or(vocab_size)
        }
    };
    let top_p = match &body.top_p {
        None => defaults.top_p,
        Some(v) => {
            let (p, text) = number(v);
            let p32 = p as f32;
            // Checked on the f32 too: 1e-300 > 0 but rounds to 0.0f32.
            if !(p > 0.0 && p <= 1.0) {
                return Err(InferError::validation(format!(
                    "top_p must be in (0, 1] (got {text})"
                )));
            }
            // The smallest positive f32; anything smaller would round to it or to 0.
            let smallest = f64::from(f32::from_bits(1));
            if p < smallest || p32 <= 0.0 {
                return Err(InferError::validation(format!(
                    "top_p must be at least {smallest:e}, the smallest positive 32-bit \
                     float (got {text})"
                )));
            }
            p32.min(1.0)
        }
    };
    let min_p = match &body.min_p {
        None => defaults.min_p,
        Some(v) => {
            let (p, text) = number(v);
            if !(0.0..=1.0).contains(&p) {
                return Err(InferError::validation(format!(
                    "min_p must be in [0, 1] (got {text})"
                )));
            }
            (p as f32).clamp(0.0, 1.0)
        }
    };
    let seed = match &body.seed {
        None => rand::random::<u64>(),
        Some(v) => unsigned("seed", v, 0, u64::MAX, "")?,
    };
    let (n, echo) = choices::parse_choices(body)?;
    // OpenAI chat's max_completion_tokens replaces max_tokens; errors name the one given.
    // A max_tokens beside it is still checked: out of bounds, it is refused, not ignored.
    let max_tokens = match (&body.max_completion_tokens, &body.max_tokens) {
        (Some(v), ignored) => {
            if let Some(m) = ignored {
                choices::parse_max_tokens("max_tokens", m, echo, MAX_MAX_TOKENS, false)?;
            }
            Some(("max_completion_tokens", v))
        }
        (None, v) => v.as_ref().map(|v| ("max_tokens", v)),
    };
    let max_tokens = match max_tokens {
        None => defaults.max_tokens,
        Some((field, v)) => {
            let n =
                choices::parse_max_tokens(field, v, echo, MAX_MAX_TOKENS, body.messages.is_none())?;
            usize::try_from(n).unwrap_or(defaults.max_tokens)
        }
    };
    let stop = match &body.stop {
        None => Vec::new(),
        Some(v) => parse_stop(v)?,
    };
    let steering = parse_steering(body, max_tokens, vocab_size)?;
    Ok(SamplingParams {
        temperature,
        top_k,
        top_p,
        min_p,
        seed,
        max_tokens,
        stop,
        n,
        echo,
        speculative: body.speculative.unwrap_or(true),
        ..steering
    })
}

fn parse_stop(v: &Value) -> VResult<Vec<String>> {
    match v {
        Value::String(s) => Ok(vec![stop_entry("stop", s)?]),
        Value::Array(items) => {
            if items.len() > MAX_STOP_SEQUENCES {
                return Err(InferError::validation(format!(
                    "stop must have at most {MAX_STOP_SEQUENCES} entries (got {})",
                    items.len()
                )));
            }
            items
                .iter()
                .enumerate()
                .map(|(i, item)| match item {
                    Value::String(s) => stop_entry(&format!("stop[{i}]"), s),
                    other => Err(InferError::validation(format!(
                        "stop[{i}] must be a string (got {})",
                        quote(other)
                    ))),
                })
                .collect()
        }
        other => Err(InferError::validation(format!(
            "stop must be a string or an array of strings (got {})",
            quote(other)
        ))),
    }
}

fn stop_entry(field: &str, s: &str) -> VResult<String> {
    if s.is_empty() {
        return Err(InferError::validation(format!(
            "{field} must be a string of 1 to {MAX_STOP_BYTES} bytes (got \"\")"
        )));
    }
    if s.len() > MAX_STOP_BYTES {
        return Err(InferError::validation(format!(
            "{field} must be at most {MAX_STOP_BYTES} bytes (got {})",
            s.len()
        )));
    }
    Ok(s.to_owned())
}

fn parse_tokenize(obj: &Map<String, Value>, id: String) -> VResult<ClientMessage> {
    check_fields(obj, TOKENIZE_FIELDS, "tokenize message")?;
    let text = match obj.get("text") {
        None | Some(Value::Null) => {
            return Err(InferError::validation("missing field \"text\""));
        }
        Some(Value::String(s)) => s.clone(),
        Some(other) => {
            return Err(InferError::validation(format!(
                "text must be a string (got {})",
                quote(other)
            )))
        }
    };
    let special = match optional(obj, "special") {
        None => false,
        Some(Value::Bool(b)) => *b,
        Some(other) => {
            return Err(InferError::validation(format!(
                "special must be a boolean (got {})",
                quote(other)
            )))
        }
    };
    Ok(ClientMessage::Tokenize { id, text, special })
}

fn parse_detokenize(
    obj: &Map<String, Value>,
    id: String,
    vocab_size: usize,
) -> VResult<ClientMessage> {
    check_fields(obj, DETOKENIZE_FIELDS, "detokenize message")?;
    let items = match obj.get("token_ids") {
        None | Some(Value::Null) => {
            return Err(InferError::validation("missing field \"token_ids\""));
        }
        Some(Value::Array(items)) => items,
        Some(other) => {
            return Err(InferError::validation(format!(
                "token_ids must be an array of integers (got {})",
                quote(other)
            )))
        }
    };
    let token_ids = token_ids("token_ids", items, vocab_size)?;
    Ok(ClientMessage::Detokenize { id, token_ids })
}

mod choices;
mod images;
mod messages;
mod scalars;
mod steering;
mod tools;

use messages::parse_messages;
pub use scalars::quote;
use scalars::{integer_number, number, number_value, quote_str, token_ids, unsigned, IntClass};
use steering::parse_steering;

#[cfg(test)]
mod tests;
