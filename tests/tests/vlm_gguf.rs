//! Vision-language models from GGUF files with llama.cpp's mmproj beside them
//! (`model.mmproj` / `--mmproj`): the tiny fixtures of `daemon/tests/fixtures/vlm-gguf/`
//! (the transformers fixtures through llama.cpp's converters,
//! scripts/make-vlm-gguf-fixtures.sh). Gemma 3 and Qwen2.5-VL answer with natively built
//! llama.cpp's greedy tokens (llama-server `--mmproj`, recorded in reference.json) and
//! the same prompt length; LLaVA's prompt has llama.cpp's length (its CLIP graph has known
//! defects, so its tokens are not the reference: see the fixture README); SmolVLM, which
//! llama.cpp refuses on this vocabulary, is served with its tiles' image tokens.

use inferd_e2e::{ids, png_part, workspace_root, Daemon};
use serde_json::{json, Value};

fn dir(family: &str) -> std::path::PathBuf {
    workspace_root().join(format!("daemon/tests/fixtures/vlm-gguf/{family}"))
}

fn reference(family: &str) -> Value {
    let p = dir(family).join("reference.json");
    serde_json::from_str(&std::fs::read_to_string(p).expect("reference.json")).expect("json")
}

/// The case's messages with each image file as a data URL.
fn messages(family: &str, case: &Value) -> Value {
    let content: Vec<Value> = case["messages"][0]["content"]
        .as_array()
        .expect("content")
        .iter()
        .map(|part| match part["type"].as_str() {
            Some("image_url") => {
                png_part(&dir(family).join(part["image_url"]["url"].as_str().expect("url")))
            }
            _ => part.clone(),
        })
        .collect();
    json!([{"role": "user", "content": content}])
}

fn start(family: &str) -> Daemon {
    let mmproj = dir(family).join("mmproj.gguf");
    let mmproj = mmproj.to_str().expect("utf-8 path");
    Daemon::start_model(
        &dir(family).join("model.gguf"),
        None,
        &[("INFERD__MODEL__MMPROJ", mmproj)],
    )
    .expect("daemon")
}

/// Every case: 8 greedy tokens and the usage; with `tokens`, llama.cpp's greedy ids.
async fn serve(family: &str, tokens: bool) {
    let r = reference(family);
    let d = start(family);
    let mut c = d.connect().await.expect("connect");
    for case in r["cases"].as_array().expect("cases") {
        let name = case["name"].as_str().expect("name");
        let g = c
            .generate(json!({"type": "generate", "id": name, "max_tokens": 8,
                             "temperature": 0, "messages": messages(family, case)}))
            .await
            .expect("generate");
        assert!(g.error.is_none(), "{family} {name}: {:?}", g.error);
        assert_eq!(g.token_ids.len(), 8, "{family} {name}");
        if tokens {
            assert_eq!(
                g.token_ids,
                ids(&case["generated_token_ids"]),
                "{family} {name}: llama.cpp's greedy tokens"
            );
        }
        let usage = &g.done.as_ref().expect("done")["usage"];
        assert_eq!(
            usage["prompt_tokens"], case["prompt_tokens"],
            "{family} {name}: llama.cpp's prompt length"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gemma3_gguf_with_mmproj_answers_as_llama_cpp() {
    serve("gemma3", true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn qwen2_5_vl_gguf_with_mmproj_answers_as_llama_cpp() {
    serve("qwen2_5_vl", true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn llava_gguf_with_mmproj_has_llama_cpps_prompt() {
    serve("llava", false).await;
}

/// A 64×64 image: resized to 64 on its longest edge, 2×2 tiles of 32 and the global
/// image, 16 tokens each.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn smolvlm_gguf_with_mmproj_serves_tiles() {
    let d = start("smolvlm");
    let mut c = d.connect().await.expect("connect");
    let g = c
        .generate(
            json!({"type": "generate", "id": "s", "max_tokens": 8, "temperature": 0,
            "messages": [{"role": "user", "content": [
                png_part(&dir("smolvlm").join("grad_64x64.png")),
                {"type": "text", "text": "Describe this image."}]}]}),
        )
        .await
        .expect("generate");
    assert!(g.error.is_none(), "{:?}", g.error);
    assert_eq!(g.token_ids.len(), 8);
    let usage = &g.done.as_ref().expect("done")["usage"];
    assert_eq!(usage["image_tokens"], 80);
}

/// An mmproj beside a Hugging Face directory, or a file that is no mmproj: the daemon
/// does not start and says which key and why.
#[test]
fn a_wrong_mmproj_is_refused_at_start() {
    let hf = workspace_root().join("daemon/tests/fixtures/vlm/gemma3");
    let mmproj = dir("gemma3").join("mmproj.gguf");
    let e = Daemon::start_model(
        &hf,
        None,
        &[("INFERD__MODEL__MMPROJ", mmproj.to_str().expect("path"))],
    )
    .err()
    .expect("refused");
    let text = format!("{e:#}");
    assert!(
        text.contains("configuration error: model.mmproj: a vision projector file goes with a GGUF text model")
            && text.contains("a Hugging Face directory with its own vision tower"),
        "{text}"
    );
    // The mmproj given as the model.
    let e = Daemon::start_model(&mmproj, None, &[])
        .err()
        .expect("refused");
    let text = format!("{e:#}");
    assert!(
        text.contains("is a vision projector (mmproj, general.architecture \"clip\"): give it as model.mmproj (--mmproj)"),
        "{text}"
    );
    let text_model = dir("gemma3").join("model.gguf");
    let e = Daemon::start_model(
        &dir("gemma3").join("model.gguf"),
        None,
        &[("INFERD__MODEL__MMPROJ", text_model.to_str().expect("path"))],
    )
    .err()
    .expect("refused");
    let text = format!("{e:#}");
    assert!(
        text.contains("general.architecture") && text.contains("an mmproj file has \"clip\""),
        "{text}"
    );
}
