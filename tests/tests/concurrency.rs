//! Several requests progress together: two on one connection interleave their deltas
//! and each equals its solo output; requests on separate connections too.

use inferd_e2e::{Daemon, Generation};
use serde_json::json;

fn req(id: &str, prompt: &str) -> serde_json::Value {
    json!({"type":"generate","id":id,"prompt":prompt,"max_tokens":32,"temperature":0})
}

#[tokio::test]
async fn two_requests_on_one_connection_interleave_and_match_solo_runs() {
    let daemon = Daemon::start().expect("daemon");
    let mut c = daemon.connect().await.expect("connect");
    let solo_a = c.generate(req("a", "Once upon a time")).await.expect("a");
    let solo_b = c
        .generate(req("b", "The best way to learn Rust is"))
        .await
        .expect("b");

    c.send(&req("a", "Once upon a time")).await.expect("send");
    c.send(&req("b", "The best way to learn Rust is"))
        .await
        .expect("send");
    let (mut a, mut b) = (Generation::default(), Generation::default());
    let mut order = Vec::new();
    while a.done.is_none() || b.done.is_none() {
        let f = c.recv().await.expect("frame");
        let id = f["id"].as_str().expect("id").to_string();
        if f["type"] == "delta" {
            order.push(id.clone());
        }
        match id.as_str() {
            "a" => a.absorb(f),
            "b" => b.absorb(f),
            other => panic!("unexpected id {other}"),
        };
    }
    assert_eq!(a.token_ids, solo_a.token_ids);
    assert_eq!(b.token_ids, solo_b.token_ids);
    // Interleaved: b streamed before a finished (no request serializes another).
    let last_a = order.iter().rposition(|i| i == "a").expect("a deltas");
    let first_b = order.iter().position(|i| i == "b").expect("b deltas");
    assert!(first_b < last_a, "requests were serialized: {order:?}");
}

#[tokio::test]
async fn requests_on_separate_connections_all_complete() {
    let daemon = Daemon::start().expect("daemon");
    let mut handles = Vec::new();
    for i in 0..4 {
        let url = daemon.url.clone();
        handles.push(tokio::spawn(async move {
            let mut c = inferd_e2e::Client::connect(&url).await.expect("connect");
            c.generate(json!({"type":"generate","id":format!("c{i}"),"messages":[{"role":"user","content":format!("Count to {}", i + 3)}],"max_tokens":24,"temperature":0}))
                .await
                .expect("generate")
        }));
    }
    for h in handles {
        let g = h.await.expect("join");
        assert!(g.done.is_some(), "{g:?}");
        assert!(!g.token_ids.is_empty());
    }
}

#[tokio::test]
async fn a_long_prompt_is_prefilled_in_chunks_without_stalling_others() {
    // 64 tokens per step: a ~700-token prompt needs 11 engine steps before its first
    // token, while a short request admitted meanwhile decodes one token per step.
    let daemon =
        Daemon::start_with_env(&[("INFERD__SCHEDULER__MAX_BATCH_TOKENS", "64")]).expect("daemon");
    let mut c = daemon.connect().await.expect("connect");
    let long = "The quick brown fox jumps over the lazy dog. ".repeat(70);
    c.send(&json!({"type":"generate","id":"long","prompt":long,"max_tokens":2,"temperature":0}))
        .await
        .expect("send");
    let f = c.recv().await.expect("started");
    assert_eq!(f["type"], "started");
    assert!(f["prompt_tokens"].as_u64().expect("n") > 600, "{f}");
    c.send(&req("short", "Hi")).await.expect("send");
    let (mut long_g, mut short_g) = (Generation::default(), Generation::default());
    let mut first_delta = Vec::new();
    while long_g.done.is_none() || short_g.done.is_none() {
        let f = c.recv().await.expect("frame");
        let id = f["id"].as_str().expect("id").to_string();
        if f["type"] == "delta" || f["type"] == "done" {
            first_delta.push(id.clone());
        }
        match id.as_str() {
            "long" => long_g.absorb(f),
            _ => short_g.absorb(f),
        };
    }
    // The short request (32 tokens) streamed several tokens before the long prompt's
    // prefill finished.
    let first_long = first_delta
        .iter()
        .position(|i| i == "long")
        .expect("long output");
    assert!(
        first_long >= 5,
        "the long prefill blocked the short stream: {first_delta:?}"
    );
    assert_eq!(long_g.finish_reason(), Some("length"));
}
