//! Image parts in chat messages against a text-only model (the default): refused with
//! a `validation` error naming the part, on both edges, while a running stream goes on
//! and the daemon stays up. The edge's checks (URL scheme, part type) come first; then
//! any image, corrupt or not, inside `local_dirs` or not, meets the model's refusal
//! before it is read or decoded. Decoding's bounds are unit-tested in
//! `daemon/src/prepare/media_tests.rs`.

use inferd_e2e::{inferd_binary, workspace_root, Daemon, HttpResponse};
use serde_json::{json, Value};

/// A 1×1 PNG.
const PNG_1X1: &str =
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk+M9QDwADhgGAWjR9awAAAABJRU5ErkJggg==";

fn image_part(url: &str) -> Value {
    json!({"type": "image_url", "image_url": {"url": url}})
}

fn chat_with(parts: Vec<Value>) -> Value {
    let mut content = vec![json!({"type": "text", "text": "What is this?"})];
    content.extend(parts);
    json!({"messages": [{"role": "user", "content": content}], "max_tokens": 4})
}

fn post(d: &Daemon, body: &Value) -> HttpResponse {
    d.http("POST", "/v1/chat/completions", &[], Some(&body.to_string()))
        .expect("http")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn images_to_a_text_only_model_are_refused_naming_the_part() {
    let dir = tempfile::tempdir().expect("tempdir");
    let allowed = dir.path().join("images");
    std::fs::create_dir(&allowed).expect("mkdir");
    let png = data_encoding::BASE64
        .decode(PNG_1X1.as_bytes())
        .expect("png");
    std::fs::write(allowed.join("one.png"), &png).expect("write");
    std::fs::write(dir.path().join("outside.png"), &png).expect("write");
    let base = std::fs::read_to_string(workspace_root().join("configs/test.toml")).expect("toml");
    let config = dir.path().join("inferd.toml");
    std::fs::write(
        &config,
        format!(
            "{base}\n[media]\nmax_images_per_request = 2\nlocal_dirs = [{:?}]\n",
            allowed.display().to_string()
        ),
    )
    .expect("config");
    let d = Daemon::start_config(&config, &[], &[]).expect("daemon");

    // A stream that runs through all the refusals below.
    let mut ws = d.connect().await.expect("connect");
    ws.send(
        &json!({"type": "generate", "id": "long", "prompt": "Once upon a time",
                    "max_tokens": 48, "min_tokens": 48, "temperature": 0}),
    )
    .await
    .expect("send");

    let data = format!("data:image/png;base64,{PNG_1X1}");
    let truncated = format!("data:image/png;base64,{}", &PNG_1X1[..40]);
    let inside = format!("file://{}", allowed.join("one.png").display());
    let outside = format!("file://{}", dir.path().join("outside.png").display());
    let model = "model \"SmolLM2-135M-Instruct.Q4_1\" takes no images";
    let cases: Vec<(Value, String)> =
        vec![
        (
            chat_with(vec![image_part(&data)]),
            format!("messages[0].content[1]: {model}"),
        ),
        (
            chat_with(vec![image_part(&inside)]),
            format!("messages[0].content[1]: {model}"),
        ),
        (
            chat_with(vec![image_part("https://example.com/cat.png")]),
            "messages[0].content[1].image_url.url: https URLs are not fetched".into(),
        ),
        (
            chat_with(vec![json!({"type": "input_audio", "input_audio": {}})]),
            "messages[0].content[1].type must be \"text\" or \"image_url\" (got \"input_audio\")"
                .into(),
        ),
        (
            chat_with(vec![image_part(&truncated)]),
            format!("messages[0].content[1]: {model}"),
        ),
        (
            chat_with(vec![image_part(&outside)]),
            format!("messages[0].content[1]: {model}"),
        ),
        (
            chat_with(vec![image_part(&data), image_part(&data), image_part(&data)]),
            format!("messages[0].content[1]: {model}"),
        ),
    ];
    for (body, needle) in &cases {
        for stream in [false, true] {
            let mut body = body.clone();
            body["stream"] = json!(stream);
            let r = post(&d, &body);
            let e = r.json();
            assert_eq!(r.status, 400, "{}", r.body);
            assert_eq!(e["error"]["code"], "validation", "{}", r.body);
            let message = e["error"]["message"].as_str().unwrap_or_default();
            assert!(
                message.starts_with(needle.as_str()),
                "{needle:?} / {message:?}"
            );
        }
    }

    // The WebSocket edge takes the same parts and gives the same errors.
    let mut c = d.connect().await.expect("connect");
    for (i, (body, needle)) in cases.iter().enumerate() {
        let g = c
            .generate(json!({"type": "generate", "id": format!("i{i}"),
                             "messages": body["messages"], "max_tokens": 4}))
            .await
            .expect("frames");
        let err = g.error.expect("an error frame");
        assert_eq!(err["error"]["type"], "validation", "{err}");
        let message = err["error"]["message"].as_str().unwrap_or_default();
        assert!(
            message.starts_with(needle.as_str()),
            "{needle:?} / {message:?}"
        );
    }

    // The stream that ran meanwhile ends as it would have.
    let mut g = inferd_e2e::Generation::default();
    while !g.absorb(ws.recv().await.expect("frame")) {}
    assert!(g.error.is_none(), "{:?}", g.error);
    assert_eq!(g.token_ids.len(), 48);
    assert_eq!(g.done.expect("done")["finish_reason"], "length");
    assert_eq!(
        d.http("GET", "/health", &[], None).expect("health").status,
        200
    );

    // The CLI sends `--image FILE` as a data: URL part and prints the daemon's refusal.
    let cli = inferd_binary().with_file_name(format!("inferd-cli{}", std::env::consts::EXE_SUFFIX));
    let out = std::process::Command::new(cli)
        .args(["--url", &d.url, "chat", "--image"])
        .arg(allowed.join("one.png"))
        .arg("What is this?")
        .env_remove("INFERD_URL")
        .env_remove("INFERD_API_KEY")
        .output()
        .expect("inferd-cli runs");
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains(&format!(
            "server error (validation): messages[0].content[1]: {model}"
        )),
        "{stderr}"
    );
}
