//! Vision-language models end to end: the tiny random Gemma 3, LLaVA-1.5, SmolVLM and
//! Qwen2.5-VL checkpoints of `daemon/tests/fixtures/vlm/` (made by scripts/make-vlm-fixtures.py
//! with transformers 5.24.0) answer about images sent as data URLs with transformers'
//! greedy tokens, report their image tokens, and hit the prefix cache for an equal
//! image only.

use inferd_e2e::{ids, png_part, run_python, workspace_root, Daemon};
use serde_json::{json, Value};

fn reference(family: &str) -> Value {
    let p = workspace_root().join(format!("daemon/tests/fixtures/vlm/{family}/reference.json"));
    serde_json::from_str(&std::fs::read_to_string(p).expect("reference.json")).expect("json")
}

fn image_path(name: &str) -> std::path::PathBuf {
    workspace_root()
        .join("daemon/tests/fixtures/vision/images")
        .join(name)
}

/// The case's messages with each image as a data URL.
fn messages(case: &Value) -> Value {
    let content: Vec<Value> = case["messages"][0]["content"]
        .as_array()
        .expect("content")
        .iter()
        .map(|part| match part["type"].as_str() {
            Some("image") => png_part(&image_path(part["path"].as_str().expect("path"))),
            _ => part.clone(),
        })
        .collect();
    json!([{"role": "user", "content": content}])
}

async fn family_matches_transformers(family: &str) {
    let r = reference(family);
    let model = workspace_root().join(format!("daemon/tests/fixtures/vlm/{family}"));
    let d = Daemon::start_model(&model, None, &[]).expect("daemon");
    let mut c = d.connect().await.expect("connect");
    let cases = r["cases"].as_array().expect("cases");
    for case in cases {
        let name = case["name"].as_str().expect("name");
        let g = c
            .generate(
                json!({"type": "generate", "id": name, "max_tokens": 8, "temperature": 0,
                             "messages": messages(case)}),
            )
            .await
            .expect("generate");
        assert!(g.error.is_none(), "{family} {name}: {:?}", g.error);
        assert_eq!(
            g.token_ids,
            ids(&case["greedy"]["new_token_ids"]),
            "{family} {name}: greedy tokens"
        );
        let usage = &g.done.as_ref().expect("done")["usage"];
        assert_eq!(usage["prompt_tokens"], case["seq_len"], "{family} {name}");
        assert_eq!(
            usage["image_tokens"], case["num_image_tokens"],
            "{family} {name}"
        );
    }
    // The first case again: every full block up to the prompt's last is cached, its
    // image's blocks included, and the image is not encoded again.
    let encoded = || {
        let r = d.http("GET", "/metrics", &[], None).expect("metrics");
        r.body
            .lines()
            .find_map(|l| l.strip_prefix("inferd_images_encoded_total "))
            .and_then(|v| v.trim().parse::<u64>().ok())
            .expect("inferd_images_encoded_total")
    };
    let images: u64 = cases
        .iter()
        .map(|c| c["images"].as_array().map_or(0, Vec::len) as u64)
        .sum();
    // At most one encoding per image sent (fewer: an image the cache held entirely,
    // as the two-image case's first one can be).
    let before = encoded();
    assert!(
        (1..=images).contains(&before),
        "{family}: {before} encodings for {images} images"
    );
    let first = &cases[0];
    let g = c
        .generate(
            json!({"type": "generate", "id": "again", "max_tokens": 8, "temperature": 0,
                         "messages": messages(first)}),
        )
        .await
        .expect("again");
    assert_eq!(g.token_ids, ids(&first["greedy"]["new_token_ids"]));
    let seq_len = first["seq_len"].as_u64().expect("seq_len");
    let last_image = first["image_token_positions"]
        .as_array()
        .and_then(|p| p.last())
        .and_then(Value::as_u64)
        .expect("positions");
    let cached = g.done.as_ref().expect("done")["usage"]["cached_tokens"]
        .as_u64()
        .expect("cached");
    assert_eq!(cached, (seq_len - 1) / 16 * 16, "{family}: cached tokens");
    assert!(
        cached > last_image,
        "{family}: {cached} cached ≤ image end {last_image}"
    );
    assert_eq!(
        encoded(),
        before,
        "{family}: a cached image is not encoded again"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gemma3_answers_about_images_as_transformers() {
    family_matches_transformers("gemma3").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn llava_answers_about_images_as_transformers() {
    family_matches_transformers("llava").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn smolvlm_answers_about_images_as_transformers() {
    family_matches_transformers("smolvlm").await;
}

/// Qwen2.5-VL: the window-attention tower, and the decoder's M-RoPE positions from the
/// image grid (1-D positions move transformers' logits by 8).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn qwen2_5_vl_answers_about_images_as_transformers() {
    family_matches_transformers("qwen2_5_vl").await;
}

/// Another picture with the same text shares no block that holds image tokens: the
/// noise case after the gradient one caches only the blocks before the image.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_different_image_never_hits_the_cache() {
    let r = reference("llava");
    let model = workspace_root().join("daemon/tests/fixtures/vlm/llava");
    let d = Daemon::start_model(&model, None, &[]).expect("daemon");
    let mut c = d.connect().await.expect("connect");
    let (grad, noise) = (&r["cases"][0], &r["cases"][1]);
    for (id, case) in [("grad", grad), ("noise", noise)] {
        let g = c
            .generate(
                json!({"type": "generate", "id": id, "max_tokens": 8, "temperature": 0,
                             "messages": messages(case)}),
            )
            .await
            .expect("generate");
        assert_eq!(g.token_ids, ids(&case["greedy"]["new_token_ids"]), "{id}");
        let cached = g.done.as_ref().expect("done")["usage"]["cached_tokens"]
            .as_u64()
            .expect("cached");
        let first_image = case["image_token_positions"][0].as_u64().expect("pos");
        assert!(
            cached <= first_image,
            "{id}: {cached} cached tokens reach into the image at {first_image}"
        );
    }
}

/// The official `openai` package streams an answer about an image sent as a data URL.
#[test]
fn the_openai_client_streams_an_answer_about_an_image() {
    let model = workspace_root().join("daemon/tests/fixtures/vlm/gemma3");
    let d = Daemon::start_model(&model, None, &[]).expect("daemon");
    let base = format!("http://{}/v1", d.addr());
    let path = image_path("grad_37x23.png");
    let out = run_python(
        "openai_image.py",
        &[&base, path.to_str().expect("utf-8")],
        None,
    )
    .expect("openai_image.py");
    assert_eq!(out["finish_reason"], "length", "{out}");
    assert_eq!(out["usage"]["completion_tokens"], 8, "{out}");
    assert_eq!(out["usage"]["prompt_tokens"], 46, "{out}");
    assert_eq!(
        out["usage"]["prompt_tokens_details"]["image_tokens"], 16,
        "{out}"
    );
    assert!(
        !out["text"].as_str().unwrap_or_default().is_empty(),
        "{out}"
    );
}
