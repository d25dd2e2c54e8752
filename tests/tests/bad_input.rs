//! Bad input gets an `error` frame naming the problem; the connection stays usable and
//! the daemon stays up.

use inferd_e2e::Daemon;
use serde_json::{json, Value};

async fn expect_error(
    c: &mut inferd_e2e::Client,
    frame: &str,
    kind: &str,
    fragment: &str,
    id: Value,
) {
    c.send_text(frame).await.expect("send");
    let f = c.recv().await.expect("frame");
    assert_eq!(f["type"], "error", "frame {frame} gave {f}");
    assert_eq!(f["error"]["type"], kind, "frame {frame} gave {f}");
    let msg = f["error"]["message"].as_str().expect("message");
    assert!(
        msg.contains(fragment),
        "message {msg:?} lacks {fragment:?} (frame {frame})"
    );
    assert_eq!(f["id"], id, "frame {frame} gave {f}");
}

#[tokio::test]
async fn bad_frames_get_errors_and_the_connection_survives() {
    let mut daemon = Daemon::start().expect("daemon");
    let mut c = daemon.connect().await.expect("connect");
    let v = "validation";
    expect_error(&mut c, "{not json", v, "JSON", Value::Null).await;
    expect_error(&mut c, "[1,2]", v, "object", Value::Null).await;
    expect_error(&mut c, r#"{"type":"fly","id":"x"}"#, v, "fly", json!("x")).await;
    expect_error(&mut c, r#"{"id":"x"}"#, v, "type", json!("x")).await;
    expect_error(
        &mut c,
        r#"{"type":"generate","prompt":"hi"}"#,
        v,
        "id",
        Value::Null,
    )
    .await;
    expect_error(
        &mut c,
        r#"{"type":"generate","id":"g"}"#,
        v,
        "messages",
        json!("g"),
    )
    .await;
    expect_error(
        &mut c,
        r#"{"type":"generate","id":"g","messages":[]}"#,
        v,
        "messages",
        json!("g"),
    )
    .await;
    expect_error(
        &mut c,
        r#"{"type":"generate","id":"g","prompt":"hi","temperature":-1}"#,
        v,
        "temperature",
        json!("g"),
    )
    .await;
    expect_error(
        &mut c,
        r#"{"type":"generate","id":"g","prompt":"hi","top_p":1.5}"#,
        v,
        "top_p",
        json!("g"),
    )
    .await;
    expect_error(
        &mut c,
        r#"{"type":"generate","id":"g","prompt":"hi","top_p":0}"#,
        v,
        "top_p",
        json!("g"),
    )
    .await;
    expect_error(
        &mut c,
        r#"{"type":"generate","id":"g","prompt":"hi","max_tokens":0}"#,
        v,
        "max_tokens",
        json!("g"),
    )
    .await;
    expect_error(
        &mut c,
        r#"{"type":"generate","id":"g","prompt":"hi","max_tokens":"ten"}"#,
        v,
        "max_tokens",
        json!("g"),
    )
    .await;
    expect_error(
        &mut c,
        r#"{"type":"generate","id":"g","messages":[{"role":"user"}]}"#,
        v,
        "content",
        json!("g"),
    )
    .await;
    expect_error(
        &mut c,
        r#"{"type":"generate","id":"g","prompt":"hi","wat":1}"#,
        v,
        "wat",
        json!("g"),
    )
    .await;
    expect_error(
        &mut c,
        r#"{"type":"detokenize","id":"d","token_ids":[1,99999999]}"#,
        v,
        "99999999",
        json!("d"),
    )
    .await;
    // Cancelling an unknown id is a no-op (no frame): the next frame answers the tokenize.
    c.send_text(r#"{"type":"cancel","id":"nope"}"#)
        .await
        .expect("send");
    c.send_binary(vec![1, 2, 3]).await.expect("binary");
    let f = c.recv().await.expect("frame");
    assert_eq!(f["error"]["type"], "validation");

    // Still usable, and the daemon is still up.
    c.send(&json!({"type":"tokenize","id":"t","text":"Hello world"}))
        .await
        .expect("send");
    let f = c.recv().await.expect("frame");
    assert_eq!(
        f,
        json!({"type":"tokens","id":"t","token_ids":[19556, 905]})
    );
    assert!(daemon.is_running());
}

#[tokio::test]
async fn duplicate_active_id_is_rejected_without_harming_the_first() {
    let daemon = Daemon::start().expect("daemon");
    let mut c = daemon.connect().await.expect("connect");
    let req = json!({"type":"generate","id":"dup","prompt":"Once upon a time","max_tokens":40,"temperature":0});
    c.send(&req).await.expect("send");
    c.send(&req).await.expect("send");
    let mut g = inferd_e2e::Generation::default();
    let mut dup_error = None;
    loop {
        let f = c.recv().await.expect("frame");
        if f["type"] == "error" {
            dup_error = Some(f);
            continue;
        }
        if g.absorb(f) {
            break;
        }
    }
    let e = dup_error.expect("duplicate id error");
    // null id: the error must not look like the end of the active request "dup".
    assert_eq!(e["id"], serde_json::Value::Null);
    assert_eq!(e["error"]["type"], "validation");
    assert!(e["error"]["message"]
        .as_str()
        .expect("msg")
        .contains("already active"));
    assert_eq!(g.finish_reason(), Some("length"));
    assert_eq!(g.token_ids.len(), 40);
    // An invalid frame reusing the active id is also rejected with a null id.
    c.send(&req).await.expect("send");
    c.send_text(r#"{"type":"generate","id":"dup","prompt":"x","temperature":-1}"#)
        .await
        .expect("send");
    let mut g3 = inferd_e2e::Generation::default();
    let mut bad = None;
    loop {
        let f = c.recv().await.expect("frame");
        if f["type"] == "error" {
            bad = Some(f);
            continue;
        }
        if g3.absorb(f) {
            break;
        }
    }
    let bad = bad.expect("validation error");
    assert_eq!(bad["id"], serde_json::Value::Null);
    assert!(bad["error"]["message"]
        .as_str()
        .expect("msg")
        .contains("temperature"));
    assert_eq!(g3.token_ids, g.token_ids);
    // Once done, the id can be reused.
    let g2 = c.generate(req).await.expect("reuse");
    assert_eq!(g2.token_ids, g.token_ids);
}

#[tokio::test]
async fn oversized_message_gets_an_error_and_close_1009() {
    let mut daemon =
        Daemon::start_with_env(&[("INFERD__SERVER__MAX_MESSAGE_BYTES", "65536")]).expect("daemon");
    let mut c = daemon.connect().await.expect("connect");
    let big = format!(
        r#"{{"type":"generate","id":"big","prompt":"{}"}}"#,
        "a".repeat(70_000)
    );
    c.send_text(&big).await.expect("send");
    let f = c.recv().await.expect("error frame");
    assert_eq!(f["type"], "error");
    assert_eq!(f["error"]["type"], "validation");
    let msg = f["error"]["message"].as_str().expect("msg");
    assert!(
        msg.contains("65536") && msg.contains("server.max_message_bytes"),
        "{msg}"
    );
    assert!(c.recv().await.is_err(), "connection should be closed");
    // The daemon keeps serving new connections.
    let mut c2 = daemon.connect().await.expect("reconnect");
    c2.send(&json!({"type":"tokenize","id":"t","text":"Hello world"}))
        .await
        .expect("send");
    assert_eq!(
        c2.recv().await.expect("tokens")["token_ids"],
        json!([19556, 905])
    );
    assert!(daemon.is_running());
}

#[tokio::test]
async fn a_tokenize_flood_is_bounded_per_connection() {
    let daemon = Daemon::start().expect("daemon");
    let mut flood = daemon.connect().await.expect("connect");
    let text = "hello world ".repeat(80_000); // ~1 MB, ~160k tokens each
    for i in 0..40 {
        flood
            .send(&json!({"type":"tokenize","id":format!("t{i}"),"text":text}))
            .await
            .expect("send");
    }
    // Meanwhile another connection's generate is served normally.
    let mut c = daemon.connect().await.expect("connect");
    let g = c
        .generate(json!({"type":"generate","id":"g","prompt":"Once upon a time","max_tokens":8,"temperature":0}))
        .await
        .expect("generate");
    // llama.cpp's first 4 greedy tokens for this prompt (../shared/fixtures reference).
    assert_eq!(g.token_ids.len(), 8);
    assert_eq!(g.token_ids[..4], [28, 260, 2240, 282]);
    let (mut tokens, mut overloaded) = (0, 0);
    for _ in 0..40 {
        let f = flood.recv().await.expect("reply");
        match f["type"].as_str() {
            Some("tokens") => tokens += 1,
            Some("error") => {
                assert_eq!(f["error"]["type"], "overloaded", "{f}");
                assert!(f["error"]["message"]
                    .as_str()
                    .expect("msg")
                    .contains("limit 16"));
                overloaded += 1;
            }
            other => panic!("unexpected {other:?}"),
        }
    }
    assert!(
        tokens >= 16 && overloaded > 0,
        "tokens {tokens}, overloaded {overloaded}"
    );
}
