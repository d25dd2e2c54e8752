//! Steering the output on both edges: log-probabilities against transformers' logits
//! (tiny fixture model, token-id prompts), `logit_bias`, presence/frequency penalties
//! checked against the raw log-probabilities, `min_tokens`, and their validation
//! errors; the official `openai` package parsing the new response shapes.

use std::collections::HashMap;

use serde_json::{json, Value};

use inferd_e2e::{
    fixture, floats, ids_u64, log_softmax, run_python, workspace_root, Daemon, HttpResponse,
};

/// Our log-probabilities against transformers' f32 logits: the logits agree to about
/// 1e-5 here, the log-normaliser adds as much again.
const LOGPROB_TOL: f64 = 1e-4;

fn entry_ids(entry: &Value) -> Vec<u64> {
    entry["top_logprobs"]
        .as_array()
        .expect("top")
        .iter()
        .map(|t| t["token_id"].as_u64().expect("id"))
        .collect()
}

/// Top-20 log-probabilities of the next token after token-id prompts equal
/// `ln softmax` of transformers' last logits; greedy steps keep transformers' logit
/// differences between the top 5.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn logprobs_equal_transformers_log_softmax_on_token_id_prompts() {
    let dir = workspace_root().join("../shared/fixtures/tiny-models/llama");
    let d = Daemon::start_model(&dir, None, &[]).expect("start");
    let reference = fixture("tiny-models/llama/reference.json");
    let mut c = d.connect().await.expect("ws");
    for (i, seq) in reference["sequences"]
        .as_array()
        .expect("sequences")
        .iter()
        .enumerate()
    {
        let g = c
            .generate(
                json!({"type": "generate", "id": format!("s{i}"), "prompt": seq["input_ids"],
                "max_tokens": 1, "temperature": 0, "logprobs": true, "top_logprobs": 20}),
            )
            .await
            .expect("generate");
        assert_eq!(
            g.started.as_ref().expect("started")["prompt_tokens"],
            seq["input_ids"].as_array().map(Vec::len).unwrap_or(0),
            "token ids are the prompt unchanged"
        );
        let want = log_softmax(&floats(&seq["last_logits"]));
        let mut order: Vec<usize> = (0..want.len()).collect();
        order.sort_by(|&a, &b| want[b].total_cmp(&want[a]).then(a.cmp(&b)));
        assert_eq!(g.logprobs.len(), 1, "{g:?}");
        let entry = &g.logprobs[0];
        assert_eq!(entry["token_id"].as_u64(), Some(order[0] as u64), "greedy");
        let got = entry_ids(entry);
        assert_eq!(got.len(), 20);
        for (k, t) in entry["top_logprobs"]
            .as_array()
            .expect("top")
            .iter()
            .enumerate()
        {
            let id = t["token_id"].as_u64().expect("id") as usize;
            let lp = t["logprob"].as_f64().expect("logprob");
            assert!(
                (lp - want[id]).abs() < LOGPROB_TOL,
                "{}: top {k} id {id}: {lp} vs {}",
                seq["name"],
                want[id]
            );
            // The same set in the same order, unless two reference values tie closely.
            if got[k] != order[k] as u64 {
                assert!(
                    (want[order[k]] - want[id]).abs() < LOGPROB_TOL,
                    "order at {k}"
                );
            }
        }
        let total: f64 = entry["top_logprobs"]
            .as_array()
            .expect("top")
            .iter()
            .map(|t| t["logprob"].as_f64().expect("lp").exp())
            .sum();
        assert!(total > 0.0 && total <= 1.0 + 1e-6, "top-20 mass {total}");
    }

    let greedy = &reference["greedy"];
    let n = greedy["max_new_tokens"].as_u64().expect("n");
    let g = c
        .generate(
            json!({"type": "generate", "id": "g", "prompt": greedy["input_ids"],
            "max_tokens": n, "temperature": 0, "logprobs": true, "top_logprobs": 5}),
        )
        .await
        .expect("greedy");
    let want_ids = ids_u64(&greedy["new_token_ids"]);
    let got_ids: Vec<u64> = g.token_ids.iter().map(|&t| u64::from(t)).collect();
    assert_eq!(got_ids, want_ids);
    assert_eq!(g.logprobs.len(), want_ids.len());
    for (step, (entry, top5)) in g
        .logprobs
        .iter()
        .zip(greedy["top5_per_step"].as_array().expect("top5"))
        .enumerate()
    {
        assert_eq!(entry_ids(entry), ids_u64(&top5["ids"]), "step {step}");
        let logits = floats(&top5["logits"]);
        let lps: Vec<f64> = entry["top_logprobs"]
            .as_array()
            .expect("top")
            .iter()
            .map(|t| t["logprob"].as_f64().expect("lp"))
            .collect();
        for k in 1..5 {
            let (ours, theirs) = (lps[k] - lps[0], logits[k] - logits[0]);
            assert!(
                (ours - theirs).abs() < LOGPROB_TOL,
                "step {step} top {k}: {ours} vs {theirs}"
            );
        }
        assert_eq!(entry["logprob"], entry["top_logprobs"][0]["logprob"]);
    }
}

fn chat(id: &str, extra: Value) -> Value {
    let mut v = json!({"type": "generate", "id": id, "temperature": 0, "max_tokens": 12,
        "messages": [{"role": "user", "content": "What is the capital of France?"}]});
    for (k, x) in extra.as_object().expect("object") {
        v[k] = x.clone();
    }
    v
}

/// −100 on the greedy token changes it; +100 forces a token at every step, the
/// end-of-turn token included.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn logit_bias_bans_and_forces_tokens() {
    let d = Daemon::start().expect("daemon");
    let mut c = d.connect().await.expect("ws");
    let plain = c.generate(chat("p", json!({}))).await.expect("plain");
    let first = plain.token_ids[0];
    let banned = c
        .generate(chat("b", json!({"logit_bias": {first.to_string(): -100}})))
        .await
        .expect("banned");
    assert_ne!(banned.token_ids[0], first, "{banned:?}");
    assert!(!banned.token_ids.contains(&first), "{banned:?}");
    let forced = c
        .generate(chat("f", json!({"logit_bias": {"1000": 100}})))
        .await
        .expect("forced");
    assert_eq!(forced.token_ids, vec![1000; 12]);
    assert_eq!(forced.finish_reason(), Some("length"));
    // <|im_end|>, a special token, ends the turn at once.
    c.send(&json!({"type": "tokenize", "id": "t", "text": "<|im_end|>", "special": true}))
        .await
        .expect("send");
    let eot = c.recv().await.expect("tokens")["token_ids"][0]
        .as_u64()
        .expect("id");
    let ended = c
        .generate(chat("e", json!({"logit_bias": {eot.to_string(): 100}})))
        .await
        .expect("ended");
    assert_eq!(ended.token_ids, vec![eot as u32]);
    assert_eq!(ended.finish_reason(), Some("stop"));
    assert_eq!(ended.text, "");
}

/// Greedy decoding with OpenAI's presence and frequency penalties picks, at every step,
/// the best penalized score among the raw top-20 log-probabilities (the penalty moves
/// logits and log-probabilities alike).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn presence_and_frequency_penalties_follow_openais_formula() {
    let d = Daemon::start().expect("daemon");
    let mut c = d.connect().await.expect("ws");
    let (presence, frequency) = (0.4, 0.7);
    let g = c
        .generate(chat(
            "pen",
            json!({"max_tokens": 40, "presence_penalty": presence, "frequency_penalty": frequency,
                   "logprobs": true, "top_logprobs": 20,
                   "messages": [{"role": "user", "content": "List the days of the week, again and again."}]}),
        ))
        .await
        .expect("penalized");
    assert_eq!(g.logprobs.len(), g.token_ids.len());
    let mut counts: HashMap<u64, f64> = HashMap::new();
    let mut penalized_steps = 0;
    for (step, entry) in g.logprobs.iter().enumerate() {
        let chosen = entry["token_id"].as_u64().expect("id");
        let scored: Vec<(u64, f64)> = entry["top_logprobs"]
            .as_array()
            .expect("top")
            .iter()
            .map(|t| {
                let id = t["token_id"].as_u64().expect("id");
                let c = counts.get(&id).copied().unwrap_or(0.0);
                let p = if c > 0.0 { presence } else { 0.0 };
                (id, t["logprob"].as_f64().expect("lp") - c * frequency - p)
            })
            .collect();
        let best = scored
            .iter()
            .fold(scored[0], |b, &x| if x.1 > b.1 { x } else { b });
        // A tie within float noise may go either way.
        let chosen_score = scored.iter().find(|x| x.0 == chosen).map(|x| x.1);
        assert!(
            chosen_score.is_some_and(|s| s >= best.1 - 1e-4),
            "step {step}: chose {chosen} ({chosen_score:?}), best {best:?}"
        );
        if chosen != entry_ids(entry)[0] {
            penalized_steps += 1;
        }
        *counts.entry(chosen).or_insert(0.0) += 1.0;
    }
    assert!(
        penalized_steps > 0,
        "the penalties never changed a greedy choice: {g:?}"
    );
}

/// `min_tokens` holds back the end of the turn; the tokens before it are unchanged.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn min_tokens_holds_back_the_end_of_turn() {
    let d = Daemon::start().expect("daemon");
    let mut c = d.connect().await.expect("ws");
    let say = json!([{"role": "user", "content": "Say hello."}]);
    let plain = c
        .generate(chat("p", json!({"messages": say, "max_tokens": 96})))
        .await
        .expect("plain");
    assert_eq!(plain.finish_reason(), Some("stop"), "{plain:?}");
    let n = plain.token_ids.len();
    let longer = c
        .generate(chat(
            "m",
            json!({"messages": say, "max_tokens": n + 8, "min_tokens": n + 4}),
        ))
        .await
        .expect("min_tokens");
    assert!(longer.token_ids.len() >= n + 4, "{longer:?}");
    assert_eq!(longer.token_ids[..n - 1], plain.token_ids[..n - 1]);
    assert_ne!(longer.token_ids[n - 1], plain.token_ids[n - 1]);
}

fn post(d: &Daemon, path: &str, body: &Value) -> HttpResponse {
    d.http("POST", path, &[], Some(&body.to_string()))
        .expect("http")
}

/// Bad steering values get a 400 on HTTP and a `validation` error frame on the
/// WebSocket, with the same message naming the field, the bound and the value.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_steering_values_are_refused_on_both_edges() {
    let d = Daemon::start().expect("daemon");
    let mut c = d.connect().await.expect("ws");
    for (field, value, message) in [
        (
            "logit_bias",
            json!({"49152": 1}),
            "logit_bias[\"49152\"] key must be a token id below the vocabulary size 49152 (got 49152)",
        ),
        (
            "logit_bias",
            json!({"x1": 1}),
            "logit_bias keys must be token ids, integers written as strings without leading zeros (got key \"x1\")",
        ),
        (
            "logit_bias",
            json!({"5": -101}),
            "logit_bias[\"5\"] must be in [-100, 100] (got -101)",
        ),
        (
            "presence_penalty",
            json!(3),
            "presence_penalty must be in [-2, 2] (got 3)",
        ),
        (
            "frequency_penalty",
            json!(-2.5),
            "frequency_penalty must be in [-2, 2] (got -2.5)",
        ),
        (
            "top_logprobs",
            json!(21),
            "top_logprobs must be <= 20 (got 21)",
        ),
        (
            "min_tokens",
            json!(13),
            "min_tokens must be <= max_tokens = 12 (got 13)",
        ),
    ] {
        let mut extra = json!({ field: value });
        if field == "top_logprobs" {
            extra["logprobs"] = json!(true);
        }
        let g = c
            .generate(chat("bad", extra.clone()))
            .await
            .expect("frames");
        assert_eq!(g.error_type(), Some("validation"), "{g:?}");
        assert_eq!(
            g.error.as_ref().expect("error")["error"]["message"],
            message
        );
        let mut body = json!({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 12});
        for (k, v) in extra.as_object().expect("object") {
            body[k] = v.clone();
        }
        let r = post(&d, "/v1/chat/completions", &body);
        assert_eq!(r.status, 400, "{}", r.body);
        assert_eq!(r.json()["error"]["message"], message);
    }
    let r = post(
        &d,
        "/v1/completions",
        &json!({"prompt": "x", "logprobs": 6}),
    );
    assert_eq!(r.status, 400);
    assert_eq!(
        r.json()["error"]["message"],
        "logprobs must be an integer in [0, 5] on /v1/completions (got 6)"
    );
    // The daemon is still serving.
    let ok = c.generate(chat("ok", json!({}))).await.expect("ok");
    assert_eq!(ok.finish_reason(), Some("length"));
}

/// Chat log-probabilities streamed equal the whole response's and the WebSocket's;
/// the completions shape lines up with the text; the official `openai` package parses
/// both unchanged.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn openai_shapes_of_logprobs_and_the_openai_package() {
    let d = Daemon::start().expect("daemon");
    let mut c = d.connect().await.expect("ws");
    let ws = c
        .generate(chat("w", json!({"logprobs": true, "top_logprobs": 3})))
        .await
        .expect("ws");
    let body = json!({"messages": [{"role": "user", "content": "What is the capital of France?"}],
        "max_tokens": 12, "temperature": 0, "logprobs": true, "top_logprobs": 3});
    let whole = post(&d, "/v1/chat/completions", &body).json();
    let content = whole["choices"][0]["logprobs"]["content"]
        .as_array()
        .expect("content")
        .clone();
    assert_eq!(content.len(), 12);
    let mut streamed = Vec::new();
    let mut stream_body = body.clone();
    stream_body["stream"] = json!(true);
    for chunk in post(&d, "/v1/chat/completions", &stream_body).sse_data() {
        if let Some(lp) = chunk["choices"][0]["logprobs"]["content"].as_array() {
            streamed.extend(lp.iter().cloned());
        }
    }
    assert_eq!(streamed, content);
    for (e, w) in content.iter().zip(&ws.logprobs) {
        assert_eq!(e["logprob"], w["logprob"]);
        assert_eq!(e["bytes"], w["bytes"]);
        assert_eq!(e["top_logprobs"].as_array().map(Vec::len), Some(3));
    }
    let text: String = content
        .iter()
        .map(|e| e["token"].as_str().unwrap_or_default())
        .collect();
    assert_eq!(json!(text), whole["choices"][0]["message"]["content"]);

    let comp = post(
        &d,
        "/v1/completions",
        &json!({"prompt": "The capital of France is", "max_tokens": 6, "temperature": 0, "logprobs": 2}),
    )
    .json();
    let lp = &comp["choices"][0]["logprobs"];
    let tokens: Vec<&str> = lp["tokens"]
        .as_array()
        .expect("tokens")
        .iter()
        .map(|t| t.as_str().unwrap_or_default())
        .collect();
    assert_eq!(json!(tokens.concat()), comp["choices"][0]["text"]);
    let mut offset = 0;
    for (k, t) in tokens.iter().enumerate() {
        assert_eq!(lp["text_offset"][k], offset);
        offset += t.chars().count();
        assert!(lp["top_logprobs"][k]
            .as_object()
            .is_some_and(|m| m.len() <= 2));
        assert!(lp["token_logprobs"][k].as_f64().is_some_and(|x| x <= 0.0));
    }

    c.send(&json!({"type": "tokenize", "id": "t", "text": "!"}))
        .await
        .expect("send");
    let bang = c.recv().await.expect("tokens")["token_ids"][0]
        .as_u64()
        .expect("id")
        .to_string();
    let base = format!("http://{}/v1", d.addr());
    let out = tokio::task::spawn_blocking(move || {
        run_python("openai_steering.py", &[&base, &bang], None)
    })
    .await
    .expect("join")
    .expect("the openai package parses the responses");
    assert_eq!(out["whole_tokens"], out["stream_tokens"], "{out}");
    assert_eq!(
        out["whole_tokens"].as_array().map(Vec::len),
        Some(12),
        "{out}"
    );
    assert_eq!(out["whole_top_len"], json!(3), "{out}");
    assert_eq!(
        out["whole_text"],
        json!(out["whole_tokens"]
            .as_array()
            .expect("tokens")
            .iter()
            .map(|t| t.as_str().unwrap_or_default())
            .collect::<String>())
    );
    assert_eq!(out["biased_text"], "!!!!", "{out}");
    assert_eq!(
        out["completion_tokens"].as_array().map(Vec::len),
        Some(6),
        "{out}"
    );
    assert_eq!(out["token_prompt_tokens"], 4, "{out}");
    // jsonschema.validate passed in the script; the turn ended by itself.
    assert_eq!(out["structured_finish"], "stop", "{out}");
}

/// Schemas with `minItems`/`maxItems`, `pattern` + `maxLength`, `enum` and nested
/// objects: every bound keeps the output finite, so even random weights end it.
fn schemas() -> Vec<Value> {
    vec![
        json!({"type": "object", "properties": {
            "city": {"type": "string", "pattern": "^[A-Z][a-z]+$", "maxLength": 12},
            "tags": {"type": "array", "items": {"type": "string", "enum": ["big", "old", "capital"]},
                     "minItems": 1, "maxItems": 3}},
            "required": ["city", "tags"], "additionalProperties": false}),
        json!({"type": "object", "properties": {
            "answer": {"enum": ["yes", "no"]},
            "detail": {"type": "object", "properties": {
                "score": {"type": "integer", "minimum": 0, "maximum": 9},
                "ok": {"type": "boolean"}},
                "required": ["score", "ok"], "additionalProperties": false}},
            "required": ["answer", "detail"], "additionalProperties": false}),
    ]
}

/// `schema`'s rules checked by hand on `v` (the e2e crate has no JSON Schema
/// validator; the openai test below runs the `jsonschema` package on the same output).
fn check_schema(i: usize, v: &Value) {
    let obj = v.as_object().expect("an object");
    match i {
        0 => {
            assert_eq!(obj.len(), 2, "{v}");
            let city = obj["city"].as_str().expect("city");
            assert!(
                city.len() <= 12 && city.chars().next().is_some_and(|c| c.is_ascii_uppercase())
            );
            assert!(
                city.chars().skip(1).all(|c| c.is_ascii_lowercase()),
                "{city}"
            );
            let tags = obj["tags"].as_array().expect("tags");
            assert!((1..=3).contains(&tags.len()), "{v}");
            assert!(tags
                .iter()
                .all(|t| ["big", "old", "capital"].contains(&t.as_str().unwrap_or(""))));
        }
        _ => {
            assert!(
                ["yes", "no"].contains(&obj["answer"].as_str().unwrap_or("")),
                "{v}"
            );
            let d = obj["detail"].as_object().expect("detail");
            assert!(
                d["score"].as_u64().is_some_and(|s| s <= 9) && d["ok"].is_boolean(),
                "{v}"
            );
            assert_eq!((obj.len(), d.len()), (2, 2), "{v}");
        }
    }
}

/// Greedy JSON-schema output parses and keeps every keyword, ending with `stop`, on
/// the default model and on random-weight tiny models; regex and Lark grammars too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn json_schema_regex_and_grammar_output_matches_and_ends() {
    let d = Daemon::start().expect("daemon");
    let tiny = workspace_root().join("../shared/fixtures/tiny-models");
    let daemons = [
        d,
        Daemon::start_model(&tiny.join("qwen3"), None, &[]).expect("qwen3"),
        Daemon::start_model(&tiny.join("gemma3"), None, &[]).expect("gemma3"),
    ];
    for (k, d) in daemons.iter().enumerate() {
        let mut c = d.connect().await.expect("ws");
        for (i, schema) in schemas().into_iter().enumerate() {
            let g = c
                .generate(chat(
                    &format!("j{k}{i}"),
                    json!({"max_tokens": 200, "response_format": {"type": "json_schema",
                        "json_schema": {"name": "t", "schema": schema, "strict": true}}}),
                ))
                .await
                .expect("generate");
            assert_eq!(
                g.finish_reason(),
                Some("stop"),
                "daemon {k} schema {i}: {g:?}"
            );
            let v: Value =
                serde_json::from_str(&g.text).unwrap_or_else(|e| panic!("{e}: {:?}", g.text));
            check_schema(i, &v);
        }
        let g = c
            .generate(chat(
                &format!("r{k}"),
                json!({"max_tokens": 40, "response_format": {"type": "regex", "regex": "(Paris|Lyon) [0-9]{2}"}}),
            ))
            .await
            .expect("regex");
        assert_eq!(g.finish_reason(), Some("stop"), "{g:?}");
        let (city, num) = g.text.split_once(' ').expect("two parts");
        assert!(
            ["Paris", "Lyon"].contains(&city) && num.len() == 2,
            "{:?}",
            g.text
        );
        // A complete grammar ends the turn even before min_tokens.
        let g = c
            .generate(chat(
                &format!("m{k}"),
                json!({"max_tokens": 20, "min_tokens": 5,
                       "response_format": {"type": "regex", "regex": "(yes|no)"}}),
            ))
            .await
            .expect("regex with min_tokens");
        assert_eq!(g.finish_reason(), Some("stop"), "{g:?}");
        assert!(["yes", "no"].contains(&g.text.as_str()), "{g:?}");
        let lark = "start: \"answer: \" (\"yes\" | \"no\")";
        let g = c
            .generate(chat(
                &format!("g{k}"),
                json!({"max_tokens": 40, "response_format": {"type": "grammar", "grammar": lark}}),
            ))
            .await
            .expect("grammar");
        assert!(
            ["answer: yes", "answer: no"].contains(&g.text.as_str()),
            "{g:?}"
        );
        let g = c
            .generate(chat(
                &format!("o{k}"),
                json!({"max_tokens": 200, "temperature": 0,
                "response_format": {"type": "json_object"}}),
            ))
            .await
            .expect("json_object");
        if g.finish_reason() == Some("stop") {
            assert!(
                serde_json::from_str::<Value>(&g.text).is_ok_and(|v| v.is_object()),
                "{g:?}"
            );
        } else {
            assert!(g.text.starts_with('{'), "{g:?}");
        }
    }
}

/// A schema keyword llguidance cannot enforce, a bad regex and a bad grammar are
/// refused before anything runs, naming the place; the daemon keeps serving.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn constraints_that_cannot_be_enforced_are_refused() {
    let d = Daemon::start().expect("daemon");
    let mut c = d.connect().await.expect("ws");
    let schema = json!({"type": "object", "properties": {"a": {"type": "string"}},
        "dependentSchemas": {"a": {"required": ["b"]}}});
    let rf = json!({"type": "json_schema", "json_schema": {"name": "x", "schema": schema}});
    let g = c
        .generate(chat("u", json!({"response_format": rf})))
        .await
        .expect("frames");
    assert_eq!(g.error_type(), Some("validation"), "{g:?}");
    let message = g.error.as_ref().expect("error")["error"]["message"]
        .as_str()
        .expect("message")
        .to_string();
    assert!(
        message.starts_with("response_format.json_schema.schema: ")
            && message.contains("dependentSchemas"),
        "{message}"
    );
    let r = post(
        &d,
        "/v1/chat/completions",
        &json!({"messages": [{"role": "user", "content": "hi"}], "response_format": rf}),
    );
    assert_eq!(r.status, 400, "{}", r.body);
    assert_eq!(r.json()["error"]["message"], json!(message));
    for (rf, start) in [
        (
            json!({"type": "json_schema", "json_schema": {"schema": {"type": "string", "maxLenght": 3}}}),
            "response_format.json_schema.schema: keyword \"maxLenght\" at # is not one inferd enforces",
        ),
        (json!({"type": "regex", "regex": "("}), "response_format.regex must be a valid regex: unclosed group (got \"(\")"),
        (json!({"type": "grammar", "grammar": "start: nothing_defined"}), "response_format.grammar: "),
        (json!({"type": "xml"}), "response_format.type must be one of text, json_object, json_schema, regex, grammar (got \"xml\")"),
        (json!({"type": "json_schema"}), "response_format.json_schema must be an object with a \"schema\""),
    ] {
        let g = c
            .generate(chat("b", json!({"response_format": rf})))
            .await
            .expect("frames");
        assert_eq!(g.error_type(), Some("validation"), "{g:?}");
        let m = g.error.as_ref().expect("error")["error"]["message"].as_str().unwrap_or("").to_string();
        assert!(m.starts_with(start), "{m}");
    }
    let ok = c.generate(chat("ok", json!({}))).await.expect("ok");
    assert_eq!(ok.finish_reason(), Some("length"));
}
