//! HTTP on the daemon's port: probes, Prometheus metrics, the OpenAI-compatible API
//! (driven by the official `openai` Python package), the API key, validation errors and
//! cancellation by disconnect.

use std::io::{Read, Write};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use inferd_e2e::{run_python, start_failure, workspace_root, Client, Daemon, HttpResponse};

const KEY: &str = "test-key-0123";

fn post(d: &Daemon, path: &str, body: &Value) -> HttpResponse {
    d.http("POST", path, &[], Some(&body.to_string()))
        .expect("http")
}

/// `/metrics` parsed by prometheus_client: sample name with sorted labels -> value.
fn scrape(d: &Daemon) -> Value {
    let page = d.http("GET", "/metrics", &[], None).expect("metrics");
    assert_eq!(page.status, 200);
    assert!(
        page.header("content-type")
            .is_some_and(|c| c.starts_with("text/plain; version=0.0.4")),
        "{:?}",
        page.headers
    );
    run_python("parse_metrics.py", &[], Some(&page.body)).expect("prometheus_client parses it")
}

fn sample(m: &Value, key: &str) -> f64 {
    m["samples"][key].as_f64().unwrap_or(0.0)
}

/// Polls `/metrics` until `cond` holds (30 s).
fn wait_metrics(d: &Daemon, cond: impl Fn(&Value) -> bool) -> Value {
    let end = Instant::now() + Duration::from_secs(30);
    loop {
        let m = scrape(d);
        if cond(&m) {
            return m;
        }
        assert!(Instant::now() < end, "metrics never matched: {m}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn openai_package_streams_a_chat_completion_unchanged() {
    let d = Daemon::start_with_env(&[("INFERD__SERVER__API_KEY", KEY)]).expect("daemon");
    let base = format!("http://{}/v1", d.addr());
    let out =
        tokio::task::spawn_blocking(move || run_python("openai_chat.py", &[&base, KEY], None))
            .await
            .expect("join")
            .expect("the openai package talks to the daemon");

    // The same greedy request over the WebSocket: the same tokens.
    let auth = format!("Bearer {KEY}");
    let mut ws = Client::connect_with_headers(&d.url, &[("Authorization", &auth)])
        .await
        .expect("ws with key");
    let g = ws
        .chat_greedy(
            "w",
            json!([{"role":"user","content":"What is the capital of France?"}]),
            24,
        )
        .await
        .expect("ws generate");
    assert_eq!(out["model"], "SmolLM2-135M-Instruct.Q4_1");
    assert!(!g.text.is_empty());
    assert_eq!(out["stream_text"], json!(g.text), "{out}");
    assert_eq!(out["whole_text"], json!(g.text), "{out}");
    assert!(out["stream_chunks"].as_u64().unwrap_or(0) >= 10, "{out}");
    assert_eq!(out["stream_roles"], json!(["assistant"]));
    assert_eq!(out["stream_finish_reason"], "length");
    assert_eq!(out["whole_finish_reason"], "length");
    assert_eq!(out["stream_ids"].as_array().map(Vec::len), Some(1));
    assert_eq!(out["stream_objects"], json!(["chat.completion.chunk"]));
    let prompt_tokens = g.started.as_ref().expect("started")["prompt_tokens"].clone();
    for usage in [&out["stream_usage"], &out["whole_usage"]] {
        assert_eq!(usage["completion_tokens"], 24, "{out}");
        assert_eq!(usage["prompt_tokens"], prompt_tokens, "{out}");
        assert_eq!(
            usage["total_tokens"].as_u64(),
            prompt_tokens.as_u64().map(|p| p + 24)
        );
    }
    assert!(!out["completion_text"]
        .as_str()
        .unwrap_or_default()
        .is_empty());
    assert_eq!(out["wrong_key"], 401);
    assert_eq!(out["bad_value"]["status"], 400);
    assert_eq!(out["bad_value"]["body"]["code"], "validation");
    assert_eq!(
        out["bad_value"]["body"]["message"],
        "temperature must be <= 100 (got 500)"
    );
}

#[test]
fn ready_flips_from_503_to_200_while_health_answers() {
    let d = Daemon::start_bound(&[], &[]).expect("daemon bound");
    let first_ready = d.http("GET", "/ready", &[], None).expect("ready");
    let health = d.http("GET", "/health", &[], None).expect("health");
    let models = d.http("GET", "/v1/models", &[], None).expect("models");
    assert_eq!(
        (first_ready.status, first_ready.body.as_str()),
        (503, "loading\n")
    );
    assert_eq!((health.status, health.body.as_str()), (200, "ok\n"));
    assert_eq!(models.status, 503);
    assert_eq!(models.json()["error"]["code"], "loading");
    let end = Instant::now() + Duration::from_secs(120);
    let mut statuses = vec![first_ready.status];
    while *statuses.last().unwrap_or(&0) != 200 {
        assert!(Instant::now() < end, "never ready: {statuses:?}");
        std::thread::sleep(Duration::from_millis(5));
        statuses.push(d.http("GET", "/ready", &[], None).expect("ready").status);
    }
    // 503 while loading, then 200 for good.
    let flip = statuses.iter().position(|&s| s == 200).unwrap_or(0);
    assert!(statuses[..flip].iter().all(|&s| s == 503), "{statuses:?}");
    let models = d.http("GET", "/v1/models", &[], None).expect("models");
    assert_eq!(models.status, 200);
    assert_eq!(models.json()["data"][0]["id"], "SmolLM2-135M-Instruct.Q4_1");
    let one = d
        .http("GET", "/v1/models/SmolLM2-135M-Instruct.Q4_1", &[], None)
        .expect("model");
    assert_eq!(one.status, 200);
    assert_eq!(one.json(), models.json()["data"][0]);
}

#[test]
fn metrics_parse_and_move_after_requests() {
    let d = Daemon::start().expect("daemon");
    let before = scrape(&d);
    for (family, kind) in [
        ("inferd_requests", "counter"),
        ("inferd_request_errors", "counter"),
        ("inferd_prompt_tokens", "counter"),
        ("inferd_generation_tokens", "counter"),
        ("inferd_time_to_first_token_seconds", "histogram"),
        ("inferd_inter_token_latency_seconds", "histogram"),
        ("inferd_e2e_request_latency_seconds", "histogram"),
        ("inferd_requests_running", "gauge"),
        ("inferd_requests_waiting", "gauge"),
        ("inferd_kv_blocks_used", "gauge"),
        ("inferd_kv_blocks_total", "gauge"),
        ("inferd_kv_cache_usage", "gauge"),
        ("inferd_cache_config_info", "gauge"),
        ("inferd_prefix_cache_hit_tokens", "counter"),
        ("inferd_plugin_traps", "counter"),
    ] {
        assert_eq!(before["families"][family], kind, "{family}: {before}");
    }
    assert_eq!(sample(&before, "inferd_kv_blocks_total"), 728.0);
    assert_eq!(
        sample(
            &before,
            "inferd_cache_config_info{block_size=16,num_gpu_blocks=728}"
        ),
        1.0
    );
    let body = json!({"prompt": "The capital of France is", "max_tokens": 6, "temperature": 0});
    let r1 = post(&d, "/v1/completions", &body);
    let r2 = post(&d, "/v1/completions", &body);
    assert_eq!((r1.status, r2.status), (200, 200), "{}", r1.body);
    let (u1, u2) = (r1.json()["usage"].clone(), r2.json()["usage"].clone());
    assert_eq!(
        r1.json()["choices"][0]["text"],
        r2.json()["choices"][0]["text"]
    );
    // A plugin that traps after its first step (bundled fixture): counted as a trap.
    let trap = post(
        &d,
        "/v1/completions",
        &json!({"prompt": "x", "max_tokens": 5,
                "plugins": [{"name": "trap", "config": {"after_steps": 1}}]}),
    );
    assert_eq!(trap.status, 422, "{}", trap.body);
    assert_eq!(trap.json()["error"]["code"], "plugin_trap");
    let after = scrape(&d);
    let delta = |k: &str| sample(&after, k) - sample(&before, k);
    let n = |v: &Value| v.as_f64().unwrap_or(-1.0);
    assert_eq!(delta("inferd_requests_total{finish_reason=length}"), 2.0);
    assert_eq!(delta("inferd_requests_total{finish_reason=error}"), 1.0);
    assert_eq!(delta("inferd_request_errors_total{type=plugin_trap}"), 1.0);
    assert_eq!(delta("inferd_plugin_traps_total"), 1.0);
    assert_eq!(
        delta("inferd_generation_tokens_total"),
        n(&u1["completion_tokens"]) + n(&u2["completion_tokens"])
    );
    assert_eq!(
        delta("inferd_prompt_tokens_total"),
        n(&u1["prompt_tokens"]) + n(&u2["prompt_tokens"])
    );
    assert_eq!(delta("inferd_time_to_first_token_seconds_count"), 2.0);
    assert_eq!(delta("inferd_e2e_request_latency_seconds_count"), 3.0);
    // 6 tokens each: 5 intervals per request.
    assert_eq!(delta("inferd_inter_token_latency_seconds_count"), 10.0);
    assert_eq!(sample(&after, "inferd_requests_running"), 0.0);
    assert_eq!(sample(&after, "inferd_kv_blocks_used"), 0.0);
    assert_eq!(sample(&after, "inferd_kv_cache_usage"), 0.0);
    // The second request reused the first one's full prompt blocks, if any.
    assert_eq!(
        delta("inferd_prefix_cache_hit_tokens_total{tier=memory}"),
        n(&u2["prompt_tokens_details"]["cached_tokens"])
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn api_key_guards_v1_and_the_websocket_but_not_the_probes() {
    let d = Daemon::start_with_env(&[("INFERD__SERVER__API_KEY", KEY)]).expect("daemon");
    let body = json!({"prompt": "Hi", "max_tokens": 2}).to_string();
    let none = d
        .http("POST", "/v1/completions", &[], Some(&body))
        .expect("http");
    let wrong = d
        .http(
            "POST",
            "/v1/completions",
            &[("Authorization", "Bearer nope")],
            Some(&body),
        )
        .expect("http");
    let auth = format!("Bearer {KEY}");
    let right = d
        .http(
            "POST",
            "/v1/completions",
            &[("Authorization", &auth)],
            Some(&body),
        )
        .expect("http");
    for r in [&none, &wrong] {
        assert_eq!(r.status, 401, "{}", r.body);
        assert_eq!(r.json()["error"]["code"], "invalid_api_key");
        assert_eq!(r.json()["error"]["type"], "authentication_error");
        assert_eq!(r.header("www-authenticate"), Some("Bearer"));
    }
    assert!(none.json()["error"]["message"]
        .as_str()
        .is_some_and(|m| m.contains("missing API key")));
    assert_eq!(right.status, 200, "{}", right.body);
    // The scheme is case-insensitive (RFC 9110 §11.1).
    let lower = format!("bearer {KEY}");
    let r = d
        .http("GET", "/v1/models", &[("Authorization", &lower)], None)
        .expect("http");
    assert_eq!(r.status, 200, "{}", r.body);
    for probe in ["/health", "/ready", "/metrics"] {
        assert_eq!(d.http("GET", probe, &[], None).expect("probe").status, 200);
    }
    let refused = Client::connect(&d.url)
        .await
        .err()
        .expect("no key, no socket");
    assert!(format!("{refused:#}").contains("401"), "{refused:#}");
    let mut ws = Client::connect_with_headers(&d.url, &[("Authorization", &auth)])
        .await
        .expect("with key");
    let g = ws
        .generate(json!({"type":"generate","id":"a","prompt":"Hi","max_tokens":2}))
        .await
        .expect("generate");
    assert_eq!(g.finish_reason(), Some("length"));

    // inferd-cli sends the key with --api-key (or INFERD_API_KEY).
    let cli = inferd_e2e::inferd_binary().with_file_name("inferd-cli");
    let run = |key: Option<&str>| {
        let mut c = std::process::Command::new(&cli);
        c.args(["--url", &d.url, "complete", "Hi", "--max-tokens", "2"])
            .env_remove("INFERD_API_KEY");
        if let Some(k) = key {
            c.env("INFERD_API_KEY", k);
        }
        c.output().expect("inferd-cli runs")
    };
    let (with, without) = (run(Some(KEY)), run(None));
    assert!(
        with.status.success(),
        "{}",
        String::from_utf8_lossy(&with.stderr)
    );
    assert!(!without.status.success());
    let stderr = String::from_utf8_lossy(&without.stderr);
    assert!(
        stderr.contains("requires an API key (HTTP 401)") && stderr.contains("--api-key"),
        "{stderr}"
    );
}

#[test]
fn non_loopback_listen_without_a_key_is_refused() {
    let root = workspace_root();
    let config = root.join("configs/test.toml");
    let model = inferd_e2e::model_path();
    let args = [
        "--config",
        config.to_str().expect("utf-8"),
        "--model",
        model.to_str().expect("utf-8"),
        "--listen",
        "0.0.0.0:0",
    ];
    let (code, stderr) = start_failure(&args, &[]).expect("run");
    assert_eq!(code, Some(2), "{stderr}");
    assert!(
        stderr.contains("server.listen = \"0.0.0.0:0\"")
            && stderr.contains("server.api_key is not set")
            && stderr.contains("server.allow_remote_without_api_key"),
        "{stderr}"
    );
}

#[test]
fn bad_requests_get_openai_errors_naming_the_field_and_the_daemon_goes_on() {
    let d = Daemon::start_with_env(&[
        ("INFERD__SERVER__MAX_MESSAGE_BYTES", "2048"),
        ("INFERD__MODEL__CONTEXT_LENGTH", "64"),
    ])
    .expect("daemon");
    let chat = |extra: Value| {
        let mut b = json!({"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2});
        for (k, v) in extra.as_object().expect("object") {
            b[k] = v.clone();
        }
        post(&d, "/v1/chat/completions", &b)
    };
    let cases: Vec<(HttpResponse, u16, &str, &str)> = vec![
        (
            chat(json!({"max_tokens": 0})),
            400,
            "validation",
            "max_tokens must be >= 1 (got 0)",
        ),
        (chat(json!({"top_p": 2})), 400, "validation", "top_p"),
        (
            chat(json!({"foo": 1})),
            400,
            "validation",
            "unknown field \"foo\"",
        ),
        (
            chat(json!({"n": 17})),
            400,
            "validation",
            "n must be <= 16 (got 17)",
        ),
        (
            chat(json!({"presence_penalty": 2.5})),
            400,
            "validation",
            "presence_penalty must be in [-2, 2] (got 2.5)",
        ),
        (
            chat(json!({"messages": "hi"})),
            400,
            "validation",
            "messages",
        ),
        (
            chat(json!({"model": "gpt-4"})),
            404,
            "model_not_found",
            "no model or LoRA adapter is named \"gpt-4\"",
        ),
        (
            chat(
                json!({"messages": [{"role": "user", "content": "word ".repeat(80)}], "stream": true}),
            ),
            400,
            "context_length_exceeded",
            "the context window is 64 tokens",
        ),
        (
            post(
                &d,
                "/v1/completions",
                &json!({"prompt": "word ".repeat(80), "max_tokens": 1}),
            ),
            400,
            "context_length_exceeded",
            "but the context window is 64 tokens",
        ),
        (
            d.http("POST", "/v1/completions", &[], Some("{not json"))
                .expect("http"),
            400,
            "validation",
            "malformed JSON",
        ),
        (
            d.http(
                "POST",
                "/v1/completions",
                &[],
                Some(&format!("{{\"prompt\":\"{}\"}}", "a".repeat(4000))),
            )
            .expect("http"),
            413,
            "validation",
            "the request body of 4013 bytes exceeds server.max_message_bytes = 2048 bytes",
        ),
        (
            d.http("GET", "/v1/chat/completions", &[], None)
                .expect("http"),
            405,
            "method_not_allowed",
            "POST",
        ),
        (
            d.http("GET", "/nope", &[], None).expect("http"),
            404,
            "not_found",
            "/nope",
        ),
        (
            d.http("GET", "/v1/nope", &[], None).expect("http"),
            404,
            "not_found",
            "/v1/models/{id}, /v1/load_lora_adapter, /v1/unload_lora_adapter, /v1/ws",
        ),
        (
            d.http("GET", "/v1/ws", &[], None).expect("http"),
            400,
            "validation",
            "upgrade",
        ),
    ];
    for (r, status, code, needle) in &cases {
        let body = r.json();
        assert_eq!(r.status, *status, "{}", r.body);
        assert_eq!(body["error"]["code"], *code, "{}", r.body);
        assert!(
            body["error"]["message"]
                .as_str()
                .is_some_and(|m| m.contains(needle)),
            "{needle:?} not in {}",
            r.body
        );
        assert!(body["error"]["type"].is_string());
        // `param` names the field the message starts with, else null.
        let message = body["error"]["message"].as_str().unwrap_or("");
        match (*needle, body["error"]["param"].as_str()) {
            ("presence_penalty must be in [-2, 2] (got 2.5)", p) => {
                assert_eq!(p, Some("presence_penalty"))
            }
            ("messages", p) => assert_eq!(p, Some("messages")),
            // OpenAI names the prompt's field for a prompt over the context window.
            ("the context window is 64 tokens", p) => assert_eq!(p, Some("messages")),
            ("but the context window is 64 tokens", p) => assert_eq!(p, Some("prompt")),
            ("unknown field \"foo\"", p) => assert_eq!(p, Some("foo")),
            (_, Some(p)) => assert!(message.starts_with(p), "{p} / {message}"),
            (_, None) => {}
        }
    }
    let delete = d.http("DELETE", "/v1/models", &[], None).expect("http");
    assert_eq!(
        (delete.status, delete.header("allow")),
        (405, Some("GET, HEAD"))
    );
    let ok = chat(json!({"temperature": 0}));
    assert_eq!(ok.status, 200, "{}", ok.body);
    assert_eq!(ok.json()["choices"][0]["finish_reason"], "length");
}

/// Starts a request on a raw socket, waits until it runs, then closes the socket.
fn start_and_drop(d: &Daemon, body: &Value) {
    let mut s = std::net::TcpStream::connect(d.addr()).expect("connect");
    let b = body.to_string();
    let req = format!(
        "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\n\r\n{b}",
        b.len()
    );
    s.write_all(req.as_bytes()).expect("write");
    if body["stream"] == true {
        let mut buf = [0u8; 512];
        let n = s.read(&mut buf).expect("the stream's first bytes");
        assert!(String::from_utf8_lossy(&buf[..n]).starts_with("HTTP/1.1 200"));
    }
    wait_metrics(d, |m| sample(m, "inferd_requests_running") == 1.0);
    drop(s);
}

#[test]
fn a_client_that_disconnects_cancels_its_request() {
    let d = Daemon::start().expect("daemon");
    let long = json!({"prompt": "Once upon a time", "max_tokens": 4000, "temperature": 0});
    start_and_drop(&d, &long);
    let m = wait_metrics(&d, |m| {
        sample(m, "inferd_requests_total{finish_reason=cancelled}") == 1.0
            && sample(m, "inferd_requests_running") == 0.0
    });
    assert!(sample(&m, "inferd_generation_tokens_total") < 4000.0);
    let mut streamed = long.clone();
    streamed["stream"] = json!(true);
    start_and_drop(&d, &streamed);
    wait_metrics(&d, |m| {
        sample(m, "inferd_requests_total{finish_reason=cancelled}") == 2.0
            && sample(m, "inferd_requests_running") == 0.0
    });
    // A WebSocket connection that closes counts the same way: cancelled, no tokens.
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let mut ws = rt.block_on(d.connect()).expect("ws");
    rt.block_on(ws.send(
        &json!({"type": "generate", "id": "w", "prompt": "Once upon a time",
                                "max_tokens": 4000, "temperature": 0}),
    ))
    .expect("send");
    wait_metrics(&d, |m| sample(m, "inferd_requests_running") == 1.0);
    drop(ws);
    let m = wait_metrics(&d, |m| {
        sample(m, "inferd_requests_total{finish_reason=cancelled}") == 3.0
            && sample(m, "inferd_requests_running") == 0.0
    });
    assert_eq!(sample(&m, "inferd_generation_tokens_total"), 0.0, "{m}");
    assert_eq!(
        sample(&m, "inferd_e2e_request_latency_seconds_count"),
        0.0,
        "{m}"
    );
}
