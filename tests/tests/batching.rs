//! Continuous batching end to end: batch-invariant outputs, KV blocks returned on
//! cancel and disconnect (seen through `stats`), `overloaded` under a burst, and
//! preemption that neither loses nor changes tokens.

use std::time::{Duration, Instant};

use inferd_e2e::{concurrently, Client, Daemon, TOPICS};
use serde_json::{json, Value};

fn chat(id: &str, content: &str, max_tokens: u64) -> Value {
    json!({"type":"generate","id":id,"messages":[{"role":"user","content":content}],
           "max_tokens":max_tokens,"temperature":0})
}

#[tokio::test]
async fn sixteen_concurrent_streams_equal_their_solo_runs() {
    let daemon = Daemon::start().expect("daemon");
    let mut reqs: Vec<Value> = TOPICS[..15]
        .iter()
        .enumerate()
        .map(|(i, t)| {
            chat(
                &format!("g{i}"),
                &format!("Write one sentence about {t}."),
                20,
            )
        })
        .collect();
    // One seeded sampled request: its per-sequence RNG makes it batch-invariant too.
    reqs.push(json!({"type":"generate","id":"s","messages":[{"role":"user","content":"Tell me about stars."}],
                     "max_tokens":20,"temperature":0.9,"top_p":0.95,"seed":1234}));
    let mut solo = Vec::new();
    let mut c = daemon.connect().await.expect("connect");
    for r in &reqs {
        solo.push(c.generate(r.clone()).await.expect("solo"));
    }
    let before = c.stats().await.expect("stats");
    let together = concurrently(&daemon.url, reqs).await;
    let after = c.stats().await.expect("stats");
    let mut generated = 0;
    for (i, (a, b)) in solo.iter().zip(&together).enumerate() {
        assert!(
            a.done.is_some() && b.done.is_some(),
            "stream {i}: {a:?} / {b:?}"
        );
        assert!(!a.token_ids.is_empty());
        assert_eq!(
            a.token_ids, b.token_ids,
            "stream {i} differs from its solo run"
        );
        generated += b.token_ids.len() as u64;
    }
    // Batched: far fewer forward passes than tokens (a serial engine needs one each).
    let steps = after["steps"].as_u64().expect("steps") - before["steps"].as_u64().expect("steps");
    assert!(
        steps * 3 < generated,
        "{steps} steps for {generated} tokens: not batched"
    );
    assert_eq!(
        after["tokens_generated"].as_u64().expect("tokens")
            - before["tokens_generated"].as_u64().expect("tokens"),
        generated
    );
    assert_eq!(after["kv_blocks_used"], 0, "{after}");
}

/// Polls `stats` until `kv_blocks_used` is `want` or `limit` passes.
async fn wait_blocks(c: &mut Client, want: u64, limit: Duration) -> Value {
    let t = Instant::now();
    loop {
        let st = c.stats().await.expect("stats");
        if st["kv_blocks_used"].as_u64() == Some(want) || t.elapsed() > limit {
            return st;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn cancel_and_disconnect_return_kv_blocks_to_the_baseline() {
    let daemon = Daemon::start().expect("daemon");
    let mut probe = daemon.connect().await.expect("connect");
    let base = probe.stats().await.expect("stats");
    assert_eq!(base["kv_blocks_used"], 0, "{base}");
    assert_eq!(base["running"], 0);

    // Cancel: the blocks are free by the time `done` (cancelled) arrives.
    let mut a = daemon.connect().await.expect("connect");
    a.send(&chat(
        "long",
        "Write a very long story about a dragon.",
        400,
    ))
    .await
    .expect("send");
    let mut deltas = 0;
    while deltas < 3 {
        let f = a.recv().await.expect("frame");
        deltas += usize::from(f["type"] == "delta");
    }
    let busy = probe.stats().await.expect("stats");
    assert!(busy["kv_blocks_used"].as_u64().expect("used") > 0, "{busy}");
    assert_eq!(busy["running"], 1);
    a.send(&json!({"type":"cancel","id":"long"}))
        .await
        .expect("cancel");
    loop {
        let f = a.recv().await.expect("frame");
        if f["type"] == "done" {
            assert_eq!(f["finish_reason"], "cancelled");
            break;
        }
    }
    let st = probe.stats().await.expect("stats");
    assert_eq!(st["kv_blocks_used"], 0, "after cancel: {st}");
    assert_eq!(st["running"], 0);

    // Disconnect: the engine frees the blocks within a step of noticing.
    let mut b = daemon.connect().await.expect("connect");
    b.send(&chat(
        "gone",
        "Write a very long story about a knight.",
        400,
    ))
    .await
    .expect("send");
    let mut deltas = 0;
    while deltas < 3 {
        let f = b.recv().await.expect("frame");
        deltas += usize::from(f["type"] == "delta");
    }
    drop(b);
    let st = wait_blocks(&mut probe, 0, Duration::from_secs(5)).await;
    assert_eq!(st["kv_blocks_used"], 0, "after disconnect: {st}");
    assert_eq!(st["running"], 0, "{st}");
}

#[tokio::test]
async fn a_burst_beyond_max_waiting_is_refused_as_overloaded_at_once() {
    let daemon = Daemon::start_with_env(&[
        ("INFERD__SCHEDULER__MAX_RUNNING", "1"),
        ("INFERD__SCHEDULER__MAX_WAITING", "2"),
    ])
    .expect("daemon");
    let mut c = daemon.connect().await.expect("connect");
    for i in 0..8 {
        c.send(&chat(&format!("b{i}"), "Count from one to twenty.", 40))
            .await
            .expect("send");
    }
    let mut overloaded = Vec::new();
    let mut done = 0;
    let mut first_done_at = None;
    while overloaded.len() + done < 8 {
        let f = c.recv().await.expect("frame");
        match f["type"].as_str() {
            Some("error") => {
                assert_eq!(f["error"]["type"], "overloaded", "{f}");
                let msg = f["error"]["message"].as_str().expect("message");
                assert!(msg.contains("scheduler.max_waiting = 2"), "{msg}");
                assert!(
                    first_done_at.is_none(),
                    "overloaded must come at once, not after a stream ends"
                );
                overloaded.push(f["id"].as_str().expect("id").to_string());
            }
            Some("done") => {
                done += 1;
                first_done_at.get_or_insert(Instant::now());
            }
            _ => {}
        }
    }
    // One runs, two wait, the other five are refused.
    assert_eq!(overloaded.len(), 5, "{overloaded:?}");
    assert_eq!(done, 3);
}

#[tokio::test]
async fn a_preempted_stream_completes_with_the_same_tokens() {
    // 8 blocks of 16 tokens (128 tokens of KV): each request fits alone, four at once
    // do not, so the newest are preempted and recomputed.
    let bytes_per_token = 2 * 30 * 3 * 64 * 2;
    let budget = (8 * 16 * bytes_per_token).to_string();
    let daemon = Daemon::start_with_env(&[
        ("INFERD__SCHEDULER__KV_CACHE_BYTES", budget.as_str()),
        ("INFERD__SCHEDULER__MAX_BATCH_TOKENS", "64"),
    ])
    .expect("daemon");
    let reqs: Vec<Value> = (0..4)
        .map(|i| {
            json!({"type":"generate","id":format!("p{i}"),
                   "prompt":format!("Chapter {}. The old lighthouse keeper", i + 1),
                   "max_tokens":70,"temperature":0})
        })
        .collect();
    let mut c = daemon.connect().await.expect("connect");
    let st = c.stats().await.expect("stats");
    assert_eq!(st["kv_blocks_total"], 8, "{st}");
    let mut solo = Vec::new();
    for r in &reqs {
        solo.push(c.generate(r.clone()).await.expect("solo"));
    }
    let together = concurrently(&daemon.url, reqs).await;
    let st = c.stats().await.expect("stats");
    assert!(
        st["preemptions_total"].as_u64().expect("preemptions") > 0,
        "no preemption happened: {st}"
    );
    for (i, (a, b)) in solo.iter().zip(&together).enumerate() {
        assert!(
            a.done.is_some() && b.done.is_some(),
            "stream {i}: {a:?} / {b:?}"
        );
        assert!(
            a.token_ids.len() > 30,
            "stream {i} too short to need preemption"
        );
        assert_eq!(a.finish_reason(), b.finish_reason(), "stream {i}");
        assert_eq!(a.token_ids, b.token_ids, "stream {i} changed by preemption");
        assert_eq!(a.text, b.text, "stream {i} text");
    }
    assert_eq!(st["kv_blocks_used"], 0, "{st}");
}

#[tokio::test]
async fn stats_message_shape_and_errors() {
    let daemon = Daemon::start().expect("daemon");
    let mut c = daemon.connect().await.expect("connect");
    let st = c.stats().await.expect("stats");
    // 256 MiB / (16 tokens × 23,040 bytes per token) = 728 blocks.
    assert_eq!(st["kv_blocks_total"], 728, "{st}");
    assert_eq!(st["kv_block_size"], 16);
    assert_eq!(st["id"], Value::Null);
    for key in [
        "running",
        "waiting",
        "preempted",
        "preemptions_total",
        "kv_blocks_used",
        "tokens_generated",
        "steps",
    ] {
        assert!(st[key].is_u64(), "{key} missing: {st}");
    }
    c.send(&json!({"type":"stats","id":"s1"}))
        .await
        .expect("send");
    let f = c.recv().await.expect("frame");
    assert_eq!(
        (f["type"].as_str(), f["id"].as_str()),
        (Some("stats"), Some("s1"))
    );
    c.send(&json!({"type":"stats","verbose":true}))
        .await
        .expect("send");
    let f = c.recv().await.expect("frame");
    assert_eq!(f["error"]["type"], "validation", "{f}");
    assert!(
        f["error"]["message"]
            .as_str()
            .expect("msg")
            .contains("verbose"),
        "{f}"
    );
}

#[tokio::test]
async fn utility_errors_never_carry_an_active_requests_id() {
    let daemon = Daemon::start().expect("daemon");
    let mut c = daemon.connect().await.expect("connect");
    c.send(&chat("g0", "Write a very long story about a dragon.", 300))
        .await
        .expect("send");
    loop {
        let f = c.recv().await.expect("frame");
        if f["type"] == "delta" {
            break;
        }
    }
    // 40 stats and 40 tokenize frames reusing the active id: beyond the per-connection
    // limit of 16 they are refused as overloaded, with id null, and g0 keeps streaming.
    for _ in 0..40 {
        c.send(&json!({"type":"stats","id":"g0"}))
            .await
            .expect("send");
        c.send(&json!({"type":"tokenize","id":"g0","text":"hi"}))
            .await
            .expect("send");
    }
    c.send(&json!({"type":"cancel","id":"g0"}))
        .await
        .expect("cancel");
    let (mut overloaded, mut replies) = (0, 0);
    loop {
        let f = c.recv().await.expect("frame");
        match f["type"].as_str() {
            Some("error") => {
                assert_eq!(f["id"], Value::Null, "{f}");
                assert_eq!(f["error"]["type"], "overloaded", "{f}");
                overloaded += 1;
            }
            Some("stats") | Some("tokens") => replies += 1,
            Some("done") => {
                assert_eq!(f["id"], "g0");
                assert_eq!(f["finish_reason"], "cancelled");
                break;
            }
            _ => {}
        }
    }
    assert!(overloaded > 0, "the flood never hit the limit");
    assert!(replies > 0);
}
