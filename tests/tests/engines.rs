//! Several engines in one process (`[[engines]]`), two of one compute thread each
//! behind one port: greedy tokens equal one engine's, requests placed by prefix score
//! (a conversation's next turn goes where its prefix is cached, a new prefix to the
//! engine holding less) and by load (two requests at once run on both engines), each
//! engine with its own KV pool, prefix-store directory and `engine`-labelled metrics;
//! an adapter loaded once serves on both; bad entries refused naming the key.

use std::path::{Path, PathBuf};

use inferd_e2e::{ids_u64, run_python, workspace_root, Daemon};
use serde_json::{json, Value};

/// The test profile plus two engines: the first of one thread, the second as `second`
/// says (one thread when empty).
fn config(dir: &Path, second: &str) -> PathBuf {
    let base =
        std::fs::read_to_string(workspace_root().join("configs/test.toml")).expect("test.toml");
    let path = dir.join("engines.toml");
    let second = if second.is_empty() {
        "threads = 1\n"
    } else {
        second
    };
    let text = format!("{base}\n[[engines]]\nthreads = 1\n\n[[engines]]\n{second}");
    std::fs::write(&path, text).expect("write config");
    path
}

fn chat(id: &str, system: &str, user: &str) -> Value {
    json!({"type": "generate", "id": id, "max_tokens": 8, "temperature": 0,
           "messages": [{"role": "system", "content": system},
                        {"role": "user", "content": user}]})
}

const SYSTEM_A: &str = "You are a patient mathematics tutor. You explain every step of a \
    calculation, you check the answer twice, and you never skip the units of a quantity.";
const SYSTEM_B: &str = "You are a terse travel agent who answers in one sentence, names the \
    cheapest train first, and never recommends flying when a train takes under six hours.";

async fn placed(c: &mut inferd_e2e::Client) -> Vec<u64> {
    let st = c.stats().await.expect("stats");
    st["engines"]
        .as_array()
        .expect("stats.engines")
        .iter()
        .map(|e| e["placed"].as_u64().expect("placed"))
        .collect()
}

fn cached(g: &inferd_e2e::Generation) -> u64 {
    g.done.as_ref().expect("done")["usage"]["cached_tokens"]
        .as_u64()
        .expect("usage.cached_tokens")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_engines_place_by_prefix_and_load_with_one_engines_tokens() {
    let turns = [
        ("a1", SYSTEM_A, "What is 12 times 7?"),
        ("b1", SYSTEM_B, "Paris to Lyon?"),
        ("a2", SYSTEM_A, "What is 12 times 8?"),
        ("b2", SYSTEM_B, "Paris to Nice?"),
    ];
    // One engine's greedy tokens.
    let single = Daemon::start().expect("daemon");
    let mut c = single.connect().await.expect("connect");
    let mut want = Vec::new();
    for (id, system, user) in turns {
        want.push(
            c.generate(chat(id, system, user))
                .await
                .expect("gen")
                .token_ids,
        );
    }
    drop(c);
    drop(single);

    let dir = tempfile::tempdir().expect("tempdir");
    let store = dir.path().join("store");
    let store_s = store.display().to_string();
    let d = Daemon::start_config(
        &config(dir.path(), ""),
        &[],
        &[("INFERD__PREFIX_STORE__PATH", store_s.as_str())],
    )
    .expect("daemon with two engines");
    let mut c = d.connect().await.expect("connect");
    let mut got = Vec::new();
    let mut place = Vec::new();
    for (id, system, user) in turns {
        let g = c.generate(chat(id, system, user)).await.expect("gen");
        assert!(g.error.is_none(), "{id}: {:?}", g.error);
        place.push((placed(&mut c).await, cached(&g)));
        got.push(g.token_ids);
    }
    assert_eq!(got, want, "two engines give one engine's greedy tokens");
    // a1 on engine 0 (a tie: the lower index); b1, a new prefix, on engine 1, which
    // holds fewer blocks; each second turn where its system prompt is cached.
    assert_eq!(place[0], (vec![1, 0], 0), "{place:?}");
    assert_eq!(place[1], (vec![1, 1], 0), "{place:?}");
    assert_eq!(place[2].0, vec![2, 1], "{place:?}");
    assert_eq!(place[3].0, vec![2, 2], "{place:?}");
    assert!(
        place[2].1 >= 32 && place[3].1 >= 32,
        "second turns reuse the system prompt: {place:?}"
    );

    // Two long requests at once, new prefixes: one on each engine.
    let mut c2 = d.connect().await.expect("connect");
    for (id, text) in [
        ("x", "Count slowly to one hundred."),
        ("y", "Name every planet."),
    ] {
        c2.send(
            &json!({"type": "generate", "id": id, "max_tokens": 400, "min_tokens": 400,
                        "temperature": 0, "messages": [{"role": "user", "content": text}]}),
        )
        .await
        .expect("send");
    }
    let mut first = std::collections::BTreeSet::new();
    while first.len() < 2 {
        let f = c2.recv().await.expect("frame");
        if f["type"] == "delta" {
            first.insert(f["id"].as_str().unwrap_or_default().to_string());
        }
    }
    let st = c.stats().await.expect("stats");
    let running: Vec<u64> = st["engines"]
        .as_array()
        .expect("engines")
        .iter()
        .map(|e| e["running"].as_u64().expect("running"))
        .collect();
    assert_eq!(running, [1, 1], "{st}");
    assert_eq!(st["running"], 2);

    // Metrics: the totals for the pod, each engine's share labelled.
    let page = d.http("GET", "/metrics", &[], None).expect("metrics");
    let m = run_python("parse_metrics.py", &[], Some(&page.body)).expect("parses");
    let sample = |k: &str| m["samples"][k].as_f64().unwrap_or(-1.0);
    let per_engine = sample("inferd_engine_kv_blocks_total{engine=0}");
    assert!(per_engine > 0.0, "{m}");
    assert_eq!(
        sample("inferd_engine_kv_blocks_total{engine=1}"),
        per_engine
    );
    assert_eq!(sample("inferd_kv_blocks_total"), 2.0 * per_engine);
    assert_eq!(sample("inferd_engine_requests_running{engine=0}"), 1.0);
    assert_eq!(sample("inferd_engine_requests_running{engine=1}"), 1.0);
    assert_eq!(sample("inferd_engine_requests_placed_total{engine=0}"), 3.0);
    assert_eq!(sample("inferd_engine_requests_placed_total{engine=1}"), 3.0);
    assert_eq!(m["families"]["inferd_engine_requests_placed"], "counter");
    c2.send(&json!({"type": "cancel", "id": "x"}))
        .await
        .expect("cancel");
    c2.send(&json!({"type": "cancel", "id": "y"}))
        .await
        .expect("cancel");

    // Each engine's disk tier in its own directory.
    for e in ["engine-0", "engine-1"] {
        assert!(
            store.join(e).is_dir(),
            "{} missing",
            store.join(e).display()
        );
    }
}

/// Runs 32 two-turn conversations over 8 shared system prompts (token-id prompts of 84
/// and 108 tokens, the workload of `tests/dynamo-router`), one request at a time;
/// returns (prompt tokens, cached tokens).
async fn conversations(d: &Daemon) -> (u64, u64) {
    let mut c = d.connect().await.expect("connect");
    let (mut prompt, mut cached_total) = (0, 0);
    for conv in 0..32u32 {
        let system: Vec<u32> = (0..64).map(|i| 1000 + 97 * (conv % 8) + i).collect();
        let user =
            |turn: u32| -> Vec<u32> { (0..20).map(|i| 5000 + 40 * conv + 20 * turn + i).collect() };
        let mut ids = [system, user(0)].concat();
        for turn in 0..2 {
            let g = c
                .generate(json!({"type": "generate", "id": format!("c{conv}t{turn}"),
                                 "prompt": ids, "max_tokens": 4, "min_tokens": 4,
                                 "temperature": 0}))
                .await
                .expect("gen");
            assert!(g.error.is_none(), "{:?}", g.error);
            prompt += ids.len() as u64;
            cached_total += cached(&g);
            ids.extend(&g.token_ids);
            ids.extend(user(1));
        }
    }
    (prompt, cached_total)
}

/// Placement by prefix inside one process keeps every cached token one engine would
/// have (the figure docs/performance.md reports).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prefix_placement_keeps_one_engines_cache_hits() {
    let single = Daemon::start().expect("daemon");
    let one = conversations(&single).await;
    drop(single);
    let dir = tempfile::tempdir().expect("tempdir");
    let d = Daemon::start_config(&config(dir.path(), ""), &[], &[]).expect("two engines");
    let two = conversations(&d).await;
    let mut c = d.connect().await.expect("connect");
    let shares = placed(&mut c).await;
    println!(
        "engines placement: one engine {one:?}, two engines {two:?} (placed {shares:?}), \
         share {:.3}",
        two.1 as f64 / one.1 as f64
    );
    assert_eq!(one.0, two.0);
    assert_eq!(one, (6144, 4096), "the workload's cacheable tokens");
    assert_eq!(two.1, one.1, "placement by prefix loses no cache hit");
    assert!(
        shares.iter().all(|&p| p >= 16),
        "both engines serve: {shares:?}"
    );
}

/// The tiny llama with its PEFT adapter: loaded once at start, it serves on both
/// engines with transformers+peft's greedy tokens, and an unload reaches both.
/// The first request runs until cancelled (`min_tokens` holds off its end), so the
/// second is placed while the first engine is busy: on the other one, whatever the
/// machine's speed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_adapter_serves_on_every_engine() {
    let peft = workspace_root().join("daemon/tests/fixtures/lora-peft/llama");
    let reference: Value = serde_json::from_str(
        &std::fs::read_to_string(peft.join("reference.json")).expect("reference.json"),
    )
    .expect("json");
    let greedy = &reference["greedy"];
    let model = workspace_root().join("../shared/fixtures/tiny-models/llama");
    let dir = tempfile::tempdir().expect("tempdir");
    let second = format!(
        "threads = 1\n\n[lora.adapters]\na = {:?}\n",
        peft.display().to_string()
    );
    let d = Daemon::start_model(&model, Some(&config(dir.path(), &second)), &[]).expect("daemon");
    let want = ids_u64(&greedy["new_token_ids"]);
    let req = |id: &str, max_tokens: u64| {
        json!({"type": "generate", "id": id, "prompt": greedy["input_ids"], "adapter": "a",
               "max_tokens": max_tokens, "min_tokens": max_tokens, "temperature": 0})
    };
    let mut c = d.connect().await.expect("connect");
    // The long one, until its first token: it is running on the first engine.
    c.send(&req("p", 400)).await.expect("send p");
    let mut p = inferd_e2e::Generation::default();
    while p.token_ids.is_empty() {
        let f = c.recv().await.expect("frame");
        assert!(!p.absorb(f), "p ended early: {:?}", p.error);
    }
    c.send(&req("q", want.len() as u64)).await.expect("send q");
    let mut q = inferd_e2e::Generation::default();
    let mut cancelled = false;
    loop {
        let f = c.recv().await.expect("frame");
        match f["id"].as_str() {
            Some("p") => {
                if p.absorb(f) {
                    break;
                }
            }
            Some("q") => {
                if q.absorb(f) {
                    assert!(q.error.is_none(), "{:?}", q.error);
                }
            }
            _ => panic!("unexpected frame {f}"),
        }
        if !cancelled && q.done.is_some() && p.token_ids.len() >= want.len() {
            c.send(&json!({"type": "cancel", "id": "p"}))
                .await
                .expect("cancel");
            cancelled = true;
        }
    }
    assert!(cancelled, "q ended before p");
    assert!(p.error.is_none(), "{:?}", p.error);
    for g in [&p, &q] {
        let ids: Vec<u64> = g.token_ids.iter().map(|&t| u64::from(t)).collect();
        assert_eq!(ids[..want.len()], want[..]);
    }
    assert_eq!(placed(&mut c).await, [1, 1]);
    let body = json!({"lora_name": "a"}).to_string();
    let r = d
        .http("POST", "/v1/unload_lora_adapter", &[], Some(&body))
        .expect("unload");
    assert_eq!(r.status, 200, "{}", r.body);
    let g = c.generate(req("r", 4)).await.expect("after unload");
    assert_eq!(g.error_type(), Some("model_not_found"), "{:?}", g.error);
}

#[test]
fn bad_engine_entries_are_refused_naming_the_key() {
    let dir = tempfile::tempdir().expect("tempdir");
    for (extra, msg) in [
        (
            "threads = 5000\n",
            "engines[1].threads must be in [0, 1024] (got 5000)",
        ),
        (
            "prefix_store_dir = \"engine-0\"\n",
            "engines[1].prefix_store_dir: \"engine-0\" is another engine's directory too",
        ),
        ("threads = 1\ncolour = \"red\"\n", "colour"),
    ] {
        let path = config(dir.path(), extra);
        let p = path.display().to_string();
        let (code, stderr) =
            inferd_e2e::start_failure(&["--config", p.as_str()], &[]).expect("runs");
        assert_eq!(code, Some(2), "{extra}: {stderr}");
        assert!(stderr.contains(msg), "{extra}: {stderr}");
    }
}
