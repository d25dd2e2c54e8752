//! The check that a parsed request (or WebSocket message) holds what was generated:
//! the round trip of every field, the defaults for the absent ones.

use serde_json::Value;

use super::{Body, Choice, Edge, Format, Input, WsMsg, HTTP_ID};
use crate::api::openai::ResponseOptions;
use crate::api::{ClientMessage, SamplingDefaults};
use crate::request::{ConstraintSpec, GenerateRequest, PromptInput, ToolChoice};

impl WsMsg {
    /// Checks a parsed message against this one.
    pub fn check(&self, got: &ClientMessage) -> Result<(), String> {
        let same = match (self, got) {
            (WsMsg::Generate(b), ClientMessage::Generate(r)) => {
                return check_request(b, Edge::Ws, r)
            }
            (WsMsg::Cancel(a), ClientMessage::Cancel { id }) => a == id,
            (WsMsg::Tokenize(a, t, s), ClientMessage::Tokenize { id, text, special }) => {
                (a, t, s.unwrap_or(false)) == (id, text, *special)
            }
            (WsMsg::Detokenize(a, ids), ClientMessage::Detokenize { id, token_ids }) => {
                (a, ids) == (id, token_ids)
            }
            (WsMsg::Stats(a), ClientMessage::Stats { id }) => a == id,
            (WsMsg::Plugins(a), ClientMessage::Plugins { id }) => a == id,
            _ => false,
        };
        same.then_some(())
            .ok_or_else(|| format!("{got:?} is not {self:?}"))
    }
}

/// Compares `field` of the parsed request with what was generated.
macro_rules! expect {
    ($field:literal, $got:expr, $want:expr) => {
        if $got != $want {
            return Err(format!(
                "{}: parsed {:?}, generated {:?}",
                $field, $got, $want
            ));
        }
    };
}

/// Checks that `req` holds every field of `b` (sent to `edge`), and the defaults of
/// the absent ones.
pub fn check_request(b: &Body, edge: Edge, req: &GenerateRequest) -> Result<(), String> {
    let d = SamplingDefaults::default();
    let s = &req.sampling;
    let id = if edge == Edge::Ws {
        b.id.as_str()
    } else {
        HTTP_ID
    };
    expect!("id", req.client_id.as_str(), id);
    match (&b.input, &req.input) {
        (Some(Input::Text(t)), PromptInput::Text(got)) => expect!("prompt", got, t),
        (Some(Input::Tokens(t)), PromptInput::Tokens(got)) => expect!("prompt", got, t),
        (Some(Input::Messages(ms)), PromptInput::Messages(got)) => {
            expect!("messages.len", got.len(), ms.len());
            for (i, (m, g)) in ms.iter().zip(got).enumerate() {
                let content = match &m.content {
                    Some(Ok(s)) => s.clone(),
                    Some(Err(parts)) => parts.concat(),
                    None => String::new(),
                };
                let calls: Vec<_> = m
                    .calls
                    .iter()
                    .enumerate()
                    .map(|(j, (id, name, args))| {
                        let id = id.clone().unwrap_or(format!("call_{i}_{j}"));
                        (id, name.clone(), args.clone().unwrap_or("{}".into()))
                    })
                    .collect();
                let got_calls: Vec<_> = g
                    .tool_calls
                    .iter()
                    .map(|c| (c.id.clone(), c.name.clone(), c.arguments.clone()))
                    .collect();
                expect!("messages.role", &g.role, &m.role);
                expect!("messages.content", &g.content, &content);
                expect!("messages.tool_calls", got_calls, calls);
                expect!("messages.tool_call_id", &g.tool_call_id, &m.tool_call_id);
                expect!("messages.name", &g.name, &m.name);
            }
        }
        (want, got) => return Err(format!("input: parsed {got:?}, generated {want:?}")),
    }
    let max_tokens = b
        .effective_max_tokens()
        .map_or(d.max_tokens, |m| m as usize);
    expect!("max_tokens", s.max_tokens, max_tokens);
    expect!(
        "temperature",
        s.temperature,
        b.temperature.map_or(d.temperature, |t| t as f32)
    );
    expect!("top_k", s.top_k, b.top_k.map_or(d.top_k, |k| k as usize));
    expect!("top_p", s.top_p, b.top_p.map_or(d.top_p, |p| p as f32));
    expect!("min_p", s.min_p, b.min_p.map_or(d.min_p, |p| p as f32));
    if let Some(seed) = b.seed {
        expect!("seed", s.seed, seed);
    }
    let stop = match &b.stop {
        None => vec![],
        Some(Ok(one)) => vec![one.clone()],
        Some(Err(v)) => v.clone(),
    };
    expect!("stop", &s.stop, &stop);
    expect!("n", s.n, b.n.unwrap_or(1) as usize);
    expect!("echo", s.echo, b.echo.unwrap_or(false));
    expect!("cache", req.cache.enabled, b.cache.unwrap_or(true));
    expect!(
        "cache_salt",
        &req.cache.salt,
        &b.cache_salt.clone().unwrap_or_default()
    );
    expect!("speculative", s.speculative, b.speculative.unwrap_or(true));
    expect!(
        "presence_penalty",
        s.presence_penalty,
        b.presence_penalty.unwrap_or(0.0) as f32
    );
    expect!(
        "frequency_penalty",
        s.frequency_penalty,
        b.frequency_penalty.unwrap_or(0.0) as f32
    );
    expect!(
        "repetition_penalty",
        s.repetition_penalty,
        b.repetition_penalty.unwrap_or(1.0) as f32
    );
    let window = match b.repeat_last_n {
        None => Some(crate::request::DEFAULT_REPEAT_LAST_N),
        Some(-1) => None,
        Some(n) => Some(n as usize),
    };
    expect!("repeat_last_n", s.repeat_last_n, window);
    expect!(
        "min_tokens",
        s.min_tokens,
        b.min_tokens.unwrap_or(0) as usize
    );
    let bias: Vec<(u32, f32)> = b
        .logit_bias
        .iter()
        .flatten()
        .map(|(k, v)| (*k, *v as f32))
        .collect();
    expect!("logit_bias", &s.logit_bias, &bias);
    let logprobs = (b.logprobs == Some(true)).then(|| b.top_logprobs.unwrap_or(0) as usize);
    expect!("logprobs", s.logprobs, logprobs);
    let constraint = match &b.response_format {
        None | Some(Format::Text) => None,
        Some(Format::JsonObject) => Some(ConstraintSpec::JsonObject),
        Some(Format::JsonSchema(_, _, schema)) => Some(ConstraintSpec::JsonSchema(schema.clone())),
        Some(Format::Regex(r)) => Some(ConstraintSpec::Regex(r.clone())),
        Some(Format::Grammar(g)) => Some(ConstraintSpec::Grammar(g.clone())),
    };
    expect!("response_format", &s.constraint, &constraint);
    let plugins: Vec<(String, String)> = b
        .plugins
        .iter()
        .flatten()
        .map(|(n, c)| {
            (
                n.clone(),
                c.as_ref()
                    .filter(|c| !c.is_null())
                    .map_or("{}".into(), Value::to_string),
            )
        })
        .collect();
    let got: Vec<(String, String)> = req
        .plugins
        .iter()
        .map(|p| (p.name.clone(), p.config.clone()))
        .collect();
    expect!("plugins", got, plugins);
    let tools_given =
        b.tools.is_some() || b.tool_choice.is_some() || b.parallel_tool_calls.is_some();
    match (&req.tools, tools_given) {
        (None, false) => {}
        (Some(t), true) => {
            let names: Vec<&str> = t.tools.iter().map(|t| t.name.as_str()).collect();
            expect!("tools", names, b.tool_names());
            let choice = match &b.tool_choice {
                None if names.is_empty() => ToolChoice::None,
                None | Some(Choice::Auto) => ToolChoice::Auto,
                Some(Choice::None) => ToolChoice::None,
                Some(Choice::Required) => ToolChoice::Required,
                Some(Choice::Named(i)) => ToolChoice::Function(names[*i].to_owned()),
            };
            expect!("tool_choice", &t.choice, &choice);
            expect!(
                "parallel_tool_calls",
                t.parallel,
                b.parallel_tool_calls.unwrap_or(true)
            );
        }
        (got, _) => return Err(format!("tools: parsed {got:?}, generated {:?}", b.tools)),
    }
    expect!(
        "chat_template_kwargs",
        &req.template_kwargs,
        &b.kwargs.clone().unwrap_or_default()
    );
    Ok(())
}

/// Checks the HTTP options the body asked for.
pub fn check_options(b: &Body, o: &ResponseOptions) -> Result<(), String> {
    expect!("stream", o.stream, b.stream.unwrap_or(false));
    expect!(
        "stream_options.include_usage",
        o.include_usage,
        b.include_usage.flatten().unwrap_or(false)
    );
    expect!("logprobs (response)", o.logprobs, b.logprobs == Some(true));
    Ok(())
}
