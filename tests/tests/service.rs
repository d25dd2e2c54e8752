//! Running under systemd: the daemon's sd_notify(3) messages arrive, in order, on a
//! datagram socket the test owns (`NOTIFY_SOCKET`), with watchdog pings at half
//! `WATCHDOG_USEC`.

use std::os::unix::net::UnixDatagram;
use std::time::{Duration, Instant};

use serde_json::json;

use inferd_e2e::{Daemon, HttpResponse};

fn index_of(msgs: &[String], needle: &str) -> usize {
    msgs.iter()
        .position(|m| m.contains(needle))
        .unwrap_or_else(|| panic!("no message with {needle:?} in {msgs:#?}"))
}

#[test]
fn notify_socket_gets_status_ready_watchdog_and_stopping_in_order() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("notify.sock");
    let sock = UnixDatagram::bind(&path).expect("bind");
    sock.set_read_timeout(Some(Duration::from_secs(120)))
        .expect("timeout");
    let mut daemon = Daemon::start_with_env(&[
        ("NOTIFY_SOCKET", path.to_str().expect("utf-8")),
        ("WATCHDOG_USEC", "400000"),
    ])
    .expect("daemon");
    let mut msgs: Vec<String> = Vec::new();
    let mut buf = [0u8; 4096];
    let recv = |msgs: &mut Vec<String>, buf: &mut [u8]| {
        let n = sock.recv(buf).expect("a notification");
        msgs.push(String::from_utf8_lossy(&buf[..n]).into_owned());
    };
    // READY, then watchdog pings: 0.2 s apart, so four within ~1 s.
    let t0 = Instant::now();
    while msgs.iter().filter(|m| m.contains("WATCHDOG=1")).count() < 4
        || !msgs.iter().any(|m| m.contains("READY=1"))
    {
        recv(&mut msgs, &mut buf);
    }
    let after_ready = t0.elapsed();
    daemon.signal("TERM").expect("SIGTERM");
    while !msgs.iter().any(|m| m.contains("STOPPING=1")) {
        recv(&mut msgs, &mut buf);
    }
    assert_eq!(
        daemon.wait_exit(Duration::from_secs(30)).expect("exit"),
        Some(0)
    );
    let loading = index_of(&msgs, "STATUS=loading model");
    let store = index_of(&msgs, "STATUS=opening the prefix store");
    let plugins = index_of(&msgs, "STATUS=loading plugins");
    let ready = index_of(&msgs, "READY=1");
    let stopping = index_of(&msgs, "STOPPING=1");
    assert!(
        loading < store && store < plugins && plugins < ready && ready < stopping,
        "{msgs:#?}"
    );
    assert!(
        msgs[ready].contains("STATUS=serving on 127.0.0.1:"),
        "{msgs:#?}"
    );
    assert!(after_ready < Duration::from_secs(120));
}

/// Runs one HTTP request on a thread of its own (the whole response once it ends).
fn in_thread(
    d: &Daemon,
    path: &str,
    body: serde_json::Value,
) -> std::thread::JoinHandle<HttpResponse> {
    let addr = d.addr();
    let path = path.to_string();
    std::thread::spawn(move || {
        inferd_e2e::http(&addr, "POST", &path, &[], Some(&body.to_string())).expect("http")
    })
}

/// Waits until `/metrics` shows `n` running requests (60 s).
fn wait_running(d: &Daemon, n: usize) {
    let line = format!("inferd_requests_running {n}");
    let end = Instant::now() + Duration::from_secs(60);
    while !d
        .http("GET", "/metrics", &[], None)
        .is_ok_and(|m| m.body.lines().any(|l| l == line))
    {
        assert!(Instant::now() < end, "never {line}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The final chunk's finish reason and whether `[DONE]` ends the stream.
fn stream_end(r: &HttpResponse) -> (Option<String>, bool, String) {
    let data = r.sse_data();
    let text: String = data
        .iter()
        .filter_map(|c| c["choices"][0]["text"].as_str())
        .collect();
    let reason = data
        .iter()
        .rev()
        .find_map(|c| c["choices"][0]["finish_reason"].as_str().map(str::to_owned));
    (reason, data.last() == Some(&json!("[DONE]")), text)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_mid_stream_lets_streams_finish_then_exits_0() {
    let mut d = Daemon::start().expect("daemon");
    let sse = in_thread(
        &d,
        "/v1/completions",
        json!({"prompt": "Once upon a time", "max_tokens": 64, "temperature": 0, "stream": true}),
    );
    let mut ws = d.connect().await.expect("ws");
    ws.send(&json!({"type":"generate","id":"w","prompt":"Hello","max_tokens":48,"temperature":0}))
        .await
        .expect("send");
    wait_running(&d, 2);
    d.signal("TERM").expect("SIGTERM");
    let mut g = inferd_e2e::Generation::default();
    while !g.absorb(ws.recv().await.expect("frames until done")) {}
    assert_eq!(g.finish_reason(), Some("length"), "{:?}", g.done);
    assert_eq!(g.token_ids.len(), 48);
    let r = tokio::task::spawn_blocking(move || sse.join().expect("join"))
        .await
        .expect("join");
    assert_eq!(r.status, 200);
    let (reason, done, text) = stream_end(&r);
    assert_eq!(
        (reason.as_deref(), done),
        (Some("length"), true),
        "{}",
        r.body
    );
    assert!(!text.is_empty());
    assert_eq!(d.wait_exit(Duration::from_secs(30)).expect("exit"), Some(0));
    assert!(
        inferd_e2e::http(&d.addr(), "GET", "/health", &[], None).is_err(),
        "the listener is closed"
    );
}

#[test]
fn requests_still_running_when_the_grace_period_ends_are_cancelled() {
    let mut d =
        Daemon::start_with_env(&[("INFERD__SERVER__SHUTDOWN_GRACE_S", "1")]).expect("daemon");
    let sse = in_thread(
        &d,
        "/v1/completions",
        json!({"prompt": "Once upon a time", "max_tokens": 4000, "temperature": 0, "stream": true}),
    );
    wait_running(&d, 1);
    let t0 = Instant::now();
    d.signal("TERM").expect("SIGTERM");
    let r = sse.join().expect("join");
    let (reason, done, text) = stream_end(&r);
    assert_eq!(
        (reason.as_deref(), done),
        (Some("cancelled"), true),
        "{}",
        r.body
    );
    assert!(!text.is_empty());
    assert_eq!(d.wait_exit(Duration::from_secs(30)).expect("exit"), Some(0));
    let took = t0.elapsed();
    assert!(took >= Duration::from_secs(1), "{took:?}");
}

#[test]
fn sighup_rejects_a_bad_config_keeps_serving_and_applies_a_good_one() {
    let dir = tempfile::tempdir().expect("tempdir");
    let config = dir.path().join("inferd.toml");
    let base = std::fs::read_to_string(inferd_e2e::workspace_root().join("configs/test.toml"))
        .expect("test.toml");
    std::fs::write(&config, &base).expect("write");
    let sock_path = dir.path().join("notify.sock");
    let sock = UnixDatagram::bind(&sock_path).expect("bind");
    sock.set_read_timeout(Some(Duration::from_secs(60)))
        .expect("timeout");
    let d = Daemon::start_config(
        &config,
        &[],
        &[("NOTIFY_SOCKET", sock_path.to_str().expect("utf-8"))],
    )
    .expect("daemon");
    let mut buf = [0u8; 4096];
    let mut next_msg = || {
        let n = sock.recv(&mut buf).expect("a notification");
        String::from_utf8_lossy(&buf[..n]).into_owned()
    };
    while !next_msg().contains("READY=1") {}
    let long = in_thread(
        &d,
        "/v1/completions",
        json!({"prompt": "Once upon a time", "max_tokens": 200, "temperature": 0, "stream": true}),
    );
    wait_running(&d, 1);

    // An invalid value: rejected, logged, the old configuration stays.
    std::fs::write(&config, format!("{base}\n[sampling]\ntemperature = -1\n")).expect("write");
    d.signal("HUP").expect("SIGHUP");
    let mut msgs = vec![next_msg(), next_msg()];
    assert!(msgs[0].contains("RELOADING=1"), "{msgs:?}");
    assert!(msgs[1].contains("READY=1"), "{msgs:?}");
    let end = Instant::now() + Duration::from_secs(30);
    while !d.stderr_tail().contains("reload rejected") {
        assert!(Instant::now() < end, "{}", d.stderr_tail());
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(
        d.stderr_tail().contains("sampling.temperature") || d.stderr_tail().contains("temperature"),
        "{}",
        d.stderr_tail()
    );
    let ok = d
        .http(
            "POST",
            "/v1/completions",
            &[],
            Some(r#"{"prompt":"Hi","max_tokens":3}"#),
        )
        .expect("http");
    assert_eq!(ok.status, 200, "{}", ok.body);
    assert_eq!(
        d.http("GET", "/ready", &[], None).expect("ready").status,
        200
    );

    // Not TOML at all: rejected too.
    std::fs::write(&config, "[server\nlisten = ").expect("write");
    d.signal("HUP").expect("SIGHUP");
    msgs.extend([next_msg(), next_msg()]);
    assert!(
        msgs[2].contains("RELOADING=1") && msgs[3].contains("READY=1"),
        "{msgs:?}"
    );

    // A good one: an API key now guards /v1.
    std::fs::write(
        &config,
        format!("{base}\n").replace("[server]", "[server]\napi_key = \"k2\""),
    )
    .expect("write");
    d.signal("HUP").expect("SIGHUP");
    msgs.extend([next_msg(), next_msg()]);
    assert!(
        msgs[4].contains("RELOADING=1") && msgs[5].contains("READY=1"),
        "{msgs:?}"
    );
    let refused = d
        .http(
            "POST",
            "/v1/completions",
            &[],
            Some(r#"{"prompt":"Hi","max_tokens":3}"#),
        )
        .expect("http");
    assert_eq!(refused.status, 401, "{}", refused.body);

    // The stream that ran through all three reloads finished whole.
    let r = long.join().expect("join");
    let (reason, done, _) = stream_end(&r);
    assert_eq!(
        (reason.as_deref(), done),
        (Some("length"), true),
        "{}",
        r.body
    );
    let usage_tokens = r
        .sse_data()
        .iter()
        .filter(|c| {
            c["choices"][0]["text"]
                .as_str()
                .is_some_and(|t| !t.is_empty())
        })
        .count();
    assert!(usage_tokens >= 150, "{usage_tokens} chunks");
}
