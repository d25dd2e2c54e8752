//! LoRA adapters end to end on the default model, with the GGUF adapters of
//! `scripts/lora-gguf.sh files` (F16 rank 8, Q8_0 rank 8, F32 rank 4; in
//! `~/.cache/inferd/lora` or `INFERD_LORA_DIR`): one batch mixing four adapters and the
//! base gives every stream its solo tokens; adapters beyond `lora.max_loras` queue and
//! still match; the prefix cache never serves one adapter's blocks to another or to the
//! base, in memory or across a restart; load, unload, `/v1/models`, metrics and bad
//! input.

use std::path::PathBuf;
use std::time::Duration;

use inferd_e2e::{concurrently, Daemon, Generation, TOPICS};
use serde_json::{json, Value};

fn lora_dir() -> PathBuf {
    if let Some(d) = std::env::var_os("INFERD_LORA_DIR") {
        return PathBuf::from(d);
    }
    let home = std::env::var_os("HOME")
        .map(PathBuf::from)
        .unwrap_or_default();
    home.join(".cache/inferd/lora")
}

fn adapter(file: &str) -> String {
    let p = lora_dir().join(file);
    assert!(
        p.is_file(),
        "{} missing: run scripts/lora-gguf.sh files",
        p.display()
    );
    p.display().to_string()
}

/// `--lora-modules` for adapters a (F16), b (Q8_0), c (F32 rank 4) and d (the F16 file
/// again, which the tests use at scale 0.5).
fn modules() -> Vec<String> {
    let mut args = Vec::new();
    for (name, file) in [
        ("a", "smollm2-lora-f16.gguf"),
        ("b", "smollm2-lora-q8_0.gguf"),
        ("c", "smollm2-lora-f32-r4.gguf"),
        ("d", "smollm2-lora-f16.gguf"),
    ] {
        args.push("--lora-modules".to_string());
        args.push(format!("{name}={}", adapter(file)));
    }
    args
}

fn start(max_loras: &str, env: &[(&str, &str)]) -> Daemon {
    let args = modules();
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let mut env = env.to_vec();
    env.push(("INFERD__LORA__MAX_LORAS", max_loras));
    env.push(("INFERD__SPECULATIVE__METHOD", "off"));
    Daemon::start_args(&args, &env).expect("daemon")
}

/// A greedy chat request; `adapter` `None` for the base, with its scale.
fn chat(id: &str, content: &str, adapter: Option<(&str, f64)>, max_tokens: u64) -> Value {
    let mut r = json!({"type":"generate","id":id,"messages":[{"role":"user","content":content}],
                       "max_tokens":max_tokens,"temperature":0});
    if let Some((name, scale)) = adapter {
        r["adapter"] = json!(name);
        if scale != 1.0 {
            r["lora_scale"] = json!(scale);
        }
    }
    r
}

const KINDS: [Option<(&str, f64)>; 5] = [
    None,
    Some(("a", 1.0)),
    Some(("b", 1.0)),
    Some(("c", 1.0)),
    Some(("d", 0.5)),
];

fn sixteen() -> Vec<Value> {
    TOPICS
        .iter()
        .enumerate()
        .map(|(i, t)| {
            chat(
                &format!("g{i}"),
                &format!("Write one sentence about {t}."),
                KINDS[i % KINDS.len()],
                16,
            )
        })
        .collect()
}

async fn solo_and_together(
    daemon: &Daemon,
    reqs: Vec<Value>,
) -> (Vec<Generation>, Vec<Generation>) {
    let mut c = daemon.connect().await.expect("connect");
    let mut solo = Vec::new();
    for r in &reqs {
        // Each solo run without the prefix cache, so the batch's run computes the same.
        let mut r = r.clone();
        r["cache"] = json!(false);
        solo.push(c.generate(r).await.expect("solo"));
    }
    let reqs = reqs
        .into_iter()
        .map(|mut r| {
            r["cache"] = json!(false);
            r
        })
        .collect();
    (solo, concurrently(&daemon.url, reqs).await)
}

#[tokio::test]
async fn sixteen_streams_over_four_adapters_and_the_base_equal_their_solo_runs() {
    let daemon = start("4", &[]);
    let (solo, together) = solo_and_together(&daemon, sixteen()).await;
    for (i, (s, t)) in solo.iter().zip(&together).enumerate() {
        assert!(
            s.error.is_none() && t.error.is_none(),
            "g{i}: {:?} {:?}",
            s.error,
            t.error
        );
        assert_eq!(
            s.token_ids,
            t.token_ids,
            "g{i} ({:?})",
            KINDS[i % KINDS.len()]
        );
        assert_eq!(s.token_ids.len(), 16, "g{i}");
    }
    // The adapters change the output: the same prompt under each kind differs.
    let mut c = daemon.connect().await.expect("connect");
    let mut outs = Vec::new();
    for (k, kind) in KINDS.iter().enumerate() {
        let g = c
            .generate(chat(
                &format!("k{k}"),
                "Write one sentence about the sea.",
                *kind,
                16,
            ))
            .await
            .expect("kind");
        outs.push(g.token_ids);
    }
    for i in 0..outs.len() {
        for j in i + 1..outs.len() {
            assert_ne!(
                outs[i], outs[j],
                "{:?} and {:?} gave the same tokens",
                KINDS[i], KINDS[j]
            );
        }
    }
}

#[tokio::test]
async fn adapters_beyond_max_loras_wait_for_a_slot_and_still_match() {
    let daemon = start("1", &[]);
    let reqs: Vec<Value> = sixteen().into_iter().take(10).collect();
    let (solo, together) = solo_and_together(&daemon, reqs).await;
    for (i, (s, t)) in solo.iter().zip(&together).enumerate() {
        assert!(t.error.is_none(), "g{i}: {:?}", t.error);
        assert_eq!(s.token_ids, t.token_ids, "g{i}");
    }
    let st = daemon
        .http("GET", "/metrics", &[], None)
        .expect("metrics")
        .body;
    assert!(
        st.lines().any(|l| l.starts_with(
            "inferd_lora_requests_info{max_lora=\"1\",running_lora_adapters=\"\",waiting_lora_adapters=\"\"}"
        )),
        "{st}"
    );
    // Ten requests of five kinds, solo and together: each adapter named four times.
    for (name, n) in [("a", 4), ("b", 4), ("c", 4), ("d", 4)] {
        let want = format!("inferd_lora_requests_total{{adapter=\"{name}\"}} {n}");
        assert!(st.lines().any(|l| l == want), "{want} in\n{st}");
    }
}

fn long_prompt() -> String {
    let mut s = String::new();
    for i in 0..12 {
        s.push_str(&format!(
            "Lighthouse {i} stands on a rock. Its keeper writes the weather, the ships and \
             the oil burned each night into a log that nobody reads. "
        ));
    }
    s
}

fn completion(id: &str, prompt: &str, adapter: Option<&str>) -> Value {
    let mut r = json!({"type":"generate","id":id,"prompt":prompt,"max_tokens":8,"temperature":0});
    if let Some(a) = adapter {
        r["adapter"] = json!(a);
    }
    r
}

fn cached(g: &Generation) -> u64 {
    assert!(g.error.is_none(), "{:?}", g.error);
    g.done.as_ref().expect("done")["usage"]["cached_tokens"]
        .as_u64()
        .expect("cached_tokens")
}

#[tokio::test]
async fn the_prefix_cache_keeps_each_adapter_apart_in_memory_and_on_disk() {
    let store = tempfile::tempdir().expect("store");
    let store_path = store.path().display().to_string();
    let env = [("INFERD__PREFIX_STORE__PATH", store_path.as_str())];
    let prompt = long_prompt();
    let mut solo = std::collections::HashMap::new();
    {
        let daemon = start("4", &env);
        let mut c = daemon.connect().await.expect("connect");
        // Solo tokens without the cache, for each of a, b and the base.
        for k in [Some("a"), Some("b"), None] {
            let mut r = completion("s", &prompt, k);
            r["cache"] = json!(false);
            solo.insert(k, c.generate(r).await.expect("solo").token_ids);
        }
        let first = c
            .generate(completion("a1", &prompt, Some("a")))
            .await
            .expect("a1");
        assert_eq!(cached(&first), 0);
        assert_eq!(first.token_ids, solo[&Some("a")]);
        let again = c
            .generate(completion("a2", &prompt, Some("a")))
            .await
            .expect("a2");
        assert!(
            cached(&again) > 100,
            "a's own prefix is reused: {}",
            cached(&again)
        );
        assert_eq!(again.token_ids, solo[&Some("a")]);
        for (k, id) in [(Some("b"), "b1"), (None, "base1")] {
            let g = c.generate(completion(id, &prompt, k)).await.expect("other");
            assert_eq!(cached(&g), 0, "{id}: nothing of a's cache");
            assert_eq!(g.token_ids, solo[&k], "{id}");
        }
        // The same adapter file under another scale is another cache.
        let mut half = completion("a-half", &prompt, Some("a"));
        half["lora_scale"] = json!(0.5);
        assert_eq!(cached(&c.generate(half).await.expect("half")), 0);
    }
    // Across a restart the disk tier serves a's blocks to a only.
    let daemon = start("4", &env);
    let mut c = daemon.connect().await.expect("connect");
    let g = c
        .generate(completion("c1", &prompt, Some("c")))
        .await
        .expect("c1");
    assert_eq!(cached(&g), 0, "c never ran this prompt");
    let g = c
        .generate(completion("a3", &prompt, Some("a")))
        .await
        .expect("a3");
    assert!(cached(&g) > 100, "a's blocks from disk: {}", cached(&g));
    assert_eq!(g.token_ids, solo[&Some("a")]);
}

#[tokio::test]
async fn models_load_unload_and_bad_input_over_http_and_websocket() {
    let daemon = start("4", &[]);
    let models = daemon
        .http("GET", "/v1/models", &[], None)
        .expect("models")
        .json();
    let data = models["data"].as_array().expect("data");
    let base = data[0]["id"].as_str().expect("base id").to_string();
    assert_eq!(data[0]["parent"], Value::Null);
    let names: Vec<&str> = data[1..].iter().filter_map(|m| m["id"].as_str()).collect();
    assert_eq!(names, ["a", "b", "c", "d"]);
    assert!(
        data[1..].iter().all(|m| m["parent"] == json!(base)),
        "{models}"
    );
    let one = daemon
        .http("GET", "/v1/models/b", &[], None)
        .expect("model b");
    assert_eq!(one.status, 200);
    assert!(one.json()["root"]
        .as_str()
        .expect("root")
        .ends_with("smollm2-lora-q8_0.gguf"));

    // OpenAI `model: a` gives adapter a's tokens, and the response names it.
    let mut c = daemon.connect().await.expect("connect");
    let ws = c
        .generate(chat("w", "Say hello.", Some(("a", 1.0)), 12))
        .await
        .expect("ws");
    let body = json!({"model":"a","messages":[{"role":"user","content":"Say hello."}],
                      "max_tokens":12,"temperature":0,"logprobs":true})
    .to_string();
    let r = daemon
        .http("POST", "/v1/chat/completions", &[], Some(&body))
        .expect("chat");
    assert_eq!(r.status, 200, "{}", r.body);
    let j = r.json();
    assert_eq!(j["model"], "a");
    let text = j["choices"][0]["message"]["content"]
        .as_str()
        .expect("content");
    assert_eq!(text, ws.text);

    // Unknown names: 404 model_not_found naming it and what is served.
    let body = json!({"model":"nope","messages":[{"role":"user","content":"hi"}]}).to_string();
    let r = daemon
        .http("POST", "/v1/chat/completions", &[], Some(&body))
        .expect("404");
    assert_eq!(r.status, 404, "{}", r.body);
    let e = r.json();
    assert_eq!(e["error"]["code"], "model_not_found");
    let msg = e["error"]["message"].as_str().expect("message");
    assert!(
        msg.contains("\"nope\"") && msg.contains("\"a\", \"b\", \"c\", \"d\""),
        "{msg}"
    );
    let g = c
        .generate(chat("x", "hi", Some(("nope", 1.0)), 4))
        .await
        .expect("ws 404");
    assert_eq!(g.error_type(), Some("model_not_found"), "{:?}", g.error);
    let msg = g.error.as_ref().map(|e| e["error"]["message"].clone());
    assert!(
        msg.as_ref()
            .and_then(Value::as_str)
            .is_some_and(|m| m.starts_with("adapter: no model or LoRA adapter is named \"nope\"")),
        "{msg:?}"
    );
    // The base model's name as the WebSocket's adapter means no adapter, as OpenAI
    // `model` does.
    let plain = c
        .generate(chat("p", "Say hello.", None, 8))
        .await
        .expect("base");
    let named = c
        .generate(chat("q", "Say hello.", Some((&base, 1.0)), 8))
        .await
        .expect("base by name");
    assert!(named.error.is_none(), "{:?}", named.error);
    assert_eq!(named.token_ids, plain.token_ids);
    let g = c
        .generate(json!({"type":"generate","id":"y","prompt":"hi","lora_scale":2}))
        .await
        .expect("scale without adapter");
    assert_eq!(g.error_type(), Some("validation"));

    // Load a fifth under a new name; bad loads are refused naming what is wrong.
    let load = |name: &str, path: &str| {
        let body = json!({"lora_name": name, "lora_path": path}).to_string();
        daemon
            .http("POST", "/v1/load_lora_adapter", &[], Some(&body))
            .expect("load")
    };
    let r = load("e", &adapter("smollm2-lora-f32-r4.gguf"));
    assert_eq!(r.status, 200, "{}", r.body);
    assert!(r.body.contains("'e' added"), "{}", r.body);
    let g = c
        .generate(chat("e", "Say hello.", Some(("e", 1.0)), 4))
        .await
        .expect("e");
    assert!(g.error.is_none(), "{:?}", g.error);
    let r = load("e", &adapter("smollm2-lora-f32-r4.gguf"));
    assert_eq!(r.status, 400);
    let e = r.json();
    assert_eq!(
        (e["error"]["message"].clone(), e["error"]["param"].clone()),
        (
            json!("lora_name \"e\": an adapter of this name is already loaded (unload it first)"),
            json!("lora_name")
        )
    );
    let r = load(&base, &adapter("smollm2-lora-f32-r4.gguf"));
    assert_eq!(r.status, 400);
    assert!(
        r.json()["error"]["message"].as_str().is_some_and(
            |m| m.ends_with("is the base model's name (requests naming it get no adapter)")
        ),
        "{}",
        r.body
    );
    let r = load("f", "/no/such/adapter.gguf");
    assert_eq!(r.status, 400);
    assert!(r.body.contains("/no/such/adapter.gguf"), "{}", r.body);
    assert_eq!(r.json()["error"]["param"], "lora_path");
    let gemma_lora = lora_dir().join("gemma3-lora-f16.gguf");
    if gemma_lora.is_file() {
        let r = load("g", &gemma_lora.display().to_string());
        assert_eq!(r.status, 400);
        assert!(
            r.body
                .contains("general.architecture is \\\"gemma3\\\", but the base model is llama"),
            "{}",
            r.body
        );
    }
    let bad = |body: &str| {
        daemon
            .http("POST", "/v1/load_lora_adapter", &[], Some(body))
            .expect("bad")
    };
    let r = bad(r#"{"lora_name":"h"}"#);
    assert_eq!(
        (r.status, r.json()["error"]["message"].clone()),
        (400, json!("lora_path is required"))
    );
    let r = bad(r#"{"lora_name":"h","lora_path":"/x","extra":1}"#);
    assert!(r.body.contains("unknown field \\\"extra\\\""), "{}", r.body);
    let r = bad(r#"{"lora_name":"","lora_path":"/x"}"#);
    let e = r.json();
    assert_eq!(e["error"]["param"], "lora_name", "{}", r.body);
    assert!(
        e["error"]["message"]
            .as_str()
            .is_some_and(|m| m.starts_with("lora_name must be 1 to 128 characters")),
        "{}",
        r.body
    );

    // Unload: refused (409) while a request uses it, which runs on unharmed.
    let mut long = daemon.connect().await.expect("connect");
    let req = chat(
        "long",
        "Tell me a long story about the sea.",
        Some(("e", 1.0)),
        200,
    );
    long.send(&req).await.expect("send");
    let mut g = Generation::default();
    while g.deltas.is_empty() {
        let f = long
            .recv_within(Duration::from_secs(60))
            .await
            .expect("frame");
        assert!(!g.absorb(f), "ended early: {:?}", g.error);
    }
    let metrics = lora_metrics(&daemon);
    assert!(metrics.contains("running_lora_adapters=\"e\""), "{metrics}");
    let unload = |name: &str| {
        let body = json!({ "lora_name": name }).to_string();
        daemon
            .http("POST", "/v1/unload_lora_adapter", &[], Some(&body))
            .expect("unload")
    };
    let r = unload("e");
    assert_eq!(r.status, 409, "{}", r.body);
    assert!(r.body.contains("in use by 1 request"), "{}", r.body);
    loop {
        let f = long
            .recv_within(Duration::from_secs(120))
            .await
            .expect("frame");
        if g.absorb(f) {
            break;
        }
    }
    assert_eq!(g.finish_reason(), Some("length"), "{:?}", g.error);
    assert_eq!(g.token_ids.len(), 200);
    let r = unload("e");
    assert_eq!(r.status, 200, "{}", r.body);
    let r = unload("e");
    assert_eq!(r.status, 404, "{}", r.body);
    let g = c
        .generate(chat("gone", "hi", Some(("e", 1.0)), 4))
        .await
        .expect("gone");
    assert_eq!(g.error_type(), Some("model_not_found"));
    // Loaded again under the same name, its request counter goes on from its two
    // earlier requests (a counter never goes back).
    let r = load("e", &adapter("smollm2-lora-f32-r4.gguf"));
    assert_eq!(r.status, 200, "{}", r.body);
    let g = c
        .generate(chat("again", "hi", Some(("e", 1.0)), 4))
        .await
        .expect("again");
    assert!(g.error.is_none(), "{:?}", g.error);
    let metrics = lora_metrics(&daemon);
    assert!(
        metrics.contains("inferd_lora_requests_total{adapter=\"e\"} 3"),
        "{metrics}"
    );
    // The daemon still serves.
    let g = c.generate(chat("ok", "hi", None, 4)).await.expect("ok");
    assert!(g.error.is_none());
}

/// The LoRA lines of the daemon's `/metrics`.
fn lora_metrics(daemon: &Daemon) -> String {
    let page = daemon
        .http("GET", "/metrics", &[], None)
        .expect("metrics")
        .body;
    page.lines()
        .filter(|l| l.contains("lora"))
        .collect::<Vec<_>>()
        .join("\n")
}

fn model_ids(daemon: &Daemon) -> Vec<String> {
    let m = daemon
        .http("GET", "/v1/models", &[], None)
        .expect("models")
        .json();
    m["data"]
        .as_array()
        .expect("data")
        .iter()
        .skip(1)
        .filter_map(|x| x["id"].as_str().map(str::to_string))
        .collect()
}

#[tokio::test]
async fn sighup_applies_the_configs_adapters() {
    let dir = tempfile::tempdir().expect("tmp");
    let config = dir.path().join("lora.toml");
    let base = std::fs::read_to_string(inferd_e2e::workspace_root().join("configs/test.toml"))
        .expect("test.toml");
    let write = |adapters: &str| {
        std::fs::write(
            &config,
            format!("{base}\n[lora]\nadapters = {{ {adapters} }}\n"),
        )
        .expect("write")
    };
    let f16 = adapter("smollm2-lora-f16.gguf");
    let q8 = adapter("smollm2-lora-q8_0.gguf");
    write(&format!("a = {f16:?}"));
    let daemon = Daemon::start_config(&config, &[], &[("INFERD__SPECULATIVE__METHOD", "off")])
        .expect("daemon");
    assert_eq!(model_ids(&daemon), ["a"]);
    write(&format!("b = {q8:?}, c = {f16:?}"));
    daemon.signal("HUP").expect("hup");
    let mut ids = Vec::new();
    for _ in 0..100 {
        ids = model_ids(&daemon);
        if ids == ["b", "c"] {
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    assert_eq!(ids, ["b", "c"], "{}", daemon.stderr_tail());
    let mut c = daemon.connect().await.expect("connect");
    let g = c
        .generate(chat("a", "hi", Some(("a", 1.0)), 4))
        .await
        .expect("a");
    assert_eq!(g.error_type(), Some("model_not_found"));
    let g = c
        .generate(chat("b", "hi", Some(("b", 1.0)), 4))
        .await
        .expect("b");
    assert!(g.error.is_none(), "{:?}", g.error);
    // A config naming a missing file: logged, and the other adapters stay.
    write(&format!("b = {q8:?}, c = {f16:?}, z = \"/no/such.gguf\""));
    daemon.signal("HUP").expect("hup");
    for _ in 0..100 {
        if daemon.stderr_tail().contains("/no/such.gguf") {
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(
        daemon.stderr_tail().contains("/no/such.gguf"),
        "{}",
        daemon.stderr_tail()
    );
    assert_eq!(model_ids(&daemon), ["b", "c"]);
}

/// Speculation (n-gram lookup, and a draft model, which drafts for the base) and plugins
/// work with adapters: the adapter's tokens are the same with speculation on and off.
#[tokio::test]
async fn speculation_and_plugins_work_with_adapters() {
    let model = inferd_e2e::model_path().display().to_string();
    for (method, extra) in [
        // A fixed, cheap row cost: the controller then drafts whatever the
        // start-up measurement on a busy CI machine says (the test is about
        // adapters, not about the controller's choice).
        ("ngram", vec![("INFERD__SPECULATIVE__ROW_COST", "0.1")]),
        (
            "draft",
            vec![
                ("INFERD__SPECULATIVE__DRAFT_MODEL", model.as_str()),
                ("INFERD__SPECULATIVE__ROW_COST", "0.1"),
                ("INFERD__SPECULATIVE__DRAFT_COST", "0.2"),
            ],
        ),
    ] {
        let args = modules();
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let mut env = vec![("INFERD__SPECULATIVE__METHOD", method)];
        env.extend(extra);
        let daemon = Daemon::start_args(&args, &env).expect("daemon");
        let mut c = daemon.connect().await.expect("connect");
        let mut drafted = 0;
        for (i, prompt) in [
            "Repeat after me: the cat sat on the mat, the cat sat on the mat.",
            "Write a short poem about the sea.",
        ]
        .iter()
        .enumerate()
        {
            let mut off = chat(&format!("off{i}"), prompt, Some(("a", 1.0)), 32);
            off["speculative"] = json!(false);
            let off = c.generate(off).await.expect("off");
            let on = c
                .generate(chat(&format!("on{i}"), prompt, Some(("a", 1.0)), 32))
                .await
                .expect("on");
            assert!(on.error.is_none(), "{method}: {:?}", on.error);
            assert_eq!(on.token_ids, off.token_ids, "{method} {prompt}");
            drafted += on.done.as_ref().expect("done")["usage"]["draft_tokens"]
                .as_u64()
                .unwrap_or(0);
        }
        assert!(drafted > 0, "{method}: no drafts were verified");
        // A plugin on an adapted request sees the adapter's logits.
        let plain = c
            .generate(chat("p0", "Say hello.", Some(("a", 1.0)), 12))
            .await
            .expect("plain");
        let first_word = plain
            .text
            .split_whitespace()
            .next()
            .expect("a word")
            .trim_matches(|ch: char| !ch.is_alphanumeric())
            .to_string();
        let mut banned = chat("p1", "Say hello.", Some(("a", 1.0)), 12);
        banned["plugins"] = json!([{"name":"ban_words","config":{"words":[first_word]}}]);
        let banned = c.generate(banned).await.expect("banned");
        assert!(banned.error.is_none(), "{:?}", banned.error);
        assert_ne!(
            banned.token_ids, plain.token_ids,
            "{method}: the plugin changed nothing"
        );
    }
}

/// The adapter endpoints sit behind the API key like every `/v1/` route.
#[tokio::test]
async fn load_and_unload_need_the_api_key() {
    let daemon = start("4", &[("INFERD__SERVER__API_KEY", "sk-lora")]);
    let body =
        json!({"lora_name": "k", "lora_path": adapter("smollm2-lora-f32-r4.gguf")}).to_string();
    let r = daemon
        .http("POST", "/v1/load_lora_adapter", &[], Some(&body))
        .expect("load");
    assert_eq!(r.status, 401, "{}", r.body);
    assert_eq!(r.json()["error"]["code"], "invalid_api_key");
    let key = [("Authorization", "Bearer sk-lora")];
    let r = daemon
        .http("POST", "/v1/load_lora_adapter", &key, Some(&body))
        .expect("load");
    assert_eq!(r.status, 200, "{}", r.body);
    let unload = json!({"lora_name": "k"}).to_string();
    let r = daemon
        .http("POST", "/v1/unload_lora_adapter", &[], Some(&unload))
        .expect("unload");
    assert_eq!(r.status, 401, "{}", r.body);
    let r = daemon
        .http("POST", "/v1/unload_lora_adapter", &key, Some(&unload))
        .expect("unload");
    assert_eq!(r.status, 200, "{}", r.body);
}
