//! The mmproj GGUFs of `daemon/tests/fixtures/vlm-gguf/<family>/` (llama.cpp's
//! converter run on the transformers fixtures, scripts/make-vlm-gguf-fixtures.sh) read
//! as towers, against transformers' `image_features` of the same weights.
//!
//! Tolerance: 1e-4 where every tensor is F32 (SmolVLM), else 1e-3 of the largest
//! |feature| (3.93 for Gemma 3, 11.8 for LLaVA): the converter stores some matrices as
//! F16 even for `--outtype f32` (Gemma 3's `mm.input_projection.weight`, LLaVA's patch
//! embedding and both projector matrices), and F16 keeps 11 bits (relative 4.9e-4).

use std::path::PathBuf;

use candle_core::Device;
use serde_json::json;

use super::mmproj::{read, Mmproj};
use super::tests::{check_tower, fixture};
use super::VisionTower;
use crate::model::{ModelError, Tower};

fn path(family: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/vlm-gguf")
        .join(family)
        .join("mmproj.gguf")
}

/// The tiny fixtures' vocabulary as far as the image tokens go (SmolVLM's tiles: 64 px
/// longest edge, 32 px tiles).
fn vocab() -> Vec<String> {
    let mut v: Vec<String> = [
        "<image_soft_token>",
        "<start_of_image>",
        "<end_of_image>",
        "<image>",
        "<|image_pad|>",
        "<|vision_start|>",
        "<|vision_end|>",
        "<fake_token_around_image>",
        "<global-img>",
    ]
    .map(String::from)
    .to_vec();
    for r in 1..=2 {
        for c in 1..=2 {
            v.push(format!("<row_{r}_col_{c}>"));
        }
    }
    v
}

fn mmproj(family: &str) -> Mmproj {
    read(&path(family), 64, &vocab()).unwrap_or_else(|e| panic!("{family}: {e}"))
}

fn check(family: &str, tokens_per_frame: usize, tolerance: f32) {
    let m = mmproj(family);
    let tower = VisionTower::from_hf(&m.config, m.tensors, &Device::Cpu).expect("from_hf");
    check_tower(
        &fixture(family, true),
        &tower,
        None,
        tokens_per_frame,
        tolerance,
    );
}

#[test]
fn gemma3_mmproj_matches_transformers() {
    check("gemma3", 16, 4e-3);
    let m = mmproj("gemma3");
    assert_eq!(m.config["image_token_index"], 0);
    assert_eq!(m.config["mm_tokens_per_image"], 16);
    assert_eq!(m.preprocessor["size"], json!({"height": 32, "width": 32}));
}

/// The legacy LLaVA converter's file (fc1/fc2 stored as ffn_down/ffn_up, the last CLIP
/// layer already cut off): the class token first and every stored layer run, as
/// transformers' CLIP does (llama.cpp 0.3.36's own graph puts the class token last and
/// runs one layer fewer, ggml-org/llama.cpp#25814, so it is not the reference here).
#[test]
fn llava_mmproj_matches_transformers() {
    check("llava", 36, 1.2e-2);
    let m = mmproj("llava");
    assert_eq!(m.config["vision_feature_layer"], 2);
    assert_eq!(m.config["vision_config"]["hidden_act"], "quick_gelu");
}

#[test]
fn smolvlm_mmproj_matches_transformers() {
    check("smolvlm", 16, 1e-4);
    let m = mmproj("smolvlm");
    assert_eq!(m.preprocessor["size"], json!({"longest_edge": 64}));
    assert_eq!(
        m.preprocessor["max_image_size"],
        json!({"longest_edge": 32})
    );
}

/// Qwen2.5-VL's file keeps no window size or full-attention list: clip.cpp's 112 px and
/// every `n_wa_pattern`-th block, and its bounds of 8 to 4096 image tokens.
#[test]
fn qwen_mmproj_takes_clip_cpp_settings() {
    let m = mmproj("qwen2_5_vl");
    let vc = &m.config["vision_config"];
    assert_eq!(vc["window_size"], 112);
    assert_eq!(vc["fullatt_block_indexes"], json!([1, 3]));
    assert_eq!(vc["out_hidden_size"], 64);
    assert_eq!(m.config["image_token_id"], 4);
    assert_eq!(m.preprocessor["min_pixels"], 8 * 28 * 28);
    assert_eq!(m.preprocessor["max_pixels"], 4096 * 28 * 28);
    let tower = Tower::from_hf(&m.config, m.tensors, &Device::Cpu).expect("tower");
    assert_eq!(tower.out_dim(), 64);
}

#[test]
fn wrong_files_and_missing_tokens_are_named() {
    let text_model = path("gemma3").with_file_name("model.gguf");
    let e = read(&text_model, 64, &vocab()).expect_err("a text model");
    assert_eq!(
        e.to_string(),
        "model metadata `general.architecture`: an mmproj file has \"clip\" (got \"gemma3\")"
    );
    let e = read(&path("gemma3"), 64, &["<image>".to_string()]).expect_err("vocab");
    assert!(
        matches!(&e, ModelError::Metadata { key, message } if key == "clip.projector_type"
            && message == "\"gemma3\" needs the token \"<image_soft_token>\" in the text model's vocabulary"),
        "{e}"
    );
    let e = read(&path("smolvlm"), 64, &vocab()[..8]).expect_err("no <global-img>");
    assert!(
        e.to_string().contains("needs the token \"<global-img>\""),
        "{e}"
    );
    let e = read(&path("smolvlm"), 64, &vocab()[..12]).expect_err("no <row_2_col_2>");
    assert!(
        e.to_string().contains("needs the token \"<row_2_col_2>\""),
        "{e}"
    );
    let png = path("gemma3").with_file_name("grad_32x32.png");
    let e = read(&png, 64, &vocab()).expect_err("not GGUF");
    assert!(matches!(e, ModelError::Corrupt { .. }), "{e}");
}
