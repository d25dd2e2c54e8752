//! `echo` (the prompt back with its log-probabilities: teacher forcing) and `n` > 1
//! choices, on both edges: prompt scores against transformers' logits (tiny fixture
//! model, chunked prefill), a generation's log-probabilities against the echo of
//! prompt + generation, each of `n` choices against a request of one choice with that
//! choice's seed, the prompt prefilled once, and the validation errors.

use std::collections::BTreeMap;

use serde_json::{json, Value};

use inferd_e2e::{
    fixture, floats, ids_u64, log_softmax, workspace_root, Client, Daemon, HttpResponse,
};

/// Our log-probabilities against transformers' f32 logits (the tiny fixture): the
/// logits agree to about 1e-5, the log-normaliser adds as much again.
const REFERENCE_TOL: f64 = 1e-4;
/// A prompt row's log-probability against the same token's when it was generated: the
/// same kernels but for the rows' batching (prefill chunk vs one decode row), on the
/// tiny f32 fixture (measured 2e-6) and on the default Q4_1 model while prompt and
/// generation stay under 64 tokens (measured 0: the same bits).
const TEACHER_TOL: f64 = 1e-4;
/// The same on a GGUF model for an echoed prompt of 64 tokens or more, whose rows take
/// llama.cpp's tiled prefill attention (f32) where the decode steps took its one-row
/// kernel (f16 dot products and value accumulation): measured up to 0.16 on the default
/// Q4_1 model (typically 0.03–0.1 per token).
const TEACHER_TOL_TILED: f64 = 0.3;

fn post(d: &Daemon, path: &str, body: &Value) -> HttpResponse {
    d.http("POST", path, &[], Some(&body.to_string()))
        .expect("http")
}

/// The frames of one WebSocket request, by choice.
#[derive(Debug, Default)]
struct Frames {
    started: Option<Value>,
    echo: Option<Value>,
    /// Per choice index: concatenated text, token ids, logprob entries, `done`.
    text: BTreeMap<u64, String>,
    tokens: BTreeMap<u64, Vec<u64>>,
    logprobs: BTreeMap<u64, Vec<Value>>,
    done: BTreeMap<u64, Value>,
    error: Option<Value>,
}

/// Sends `req` and reads its frames until `n` choices are done (or an error).
async fn run(c: &mut Client, req: Value, n: usize) -> Frames {
    let id = req["id"].as_str().expect("id").to_string();
    c.send(&req).await.expect("send");
    let mut f = Frames::default();
    while f.done.len() < n && f.error.is_none() {
        let frame = c.recv().await.expect("frame");
        assert_eq!(frame["id"].as_str(), Some(id.as_str()), "{frame}");
        // Frames of a request of several choices carry their index; one choice's don't.
        let index = frame["index"].as_u64();
        assert_eq!(
            index.is_some(),
            n > 1 && matches!(frame["type"].as_str(), Some("delta" | "done")),
            "{frame}"
        );
        let index = index.unwrap_or(0);
        match frame["type"].as_str() {
            Some("started") => f.started = Some(frame),
            Some("echo") => {
                assert!(f.text.is_empty(), "the echo comes before any delta");
                f.echo = Some(frame);
            }
            Some("delta") => {
                f.text
                    .entry(index)
                    .or_default()
                    .push_str(frame["text"].as_str().unwrap_or_default());
                f.tokens
                    .entry(index)
                    .or_default()
                    .extend(ids_u64(&frame["token_ids"]));
                if let Some(lp) = frame["logprobs"].as_array() {
                    f.logprobs.entry(index).or_default().extend(lp.clone());
                }
            }
            Some("done") => {
                assert!(f.done.insert(index, frame).is_none(), "one done per choice");
            }
            Some("error") => f.error = Some(frame),
            other => panic!("unexpected frame type {other:?}"),
        }
    }
    f
}

fn tiny_llama() -> std::path::PathBuf {
    workspace_root().join("../shared/fixtures/tiny-models/llama")
}

/// The echo of a token-id prompt scores each token with `ln softmax` of transformers'
/// logits at the position before it (the first token: null), through a chunked
/// prefill (4 tokens per step here), on both edges, and again when the prompt's
/// blocks are in the prefix cache (a scored prompt does not read them).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn echo_scores_the_prompt_as_transformers_does() {
    let d = Daemon::start_model(
        &tiny_llama(),
        None,
        &[
            ("INFERD__SCHEDULER__MAX_RUNNING", "4"),
            ("INFERD__SCHEDULER__MAX_BATCH_TOKENS", "4"),
            ("INFERD__SCHEDULER__BLOCK_SIZE", "4"),
        ],
    )
    .expect("start");
    let reference = fixture("tiny-models/llama/reference.json");
    let seq = &reference["sequences"][1];
    assert_eq!(seq["name"], "len7");
    let prompt = ids_u64(&seq["input_ids"]);
    let rows: Vec<Vec<f64>> = seq["all_logits"]
        .as_array()
        .expect("all_logits")
        .iter()
        .map(|r| log_softmax(&floats(r)))
        .collect();
    let mut c = d.connect().await.expect("ws");
    let mut echo_text = Value::Null;
    for round in 0..2 {
        let f = run(
            &mut c,
            json!({"type": "generate", "id": format!("e{round}"), "prompt": prompt, "echo": true,
                   "max_tokens": 0, "logprobs": true, "top_logprobs": 5}),
            1,
        )
        .await;
        assert!(f.error.is_none(), "{f:?}");
        let done = &f.done[&0];
        assert_eq!(done["finish_reason"], "length", "{done}");
        assert_eq!(done["usage"]["completion_tokens"], 0, "{done}");
        assert_eq!(done["usage"]["cached_tokens"], 0, "{done}");
        assert!(f.tokens.is_empty(), "nothing generated: {f:?}");
        let echo = f.echo.expect("echo frame");
        assert_eq!(ids_u64(&echo["token_ids"]), prompt);
        echo_text = echo["text"].clone();
        let entries = echo["logprobs"].as_array().expect("logprobs");
        assert_eq!(entries.len(), prompt.len());
        assert_eq!(entries[0]["logprob"], Value::Null, "no context for token 0");
        assert_eq!(entries[0]["top_logprobs"], json!([]));
        for (i, e) in entries.iter().enumerate().skip(1) {
            assert_eq!(e["token_id"].as_u64(), Some(prompt[i]));
            let want = rows[i - 1][prompt[i] as usize];
            let got = e["logprob"].as_f64().expect("logprob");
            assert!(
                (got - want).abs() < REFERENCE_TOL,
                "token {i}: {got} vs {want}"
            );
            let top = e["top_logprobs"].as_array().expect("top");
            assert_eq!(top.len(), 5);
            let mut order: Vec<usize> = (0..rows[i - 1].len()).collect();
            order.sort_by(|&a, &b| rows[i - 1][b].total_cmp(&rows[i - 1][a]));
            for (k, t) in top.iter().enumerate() {
                let tid = t["token_id"].as_u64().expect("id") as usize;
                let lp = t["logprob"].as_f64().expect("lp");
                assert!((lp - rows[i - 1][tid]).abs() < REFERENCE_TOL, "{i}/{k}");
                assert!((rows[i - 1][order[k]] - rows[i - 1][tid]).abs() < REFERENCE_TOL);
            }
        }
    }

    // The completions shape: the same numbers, `null` first, text = the echo's text.
    let r = post(
        &d,
        "/v1/completions",
        &json!({"prompt": prompt, "echo": true, "max_tokens": 0, "logprobs": 2}),
    );
    assert_eq!(r.status, 200, "{}", r.body);
    let v = r.json();
    let choice = &v["choices"][0];
    assert_eq!(choice["finish_reason"], "length");
    let lp = &choice["logprobs"];
    assert_eq!(lp["token_logprobs"][0], Value::Null);
    assert_eq!(lp["top_logprobs"][0], Value::Null);
    assert_eq!(lp["tokens"].as_array().map(Vec::len), Some(prompt.len()));
    for i in 1..prompt.len() {
        let got = lp["token_logprobs"][i].as_f64().expect("lp");
        let want = rows[i - 1][prompt[i] as usize];
        assert!((got - want).abs() < REFERENCE_TOL, "token {i}");
        assert_eq!(lp["top_logprobs"][i].as_object().map(|m| m.len()), Some(2));
    }
    // Random weights' tokens hold parts of characters: the text is the echo frame's.
    assert_eq!(choice["text"], echo_text);
    assert_eq!(v["usage"]["completion_tokens"], 0);
    assert_eq!(v["usage"]["prompt_tokens"], prompt.len());
}

/// The log-probability of each generated token equals the one the echo of prompt +
/// generation gives it (teacher forcing), on the tiny f32 model and the default Q4_1
/// model, on the WebSocket and `/v1/completions`; with `max_tokens` > 0 the echo comes
/// first and the text starts with the prompt.
///
/// On a GGUF model an echoed prompt of 64 tokens or more takes llama.cpp's tiled
/// prefill attention (f32 accumulation) where the generation's decode steps took its
/// one-row kernel (f16 dot products and value accumulation, as llama-server): the
/// scores then differ by that arithmetic, bounded here by [`TEACHER_TOL_TILED`].
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn echoed_generation_scores_equal_its_generated_logprobs() {
    let short = "The capital of France is";
    let long = "The history of Paris spans more than two thousand years, from a Gallic \
                settlement on an island in the Seine to the capital of a modern republic. \
                Over the centuries the city grew around its river, and today the capital \
                of France is";
    for model in [Some(tiny_llama()), None] {
        let d = match &model {
            Some(m) => Daemon::start_model(m, None, &[]),
            None => Daemon::start(),
        }
        .expect("start");
        let mut c = d.connect().await.expect("ws");
        let cases: Vec<(Vec<u64>, f64)> = match model {
            Some(_) => vec![(vec![1000, 1011, 389, 175, 945, 107, 267], TEACHER_TOL)],
            None => {
                let mut cases = Vec::new();
                for (text, tol) in [(short, TEACHER_TOL), (long, TEACHER_TOL_TILED)] {
                    c.send(&json!({"type": "tokenize", "id": "t", "text": text}))
                        .await
                        .expect("send");
                    cases.push((ids_u64(&c.recv().await.expect("tokens")["token_ids"]), tol));
                }
                assert!(cases[0].0.len() + GENERATED < 64 && cases[1].0.len() + GENERATED >= 64);
                cases
            }
        };
        for (prompt, tol) in cases {
            teacher_forcing(&d, &mut c, &prompt, tol).await;
        }
    }
}

/// Tokens generated in [`teacher_forcing`].
const GENERATED: usize = 16;

async fn teacher_forcing(d: &Daemon, c: &mut Client, prompt: &[u64], tol: f64) {
    let gen = run(
        c,
        json!({"type": "generate", "id": "g", "prompt": prompt, "max_tokens": GENERATED,
               "min_tokens": GENERATED, "temperature": 0.9, "seed": 5, "logprobs": true,
               "top_logprobs": 2}),
        1,
    )
    .await;
    let generated = gen.tokens[&0].clone();
    let gen_lp = &gen.logprobs[&0];
    assert_eq!(gen_lp.len(), generated.len());
    let full: Vec<u64> = prompt.iter().chain(&generated).copied().collect();
    let scored = run(
        c,
        json!({"type": "generate", "id": "s", "prompt": full, "echo": true, "max_tokens": 0,
               "logprobs": true, "top_logprobs": 2}),
        1,
    )
    .await;
    let echo = scored.echo.expect("echo");
    let entries = echo["logprobs"].as_array().expect("entries");
    let mut worst = 0f64;
    for (k, g) in gen_lp.iter().enumerate() {
        let e = &entries[prompt.len() + k];
        assert_eq!(e["token_id"], g["token_id"]);
        let d = (e["logprob"].as_f64().expect("lp") - g["logprob"].as_f64().expect("lp")).abs();
        worst = worst.max(d);
        assert!(d < tol, "token {k}: |Δ| = {d} ≥ {tol}");
    }
    eprintln!(
        "teacher forcing, {} + {} tokens: max |Δlogprob| = {worst:e}",
        prompt.len(),
        generated.len()
    );

    // HTTP: the same entries past the prompt; the text is the prompt's then the
    // generation's.
    let r = post(
        d,
        "/v1/completions",
        &json!({"prompt": full, "echo": true, "max_tokens": 0, "logprobs": 2}),
    );
    assert_eq!(r.status, 200, "{}", r.body);
    let lp = &r.json()["choices"][0]["logprobs"];
    for (k, e) in entries.iter().enumerate().skip(1) {
        let got = &lp["token_logprobs"][k];
        assert_eq!(got, &e["logprob"], "the WebSocket's number, token {k}");
    }
    let r = post(
        d,
        "/v1/completions",
        &json!({"prompt": prompt, "echo": true, "max_tokens": GENERATED,
                "min_tokens": GENERATED, "temperature": 0.9, "seed": 5, "logprobs": 2}),
    );
    let v = r.json();
    let text = v["choices"][0]["text"].as_str().expect("text");
    let prompt_text = gen_prompt_text(c, prompt).await;
    assert_eq!(text, format!("{prompt_text}{}", gen.text[&0]), "{v}");
    let n_tokens = v["choices"][0]["logprobs"]["tokens"]
        .as_array()
        .map(Vec::len);
    assert_eq!(n_tokens, Some(prompt.len() + generated.len()));
    // Streamed: the first chunk is the prompt, the rest the generation.
    let body = json!({"prompt": prompt, "echo": true, "max_tokens": GENERATED,
        "min_tokens": GENERATED, "temperature": 0.9, "seed": 5, "stream": true});
    let chunks = post(d, "/v1/completions", &body).sse_data();
    assert_eq!(chunks[0]["choices"][0]["text"], json!(prompt_text));
    let streamed: String = chunks
        .iter()
        .filter_map(|c| c["choices"][0]["text"].as_str())
        .collect();
    assert_eq!(streamed, text);
}

/// The echo's text of `prompt` (token ids), as the daemon decodes them.
async fn gen_prompt_text(c: &mut Client, prompt: &[u64]) -> String {
    let f = run(
        c,
        json!({"type": "generate", "id": "pt", "prompt": prompt, "echo": true, "max_tokens": 0}),
        1,
    )
    .await;
    let echo = f.echo.expect("echo");
    assert!(echo.get("logprobs").is_none(), "no logprobs asked: {echo}");
    echo["text"].as_str().expect("text").to_string()
}

/// `stats.prompt_tokens_computed`.
async fn prefilled(c: &mut Client) -> u64 {
    c.stats().await.expect("stats")["prompt_tokens_computed"]
        .as_u64()
        .expect("prompt_tokens_computed")
}

/// Each of `n` = 3 sampled choices equals a request of one choice with that choice's
/// seed (seed + index): each has its own RNG. The prompt is prefilled once (the
/// engine's prefill counter moves by the prompt's length, whether the prompt ends on a
/// block boundary or inside a block). The whole HTTP response, its stream and the
/// WebSocket agree; usage counts the prompt once and sums the completions.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn n_choices_each_follow_their_own_seed_and_share_one_prefill() {
    let d = Daemon::start().expect("daemon");
    let mut c = d.connect().await.expect("ws");
    let mut stats = d.connect().await.expect("ws for stats");
    c.send(&json!({"type": "tokenize", "id": "t",
        "text": "Once upon a time, in a small village by the sea, there lived an old fisherman who"}))
        .await
        .expect("send");
    let long = ids_u64(&c.recv().await.expect("tokens")["token_ids"]);
    assert!(long.len() > 16, "{long:?}");
    for prompt in [long[..16].to_vec(), long[..long.len().min(21)].to_vec()] {
        let req = |id: &str, extra: Value| {
            let mut v = json!({"type": "generate", "id": id, "prompt": prompt,
                "max_tokens": 12, "temperature": 1.0, "top_k": 0, "top_p": 1.0, "min_p": 0.0,
                "seed": 42, "cache": false});
            for (k, x) in extra.as_object().expect("object") {
                v[k] = x.clone();
            }
            v
        };
        let before = prefilled(&mut stats).await;
        let many = run(&mut c, req("m", json!({"n": 3})), 3).await;
        assert!(many.error.is_none(), "{many:?}");
        assert_eq!(
            prefilled(&mut stats).await - before,
            prompt.len() as u64,
            "the prompt of {} tokens is prefilled once for 3 choices",
            prompt.len()
        );
        assert!(many.started.is_some());
        let mut singles = Vec::new();
        for i in 0..3u64 {
            let one = run(&mut c, req("o", json!({"seed": 42 + i})), 1).await;
            assert_eq!(
                many.tokens[&i],
                one.tokens[&0],
                "choice {i} = seed {}",
                42 + i
            );
            assert_eq!(many.text[&i], one.text[&0]);
            let (a, b) = (&many.done[&i], &one.done[&0]);
            assert_eq!(a["finish_reason"], b["finish_reason"]);
            assert_eq!(a["usage"], b["usage"]);
            singles.push(one.text[&0].clone());
        }
        assert!(
            singles[0] != singles[1] || singles[1] != singles[2],
            "sampled choices should differ: {singles:?}"
        );

        // HTTP, whole: the same texts by index; usage: prompt once, completions summed.
        let body = json!({"prompt": prompt, "max_tokens": 12, "temperature": 1.0, "top_k": 0,
            "top_p": 1.0, "min_p": 0.0, "seed": 42, "n": 3, "cache": false});
        let r = post(&d, "/v1/completions", &body);
        assert_eq!(r.status, 200, "{}", r.body);
        let v = r.json();
        let choices = v["choices"].as_array().expect("choices");
        assert_eq!(choices.len(), 3);
        let mut completion = 0;
        for (i, ch) in choices.iter().enumerate() {
            assert_eq!(ch["index"], i);
            assert_eq!(ch["text"], json!(singles[i]));
            assert_eq!(ch["finish_reason"], many.done[&(i as u64)]["finish_reason"]);
            completion += many.done[&(i as u64)]["usage"]["completion_tokens"]
                .as_u64()
                .expect("n");
        }
        assert_eq!(v["usage"]["prompt_tokens"], prompt.len());
        assert_eq!(v["usage"]["completion_tokens"], completion);
        assert_eq!(v["usage"]["total_tokens"], prompt.len() as u64 + completion);

        // HTTP, streamed: chunks carry their choice's index; each index's text and
        // finish_reason equal the whole response's; the usage chunk comes once, last.
        let mut sbody = body.clone();
        sbody["stream"] = json!(true);
        sbody["stream_options"] = json!({"include_usage": true});
        let chunks = post(&d, "/v1/completions", &sbody).sse_data();
        let mut texts = vec![String::new(); 3];
        let mut finish = vec![Value::Null; 3];
        for ch in &chunks {
            let Some(c0) = ch["choices"].get(0) else {
                continue;
            };
            let i = c0["index"].as_u64().expect("index") as usize;
            texts[i].push_str(c0["text"].as_str().unwrap_or_default());
            if !c0["finish_reason"].is_null() {
                assert!(finish[i].is_null(), "one finish per choice");
                finish[i] = c0["finish_reason"].clone();
            }
        }
        for i in 0..3 {
            assert_eq!(texts[i], singles[i], "streamed choice {i}");
            assert_eq!(finish[i], choices[i]["finish_reason"]);
        }
        let usage: Vec<&Value> = chunks.iter().filter(|c| !c["usage"].is_null()).collect();
        assert_eq!(usage.len(), 1);
        assert_eq!(usage[0]["usage"], v["usage"]);
        let last = chunks.iter().rev().find(|c| c.is_object());
        assert_eq!(last.map(|c| &c["usage"]), Some(&v["usage"]), "usage last");
        assert_eq!(chunks.last(), Some(&json!("[DONE]")));
    }

    // Chat: n choices with their role chunk each; greedy choices are all the same.
    let body = json!({"messages": [{"role": "user", "content": "Name a colour."}],
        "max_tokens": 6, "temperature": 0, "n": 2});
    let v = post(&d, "/v1/chat/completions", &body).json();
    let choices = v["choices"].as_array().expect("choices");
    assert_eq!(choices.len(), 2);
    assert_eq!(
        choices[0]["message"]["content"],
        choices[1]["message"]["content"]
    );
    let mut sbody = body.clone();
    sbody["stream"] = json!(true);
    let roles = post(&d, "/v1/chat/completions", &sbody)
        .sse_data()
        .iter()
        .filter(|c| c["choices"][0]["delta"]["role"] == "assistant")
        .map(|c| c["choices"][0]["index"].as_u64().expect("index"))
        .collect::<Vec<_>>();
    assert_eq!(roles, vec![0, 1]);

    // /metrics follows the engine's prefill counter (nothing runs now).
    let engine = prefilled(&mut stats).await;
    let m = d.http("GET", "/metrics", &[], None).expect("metrics").body;
    let line = m
        .lines()
        .find(|l| l.starts_with("inferd_prefill_tokens_total "))
        .expect("prefill metric");
    assert_eq!(line, format!("inferd_prefill_tokens_total {engine}"));
}

/// A sampler plugin (mirostat, whose state follows its sequence) gets an instance per
/// choice, seeded with the choice's seed; echo with `n` starts every choice with the
/// prompt; `max_tokens: 0` with `n` ends every choice at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn choices_with_plugins_and_echo() {
    let d = Daemon::start().expect("daemon");
    let mut c = d.connect().await.expect("ws");
    let req = |id: &str, seed: u64, n: u64| {
        json!({"type": "generate", "id": id, "prompt": "Once upon a time", "max_tokens": 16,
               "seed": seed, "n": n, "plugins": [{"name": "mirostat", "config": {"tau": 5.0, "eta": 0.1}}]})
    };
    let many = run(&mut c, req("m", 7, 2), 2).await;
    assert!(many.error.is_none(), "{many:?}");
    for i in 0..2u64 {
        let one = run(&mut c, req("o", 7 + i, 1), 1).await;
        assert_eq!(many.tokens[&i], one.tokens[&0], "choice {i}");
    }

    let r = post(
        &d,
        "/v1/completions",
        &json!({"prompt": "Hello there", "echo": true, "n": 3, "max_tokens": 0}),
    );
    assert_eq!(r.status, 200, "{}", r.body);
    let v = r.json();
    let choices = v["choices"].as_array().expect("choices");
    assert_eq!(choices.len(), 3);
    for ch in choices {
        assert_eq!(ch["text"], "Hello there");
        assert_eq!(ch["finish_reason"], "length");
    }
    assert_eq!(v["usage"]["completion_tokens"], 0);
    let f = run(
        &mut c,
        json!({"type": "generate", "id": "e", "prompt": "Hello there", "echo": true, "n": 2,
               "max_tokens": 3, "temperature": 0}),
        2,
    )
    .await;
    assert_eq!(f.echo.expect("one echo")["text"], "Hello there");
    assert_eq!(f.tokens[&0], f.tokens[&1], "greedy choices agree");
}

/// Bounds of `n` and `echo` on both edges: the message names the field, the bound and
/// the value.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_choice_values_are_refused_on_both_edges() {
    let d = Daemon::start().expect("daemon");
    let mut c = d.connect().await.expect("ws");
    let chat = json!([{"role": "user", "content": "hi"}]);
    for (input, extra, message) in [
        ("prompt", json!({"n": 17}), "n must be <= 16 (got 17)"),
        ("prompt", json!({"n": 0}), "n must be >= 1 (got 0)"),
        (
            "messages",
            json!({"echo": true}),
            "echo must be false with messages (got true): echo returns a completion \
             prompt's tokens, so it needs prompt",
        ),
        (
            "prompt",
            json!({"max_tokens": 0}),
            "max_tokens must be >= 1 (got 0); 0 is allowed only with echo: true \
             (score the prompt without generating)",
        ),
        (
            "prompt",
            json!({"echo": 1}),
            "echo must be a boolean (got 1)",
        ),
    ] {
        let mut frame = json!({"type": "generate", "id": "bad"});
        let mut body = json!({});
        let value = if input == "prompt" {
            json!("x")
        } else {
            chat.clone()
        };
        frame[input] = value.clone();
        body[input] = value;
        for (k, v) in extra.as_object().expect("object") {
            frame[k] = v.clone();
            body[k] = v.clone();
        }
        let f = run(&mut c, frame, 1).await;
        let e = f.error.expect("error frame");
        assert_eq!(e["error"]["type"], "validation");
        assert_eq!(e["error"]["message"], message);
        let path = if input == "prompt" {
            "/v1/completions"
        } else {
            "/v1/chat/completions"
        };
        let r = post(&d, path, &body);
        assert_eq!(r.status, 400, "{}", r.body);
        assert_eq!(r.json()["error"]["message"], message);
    }
}
