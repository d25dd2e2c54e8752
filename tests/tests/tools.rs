//! Tool calls and reasoning on both edges: a forced call from the default model (whose
//! template has no tool support: the Hermes fallback) through the official `openai`
//! package, whole and streamed; the scripted test plugin driving a template that
//! reasons and calls tools, so the parsers see exact text split one byte per token;
//! a constraint that starts after the reasoning; `chat_template_kwargs`; validation.

use serde_json::{json, Value};

use inferd_e2e::{run_python, test_plugins_dir, Daemon, HttpResponse};

/// A ChatML template that renders `tools` (Hermes format), tool turns, an empty
/// reasoning block when `enable_thinking` is false (as Qwen3's does), and an opened one
/// when `open_thinking` is true (as DeepSeek-R1's does).
const TEMPLATE: &str = r#"{%- if tools %}<|im_start|>system
# Tools
<tools>
{%- for tool in tools %}
{{ tool | tojson }}
{%- endfor %}
</tools>
Answer with <tool_call>{"name": ..., "arguments": ...}</tool_call> blocks.<|im_end|>
{% endif %}
{%- for message in messages %}
{%- if message.role == "tool" %}<|im_start|>user
<tool_response>
{{ message.content }}
</tool_response><|im_end|>
{% elif message.tool_calls %}<|im_start|>assistant
{%- for tc in message.tool_calls %}
<tool_call>
{"name": "{{ tc.function.name }}", "arguments": {{ tc.function.arguments | tojson }}}
</tool_call>
{%- endfor %}<|im_end|>
{% else %}<|im_start|>{{ message.role }}
{{ message.content }}<|im_end|>
{% endif %}
{%- endfor %}
{%- if add_generation_prompt %}<|im_start|>assistant
{% if enable_thinking is defined and not enable_thinking %}<think>

</think>

{% endif %}{% if open_thinking is defined and open_thinking %}<think>
{% endif %}{% endif %}"#;

const THOUGHT: &str = "\nThe user wants the weather: é😀.\n";
const ARGS: &str = r#"{"city": "Paris", "unit": "celsius"}"#;

fn tools() -> Value {
    json!([
        {"type": "function", "function": {"name": "get_weather", "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "maxLength": 20},
                           "unit": {"enum": ["celsius", "fahrenheit"]}},
            "required": ["city", "unit"], "additionalProperties": false}}},
        {"type": "function", "function": {"name": "get_time"}}
    ])
}

/// The default model with the template above and the scripted plugin loaded.
fn scripted_daemon() -> (Daemon, tempfile::TempDir) {
    let dir = tempfile::tempdir().expect("tempdir");
    let src = test_plugins_dir().join("scripted.wasm");
    std::fs::copy(&src, dir.path().join("scripted.wasm"))
        .unwrap_or_else(|e| panic!("{}: {e} (run scripts/build-plugins.sh)", src.display()));
    let template = dir.path().join("template.jinja");
    std::fs::write(&template, TEMPLATE).expect("template");
    let d = Daemon::start_with_env(&[
        ("INFERD__PLUGINS__DIR", dir.path().to_str().expect("path")),
        (
            "INFERD__MODEL__CHAT_TEMPLATE",
            template.to_str().expect("path"),
        ),
    ])
    .expect("daemon");
    (d, dir)
}

/// POSTs `body` to the chat endpoint.
fn post(d: &Daemon, body: &Value) -> HttpResponse {
    d.http("POST", "/v1/chat/completions", &[], Some(&body.to_string()))
        .expect("http")
}

fn script(text: &str, then: &str) -> Value {
    json!([{"name": "scripted", "config": {"text": text, "split": "bytes", "then": then}}])
}

fn chat_body(extra: Value) -> Value {
    let mut b = json!({
        "messages": [{"role": "user", "content": "Weather in Paris?"}],
        "max_tokens": 400, "temperature": 0,
    });
    for (k, v) in extra.as_object().expect("object") {
        b[k] = v.clone();
    }
    b
}

/// Folds the streamed `delta.tool_calls` pieces, `reasoning_content` and `content`.
fn fold_stream(chunks: &[Value]) -> (String, String, Vec<Value>, Option<String>) {
    let (mut content, mut reasoning) = (String::new(), String::new());
    let mut calls: Vec<Value> = Vec::new();
    let mut finish = None;
    for c in chunks {
        let Some(choice) = c["choices"].get(0) else {
            continue;
        };
        let d = &choice["delta"];
        content.push_str(d["content"].as_str().unwrap_or(""));
        reasoning.push_str(d["reasoning_content"].as_str().unwrap_or(""));
        for p in d["tool_calls"].as_array().into_iter().flatten() {
            let i = p["index"].as_u64().expect("index") as usize;
            if i == calls.len() {
                assert!(
                    p["id"].is_string() && p["function"]["name"].is_string(),
                    "{p}"
                );
                assert_eq!(p["type"], "function");
                calls.push(json!({"id": p["id"], "type": "function",
                    "function": {"name": p["function"]["name"], "arguments": ""}}));
            } else {
                assert!(
                    p.get("id").is_none() && p["function"].get("name").is_none(),
                    "{p}"
                );
            }
            let piece = p["function"]["arguments"].as_str().expect("arguments");
            let a = calls[i]["function"]["arguments"]
                .as_str()
                .unwrap_or("")
                .to_string()
                + piece;
            calls[i]["function"]["arguments"] = json!(a);
        }
        if let Some(f) = choice["finish_reason"].as_str() {
            finish = Some(f.to_string());
        }
    }
    (content, reasoning, calls, finish)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn openai_package_gets_a_forced_tool_call_whole_and_streamed() {
    let d = Daemon::start().expect("daemon");
    let base = format!("http://{}/v1", d.addr());
    let out = run_python("openai_tools.py", &[&base], None).expect("openai_tools.py");
    assert_eq!(out["finish_reason"], "tool_calls", "{out}");
    assert_eq!(out["content"], Value::Null);
    assert_eq!(out["name"], "get_weather");
    let args: Value = serde_json::from_str(out["arguments"].as_str().expect("args")).expect("json");
    assert!(
        args["city"]
            .as_str()
            .is_some_and(|c| c.chars().count() <= 20),
        "{args}"
    );
    assert!(["celsius", "fahrenheit"].contains(&args["unit"].as_str().unwrap_or("")));
    assert_eq!(out["stream_finish_reason"], "tool_calls");
    assert_eq!(
        out["stream_calls"], out["calls"],
        "the streamed pieces concatenate to the whole calls"
    );
    assert_eq!(
        (&out["ids_unique"], &out["stream_ids"]),
        (&json!(true), &json!(true))
    );
    assert!(
        ["stop", "length"].contains(&out["answer_finish_reason"].as_str().unwrap_or("")),
        "{out}"
    );
    assert_eq!(out["answer_has_text"], true);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scripted_reasoning_and_calls_split_into_channels_on_both_edges() {
    let (d, _dir) = scripted_daemon();
    let text = format!(
        "<think>{THOUGHT}</think>\n\n<tool_call>\n{{\"name\": \"get_weather\", \"arguments\": {ARGS}}}\n</tool_call>\n<tool_call>\n{{\"name\": \"get_time\", \"arguments\": {{}}}}\n</tool_call>"
    );
    let body = chat_body(json!({"tools": tools(), "plugins": script(&text, "eos")}));
    let r = post(&d, &body);
    assert_eq!(r.status, 200, "{}", r.body);
    let v = r.json();
    let choice = &v["choices"][0];
    assert_eq!(choice["finish_reason"], "tool_calls", "{v}");
    let m = &choice["message"];
    assert_eq!(m["content"], Value::Null, "{m}");
    assert_eq!(m["reasoning_content"], THOUGHT);
    let calls = m["tool_calls"].as_array().expect("calls");
    assert_eq!(calls.len(), 2);
    assert_eq!(
        calls[0]["function"],
        json!({"name": "get_weather", "arguments": ARGS})
    );
    assert_eq!(
        calls[1]["function"],
        json!({"name": "get_time", "arguments": "{}"})
    );
    assert_ne!(calls[0]["id"], calls[1]["id"]);

    let mut sb = body.clone();
    sb["stream"] = json!(true);
    let r = post(&d, &sb);
    let (content, reasoning, scalls, finish) = fold_stream(&r.sse_data());
    assert_eq!(content, "");
    assert_eq!(reasoning, THOUGHT);
    assert_eq!(finish.as_deref(), Some("tool_calls"));
    let strip = |c: &[Value]| -> Vec<Value> { c.iter().map(|x| x["function"].clone()).collect() };
    assert_eq!(strip(&scalls), strip(calls), "streamed = whole");

    // parallel_tool_calls false keeps the first call only.
    let mut one = body.clone();
    one["parallel_tool_calls"] = json!(false);
    let r = post(&d, &one);
    let calls = r.json()["choices"][0]["message"]["tool_calls"].clone();
    assert_eq!(calls.as_array().map(Vec::len), Some(1), "{calls}");

    // The WebSocket edge: its own reasoning channel, tool-call pieces, same finish.
    let mut c = d.connect().await.expect("ws");
    let mut ws = body.clone();
    ws["type"] = json!("generate");
    ws["id"] = json!("w");
    c.send(&ws).await.expect("send");
    let (mut text_out, mut reasoning_out, mut args) = (String::new(), String::new(), String::new());
    let mut names = Vec::new();
    loop {
        let f = c.recv().await.expect("frame");
        match f["type"].as_str() {
            Some("delta") => {
                text_out.push_str(f["text"].as_str().unwrap_or(""));
                reasoning_out.push_str(f["reasoning"].as_str().unwrap_or(""));
                for p in f["tool_calls"].as_array().into_iter().flatten() {
                    if let Some(n) = p["name"].as_str() {
                        names.push(n.to_string());
                    }
                    if p["index"] == 0 {
                        args.push_str(p["arguments"].as_str().unwrap_or(""));
                    }
                }
            }
            Some("done") => {
                assert_eq!(f["finish_reason"], "tool_calls", "{f}");
                break;
            }
            Some("started") => {}
            _ => panic!("unexpected frame {f}"),
        }
    }
    assert_eq!((text_out.as_str(), reasoning_out.as_str()), ("", THOUGHT));
    assert_eq!(names, ["get_weather", "get_time"]);
    assert_eq!(args, ARGS);

    // Two choices: each parses its own calls, with ids of its own.
    let mut two = body.clone();
    two["n"] = json!(2);
    let r = post(&d, &two);
    let v = r.json();
    let ids: Vec<&Value> = (0..2)
        .map(|i| &v["choices"][i]["message"]["tool_calls"][0]["id"])
        .collect();
    for i in 0..2 {
        let c = &v["choices"][i];
        assert_eq!(
            (c["index"].as_u64(), c["finish_reason"].as_str()),
            (Some(i as u64), Some("tool_calls")),
            "{v}"
        );
        assert_eq!(c["message"]["reasoning_content"], THOUGHT);
        assert_eq!(c["message"]["tool_calls"][0]["function"]["arguments"], ARGS);
    }
    assert_ne!(ids[0], ids[1]);

    // A plain answer with tools offered: content, finish stop.
    let body = chat_body(json!({"tools": tools(), "plugins": script("It is sunny.", "eos")}));
    let r = post(&d, &body);
    let v = r.json();
    assert_eq!(v["choices"][0]["finish_reason"], "stop", "{v}");
    assert_eq!(v["choices"][0]["message"]["content"], "It is sunny.");
    assert!(v["choices"][0]["message"].get("tool_calls").is_none());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn constraints_start_after_the_reasoning() {
    let (d, _dir) = scripted_daemon();
    // The template opens the reasoning; the script reasons and closes it, then the
    // model (free) is held to the call. (Opening `<think>` itself one character at a
    // time is not possible here: its `<` is the grammar's, as `<tool_call>` starts so.)
    let thought = "\nok\n</think>";
    let opened = json!({"open_thinking": true});
    let body = chat_body(json!({
        "tools": tools(),
        "tool_choice": {"type": "function", "function": {"name": "get_weather"}},
        "chat_template_kwargs": opened,
        "plugins": script(thought, "free"),
    }));
    let r = post(&d, &body);
    let v = r.json();
    let choice = &v["choices"][0];
    assert_eq!(choice["finish_reason"], "tool_calls", "{v}");
    assert_eq!(choice["message"]["reasoning_content"], "\nok\n");
    let call = &choice["message"]["tool_calls"][0]["function"];
    assert_eq!(call["name"], "get_weather");
    let args: Value =
        serde_json::from_str(call["arguments"].as_str().expect("args")).expect("json");
    assert!(
        args["city"].is_string() && args["unit"].is_string(),
        "{args}"
    );

    // A forced call always comes out, whatever the sampler draws, with a template
    // that lets the model reason (the model cannot escape into <think> through a
    // token the grammar also allows, nor end the turn inside reasoning).
    for seed in [5, 6, 7] {
        let body = chat_body(json!({
            "tools": tools(), "tool_choice": "required", "parallel_tool_calls": false,
            "temperature": 0.8, "seed": seed, "max_tokens": 120,
        }));
        let r = post(&d, &body);
        let v = r.json();
        assert_eq!(
            v["choices"][0]["finish_reason"], "tool_calls",
            "seed {seed}: {v}"
        );
    }

    // response_format after reasoning: the content is a JSON object.
    let body = chat_body(json!({
        "response_format": {"type": "json_object"},
        "max_tokens": 60,
        "chat_template_kwargs": opened,
        "plugins": script(thought, "free"),
    }));
    let r = post(&d, &body);
    let v = r.json();
    let m = &v["choices"][0]["message"];
    assert_eq!(m["reasoning_content"], "\nok\n", "{v}");
    if v["choices"][0]["finish_reason"] == "stop" {
        let parsed: Value = serde_json::from_str(m["content"].as_str().expect("content"))
            .unwrap_or_else(|e| panic!("{e}: {m}"));
        assert!(parsed.is_object());
    } else {
        assert!(
            m["content"].as_str().is_some_and(|c| c.starts_with('{')),
            "{m}"
        );
    }

    // enable_thinking false: the template closes the block, the output is all content.
    let body = chat_body(json!({
        "chat_template_kwargs": {"enable_thinking": false},
        "plugins": script("<think>x</think>y", "eos"),
    }));
    let r = post(&d, &body);
    let v = r.json();
    assert_eq!(
        v["choices"][0]["message"]["content"], "<think>x</think>y",
        "{v}"
    );
    assert!(v["choices"][0]["message"]
        .get("reasoning_content")
        .is_none());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_tool_fields_are_refused_naming_the_field() {
    let d = Daemon::start().expect("daemon");
    let cases = [
        (
            json!({"tools": [{"type": "function", "function": {"name": "a b"}}]}),
            "tools[0].function.name must be 1 to 64 characters from a-z, A-Z, 0-9, _ and - (got \"a b\")",
        ),
        (
            json!({"tools": tools(), "tool_choice": {"type": "function", "function": {"name": "nope"}}}),
            "tool_choice.function.name must name one of tools (get_weather, get_time) (got \"nope\")",
        ),
        (
            json!({"tool_choice": "required"}),
            "tool_choice \"required\" or a named function needs a non-empty tools",
        ),
        (
            json!({"tools": tools(), "tool_choice": "sometimes"}),
            "tool_choice must be \"none\", \"auto\", \"required\" or {\"type\": \"function\", \"function\": {\"name\": …}} (got \"sometimes\")",
        ),
        (
            json!({"chat_template_kwargs": {"messages": []}}),
            "chat_template_kwargs may not set \"messages\" (the daemon sets messages, tools, add_generation_prompt, bos_token, eos_token)",
        ),
        (
            json!({"tools": [{"type": "function", "function": {"name": "f", "parameters":
                {"type": "object", "maxPropertiez": 2}}}], "tool_choice": "required"}),
            "tools[0].function.parameters: keyword \"maxPropertiez\" at # is not one inferd enforces",
        ),
    ];
    // `param` names the field, unknown keys included; a forced tool's broken schema is
    // reported for that tool, not as the grammar it is embedded in.
    let params = [
        (
            json!({"tools": [{"type": "function", "function": {"name": "f", "x": 1}}]}),
            "tools[0].function.x",
        ),
        (json!({"temprature": 1}), "temprature"),
        (
            json!({"tools": [{"type": "function", "function": {"name": "f", "parameters":
            {"type": "object", "properties": {"x": {"type": "string", "pattern": "(("}}}}}],
            "tool_choice": "required"}),
            "tools[0].function.parameters",
        ),
        (
            json!({"tools": [{"type": "function", "function": {"name": "f", "parameters":
            {"type": "string"}}}]}),
            "tools[0].function.parameters.type",
        ),
    ];
    for (extra, want) in params {
        let r = d
            .http(
                "POST",
                "/v1/chat/completions",
                &[],
                Some(&chat_body(extra.clone()).to_string()),
            )
            .expect("http");
        let e = &r.json()["error"];
        assert_eq!(
            (r.status, e["param"].as_str()),
            (400, Some(want)),
            "{extra}: {e}"
        );
        assert!(
            !e["message"].as_str().unwrap_or("").contains("start:"),
            "{e}"
        );
    }
    for (extra, want) in cases {
        let r = d
            .http(
                "POST",
                "/v1/chat/completions",
                &[],
                Some(&chat_body(extra.clone()).to_string()),
            )
            .expect("http");
        assert_eq!(r.status, 400, "{extra}: {}", r.body);
        let msg = r.json()["error"]["message"]
            .as_str()
            .unwrap_or("")
            .to_string();
        assert!(msg.starts_with(want), "{extra}: {msg}");
    }
    // Tools are for chat: a raw prompt with tools is refused on the WebSocket.
    let mut c = d.connect().await.expect("ws");
    c.send(&json!({"type": "generate", "id": "p", "prompt": "x", "tools": tools()}))
        .await
        .expect("send");
    let f = c.recv().await.expect("frame");
    assert_eq!(
        f["error"]["message"], "tools needs messages (tools are for chat requests)",
        "{f}"
    );
    assert!(d
        .http("GET", "/health", &[], None)
        .map(|r| r.status == 200)
        .unwrap_or(false));
}
