//! Bad input gets an `error` frame naming the problem; the connection stays usable and
//! the daemon stays up.

use std::time::Duration;

use futures_util::StreamExt;
use inferd_e2e::Daemon;
use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio_tungstenite::tungstenite::protocol::Role;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::WebSocketStream;

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

/// Opens `/v1/ws` by hand (for frames no WebSocket library sends) and returns the socket
/// right after the `101` response.
async fn raw_socket(addr: &str) -> TcpStream {
    let mut s = TcpStream::connect(addr).await.expect("connect");
    let request = format!(
        "GET /v1/ws HTTP/1.1\r\nHost: {addr}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\
         Sec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n"
    );
    s.write_all(request.as_bytes()).await.expect("handshake");
    let mut head = Vec::new();
    while !head.ends_with(b"\r\n\r\n") {
        head.push(s.read_u8().await.expect("response head"));
    }
    let head = String::from_utf8_lossy(&head);
    assert!(head.starts_with("HTTP/1.1 101"), "{head}");
    s
}

/// One frame: first byte `b0` (FIN, RSV1-3, opcode), then the length and the payload,
/// masked (as a client must) unless `masked` is false.
fn frame(b0: u8, payload: &[u8], masked: bool) -> Vec<u8> {
    let mask_bit = if masked { 0x80 } else { 0 };
    let mut f = vec![b0];
    match u8::try_from(payload.len()) {
        Ok(n) if n < 126 => f.push(mask_bit | n),
        _ => {
            f.push(mask_bit | 126);
            let n = u16::try_from(payload.len()).expect("short payload");
            f.extend_from_slice(&n.to_be_bytes());
        }
    }
    if masked {
        let key = [0x37, 0xfa, 0x21, 0x3d];
        f.extend_from_slice(&key);
        f.extend(payload.iter().enumerate().map(|(i, b)| b ^ key[i % 4]));
    } else {
        f.extend_from_slice(payload);
    }
    f
}

/// Sends `bytes` on a fresh connection and returns the code and reason of the close
/// frame the daemon answers with (1005, "no status", for a close frame without one).
async fn close_for(addr: &str, bytes: &[u8]) -> (u16, String) {
    let mut s = raw_socket(addr).await;
    s.write_all(bytes).await.expect("send");
    let mut ws = WebSocketStream::from_raw_socket(s, Role::Client, None).await;
    let msg = tokio::time::timeout(Duration::from_secs(10), ws.next())
        .await
        .expect("an answer within 10 s")
        .expect("a frame before the end of the stream")
        .expect("a valid frame");
    match msg {
        Message::Close(Some(c)) => (c.code.into(), c.reason.to_string()),
        Message::Close(None) => (1005, String::new()),
        other => panic!("expected a close frame, got {other:?}"),
    }
}

#[tokio::test]
async fn protocol_errors_close_with_1002_or_1007_and_a_reason() {
    let mut daemon = Daemon::start().expect("daemon");
    let addr = daemon.addr();
    // A connection open all along is not disturbed by the others' errors.
    let mut bystander = daemon.connect().await.expect("connect");
    let cases: [(&str, Vec<u8>, u16, &str); 8] = [
        (
            "invalid UTF-8",
            frame(0x81, &[b'"', 0xff, 0xfe, b'"'], true),
            1007,
            "UTF-8",
        ),
        ("unmasked frame", frame(0x81, b"{}", false), 1002, "masked"),
        ("RSV1 set", frame(0xc1, b"{}", true), 1002, "reserved bits"),
        ("RSV3 set", frame(0x91, b"{}", true), 1002, "reserved bits"),
        ("opcode 3", frame(0x83, b"{}", true), 1002, "opcode 3"),
        ("opcode 11", frame(0x8b, b"", true), 1002, "opcode 11"),
        (
            "lone continuation",
            frame(0x80, b"{}", true),
            1002,
            "continu",
        ),
        (
            "200-byte ping",
            frame(0x89, &[b'p'; 200], true),
            1002,
            "125",
        ),
    ];
    for (what, bytes, code, fragment) in &cases {
        let (got, reason) = close_for(&addr, bytes).await;
        assert_eq!(got, *code, "{what}: close code (reason {reason:?})");
        assert!(
            !reason.is_empty() && reason.len() <= 123,
            "{what}: reason {reason:?}"
        );
        assert!(reason.contains(fragment), "{what}: reason {reason:?}");
    }
    // One WARN line per case in the daemon's log.
    let logged = || {
        daemon
            .stderr_tail()
            .lines()
            .filter(|l| l.contains("WARN") && l.contains("websocket protocol error"))
            .count()
    };
    for _ in 0..50 {
        if logged() >= cases.len() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(logged(), cases.len(), "{}", daemon.stderr_tail());
    // The daemon is up and both the bystander and a new connection are served.
    for c in [
        &mut bystander,
        &mut daemon.connect().await.expect("reconnect"),
    ] {
        c.send(&json!({"type":"tokenize","id":"t","text":"Hello world"}))
            .await
            .expect("send");
        assert_eq!(
            c.recv().await.expect("tokens")["token_ids"],
            json!([19556, 905])
        );
    }
    assert!(daemon.is_running());
}

#[tokio::test]
async fn handshake_errors_quote_what_the_client_sent() {
    let daemon = Daemon::start().expect("daemon");
    let upgrade = |extra: &[(&'static str, &'static str)]| {
        let mut h = vec![
            ("Upgrade", "websocket"),
            ("Connection", "Upgrade"),
            ("Sec-WebSocket-Key", "dGhlIHNhbXBsZSBub25jZQ=="),
        ];
        h.extend_from_slice(extra);
        h
    };
    let message = |headers: &[(&str, &str)]| {
        let r = daemon.http("GET", "/v1/ws", headers, None).expect("http");
        assert_eq!(r.status, 400, "{}", r.body);
        r.json()["error"]["message"]
            .as_str()
            .expect("message")
            .to_owned()
    };
    assert_eq!(
        message(&upgrade(&[("Sec-WebSocket-Version", "8")])),
        r#"Sec-WebSocket-Version must be 13 (got "8")"#
    );
    assert_eq!(
        message(&upgrade(&[])),
        "Sec-WebSocket-Version must be 13 (got none)"
    );
    let m = message(&upgrade(&[
        ("Sec-WebSocket-Version", "13"),
        ("Sec-WebSocket-Protocol", "chat, inferd.key.dGVzdC1rZXk"),
    ]));
    assert!(
        m.starts_with("Sec-WebSocket-Protocol must include \"inferd.v1\"")
            && m.contains(r#"(got "chat, inferd.key.…";"#),
        "{m}"
    );
    assert!(!m.contains("dGVzdC1rZXk"), "the key is not echoed: {m}");
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
