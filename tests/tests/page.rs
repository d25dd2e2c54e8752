//! The browser chat page at `GET /` (its files, headers and methods) and the WebSocket
//! upgrade's subprotocols: `inferd.v1` echoed, the API key as `inferd.key.<base64url>`.
//! The page itself is driven in a real browser by `tests/browser/`.

use serde_json::json;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::http::HeaderValue;

use inferd_e2e::{Client, Daemon};

const KEY: &str = "test-key-0123";
/// base64url of `KEY`, no padding.
const KEY_B64: &str = "dGVzdC1rZXktMDEyMw";

/// The upgrade headers of a WebSocket handshake, for [`Daemon::http`] (a refused one
/// answers and closes, so a plain request reads it whole).
const UPGRADE: [(&str, &str); 4] = [
    ("Connection", "Upgrade"),
    ("Upgrade", "websocket"),
    ("Sec-WebSocket-Version", "13"),
    ("Sec-WebSocket-Key", "dGhlIHNhbXBsZSBub25jZQ=="),
];

fn upgrade_with(protocols: &str) -> Vec<(&str, &str)> {
    let mut h = UPGRADE.to_vec();
    h.push(("Sec-WebSocket-Protocol", protocols));
    h
}

/// Opens a WebSocket offering `protocols`: the answered `Sec-WebSocket-Protocol`, and a
/// client on a second connection with the same offer.
async fn connect_offering(d: &Daemon, protocols: &str) -> anyhow::Result<(Client, Option<String>)> {
    let mut req = d.url.as_str().into_client_request()?;
    req.headers_mut()
        .insert("Sec-WebSocket-Protocol", HeaderValue::from_str(protocols)?);
    let (_, resp) = tokio_tungstenite::connect_async(req).await?;
    let chosen = resp
        .headers()
        .get("sec-websocket-protocol")
        .and_then(|v| v.to_str().ok())
        .map(str::to_string);
    let client =
        Client::connect_with_headers(&d.url, &[("Sec-WebSocket-Protocol", protocols)]).await?;
    Ok((client, chosen))
}

#[test]
fn the_page_is_served_with_a_strict_policy() {
    let d = Daemon::start().expect("daemon");
    let page = d.http("GET", "/", &[], None).expect("GET /");
    assert_eq!(page.status, 200, "{}", page.body);
    assert_eq!(
        page.header("content-type"),
        Some("text/html; charset=utf-8")
    );
    assert_eq!(page.header("x-content-type-options"), Some("nosniff"));
    let csp = page.header("content-security-policy").expect("a CSP");
    for directive in [
        "default-src 'none'",
        "script-src 'self'",
        "connect-src 'self'",
    ] {
        assert!(csp.contains(directive), "{csp}");
    }
    assert!(page.body.starts_with("<!doctype html>"), "{}", page.body);
    assert!(page.body.contains("<script src=\"app.js\""));

    for (path, ty) in [
        ("/app.js", "text/javascript; charset=utf-8"),
        ("/style.css", "text/css; charset=utf-8"),
    ] {
        let r = d.http("GET", path, &[], None).expect("asset");
        assert_eq!(r.status, 200, "{path}");
        assert_eq!(r.header("content-type"), Some(ty), "{path}");
        assert_eq!(r.header("x-content-type-options"), Some("nosniff"));
        assert!(r.body.len() > 1000, "{path}: {} bytes", r.body.len());
    }

    // HEAD: the same headers, no body.
    let head = d.http("HEAD", "/", &[], None).expect("HEAD /");
    assert_eq!(head.status, 200);
    assert_eq!(
        head.header("content-type"),
        Some("text/html; charset=utf-8")
    );
    assert!(head.header("content-security-policy").is_some());
    assert!(head.body.is_empty(), "{:?}", head.body);

    // Other methods: 405 with Allow, in OpenAI's error shape.
    for method in ["POST", "PUT", "DELETE"] {
        let r = d.http(method, "/", &[], Some("{}")).expect("405");
        assert_eq!(r.status, 405, "{method}: {}", r.body);
        assert_eq!(r.header("allow"), Some("GET, HEAD"));
        assert_eq!(r.json()["error"]["code"], "method_not_allowed");
    }

    // Unknown paths still 404, naming the page among the endpoints.
    let r = d.http("GET", "/index.htm", &[], None).expect("404");
    assert_eq!(r.status, 404);
    let message = r.json()["error"]["message"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    assert!(message.contains("/ (the chat page)"), "{message}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_page_is_public_and_the_socket_takes_the_key_as_a_subprotocol() {
    let d = Daemon::start_with_env(&[("INFERD__SERVER__API_KEY", KEY)]).expect("daemon");
    // The page holds no data: served without the key, like the probes.
    for path in ["/", "/app.js", "/style.css"] {
        assert_eq!(
            d.http("GET", path, &[], None).expect("page").status,
            200,
            "{path}"
        );
    }
    // The key as a subprotocol opens the socket; inferd.v1 is echoed.
    let (mut ws, chosen) = connect_offering(&d, &format!("inferd.v1, inferd.key.{KEY_B64}"))
        .await
        .expect("the key in a subprotocol is accepted");
    assert_eq!(chosen.as_deref(), Some("inferd.v1"));
    let g = ws
        .generate(json!({"type":"generate","id":"a","prompt":"Hi","max_tokens":2}))
        .await
        .expect("generate");
    assert_eq!(g.finish_reason(), Some("length"));

    // A wrong key, a key that is not base64url, or no key: 401 before any upgrade.
    for (protocols, needle) in [
        ("inferd.v1, inferd.key.bm9wZQ", "incorrect API key"),
        ("inferd.v1, inferd.key.a+b", "incorrect API key"),
        ("inferd.v1", "missing API key"),
    ] {
        let r = d
            .http("GET", "/v1/ws", &upgrade_with(protocols), None)
            .expect("http");
        assert_eq!(r.status, 401, "{protocols}: {}", r.body);
        assert_eq!(r.json()["error"]["code"], "invalid_api_key");
        assert!(
            r.json()["error"]["message"]
                .as_str()
                .is_some_and(|m| m.contains(needle) && m.contains("inferd.key.")),
            "{}",
            r.body
        );
        assert!(r.header("sec-websocket-protocol").is_none());
    }
    let refused = connect_offering(&d, "inferd.v1, inferd.key.bm9wZQ")
        .await
        .err()
        .expect("a wrong key opens no socket");
    assert!(format!("{refused:#}").contains("401"), "{refused:#}");

    // The key counts only on the WebSocket upgrade, never as a header elsewhere.
    let r = d
        .http(
            "GET",
            "/v1/models",
            &[(
                "Sec-WebSocket-Protocol",
                &format!("inferd.v1, inferd.key.{KEY_B64}"),
            )],
            None,
        )
        .expect("http");
    assert_eq!(r.status, 401, "{}", r.body);

    // The Bearer header still works, with or without subprotocols.
    let auth = format!("Bearer {KEY}");
    let mut ws = Client::connect_with_headers(&d.url, &[("Authorization", &auth)])
        .await
        .expect("bearer");
    let g = ws
        .generate(json!({"type":"generate","id":"b","prompt":"Hi","max_tokens":1}))
        .await
        .expect("generate");
    assert_eq!(g.finish_reason(), Some("length"));
    let mut req = d.url.as_str().into_client_request().expect("request");
    req.headers_mut().insert(
        "Authorization",
        HeaderValue::from_str(&auth).expect("header"),
    );
    req.headers_mut().insert(
        "Sec-WebSocket-Protocol",
        HeaderValue::from_static("inferd.v1"),
    );
    let (_, resp) = tokio_tungstenite::connect_async(req)
        .await
        .expect("bearer and inferd.v1");
    assert_eq!(
        resp.headers()
            .get("sec-websocket-protocol")
            .map(|v| v.as_bytes()),
        Some(&b"inferd.v1"[..])
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_key_a_subprotocol_offer_gets_inferd_v1() {
    let d = Daemon::start().expect("daemon");
    // A key offered to a daemon without one is ignored.
    for protocols in ["inferd.v1", "inferd.v1, inferd.key.bm9wZQ"] {
        let (mut ws, chosen) = connect_offering(&d, protocols).await.expect("open");
        assert_eq!(chosen.as_deref(), Some("inferd.v1"), "{protocols}");
        let stats = ws.stats().await.expect("stats");
        assert!(stats["kv_blocks_total"].as_u64().unwrap_or(0) > 0);
    }
    // No offer, no answer (as before).
    let (_, resp) = tokio_tungstenite::connect_async(d.url.as_str())
        .await
        .expect("plain");
    assert!(resp.headers().get("sec-websocket-protocol").is_none());
    // Offers without inferd.v1 cannot be answered: 400 naming it.
    let r = d
        .http("GET", "/v1/ws", &upgrade_with("chat, superchat"), None)
        .expect("http");
    assert_eq!(r.status, 400, "{}", r.body);
    assert!(
        r.json()["error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("inferd.v1")),
        "{}",
        r.body
    );
}
