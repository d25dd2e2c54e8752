//! The prompt side of the four VLM fixtures against transformers' processors
//! (`daemon/tests/fixtures/vlm/*/reference.json`): the ids after the template and the
//! placeholder expansion, the image positions, and Qwen2.5-VL's M-RoPE positions.

use std::path::PathBuf;

use serde_json::Value;

use super::media::MediaStep;
use super::prompt::{render_with_images, Prompt};
use super::vision::VisionPrompt;
use crate::config::MediaConfig;
use crate::model::{LoadOptions, MatrixPolicy};
use crate::request::{
    ChatMessage, GenerateRequest, ImageDetail, ImageInput, ImageSource, PromptInput,
};
use crate::tokenizer::TextTokenizer;

fn dir(family: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(format!("tests/fixtures/vlm/{family}"))
}

/// The case's user message as the edge builds it: text parts joined, each image at
/// its offset as a data URL.
fn message(case: &Value) -> ChatMessage {
    let mut m = ChatMessage::new("user", "");
    for (i, part) in case["messages"][0]["content"]
        .as_array()
        .expect("content")
        .iter()
        .enumerate()
    {
        match part["type"].as_str() {
            Some("image") => {
                let p = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
                    .join("tests/fixtures/vision/images")
                    .join(part["path"].as_str().expect("path"));
                let bytes = std::fs::read(p).expect("image");
                m.images.push(ImageInput {
                    at: format!("messages[0].content[{i}]"),
                    offset: m.content.len(),
                    source: ImageSource::Data {
                        media_type: "image/png".into(),
                        base64: data_encoding::BASE64.encode(&bytes),
                    },
                    detail: ImageDetail::Auto,
                });
            }
            _ => m.content.push_str(part["text"].as_str().expect("text")),
        }
    }
    m
}

fn request(m: ChatMessage) -> GenerateRequest {
    GenerateRequest {
        client_id: "t".into(),
        input: PromptInput::Messages(vec![m]),
        sampling: crate::request::SamplingParams::default(),
        plugins: vec![],
        cache: crate::request::CacheOptions::default(),
        tools: None,
        template_kwargs: serde_json::Map::new(),
        adapter: None,
    }
}

fn prompt(family: &str, case: &Value) -> Prompt {
    let d = dir(family);
    let loaded = crate::model::load(
        &d,
        &LoadOptions {
            device: candle_core::Device::Cpu,
            matrices: MatrixPolicy::default(),
        },
    )
    .expect("model");
    let vision = loaded.vision.expect("a vision tower");
    let mut tok = TextTokenizer::from_hf_dir(&d).expect("tokenizer");
    tok.set_content_parts(crate::tokenizer::ContentParts::Typed);
    let vp = VisionPrompt::from_hf(&d, &vision.config, &tok, vision.tower.tokens_per_frame())
        .expect("vision prompt");
    let msg = message(case);
    let decoded = MediaStep::new(&MediaConfig::default())
        .decode_all(std::slice::from_ref(&msg))
        .expect("decoded");
    let processed: Vec<_> = decoded.iter().map(|d| vp.process(d)).collect();
    let texts: Vec<String> = processed.iter().map(|p| p.text.clone()).collect();
    let req = request(msg);
    let mut p = render_with_images(&tok, &req, Some((vp.marker(), &texts))).expect("prompt");
    p.images = vp.place(&p.ids, processed).expect("placed");
    p
}

fn u32s(v: &Value) -> Vec<u32> {
    v.as_array()
        .expect("array")
        .iter()
        .map(|x| x.as_u64().expect("id") as u32)
        .collect()
}

#[test]
fn prompt_ids_and_image_places_equal_the_processors() {
    for family in ["gemma3", "llava", "smolvlm", "qwen2_5_vl"] {
        let r: Value = serde_json::from_str(
            &std::fs::read_to_string(dir(family).join("reference.json")).expect("reference"),
        )
        .expect("json");
        for case in r["cases"].as_array().expect("cases") {
            let name = case["name"].as_str().expect("name");
            let p = prompt(family, case);
            assert_eq!(p.ids, u32s(&case["input_ids"]), "{family} {name}: ids");
            let places: Vec<u32> = p
                .images
                .iter()
                .flat_map(|im| im.runs.iter().cloned().flatten())
                .map(|x| x as u32)
                .collect();
            assert_eq!(
                places,
                u32s(&case["image_token_positions"]),
                "{family} {name}: image positions"
            );
            if family == "qwen2_5_vl" {
                let v = u32s(&case["mrope_position_ids"]["values"]);
                let n = p.ids.len();
                for pos in 0..n {
                    let want = [v[pos], v[n + pos], v[2 * n + pos]];
                    assert_eq!(
                        crate::request::media::mrope_position(&p.images, pos),
                        want,
                        "{name}: M-RoPE position {pos}"
                    );
                }
                // Decode continues at seq_len + rope_deltas on all three.
                let delta = case["rope_deltas"][0].as_i64().expect("delta");
                let next = (n as i64 + delta) as u32;
                assert_eq!(
                    crate::request::media::mrope_position(&p.images, n),
                    [next; 3]
                );
            }
        }
    }
}

#[test]
fn a_template_that_drops_an_image_is_refused_naming_the_counts() {
    let r: Value = serde_json::from_str(
        &std::fs::read_to_string(dir("llava").join("reference.json")).expect("reference"),
    )
    .expect("json");
    let case = &r["cases"][0];
    let d = dir("llava");
    let mut tok = TextTokenizer::from_hf_dir(&d).expect("tokenizer");
    tok.set_content_parts(crate::tokenizer::ContentParts::Typed);
    let req = request(message(case));
    // Two expansions for the template's one marker.
    let texts = vec!["<image>".to_string(), "<image>".to_string()];
    let e = render_with_images(&tok, &req, Some(("<image>", &texts))).expect_err("refused");
    assert_eq!(
        e.message,
        "messages: the chat template placed 1 image markers (\"<image>\") for 2 images"
    );
}
