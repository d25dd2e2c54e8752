//! Speculative decoding end to end on the default model (n-gram prompt lookup, on by
//! default): the same tokens with and without it (greedy and seeded sampling, alone and
//! batched), a stop sequence inside an accepted run, `max_tokens` reached mid-run, a
//! cancel mid-verification returning every block, a JSON schema that still validates,
//! and the counters in `usage`, `stats`, `/metrics` and the OpenAI usage.

use std::time::Duration;

use inferd_e2e::{Client, Daemon, Generation};
use serde_json::{json, Value};

/// An extractive prompt: the answer repeats (part of) a list from the prompt, so the
/// lookup's drafts are mostly accepted.
const LIST: &str = "Repeat this list exactly, one item per line:\n\
    apples\nbananas\ncherries\ndates\nelderberries\nfigs\ngrapes\nhoneydew melons\n\
    kiwis\nlemons\nmangoes\nnectarines\noranges\npapayas\nquinces\nraspberries";

/// The default model's daemon with the verification row cost pinned (instead of
/// measured), so that the drafts these tests need run however loaded the machine is.
fn daemon(env: &[(&str, &str)]) -> Daemon {
    let mut env = env.to_vec();
    env.push(("INFERD__SPECULATIVE__ROW_COST", "0.2"));
    Daemon::start_with_env(&env).expect("daemon")
}

fn chat(id: &str, content: &str, max_tokens: u64, extra: Value) -> Value {
    let mut v = json!({"type": "generate", "id": id, "max_tokens": max_tokens,
                       "temperature": 0, "messages": [{"role": "user", "content": content}]});
    if let (Some(o), Some(e)) = (v.as_object_mut(), extra.as_object()) {
        o.extend(e.clone());
    }
    v
}

/// Runs `req` with speculation on and off (in that order, one connection).
async fn on_and_off(c: &mut Client, req: Value) -> (Generation, Generation) {
    let mut on = req.clone();
    on["speculative"] = json!(true);
    on["id"] = json!("on");
    let mut off = req;
    off["speculative"] = json!(false);
    off["id"] = json!("off");
    let a = c.generate(on).await.expect("on");
    let b = c.generate(off).await.expect("off");
    (a, b)
}

fn usage(g: &Generation, field: &str) -> u64 {
    g.done.as_ref().expect("done")["usage"][field]
        .as_u64()
        .unwrap_or_else(|| panic!("usage.{field} in {:?}", g.done))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn greedy_tokens_are_the_same_with_and_without_speculation() {
    let d = daemon(&[]);
    let mut c = d.connect().await.expect("ws");
    for (i, prompt) in [
        LIST,
        "Write a short poem about the sea.",
        "What is 12 times 7?",
    ]
    .iter()
    .enumerate()
    {
        let (on, off) = on_and_off(&mut c, chat("x", prompt, 96, json!({}))).await;
        assert_eq!(on.token_ids, off.token_ids, "prompt {i}");
        assert_eq!(on.text, off.text, "prompt {i}");
        assert_eq!(on.finish_reason(), off.finish_reason(), "prompt {i}");
        assert_eq!(usage(&off, "draft_tokens"), 0);
        assert_eq!(usage(&off, "accepted_draft_tokens"), 0);
        assert!(usage(&on, "accepted_draft_tokens") <= usage(&on, "draft_tokens"));
    }
    // The list is copied: most of its tokens came from accepted drafts.
    let (on, _) = on_and_off(&mut c, chat("x", LIST, 96, json!({}))).await;
    let accepted = usage(&on, "accepted_draft_tokens");
    let n = usage(&on, "completion_tokens");
    assert!(2 * accepted > n, "{accepted} of {n} tokens from drafts");
    // Engine counters follow.
    let mut s = d.connect().await.expect("ws");
    let st = s.stats().await.expect("stats");
    let sp = &st["speculative"];
    assert_eq!(sp["method"], "ngram");
    assert!(
        sp["accepted_tokens"].as_u64().unwrap_or(0) >= accepted,
        "{sp}"
    );
    assert!(sp["acceptance_rate"].as_f64().unwrap_or(0.0) > 0.0, "{sp}");
    assert!(
        sp["tokens_per_verification"].as_f64().unwrap_or(0.0) > 1.0,
        "{sp}"
    );
}

/// Seeded sampling draws one uniform per token in the same order either way.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn seeded_sampled_tokens_are_the_same_with_and_without_speculation() {
    let d = daemon(&[]);
    let mut c = d.connect().await.expect("ws");
    for seed in [1u64, 7, 42] {
        let req = chat(
            "x",
            LIST,
            64,
            json!({"temperature": 0.7, "top_k": 40, "seed": seed}),
        );
        let (on, off) = on_and_off(&mut c, req).await;
        assert_eq!(on.token_ids, off.token_ids, "seed {seed}");
        assert!(usage(&on, "draft_tokens") > 0, "seed {seed}: no drafts");
    }
}

/// Four extractive streams at once (within `speculative.max_running`, raised to 4) give
/// the tokens each gives alone without speculation.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batched_speculative_streams_equal_their_solo_runs() {
    let d = daemon(&[("INFERD__SPECULATIVE__MAX_RUNNING", "4")]);
    let prompts: Vec<String> = (0..4)
        .map(|i| format!("{LIST}\nstrawberries {i}"))
        .collect();
    let mut solo = Vec::new();
    let mut c = d.connect().await.expect("ws");
    for p in &prompts {
        let g = c
            .generate(chat(
                "solo",
                p,
                64,
                json!({"speculative": false, "cache": false}),
            ))
            .await
            .expect("solo");
        solo.push(g.token_ids);
    }
    let url = d.url.clone();
    let handles: Vec<_> = prompts
        .iter()
        .map(|p| {
            let (url, req) = (url.clone(), chat("b", p, 64, json!({"cache": false})));
            tokio::spawn(async move {
                let mut c = Client::connect(&url).await.expect("connect");
                c.generate(req).await.expect("generate")
            })
        })
        .collect();
    for (i, h) in handles.into_iter().enumerate() {
        let g = h.await.expect("join");
        assert_eq!(g.token_ids, solo[i], "stream {i}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stop_sequence_inside_an_accepted_run_ends_where_it_would_without() {
    let d = daemon(&[]);
    let mut c = d.connect().await.expect("ws");
    // The default model copies the list's start, then repeats "grapes, " (greedy); the
    // stop string lies deep in that repetition, where the lookup's drafts are accepted.
    let stop = "grapes, grapes, grapes, grapes, grapes";
    let (on, off) = on_and_off(&mut c, chat("x", LIST, 96, json!({"stop": [stop]}))).await;
    assert_eq!(off.finish_reason(), Some("stop"), "{:?}", off.text);
    assert!(off.text.contains("bananas") && !off.text.contains(stop));
    assert_eq!(on.text, off.text);
    assert_eq!(on.token_ids, off.token_ids);
    assert_eq!(on.finish_reason(), Some("stop"));
    assert!(usage(&on, "accepted_draft_tokens") > 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn max_tokens_reached_mid_run_gives_exactly_max_tokens() {
    let d = daemon(&[]);
    let mut c = d.connect().await.expect("ws");
    for max in [13u64, 30, 31] {
        let (on, off) = on_and_off(&mut c, chat("x", LIST, max, json!({}))).await;
        assert_eq!(on.finish_reason(), Some("length"), "max {max}");
        assert_eq!(usage(&on, "completion_tokens"), max);
        assert_eq!(on.token_ids, off.token_ids, "max {max}");
    }
}

/// A cancel while drafts are being verified: the stream ends `cancelled` and every
/// block returns (cached prefix blocks count as free).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancel_mid_verification_returns_every_block() {
    let d = daemon(&[]);
    let mut c = d.connect().await.expect("ws");
    let long = format!("{LIST}\n{LIST}\n{LIST}");
    c.send(&chat("r", &long, 400, json!({})))
        .await
        .expect("send");
    let mut deltas = 0;
    while deltas < 5 {
        let f = c.recv().await.expect("frame");
        if f["type"] == "delta" {
            deltas += 1;
        }
        assert_ne!(f["type"], "done", "finished before the cancel: {f}");
    }
    c.send(&json!({"type": "cancel", "id": "r"}))
        .await
        .expect("cancel");
    let mut g = Generation::default();
    loop {
        let f = c.recv().await.expect("frame");
        if g.absorb(f) {
            break;
        }
    }
    assert_eq!(g.finish_reason(), Some("cancelled"));
    let mut s = d.connect().await.expect("ws");
    let mut used = u64::MAX;
    for _ in 0..50 {
        used = s.stats().await.expect("stats")["kv_blocks_used"]
            .as_u64()
            .unwrap_or(u64::MAX);
        if used == 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(used, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_json_schema_still_validates_with_speculation() {
    let d = daemon(&[]);
    let mut c = d.connect().await.expect("ws");
    let schema = json!({"type": "object", "properties": {
        "fruits": {"type": "array", "items": {"type": "string"}, "minItems": 3, "maxItems": 6}},
        "required": ["fruits"], "additionalProperties": false});
    let req = chat(
        "x",
        &format!("{LIST}\nAnswer in JSON with the first fruits."),
        200,
        json!({"response_format": {"type": "json_schema", "json_schema": {"name": "f", "schema": schema}}}),
    );
    let (on, off) = on_and_off(&mut c, req).await;
    assert_eq!(on.token_ids, off.token_ids);
    assert_eq!(on.finish_reason(), Some("stop"), "{}", on.text);
    let v: Value = serde_json::from_str(&on.text).expect("JSON");
    let fruits = v["fruits"].as_array().expect("fruits");
    assert!((3..=6).contains(&fruits.len()), "{v}");
    assert!(fruits.iter().all(Value::is_string), "{v}");
}

/// The OpenAI edge: predicted-output counts in `usage`, `speculative: false` honoured,
/// and the Prometheus counters.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn openai_usage_and_metrics_count_the_drafts() {
    let d = daemon(&[]);
    let body = |spec: bool| {
        json!({"model": "SmolLM2-135M-Instruct.Q4_1", "max_tokens": 64, "temperature": 0,
               "speculative": spec, "messages": [{"role": "user", "content": LIST}]})
        .to_string()
    };
    let on = d
        .http("POST", "/v1/chat/completions", &[], Some(&body(true)))
        .expect("on");
    let off = d
        .http("POST", "/v1/chat/completions", &[], Some(&body(false)))
        .expect("off");
    assert_eq!(on.status, 200, "{}", on.body);
    let (u_on, u_off) = (on.json()["usage"].clone(), off.json()["usage"].clone());
    let accepted = u_on["completion_tokens_details"]["accepted_prediction_tokens"]
        .as_u64()
        .expect("accepted");
    assert!(accepted > 0, "{u_on}");
    assert!(u_on["completion_tokens_details"]["rejected_prediction_tokens"].is_u64());
    assert_eq!(
        u_off["completion_tokens_details"]["accepted_prediction_tokens"],
        0
    );
    assert_eq!(
        on.json()["choices"][0]["message"]["content"],
        off.json()["choices"][0]["message"]["content"]
    );
    let m = d.http("GET", "/metrics", &[], None).expect("metrics").body;
    let value = |name: &str| -> f64 {
        m.lines()
            .find_map(|l| l.strip_prefix(name)?.trim().parse().ok())
            .unwrap_or_else(|| panic!("no {name} in\n{m}"))
    };
    assert!(value("inferd_spec_decode_num_accepted_tokens_total ") >= accepted as f64);
    assert!(value("inferd_spec_decode_num_draft_tokens_total ") >= accepted as f64);
    assert!(value("inferd_spec_decode_num_drafts_total ") >= 1.0);
    assert!(value("inferd_spec_decode_acceptance_rate ") > 0.0);
}

/// `speculative` must be a boolean on both edges.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn speculative_must_be_a_boolean() {
    let d = daemon(&[]);
    let mut c = d.connect().await.expect("ws");
    let g = c
        .generate(chat("x", "Hi", 4, json!({"speculative": "yes"})))
        .await
        .expect("gen");
    assert_eq!(g.error_type(), Some("validation"));
    let msg = g.error.as_ref().expect("error")["error"]["message"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    assert_eq!(msg, "speculative must be a boolean (got \"yes\")");
    let r = d
        .http(
            "POST",
            "/v1/chat/completions",
            &[],
            Some(
                &json!({"model": "SmolLM2-135M-Instruct.Q4_1", "speculative": 1,
                        "messages": [{"role": "user", "content": "Hi"}]})
                .to_string(),
            ),
        )
        .expect("http");
    assert_eq!(r.status, 400);
    assert_eq!(r.json()["error"]["param"], "speculative");
}
