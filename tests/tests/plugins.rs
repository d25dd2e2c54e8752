//! Wasm plugins end to end on the real model: the bundled Rust plugins and the C plugin
//! (`min_tokens`) change what is generated, a seeded sampler plugin reproduces, and a
//! plugin that hangs, exhausts memory or traps fails only its own request; the test-only
//! `scripted` plugin, loaded from a directory of its own, makes the model say exactly
//! what it is told.

use std::collections::HashMap;

use inferd_e2e::{bundled_plugins_dir, ids, test_plugins_dir, Client, Daemon, Generation};
use serde_json::{json, Value};

const FRANCE: &str = "What is the capital of France? Answer in one short sentence.";

fn chat(id: &str, content: &str, max_tokens: u64, plugins: Value) -> Value {
    json!({"type":"generate","id":id,"messages":[{"role":"user","content":content}],
           "max_tokens":max_tokens,"temperature":0,"plugins":plugins})
}

/// Sends every request, then collects frames until each has ended.
async fn run_all(c: &mut Client, reqs: &[Value]) -> HashMap<String, Generation> {
    c.generate_all(reqs).await.expect("generate")
}

fn error_message(g: &Generation) -> &str {
    g.error
        .as_ref()
        .and_then(|e| e["error"]["message"].as_str())
        .unwrap_or_default()
}

#[tokio::test]
async fn plugins_message_lists_the_bundled_plugins() {
    // The directory scripts/run.sh serves, not the harness's (which adds the fixtures).
    let bundled = bundled_plugins_dir();
    let daemon = Daemon::start_with_env(&[(
        "INFERD__PLUGINS__DIR",
        bundled.to_str().expect("utf-8 path"),
    )])
    .expect("daemon");
    let mut c = daemon.connect().await.expect("connect");
    c.send(&json!({"type":"plugins","id":"p"}))
        .await
        .expect("send");
    let f = c.recv().await.expect("frame");
    assert_eq!(f["type"], "plugins");
    assert_eq!(f["id"], "p");
    assert_eq!(f["interface"], "inferd:plugin@0.1.1");
    let list = f["plugins"].as_array().expect("plugins array");
    let world = |name: &str| {
        list.iter()
            .find(|p| p["name"] == name)
            .map(|p| p["world"].as_str().unwrap_or_default().to_string())
    };
    assert_eq!(world("ban_words").as_deref(), Some("logits-processor"));
    assert_eq!(
        world("repetition_guard").as_deref(),
        Some("logits-processor")
    );
    assert_eq!(world("min_tokens").as_deref(), Some("logits-processor"));
    assert_eq!(world("mirostat").as_deref(), Some("sampler"));
    // Test-only plugins are built into target/test-plugins/, not loaded by default.
    for fixture in ["scripted", "busy_loop", "memory_bomb", "trap", "wasi_probe"] {
        assert_eq!(
            world(fixture),
            None,
            "test-only {fixture} loaded by default"
        );
    }
    for p in list {
        assert!(!p["version"].as_str().unwrap_or_default().is_empty(), "{p}");
    }
}

#[tokio::test]
async fn ban_words_removes_the_banned_word_from_a_greedy_answer() {
    let daemon = Daemon::start().expect("daemon");
    let mut c = daemon.connect().await.expect("connect");
    let plain = c
        .generate(chat("plain", FRANCE, 40, json!([])))
        .await
        .expect("generate");
    assert!(
        plain.text.contains("Paris"),
        "precondition: the greedy answer names Paris: {:?}",
        plain.text
    );
    let banned = c
        .generate(chat(
            "banned",
            FRANCE,
            40,
            json!([{"name":"ban_words","config":{"words":["Paris"]}}]),
        ))
        .await
        .expect("generate");
    assert_eq!(banned.error, None);
    assert!(banned.done.is_some());
    assert!(
        !banned.text.contains("Paris"),
        "banned word in the answer: {:?}",
        banned.text
    );
    assert_ne!(banned.text, plain.text);
}

#[tokio::test]
async fn seeded_mirostat_reproduces_alone_and_beside_other_streams() {
    let daemon = Daemon::start().expect("daemon");
    let mut c = daemon.connect().await.expect("connect");
    let req = |id: &str, seed: u64| {
        json!({"type":"generate","id":id,"prompt":"Once upon a time","max_tokens":24,
               "seed":seed,"plugins":[{"name":"mirostat","config":{"tau":5.0,"eta":0.1}}]})
    };
    let a = c.generate(req("a", 42)).await.expect("generate");
    assert_eq!(a.error, None);
    assert_eq!(a.token_ids.len(), 24);
    let mut both = run_all(
        &mut c,
        &[req("b", 42), chat("other", FRANCE, 24, json!([]))],
    )
    .await;
    let b = both.remove("b").expect("b");
    assert_eq!(b.token_ids, a.token_ids, "same seed, same tokens");
    assert_eq!(b.text, a.text);
    let d = c.generate(req("d", 43)).await.expect("generate");
    assert_ne!(d.token_ids, a.token_ids, "another seed, other tokens");
}

#[tokio::test]
async fn c_plugin_min_tokens_holds_off_the_end_of_the_answer() {
    let daemon = Daemon::start().expect("daemon");
    let mut c = daemon.connect().await.expect("connect");
    let plain = c
        .generate(chat("plain", FRANCE, 64, json!([])))
        .await
        .expect("generate");
    assert_eq!(
        plain.finish_reason(),
        Some("stop"),
        "precondition: ends by itself"
    );
    let n = plain.token_ids.len();
    assert!(n < 40, "precondition: a short answer ({n} tokens)");
    let min = n + 8;
    let held = c
        .generate(chat(
            "held",
            FRANCE,
            min as u64,
            json!([{"name":"min_tokens","config":{"min_tokens":min}}]),
        ))
        .await
        .expect("generate");
    assert_eq!(held.error, None);
    assert_eq!(held.finish_reason(), Some("length"));
    assert_eq!(held.token_ids.len(), min);
    // Identical until the point where the plain answer ended.
    assert_eq!(held.token_ids[..n - 1], plain.token_ids[..n - 1]);
    let bad = c
        .generate(chat(
            "bad",
            FRANCE,
            8,
            json!([{"name":"min_tokens","config":{"min_tokens":"ten"}}]),
        ))
        .await
        .expect("generate");
    assert_eq!(bad.error_type(), Some("validation"));
    assert!(error_message(&bad).contains("min_tokens"), "{bad:?}");
}

#[tokio::test]
async fn hang_memory_bomb_and_trap_fail_only_their_own_requests() {
    let mut daemon = Daemon::start().expect("daemon");
    let mut c = daemon.connect().await.expect("connect");
    let reqs = [
        chat("good", FRANCE, 32, json!([{"name":"noop"}])),
        chat("hang", FRANCE, 32, json!([{"name":"busy_loop"}])),
        chat("bomb", FRANCE, 32, json!([{"name":"memory_bomb"}])),
        chat(
            "trap",
            FRANCE,
            32,
            json!([{"name":"trap","config":{"after_steps":3}}]),
        ),
        chat(
            "nan",
            FRANCE,
            32,
            json!([{"name":"trap","config":{"never":true,"answer":"nan"}}]),
        ),
        chat("plain", FRANCE, 32, json!([])),
        // A WASI plugin (Rust std) sleeping 10 virtual seconds per step, called from the
        // scheduler's runtime thread.
        chat(
            "wasi",
            FRANCE,
            32,
            json!([{"name":"wasi_probe","config":{"spin":true}}]),
        ),
    ];
    let out = run_all(&mut c, &reqs).await;
    for (id, cause) in [
        ("hang", "plugin busy_loop (request hang) (plugins[0]) exceeded its deadline of 200 ms in process"),
        ("bomb", "plugin memory_bomb (request bomb) (plugins[0]) broke its memory limit"),
        ("trap", "plugin trap (request trap) (plugins[0]) trapped: unreachable instruction"),
        ("nan", "plugin trap (request nan) (plugins[0]) returned an invalid edit: bias: value for token 0 must be finite or -inf, got NaN"),
    ] {
        let g = out.get(id).unwrap_or_else(|| panic!("{id} missing: {out:?}"));
        assert_eq!(g.error_type(), Some("plugin_trap"), "{id}: {g:?}");
        assert!(error_message(g).contains(cause), "{id}: {}", error_message(g));
    }
    // The trap plugin let three steps through before it panicked (ids are streamed
    // with text, so at most those three arrive).
    assert!(out["trap"].started.is_some());
    assert!(out["trap"].token_ids.len() <= 3, "{:?}", out["trap"]);
    let (good, plain) = (&out["good"], &out["plain"]);
    assert_eq!(good.error, None);
    assert_eq!(plain.error, None);
    assert_eq!(good.token_ids, plain.token_ids, "noop changes nothing");
    assert_eq!(out["wasi"].error, None, "{:?}", out["wasi"]);
    assert_eq!(
        out["wasi"].token_ids, plain.token_ids,
        "wasi_probe keeps the logits"
    );
    assert!(daemon.is_running());
    // The connection and the daemon keep serving.
    let again = c
        .generate(chat("again", FRANCE, 8, json!([{"name":"noop"}])))
        .await
        .expect("generate");
    assert_eq!(again.error, None);
    assert_eq!(again.token_ids[..], plain.token_ids[..8]);
}

#[tokio::test]
async fn unknown_plugins_and_bad_chains_are_validation_errors() {
    let daemon = Daemon::start().expect("daemon");
    let mut c = daemon.connect().await.expect("connect");
    for (id, plugins, fragment) in [
        (
            "unknown",
            json!([{"name":"nope"}]),
            "plugins[0].name: no plugin named \"nope\" is loaded (loaded: ",
        ),
        (
            "order",
            json!([{"name":"mirostat"},{"name":"noop"}]),
            "plugins[0]: \"mirostat\" is a sampler and must be the last entry",
        ),
        (
            "config",
            json!([{"name":"noop"},{"name":"ban_words","config":{"words":"Paris"}}]),
            "plugins[1].config: plugin \"ban_words\" rejected it:",
        ),
        (
            "shape",
            json!([{"name":"noop","options":{}}]),
            "unknown field \"options\" in plugins[0]",
        ),
    ] {
        let g = c
            .generate(chat(id, FRANCE, 8, plugins))
            .await
            .expect("generate");
        assert_eq!(g.error_type(), Some("validation"), "{id}: {g:?}");
        assert!(g.started.is_none(), "{id}: nothing generated");
        assert!(
            error_message(&g).contains(fragment),
            "{id}: {}",
            error_message(&g)
        );
    }
}

#[tokio::test]
async fn a_hanging_configure_holds_up_neither_tokenizing_nor_plain_requests() {
    let daemon = Daemon::start().expect("daemon");
    let mut c = daemon.connect().await.expect("connect");
    // Three configures that never return (the test profile's configure deadline is 5 s)
    // occupy the plugin set-up pool; a request without plugins, sent after them, must
    // finish first.
    let hang = |id: &str| {
        chat(
            id,
            FRANCE,
            8,
            json!([{"name":"busy_loop","config":{"in_configure":true}}]),
        )
    };
    for id in ["h1", "h2", "h3"] {
        c.send(&hang(id)).await.expect("send");
    }
    c.send(&chat("plain", FRANCE, 8, json!([])))
        .await
        .expect("send");
    let mut ended: Vec<String> = Vec::new();
    let mut out: HashMap<String, Generation> = HashMap::new();
    while ended.len() < 4 {
        let f = c.recv().await.expect("frame");
        let id = f["id"].as_str().expect("frame id").to_string();
        if out.entry(id.clone()).or_default().absorb(f) {
            ended.push(id);
        }
    }
    assert_eq!(ended[0], "plain", "order of endings: {ended:?}");
    assert_eq!(out["plain"].error, None);
    for id in ["h1", "h2", "h3"] {
        let g = &out[id];
        assert_eq!(g.error_type(), Some("plugin_trap"), "{id}: {g:?}");
        assert!(g.started.is_none(), "{id} never started");
        assert!(
            error_message(g).contains("exceeded its deadline of 5000 ms in configure"),
            "{id}: {}",
            error_message(g)
        );
    }
}

#[tokio::test]
async fn cancelling_during_configure_ends_the_request_as_cancelled() {
    let daemon = Daemon::start().expect("daemon");
    let mut c = daemon.connect().await.expect("connect");
    c.send(&chat(
        "c1",
        FRANCE,
        8,
        json!([{"name":"busy_loop","config":{"in_configure":true}}]),
    ))
    .await
    .expect("send");
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    c.send(&json!({"type":"cancel","id":"c1"}))
        .await
        .expect("send");
    let mut g = Generation::default();
    while !g.absorb(c.recv().await.expect("frame")) {}
    assert_eq!(g.error_type(), Some("cancelled"), "{g:?}");
}

/// Vocabulary size of the default model (SmolLM2-135M).
const DEFAULT_VOCAB: u32 = 49_152;

/// A daemon whose `plugins.dir` is a temporary directory holding only the test-only
/// `scripted` plugin (copied from `target/test-plugins/`); keep the directory alive as
/// long as the daemon.
fn scripted_daemon() -> (Daemon, tempfile::TempDir) {
    let dir = tempfile::tempdir().expect("tempdir");
    let src = test_plugins_dir().join("scripted.wasm");
    std::fs::copy(&src, dir.path().join("scripted.wasm"))
        .unwrap_or_else(|e| panic!("{}: {e} (run scripts/build-plugins.sh)", src.display()));
    let daemon = Daemon::start_with_env(&[(
        "INFERD__PLUGINS__DIR",
        dir.path().to_str().expect("utf-8 path"),
    )])
    .expect("daemon");
    (daemon, dir)
}

#[tokio::test]
async fn scripted_plugin_emits_its_tokens_or_text_then_ends() {
    let (daemon, _dir) = scripted_daemon();
    let mut c = daemon.connect().await.expect("connect");
    c.send(&json!({"type":"plugins","id":"p"}))
        .await
        .expect("send");
    let f = c.recv().await.expect("frame");
    let names: Vec<&str> = f["plugins"]
        .as_array()
        .expect("plugins array")
        .iter()
        .filter_map(|p| p["name"].as_str())
        .collect();
    assert_eq!(names, ["scripted"]);

    // Token ids: exactly those, then one end-of-generation token (no text).
    let said = "Hello world, scripted!";
    c.send(&json!({"type":"tokenize","id":"t","text":said}))
        .await
        .expect("send");
    let f = c.recv().await.expect("frame");
    assert_eq!(f["type"], "tokens", "{f}");
    let script = ids(&f["token_ids"]);
    assert!(script.len() > 2, "{script:?}");
    let g = c
        .generate(chat(
            "tokens",
            FRANCE,
            64,
            json!([{"name":"scripted","config":{"tokens":script}}]),
        ))
        .await
        .expect("generate");
    assert_eq!(g.error, None);
    assert_eq!(g.finish_reason(), Some("stop"), "{g:?}");
    assert_eq!(g.token_ids[..script.len()], script[..], "{g:?}");
    assert_eq!(g.token_ids.len(), script.len() + 1, "{g:?}");
    assert_eq!(g.text, said);

    // Text, one token per byte: a reasoning block whose markers are split into single
    // bytes, and a two-byte character split across two tokens.
    for (id, text, split) in [
        ("think", "<think>\nhi</think>", "bytes"),
        ("split_char", "é", "bytes"),
        ("greedy", "<think>\nhi</think>", "greedy"),
    ] {
        let g = c
            .generate(chat(
                id,
                FRANCE,
                64,
                json!([{"name":"scripted","config":{"text":text,"split":split}}]),
            ))
            .await
            .expect("generate");
        assert_eq!(g.error, None, "{id}");
        assert_eq!(g.finish_reason(), Some("stop"), "{id}: {g:?}");
        assert_eq!(g.text, text, "{id}");
        if split == "bytes" {
            assert_eq!(g.token_ids.len(), text.len() + 1, "{id}: {g:?}");
        } else {
            assert!(g.token_ids.len() <= text.len(), "{id}: {g:?}");
        }
    }

    // A token id outside the vocabulary: the config is refused, naming the field, the
    // index and the bound; nothing is generated.
    let g = c
        .generate(chat(
            "bad",
            FRANCE,
            8,
            json!([{"name":"scripted","config":{"tokens":[script[0], DEFAULT_VOCAB]}}]),
        ))
        .await
        .expect("generate");
    assert_eq!(g.error_type(), Some("validation"), "{g:?}");
    assert!(g.started.is_none(), "{g:?}");
    assert_eq!(
        error_message(&g),
        format!(
            "plugins[0].config: plugin \"scripted\" rejected it: tokens[1]: must be a token id \
             below the vocabulary size {DEFAULT_VOCAB}, got {DEFAULT_VOCAB}"
        )
    );
}
