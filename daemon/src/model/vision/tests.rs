//! The towers and projectors against transformers 5.24.0 on the fixtures of
//! `daemon/tests/fixtures/vlm/<family>/` (`reference.json`, made by
//! `scripts/make-vlm-fixtures.py`): image features and the tower's own output per case.

use std::collections::HashMap;
use std::path::PathBuf;

use candle_core::{Device, Tensor};
use serde_json::{json, Value};

use super::{VisionPixels, VisionTower};
use crate::model::ModelError;

const TOLERANCE: f32 = 1e-4;

pub(super) struct Fixture {
    config: Value,
    tensors: HashMap<String, Tensor>,
    reference: Value,
}

fn dir(family: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/vlm")
        .join(family)
}

fn json_file(path: PathBuf) -> Value {
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// The fixture's config, its vision-side tensors (split off by `tensor_prefixes`) and,
/// when `with_reference`, its reference.json.
pub(super) fn fixture(family: &str, with_reference: bool) -> Fixture {
    let config = json_file(dir(family).join("config.json"));
    let arch = config["architectures"][0]
        .as_str()
        .expect("architectures[0]");
    let prefixes = VisionTower::tensor_prefixes(arch);
    assert!(!prefixes.is_empty(), "{arch}");
    let all = candle_core::safetensors::load(dir(family).join("model.safetensors"), &Device::Cpu)
        .expect("model.safetensors");
    let tensors: HashMap<String, Tensor> = all
        .into_iter()
        .filter(|(k, _)| prefixes.iter().any(|p| k.starts_with(p)))
        .collect();
    let reference = match with_reference {
        true => json_file(dir(family).join("reference.json")),
        false => Value::Null,
    };
    Fixture {
        config,
        tensors,
        reference,
    }
}

fn build(f: &Fixture) -> VisionTower {
    VisionTower::from_hf(&f.config, f.tensors.clone(), &Device::Cpu).expect("from_hf")
}

fn shape(v: &Value) -> Vec<usize> {
    let s = v["shape"].as_array().expect("shape");
    s.iter()
        .map(|d| d.as_u64().expect("dim") as usize)
        .collect()
}

fn values(v: &Value) -> Vec<f32> {
    let s = v["values"].as_array().expect("values");
    s.iter()
        .map(|x| x.as_f64().expect("float") as f32)
        .collect()
}

fn flat(ts: &[Tensor]) -> Vec<f32> {
    let t = Tensor::cat(ts, 0).expect("cat");
    t.flatten_all()
        .and_then(|t| t.to_vec1::<f32>())
        .expect("to_vec1")
}

fn max_abs_diff(what: &str, got: &[f32], want: &[f32]) -> f32 {
    max_abs_diff_within(what, got, want, TOLERANCE)
}

fn max_abs_diff_within(what: &str, got: &[f32], want: &[f32], tolerance: f32) -> f32 {
    assert_eq!(got.len(), want.len(), "{what}: element count");
    let d = got
        .iter()
        .zip(want)
        .map(|(a, b)| (a - b).abs())
        .fold(0f32, f32::max);
    println!("{what}: max |Δ| = {d:.3e}");
    assert!(d < tolerance, "{what}: max |Δ| = {d} ≥ {tolerance}");
    d
}

/// Every case of `family`: each image encoded on its own, features concatenated in
/// image order, compared with `image_features`; the tower's output with `hidden_key`.
fn check_family(family: &str, hidden_key: &str, tokens_per_frame: usize) {
    let f = fixture(family, true);
    check_tower(
        &f,
        &build(&f),
        Some(hidden_key),
        tokens_per_frame,
        TOLERANCE,
    );
}

/// `tower` on every case of the fixture `f`'s reference: `image_features` (and the
/// tower's own output with `hidden_key`) within `tolerance`.
pub(super) fn check_tower(
    f: &Fixture,
    tower: &VisionTower,
    hidden_key: Option<&str>,
    tokens_per_frame: usize,
    tolerance: f32,
) {
    let family = f.reference["family"].as_str().unwrap_or("?");
    assert_eq!(tower.tokens_per_frame(), tokens_per_frame);
    assert_eq!(tower.out_dim(), 64);
    let cases = f.reference["cases"].as_array().expect("cases");
    assert_eq!(cases.len(), 3);
    // A case of several images stores no values: they are its images' single-image cases'.
    let mut by_image: HashMap<String, Vec<f32>> = HashMap::new();
    for case in cases {
        let name = case["name"].as_str().expect("name");
        let px = &case["pixel_values"];
        let dims = shape(px);
        let data = match px["values"].is_null() {
            false => values(px),
            true => case["images"]
                .as_array()
                .expect("images")
                .iter()
                .flat_map(|i| by_image[i.as_str().expect("image")].clone())
                .collect(),
        };
        if let [image] = case["images"].as_array().expect("images").as_slice() {
            by_image.insert(image.as_str().expect("image").to_string(), data.clone());
        }
        // (images, 3, H, W), or Idefics3's (1, all tiles, 3, H, W) with rows/cols per image.
        let (h, w) = (dims[dims.len() - 2], dims[dims.len() - 1]);
        let images = case["images"].as_array().expect("images").len();
        let frames: Vec<usize> = match dims.len() {
            5 => (0..images)
                .map(|i| {
                    let r = case["rows"][i].as_u64().expect("rows") as usize;
                    let c = case["cols"][i].as_u64().expect("cols") as usize;
                    r * c + 1
                })
                .collect(),
            _ => vec![1; images],
        };
        let frame_len = 3 * h * w;
        assert_eq!(
            frames.iter().sum::<usize>() * frame_len,
            data.len(),
            "{name}"
        );
        let (mut features, mut hidden, mut start) = (Vec::new(), Vec::new(), 0);
        for &n in &frames {
            let px = VisionPixels::Frames {
                data: &data[start * frame_len..(start + n) * frame_len],
                frames: n,
                height: h,
                width: w,
            };
            let out = tower.encode(px).expect("encode");
            assert_eq!(out.dims(), &[n * tokens_per_frame, 64]);
            features.push(out);
            hidden.extend(tower.encode_hidden(px).expect("encode_hidden"));
            start += n;
        }
        let want = &case["image_features"];
        max_abs_diff_within(
            &format!("{family}/{name} image_features {:?}", shape(want)),
            &flat(&features),
            &values(want),
            tolerance,
        );
        let Some(hidden_key) = hidden_key else {
            continue;
        };
        if let Some(want) = case.get(hidden_key) {
            max_abs_diff(
                &format!("{family}/{name} {hidden_key} {:?}", shape(want)),
                &flat(&hidden),
                &values(want),
            );
        } else {
            assert_eq!(name, "both", "{family}/{name} records no {hidden_key}");
        }
    }
}

#[test]
fn gemma3_matches_transformers() {
    check_family("gemma3", "vision_tower_last_hidden_state", 16);
}

#[test]
fn llava_matches_transformers() {
    check_family("llava", "vision_hidden_states_minus2", 36);
}

#[test]
fn smolvlm_matches_transformers() {
    check_family("smolvlm", "vision_last_hidden_state", 16);
}

#[test]
fn llava_full_strategy_keeps_the_class_row() {
    let mut f = fixture("llava", false);
    let default = build(&f);
    f.config["vision_feature_select_strategy"] = json!("full");
    let full = build(&f);
    assert_eq!(full.tokens_per_frame(), 37);
    let data: Vec<f32> = (0..3 * 24 * 24)
        .map(|i| ((i % 97) as f32 / 48.0) - 1.0)
        .collect();
    let px = VisionPixels::Frames {
        data: &data,
        frames: 1,
        height: 24,
        width: 24,
    };
    let a = default.encode(px).expect("default");
    let b = full.encode(px).expect("full");
    assert_eq!(b.dims(), &[37, 64]);
    let tail = b.narrow(0, 1, 36).expect("narrow");
    let d = (a - tail)
        .and_then(|d| d.abs()?.flatten_all()?.max(0)?.to_scalar::<f32>())
        .expect("diff");
    assert_eq!(d, 0.0);
}

fn tensor_error(r: Result<VisionTower, ModelError>) -> (String, String) {
    match r {
        Err(ModelError::Tensor { name, message }) => (name, message),
        other => panic!("expected a tensor error, got {other:?}"),
    }
}

fn metadata_error(r: Result<VisionTower, ModelError>) -> (String, String) {
    match r {
        Err(ModelError::Metadata { key, message }) => (key, message),
        other => panic!("expected a metadata error, got {other:?}"),
    }
}

#[test]
fn a_missing_or_misshapen_tensor_is_named() {
    let f = fixture("gemma3", false);
    let name = "vision_tower.vision_model.encoder.layers.1.mlp.fc2.weight";
    let mut t = f.tensors.clone();
    assert!(t.remove(name).is_some());
    let (n, m) = tensor_error(VisionTower::from_hf(&f.config, t, &Device::Cpu));
    assert_eq!((n.as_str(), m.as_str()), (name, "missing"));

    let name = "multi_modal_projector.mm_soft_emb_norm.weight";
    let mut t = f.tensors.clone();
    t.insert(
        name.into(),
        Tensor::zeros(31, candle_core::DType::F32, &Device::Cpu).expect("zeros"),
    );
    let (n, m) = tensor_error(VisionTower::from_hf(&f.config, t, &Device::Cpu));
    assert_eq!(n, name);
    assert!(m.contains("[31]") && m.contains("[32]"), "{m}");

    let f = fixture("smolvlm", false);
    let name = "model.connector.modality_projection.proj.weight";
    let mut t = f.tensors.clone();
    assert!(t.remove(name).is_some());
    let (n, _) = tensor_error(VisionTower::from_hf(&f.config, t, &Device::Cpu));
    assert_eq!(n, name);
    let mut config = f.config.clone();
    config["text_config"]["hidden_size"] = json!(96);
    let (n, m) = tensor_error(VisionTower::from_hf(
        &config,
        f.tensors.clone(),
        &Device::Cpu,
    ));
    assert_eq!(n, name);
    assert!(m.contains("96"), "{m}");
}

#[test]
fn a_bad_config_value_is_named() {
    let f = fixture("llava", false);
    let cases: &[(&str, Value, &str, &str)] = &[
        (
            "vision_config.hidden_size",
            json!("32"),
            "vision_config.hidden_size",
            "\"32\"",
        ),
        (
            "vision_config.hidden_act",
            json!("relu2"),
            "vision_config.hidden_act",
            "relu2",
        ),
        (
            "projector_hidden_act",
            json!("tanh"),
            "projector_hidden_act",
            "tanh",
        ),
        (
            "vision_feature_select_strategy",
            json!("cls"),
            "vision_feature_select_strategy",
            "cls",
        ),
        (
            "vision_feature_layer",
            json!([-2, -1]),
            "vision_feature_layer",
            "[-2,-1]",
        ),
        (
            "vision_feature_layer",
            json!(-5),
            "vision_feature_layer",
            "-5",
        ),
        (
            "vision_config.patch_size",
            json!(5),
            "vision_config.patch_size",
            "5",
        ),
    ];
    for (path, value, key, shown) in cases {
        let mut config = f.config.clone();
        let mut slot = &mut config;
        for part in path.split('.') {
            slot = &mut slot[part];
        }
        *slot = value.clone();
        let (k, m) = metadata_error(VisionTower::from_hf(
            &config,
            f.tensors.clone(),
            &Device::Cpu,
        ));
        assert_eq!(k, format!("config.json: {key}"));
        assert!(m.contains(shown), "{k}: {m}");
    }
    let g = fixture("gemma3", false);
    let mut config = g.config.clone();
    config["mm_tokens_per_image"] = json!(15);
    let (k, m) = metadata_error(VisionTower::from_hf(
        &config,
        g.tensors.clone(),
        &Device::Cpu,
    ));
    assert_eq!(k, "config.json: mm_tokens_per_image", "{m}");

    let mut config = f.config.clone();
    config
        .as_object_mut()
        .expect("object")
        .remove("vision_config");
    let (k, _) = metadata_error(VisionTower::from_hf(
        &config,
        f.tensors.clone(),
        &Device::Cpu,
    ));
    assert_eq!(k, "config.json: vision_config");

    config["architectures"] = json!(["Qwen2VLForConditionalGeneration"]);
    match VisionTower::from_hf(&config, f.tensors.clone(), &Device::Cpu) {
        Err(ModelError::UnsupportedArchitecture { value, .. }) => {
            assert!(value.contains("Qwen2VL"), "{value}")
        }
        other => panic!("expected an unsupported architecture, got {other:?}"),
    }
    assert!(VisionTower::tensor_prefixes("LlamaForCausalLM").is_empty());
}

#[test]
fn frames_of_the_wrong_size_are_refused() {
    let tower = build(&fixture("smolvlm", false));
    let data = vec![0.5f32; 3 * 16 * 16];
    let px = VisionPixels::Frames {
        data: &data,
        frames: 1,
        height: 16,
        width: 16,
    };
    let e = tower.encode(px).expect_err("16×16 tile");
    assert!(e.to_string().contains("32×32"), "{e}");
    let px = VisionPixels::Frames {
        data: &data,
        frames: 2,
        height: 32,
        width: 32,
    };
    assert!(tower.encode(px).is_err());
    let px = VisionPixels::Patches {
        data: &data,
        grid_thw: [1, 4, 4],
    };
    assert!(tower.encode(px).is_err());
}
