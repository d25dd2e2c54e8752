//! The generated input as the JSON each edge takes.

use serde_json::{json, Map, Value};

use super::{Body, Choice, Edge, Format, Input, WsMsg, MODEL};

fn put<T: Into<Value>>(o: &mut Map<String, Value>, key: &str, v: Option<T>) {
    if let Some(v) = v {
        o.insert(key.to_owned(), v.into());
    }
}

fn input_json(input: &Input) -> Value {
    match input {
        Input::Text(t) => json!(t),
        Input::Tokens(ids) => json!(ids),
        Input::Messages(ms) => Value::Array(
            ms.iter()
                .map(|m| {
                    let mut o = Map::new();
                    o.insert("role".into(), json!(m.role));
                    match &m.content {
                        Some(Ok(s)) => put(&mut o, "content", Some(s.as_str())),
                        Some(Err(parts)) => put(
                            &mut o,
                            "content",
                            Some(Value::Array(
                                parts
                                    .iter()
                                    .map(|t| json!({"type": "text", "text": t}))
                                    .collect(),
                            )),
                        ),
                        None => {}
                    }
                    if !m.calls.is_empty() {
                        let calls = m.calls.iter().map(|(id, name, args)| {
                            let mut f = Map::new();
                            f.insert("name".into(), json!(name));
                            put(&mut f, "arguments", args.clone());
                            let mut c = Map::new();
                            put(&mut c, "id", id.clone());
                            c.insert("type".into(), json!("function"));
                            c.insert("function".into(), Value::Object(f));
                            Value::Object(c)
                        });
                        o.insert("tool_calls".into(), Value::Array(calls.collect()));
                    }
                    put(&mut o, "tool_call_id", m.tool_call_id.clone());
                    put(&mut o, "name", m.name.clone());
                    Value::Object(o)
                })
                .collect(),
        ),
    }
}

fn format_json(f: &Format) -> Value {
    match f {
        Format::Text => json!({"type": "text"}),
        Format::JsonObject => json!({"type": "json_object"}),
        Format::JsonSchema(name, strict, schema) => {
            let mut js = Map::new();
            put(&mut js, "name", name.clone());
            put(&mut js, "strict", *strict);
            js.insert("schema".into(), schema.clone());
            json!({"type": "json_schema", "json_schema": js})
        }
        Format::Regex(r) => json!({"type": "regex", "regex": r}),
        Format::Grammar(g) => json!({"type": "grammar", "grammar": g}),
    }
}

impl Body {
    /// The body as `edge` takes it (a WebSocket frame adds `type` and `id`).
    pub fn to_json(&self, edge: Edge) -> Value {
        let mut o = Map::new();
        if edge == Edge::Ws {
            o.insert("type".into(), json!("generate"));
            o.insert("id".into(), json!(self.id));
        }
        match &self.input {
            Some(i @ Input::Messages(_)) => put(&mut o, "messages", Some(input_json(i))),
            Some(i) if self.wrap_prompt => put(&mut o, "prompt", Some(json!([input_json(i)]))),
            Some(i) => put(&mut o, "prompt", Some(input_json(i))),
            None => {}
        }
        put(&mut o, "max_tokens", self.max_tokens);
        put(&mut o, "max_completion_tokens", self.max_completion_tokens);
        put(&mut o, "temperature", self.temperature);
        put(&mut o, "top_k", self.top_k);
        put(&mut o, "top_p", self.top_p);
        put(&mut o, "min_p", self.min_p);
        put(&mut o, "seed", self.seed);
        put(
            &mut o,
            "stop",
            self.stop
                .clone()
                .map(|s| s.map_or_else(|v| json!(v), |s| json!(s))),
        );
        put(&mut o, "n", self.n);
        put(&mut o, "echo", self.echo);
        put(&mut o, "cache", self.cache);
        put(&mut o, "cache_salt", self.cache_salt.clone());
        put(&mut o, "speculative", self.speculative);
        put(&mut o, "presence_penalty", self.presence_penalty);
        put(&mut o, "frequency_penalty", self.frequency_penalty);
        put(&mut o, "repetition_penalty", self.repetition_penalty);
        put(&mut o, "repeat_last_n", self.repeat_last_n);
        put(&mut o, "min_tokens", self.min_tokens);
        let bias = self
            .logit_bias
            .as_ref()
            .map(|m| Value::Object(m.iter().map(|(k, v)| (k.to_string(), json!(v))).collect()));
        put(&mut o, "logit_bias", bias);
        if edge == Edge::Completion {
            let lp = self.logprobs.map(|l| {
                if l {
                    json!(self.top_logprobs.unwrap_or(0))
                } else {
                    json!(false)
                }
            });
            put(&mut o, "logprobs", lp);
        } else {
            put(&mut o, "logprobs", self.logprobs);
            put(&mut o, "top_logprobs", self.top_logprobs);
        }
        put(
            &mut o,
            "response_format",
            self.response_format.as_ref().map(format_json),
        );
        let plugins = self.plugins.as_ref().map(|ps| {
            ps.iter()
                .map(|(name, config)| {
                    let mut e = Map::new();
                    e.insert("name".into(), json!(name));
                    put(&mut e, "config", config.clone());
                    Value::Object(e)
                })
                .collect::<Vec<_>>()
        });
        put(&mut o, "plugins", plugins);
        let tools = self.tools.as_ref().map(|ts| {
            ts.iter()
                .map(|(name, description, parameters, strict)| {
                    let mut f = Map::new();
                    f.insert("name".into(), json!(name));
                    put(&mut f, "description", description.clone());
                    put(&mut f, "parameters", parameters.clone());
                    put(&mut f, "strict", *strict);
                    json!({"type": "function", "function": f})
                })
                .collect::<Vec<_>>()
        });
        put(&mut o, "tools", tools);
        let choice = self.tool_choice.as_ref().map(|c| match c {
            Choice::None => json!("none"),
            Choice::Auto => json!("auto"),
            Choice::Required => json!("required"),
            Choice::Named(i) => {
                json!({"type": "function", "function": {"name": self.tool_names()[*i]}})
            }
        });
        put(&mut o, "tool_choice", choice);
        put(&mut o, "parallel_tool_calls", self.parallel_tool_calls);
        put(&mut o, "chat_template_kwargs", self.kwargs.clone());
        put(&mut o, "model", self.model.then_some(MODEL));
        put(&mut o, "stream", self.stream);
        let usage = self.include_usage.map(|u| {
            let mut so = Map::new();
            put(&mut so, "include_usage", u);
            so
        });
        put(&mut o, "stream_options", usage);
        put(&mut o, "user", self.user.clone());
        put(&mut o, "suffix", self.suffix.then_some(""));
        put(&mut o, "best_of", self.best_of.then_some(1));
        for key in &self.nulls {
            if !o.contains_key(*key) {
                o.insert((*key).to_owned(), Value::Null);
            }
        }
        Value::Object(o)
    }
}

impl WsMsg {
    /// The frame's JSON.
    pub fn to_json(&self) -> Value {
        let with_id = |kind: &str, id: &Option<String>| match id {
            Some(id) => json!({"type": kind, "id": id}),
            None => json!({"type": kind}),
        };
        match self {
            WsMsg::Generate(b) => b.to_json(Edge::Ws),
            WsMsg::Cancel(id) => json!({"type": "cancel", "id": id}),
            WsMsg::Tokenize(id, text, None) => json!({"type": "tokenize", "id": id, "text": text}),
            WsMsg::Tokenize(id, text, Some(s)) => {
                json!({"type": "tokenize", "id": id, "text": text, "special": s})
            }
            WsMsg::Detokenize(id, ids) => json!({"type": "detokenize", "id": id, "token_ids": ids}),
            WsMsg::Stats(id) => with_id("stats", id),
            WsMsg::Plugins(id) => with_id("plugins", id),
        }
    }

    /// The id an error about this frame must carry.
    pub fn id(&self) -> Option<&str> {
        match self {
            WsMsg::Generate(b) => Some(&b.id),
            WsMsg::Cancel(id) | WsMsg::Tokenize(id, ..) | WsMsg::Detokenize(id, _) => Some(id),
            WsMsg::Stats(id) | WsMsg::Plugins(id) => id.as_deref(),
        }
    }
}
