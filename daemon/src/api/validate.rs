//! Parsing and validation of client frames: JSON text → [`ClientMessage`].
//!
//! The frame is parsed into a `serde_json::Value` and walked by hand so every error
//! names the field, the expected type or bound, and the value given. Unknown fields
//! are rejected everywhere. A JSON `null` counts as absent for optional fields.
//! Nothing here panics, whatever the input.

use serde_json::{Map, Number, Value};

use super::{ApiError, ClientMessage, SamplingDefaults};
use crate::error::InferError;
use crate::request::{
    CacheOptions, ChatMessage, GenerateRequest, PluginSpec, PromptInput, SamplingParams,
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

/// Longest rendering of a client value quoted back in an error message.
const MAX_QUOTED_CHARS: usize = 64;

const GENERATE_FIELDS: &[&str] = &[
    "type",
    "id",
    "messages",
    "prompt",
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
    "logprobs",
    "top_logprobs",
    "n",
    "echo",
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
const MESSAGE_FIELDS: &[&str] = &["role", "content", "tool_calls", "tool_call_id", "name"];
const PART_FIELDS: &[&str] = &["type", "text"];

type VResult<T> = Result<T, InferError>;

/// Whether `name` is a field of a `generate` (either edge's spelling) — for naming the
/// field of an error (OpenAI's `param`).
pub fn is_request_field(name: &str) -> bool {
    const HTTP_ONLY: &[&str] = &[
        "model",
        "stream",
        "stream_options",
        "n",
        "user",
        "max_completion_tokens",
        "echo",
        "suffix",
        "best_of",
    ];
    name != "type"
        && name != "id"
        && [
            GENERATE_FIELDS,
            STEERING_FIELDS,
            tools::TOOL_FIELDS,
            HTTP_ONLY,
        ]
        .iter()
        .any(|l| l.contains(&name))
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
        error: InferError::validation(format!("malformed JSON: {e}")),
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
        MessageType::Generate => parse_generate(obj, id, defaults, vocab_size),
        MessageType::Cancel => check_fields(obj, CANCEL_FIELDS, "cancel message")
            .map(|()| ClientMessage::Cancel { id }),
        MessageType::Tokenize => parse_tokenize(obj, id),
        MessageType::Detokenize => parse_detokenize(obj, id, vocab_size),
        MessageType::Stats => Ok(ClientMessage::Stats { id: Some(id) }),
        MessageType::Plugins => Ok(ClientMessage::Plugins { id: Some(id) }),
    };
    result.map_err(with_id)
}

/// Validates a `generate` object built by another edge (the OpenAI-compatible HTTP API
/// translates its bodies into one), with the same rules and messages as a frame.
///
/// # Errors
/// A [`crate::error::ErrorKind::Validation`] error naming the field, bound and value.
pub fn parse_generate_object(
    obj: &Map<String, Value>,
    id: String,
    defaults: &SamplingDefaults,
    vocab_size: usize,
) -> Result<GenerateRequest, InferError> {
    match parse_generate(obj, id, defaults, vocab_size)? {
        ClientMessage::Generate(request) => Ok(*request),
        _ => Err(InferError::internal("generate parsed into another message")),
    }
}

/// Checks configured defaults against the client bounds (see [`SamplingDefaults::check`]).
pub(super) fn check_defaults(d: &SamplingDefaults, vocab_size: usize) -> VResult<()> {
    let prefixed = |e: InferError| InferError::validation(format!("default {}", e.message));
    let float = |v: f32| Number::from_f64(f64::from(v)).map_or(Value::Null, Value::Number);
    let mut obj = Map::new();
    obj.insert("temperature".into(), float(d.temperature));
    obj.insert("top_p".into(), float(d.top_p));
    obj.insert("min_p".into(), float(d.min_p));
    obj.insert("top_k".into(), Value::from(d.top_k as u64));
    obj.insert("max_tokens".into(), Value::from(d.max_tokens as u64));
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
    // The same parser as for a client frame, with the defaults as the frame's values.
    let fallback = SamplingDefaults::default();
    parse_sampling(&obj, &fallback, vocab_size)
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

fn parse_generate(
    obj: &Map<String, Value>,
    id: String,
    defaults: &SamplingDefaults,
    vocab_size: usize,
) -> VResult<ClientMessage> {
    check_fields(
        obj,
        &[GENERATE_FIELDS, STEERING_FIELDS, tools::TOOL_FIELDS].concat(),
        "generate message",
    )?;
    let input = match (optional(obj, "messages"), optional(obj, "prompt")) {
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
    let sampling = parse_sampling(obj, defaults, vocab_size)?;
    choices::check_echo_input(sampling.echo, !matches!(input, PromptInput::Messages(_)))?;
    let plugins = match optional(obj, "plugins") {
        None => Vec::new(),
        Some(v) => parse_plugins(v)?,
    };
    let cache = parse_cache(obj)?;
    let is_chat = matches!(input, PromptInput::Messages(_));
    let tools = tools::parse_tool_options(obj, is_chat)?;
    if let (Some(t), Some(_)) = (&tools, &sampling.constraint) {
        if t.forced().is_some() {
            return Err(InferError::validation(
                "response_format cannot be combined with tool_choice \"required\" or a named \
                 function (the call's arguments are already constrained)",
            ));
        }
    }
    let template_kwargs = tools::parse_template_kwargs(obj, is_chat)?;
    Ok(ClientMessage::Generate(Box::new(GenerateRequest {
        client_id: id,
        input,
        sampling,
        plugins,
        cache,
        tools,
        template_kwargs,
    })))
}

/// `cache` (boolean, default true) and `cache_salt` (string of 1..=256 bytes).
fn parse_cache(obj: &Map<String, Value>) -> VResult<CacheOptions> {
    let enabled = match optional(obj, "cache") {
        None => true,
        Some(Value::Bool(b)) => *b,
        Some(v) => {
            return Err(InferError::validation(format!(
                "cache must be a boolean (got {})",
                quote(v)
            )))
        }
    };
    let salt = match optional(obj, "cache_salt") {
        None => String::new(),
        Some(Value::String(s)) if !s.is_empty() && s.len() <= MAX_CACHE_SALT_BYTES => s.clone(),
        Some(Value::String(s)) => {
            return Err(InferError::validation(format!(
                "cache_salt must be 1 to {MAX_CACHE_SALT_BYTES} bytes (got {} bytes)",
                s.len()
            )))
        }
        Some(v) => {
            return Err(InferError::validation(format!(
                "cache_salt must be a string (got {})",
                quote(v)
            )))
        }
    };
    Ok(CacheOptions { enabled, salt })
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
        Value::String(s) if s.is_empty() => {
            Err(InferError::validation("prompt must be a non-empty string"))
        }
        Value::String(s) => Ok(s.clone()),
        other => Err(InferError::validation(format!(
            "prompt must be a string or an array of token ids (got {})",
            quote(other)
        ))),
    }
}

fn parse_messages(v: &Value) -> VResult<Vec<ChatMessage>> {
    let Value::Array(items) = v else {
        return Err(InferError::validation(format!(
            "messages must be an array of messages (got {})",
            quote(v)
        )));
    };
    if items.is_empty() {
        return Err(InferError::validation(
            "messages must be a non-empty array (got [])",
        ));
    }
    items
        .iter()
        .enumerate()
        .map(|(i, item)| parse_message(i, item))
        .collect()
}

fn parse_message(i: usize, v: &Value) -> VResult<ChatMessage> {
    let Value::Object(obj) = v else {
        return Err(InferError::validation(format!(
            "messages[{i}] must be an object with role and content (got {})",
            quote(v)
        )));
    };
    check_fields(obj, MESSAGE_FIELDS, &format!("messages[{i}]"))?;
    let role = match obj.get("role") {
        None => {
            return Err(InferError::validation(format!(
                "messages[{i}] is missing field \"role\""
            )))
        }
        Some(Value::String(s)) if s.is_empty() => {
            return Err(InferError::validation(format!(
                "messages[{i}].role must be a non-empty string"
            )))
        }
        Some(Value::String(s)) => s.clone(),
        Some(other) => {
            return Err(InferError::validation(format!(
                "messages[{i}].role must be a string (got {})",
                quote(other)
            )))
        }
    };
    let tool_calls = match optional(obj, "tool_calls") {
        None => Vec::new(),
        Some(v) => tools::parse_message_calls(i, v)?,
    };
    let content = match obj.get("content") {
        // An assistant turn that only calls tools has no content.
        None | Some(Value::Null) if !tool_calls.is_empty() => String::new(),
        None => {
            return Err(InferError::validation(format!(
                "messages[{i}] is missing field \"content\""
            )))
        }
        Some(Value::String(s)) => s.clone(),
        Some(Value::Array(parts)) => parse_parts(i, parts)?,
        Some(other) => {
            return Err(InferError::validation(format!(
                "messages[{i}].content must be a string or an array of text parts (got {})",
                quote(other)
            )))
        }
    };
    Ok(ChatMessage {
        role,
        content,
        tool_calls,
        tool_call_id: tools::message_string(i, obj, "tool_call_id")?,
        name: tools::message_string(i, obj, "name")?,
    })
}

/// Concatenates the texts of `[{"type":"text","text":"..."}, ...]`.
fn parse_parts(i: usize, parts: &[Value]) -> VResult<String> {
    let mut content = String::new();
    for (j, part) in parts.iter().enumerate() {
        let at = format!("messages[{i}].content[{j}]");
        let Value::Object(obj) = part else {
            return Err(InferError::validation(format!(
                "{at} must be an object {{\"type\":\"text\",\"text\":...}} (got {})",
                quote(part)
            )));
        };
        check_fields(obj, PART_FIELDS, &at)?;
        match obj.get("type") {
            Some(Value::String(t)) if t == "text" => {}
            None => {
                return Err(InferError::validation(format!(
                    "{at} is missing field \"type\" (expected \"text\")"
                )))
            }
            Some(other) => {
                return Err(InferError::validation(format!(
                    "{at}.type must be \"text\" (got {}): only text parts are supported",
                    quote(other)
                )))
            }
        }
        match obj.get("text") {
            Some(Value::String(t)) => content.push_str(t),
            None => {
                return Err(InferError::validation(format!(
                    "{at} is missing field \"text\""
                )))
            }
            Some(other) => {
                return Err(InferError::validation(format!(
                    "{at}.text must be a string (got {})",
                    quote(other)
                )))
            }
        }
    }
    Ok(content)
}

fn parse_sampling(
    obj: &Map<String, Value>,
    defaults: &SamplingDefaults,
    vocab_size: usize,
) -> VResult<SamplingParams> {
    let temperature = match optional(obj, "temperature") {
        None => defaults.temperature,
        Some(v) => {
            let (t, text) = number("temperature", v)?;
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
    let top_k = match optional(obj, "top_k") {
        None => defaults.top_k,
        Some(v) => {
            let k = unsigned("top_k", v, 0, vocab_size as u64, "the vocabulary size ")?;
            // k <= vocab_size, which is a usize.
            usize::try_from(k).unwrap_or(vocab_size)
        }
    };
    let top_p = match optional(obj, "top_p") {
        None => defaults.top_p,
        Some(v) => {
            let (p, text) = number("top_p", v)?;
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
    let min_p = match optional(obj, "min_p") {
        None => defaults.min_p,
        Some(v) => {
            let (p, text) = number("min_p", v)?;
            if !(0.0..=1.0).contains(&p) {
                return Err(InferError::validation(format!(
                    "min_p must be in [0, 1] (got {text})"
                )));
            }
            (p as f32).clamp(0.0, 1.0)
        }
    };
    let seed = match optional(obj, "seed") {
        None => rand::random::<u64>(),
        Some(v) => unsigned("seed", v, 0, u64::MAX, "")?,
    };
    let (n, echo) = choices::parse_choices(obj)?;
    let max_tokens = match optional(obj, "max_tokens") {
        None => defaults.max_tokens,
        Some(v) => {
            let n = choices::parse_max_tokens(v, echo, MAX_MAX_TOKENS)?;
            usize::try_from(n).unwrap_or(defaults.max_tokens)
        }
    };
    let stop = match optional(obj, "stop") {
        None => Vec::new(),
        Some(v) => parse_stop(v)?,
    };
    let steering = parse_steering(obj, max_tokens, vocab_size)?;
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
            "{field} must be a non-empty string"
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

/// `field`'s items as token ids, each an integer below `vocab_size`.
fn token_ids(field: &str, items: &[Value], vocab_size: usize) -> VResult<Vec<u32>> {
    let name = field;
    // Ids are u32 on the wire; a vocabulary never exceeds that.
    let limit = u64::try_from(vocab_size)
        .unwrap_or(u64::MAX)
        .min(u64::from(u32::MAX) + 1);
    let mut token_ids = Vec::with_capacity(items.len());
    for (i, item) in items.iter().enumerate() {
        let field = format!("{name}[{i}]");
        let id = match integer(&field, item)? {
            Int::Unsigned(n) if n < limit => n,
            Int::Negative => {
                return Err(InferError::validation(format!(
                    "{field} must be >= 0 (got {})",
                    quote(item)
                )))
            }
            Int::Unsigned(_) | Int::TooLarge => {
                return Err(InferError::validation(format!(
                    "{field} must be < the vocabulary size {vocab_size} (got {})",
                    quote(item)
                )))
            }
        };
        token_ids.push(u32::try_from(id).unwrap_or(u32::MAX));
    }
    Ok(token_ids)
}

/// A JSON number as `f64` plus its text as sent, or a type error naming `field`.
fn number(field: &str, v: &Value) -> VResult<(f64, String)> {
    match v {
        Value::Number(n) => {
            // Only `arbitrary_precision` builds can yield None or a non-finite value
            // here; report those as out of range through the NaN/inf that follows.
            let f = n.as_f64().unwrap_or(f64::NAN);
            Ok((f, n.to_string()))
        }
        other => Err(InferError::validation(format!(
            "{field} must be a number (got {})",
            quote(other)
        ))),
    }
}

/// Classification of a JSON number expected to be an integer.
enum Int {
    /// Fits a `u64`.
    Unsigned(u64),
    /// Below zero (any magnitude).
    Negative,
    /// An integer above `u64::MAX`.
    TooLarge,
}

/// Reads an integer literal. Integers beyond the 64-bit range arrive as floats; they
/// are classified by sign. Other non-integral numbers (`1.5`, `40.0`, `1e3`) are type
/// errors.
fn integer(field: &str, v: &Value) -> VResult<Int> {
    let Value::Number(n) = v else {
        return Err(InferError::validation(format!(
            "{field} must be an integer (got {})",
            quote(v)
        )));
    };
    if let Some(u) = n.as_u64() {
        return Ok(Int::Unsigned(u));
    }
    if n.as_i64().is_some() {
        return Ok(Int::Negative);
    }
    // An integer literal outside [-2^63, 2^64) overflows to a float; a float literal
    // (`40.0`, `1e3`, `1.5`) stays a type error.
    const TWO_POW_63: f64 = 9_223_372_036_854_775_808.0;
    const TWO_POW_64: f64 = 18_446_744_073_709_551_616.0;
    let f = n.as_f64().unwrap_or(f64::NAN);
    if f.fract() == 0.0 || f.is_infinite() {
        if f >= TWO_POW_64 {
            return Ok(Int::TooLarge);
        }
        if f <= -TWO_POW_63 {
            return Ok(Int::Negative);
        }
    }
    Err(InferError::validation(format!(
        "{field} must be an integer (got {n})"
    )))
}

/// An integer in `[min, max]`. `max_label` precedes `max` in the message
/// (e.g. `"the vocabulary size "`).
fn unsigned(field: &str, v: &Value, min: u64, max: u64, max_label: &str) -> VResult<u64> {
    let too_small =
        || InferError::validation(format!("{field} must be >= {min} (got {})", quote(v)));
    let too_large = || {
        InferError::validation(format!(
            "{field} must be <= {max_label}{max} (got {})",
            quote(v)
        ))
    };
    match integer(field, v)? {
        Int::Negative => Err(too_small()),
        Int::TooLarge => Err(too_large()),
        Int::Unsigned(n) if n < min => Err(too_small()),
        Int::Unsigned(n) if n > max => Err(too_large()),
        Int::Unsigned(n) => Ok(n),
    }
}

/// Compact JSON of a client value for an error message, cut to a readable length.
pub fn quote(v: &Value) -> String {
    shorten(v.to_string())
}

/// A string as a JSON string literal, cut to a readable length.
fn quote_str(s: &str) -> String {
    quote(&Value::String(s.to_owned()))
}

fn shorten(text: String) -> String {
    match text.char_indices().nth(MAX_QUOTED_CHARS) {
        Some((cut, _)) => format!("{}…", &text[..cut]),
        None => text,
    }
}

mod choices;
mod steering;
mod tools;

use steering::parse_steering;

#[cfg(test)]
mod tests;
