//! Every architecture against transformers: the seven tiny random models of
//! `../shared/fixtures/tiny-models/` load from their Hugging Face directories and from
//! their GGUF conversions (`daemon/tests/fixtures/tiny-gguf/`, made by
//! `scripts/convert-tiny-gguf.py` as llama.cpp's converter does), and give transformers'
//! f32 logits within 1e-4 of the logits' largest magnitude at every recorded position,
//! and its greedy continuation token for token (through the KV-cached decode path).

use std::path::{Path, PathBuf};

use candle_core::Device;
use serde_json::Value;

use super::lora::AdapterUse;
use super::{load, ForwardSeq, LoadOptions, MatrixPolicy, Model, SoloKv};
use crate::test_support::{fixtures_dir, workspace_root};

pub(crate) const ARCHS: [&str; 7] = [
    "llama",
    "mistral",
    "qwen2",
    "qwen3",
    "qwen3_moe",
    "gemma3",
    "phi3",
];

/// Tolerance relative to the largest |logit| of the reference row.
const REL_TOL: f32 = 1e-4;
/// GGUF files follow llama.cpp's numerics, whose GELU (Gemma 3's activation) is a
/// table lookup on f16-rounded inputs with f16 results (`ggml_vec_geglu_f32` under
/// `GGML_GELU_FP16`): a relative error up to 2⁻¹¹ per activation against transformers'
/// f32 GELU.
const REL_TOL_GGML_GELU: f32 = 1e-3;

pub(crate) fn ids(v: &Value) -> Vec<u32> {
    v.as_array()
        .expect("ids")
        .iter()
        .map(|x| x.as_u64().expect("id") as u32)
        .collect()
}

pub(crate) fn floats(v: &Value) -> Vec<f32> {
    v.as_array()
        .expect("floats")
        .iter()
        .map(|x| x.as_f64().expect("float") as f32)
        .collect()
}

pub(crate) fn load_model(path: &Path) -> Model {
    let opts = LoadOptions {
        device: Device::Cpu,
        matrices: MatrixPolicy::default(),
    };
    load(path, &opts)
        .unwrap_or_else(|e| panic!("loading {}: {e}", path.display()))
        .model
}

/// Largest |ours − theirs| over `theirs`' largest magnitude.
pub(crate) fn rel_diff(ours: &[f32], theirs: &[f32]) -> f32 {
    assert_eq!(ours.len(), theirs.len(), "vocabulary size");
    let scale = theirs.iter().fold(0f32, |m, x| m.max(x.abs()));
    let diff = ours
        .iter()
        .zip(theirs)
        .fold(0f32, |m, (a, b)| m.max((a - b).abs()));
    diff / scale
}

/// Logits of every position of `tokens` in one prefill, `(len, vocab)`.
fn all_logits(model: &Model, tokens: &[u32]) -> Vec<Vec<f32>> {
    all_logits_with(model, tokens, None)
}

/// [`all_logits`] with a LoRA adapter.
pub(crate) fn all_logits_with(
    model: &Model,
    tokens: &[u32],
    adapter: Option<AdapterUse<'_>>,
) -> Vec<Vec<f32>> {
    let mut cache = SoloKv::new(&model.kv_layout(), model.device()).expect("kv");
    let (pool, table, start) = cache.reserve(tokens.len()).expect("reserve");
    let seq = ForwardSeq {
        tokens,
        start_pos: start,
        block_table: table,
        logit_rows: tokens.len(),
        prompt_len: tokens.len(),
        adapter,
        media: None,
    };
    model
        .forward_batch(&[seq], pool)
        .expect("forward")
        .expect("logits")
        .to_vec2::<f32>()
        .expect("rows")
}

fn argmax(v: &[f32]) -> u32 {
    let mut best = 0;
    for (i, x) in v.iter().enumerate() {
        if *x > v[best] {
            best = i;
        }
    }
    best as u32
}

/// Checks one model file or directory against `reference.json`; returns the worst
/// relative logit difference.
fn check(model: &Model, reference: &Value, what: &str, tol: f32) -> f32 {
    check_with(model, reference, what, tol, None)
}

/// [`check`] with a LoRA adapter (its references have no chat prompts).
pub(crate) fn check_with(
    model: &Model,
    reference: &Value,
    what: &str,
    tol: f32,
    adapter: Option<AdapterUse<'_>>,
) -> f32 {
    let mut worst = 0f32;
    for s in reference["sequences"].as_array().expect("sequences") {
        let input = ids(&s["input_ids"]);
        let ours = all_logits_with(model, &input, adapter);
        let name = s["name"].as_str().unwrap_or("?");
        let d = rel_diff(&ours[input.len() - 1], &floats(&s["last_logits"]));
        assert!(d <= tol, "{what} {name}: last logits differ by {d}");
        worst = worst.max(d);
        if let Some(all) = s.get("all_logits").and_then(Value::as_array) {
            for (p, row) in all.iter().enumerate() {
                let d = rel_diff(&ours[p], &floats(row));
                assert!(d <= tol, "{what} {name} position {p}: logits differ by {d}");
                worst = worst.max(d);
            }
        }
    }
    let chats = match adapter {
        None => reference["chat"].as_array().expect("chat").as_slice(),
        Some(_) => &[],
    };
    for c in chats {
        let input = ids(&c["input_ids"]);
        let ours = all_logits_with(model, &input, adapter);
        let d = rel_diff(&ours[input.len() - 1], &floats(&c["last_logits"]));
        assert!(d <= tol, "{what} chat: last logits differ by {d}");
        worst = worst.max(d);
    }
    // Greedy with the KV cache: prefill, then one token per step.
    let g = &reference["greedy"];
    let want = ids(&g["new_token_ids"]);
    let mut cache = SoloKv::new(&model.kv_layout(), model.device()).expect("kv");
    let mut next = ids(&g["input_ids"]);
    let mut got = Vec::new();
    for _ in 0..want.len() {
        let l = model
            .forward_with(&next, &mut cache, adapter)
            .and_then(|t| t.to_vec1::<f32>())
            .expect("decode");
        let t = argmax(&l);
        got.push(t);
        next = vec![t];
    }
    assert_eq!(got, want, "{what}: greedy continuation");
    worst
}

pub(crate) fn tiny_dir(arch: &str) -> PathBuf {
    fixtures_dir().join("tiny-models").join(arch)
}

pub(crate) fn tiny_gguf(arch: &str) -> PathBuf {
    workspace_root()
        .join("daemon/tests/fixtures/tiny-gguf")
        .join(format!("{arch}.gguf"))
}

#[test]
fn tiny_models_match_transformers_from_hf_directories() {
    let mut report = Vec::new();
    for arch in ARCHS {
        let reference =
            crate::test_support::fixture_json(&format!("tiny-models/{arch}/reference.json"));
        let worst = check(&load_model(&tiny_dir(arch)), &reference, arch, REL_TOL);
        report.push(format!("{arch}: {worst:.2e}"));
    }
    eprintln!("HF directories, worst relative logit difference: {report:?}");
}

#[test]
fn tiny_models_match_transformers_from_gguf_conversions() {
    let mut report = Vec::new();
    for arch in ARCHS {
        let reference =
            crate::test_support::fixture_json(&format!("tiny-models/{arch}/reference.json"));
        let tol = if arch == "gemma3" {
            REL_TOL_GGML_GELU
        } else {
            REL_TOL
        };
        let worst = check(&load_model(&tiny_gguf(arch)), &reference, arch, tol);
        report.push(format!("{arch}: {worst:.2e}"));
    }
    eprintln!("GGUF conversions, worst relative logit difference: {report:?}");
}

/// transformers 5.x spells the config differently (`rope_parameters`, nested per layer
/// type for Gemma 3; `num_local_experts`): the models load and match with the 4.x keys
/// the fixtures added removed.
#[test]
fn config_json_without_the_4x_keys_loads_the_same() {
    for arch in ARCHS {
        let src = tiny_dir(arch);
        let reference =
            crate::test_support::fixture_json(&format!("tiny-models/{arch}/reference.json"));
        let dir = tempfile::tempdir().expect("tempdir");
        let mut config: Value = serde_json::from_str(
            &std::fs::read_to_string(src.join("config.json")).expect("config"),
        )
        .expect("json");
        for k in reference["config_keys_added_for_transformers4_compat"]
            .as_array()
            .expect("keys")
        {
            let k = k.as_str().expect("key");
            assert!(
                config.as_object_mut().expect("obj").remove(k).is_some(),
                "{arch}: {k}"
            );
        }
        std::fs::write(dir.path().join("config.json"), config.to_string()).expect("write");
        std::fs::copy(
            src.join("model.safetensors"),
            dir.path().join("model.safetensors"),
        )
        .expect("copy");
        check(
            &load_model(dir.path()),
            &reference,
            &format!("{arch} (5.x keys)"),
            REL_TOL,
        );
    }
}

/// The tensor-ops backend (the path CUDA takes: candle ops, f16 device KV pool, masks
/// for the sliding window) on every architecture, run here on the CPU with a
/// tensor-backed pool: last logits of the 33-token sequence within 2e-3 of
/// transformers' (f16 K/V) and the same argmax.
#[test]
fn tensor_backend_matches_transformers_on_every_architecture() {
    use super::KvBlockPool;
    for arch in ARCHS {
        let model = load_model(&tiny_dir(arch));
        let reference =
            crate::test_support::fixture_json(&format!("tiny-models/{arch}/reference.json"));
        let s = &reference["sequences"][2];
        let input = ids(&s["input_ids"]);
        let mut pool =
            KvBlockPool::new_tensor_backed(&model.kv_layout(), 16, 4, &Device::Cpu).expect("pool");
        let table = [3u32, 0, 2];
        // Prefill in two chunks, then check the last row.
        for (start, end, rows) in [(0, 20, 0), (20, input.len(), 1)] {
            let seq = ForwardSeq {
                tokens: &input[start..end],
                start_pos: start,
                block_table: &table,
                logit_rows: rows,
                prompt_len: 0,
                adapter: None,
                media: None,
            };
            let out = model.forward_batch_ops(&[seq], &mut pool).expect("forward");
            if rows == 1 {
                let ours = out
                    .expect("logits")
                    .to_vec2::<f32>()
                    .expect("rows")
                    .remove(0);
                let theirs = floats(&s["last_logits"]);
                let d = rel_diff(&ours, &theirs);
                assert!(d <= 2e-3, "{arch}: tensor backend differs by {d}");
                assert_eq!(argmax(&ours), argmax(&theirs), "{arch}: argmax");
            }
        }
    }
}

/// An F16 or BF16 checkpoint stays in its dtype in memory (never expanded to f32), gets
/// an f16 KV cache, and still follows transformers' f32 logits closely;
/// `model.quantize = "q8_0"` turns the matrices into Q8_0.
#[test]
fn half_precision_checkpoints_stay_half_and_q8_0_quantizes() {
    use super::layers::Linear;
    use super::matrix::{Kernels, Matrix, Quantize};
    use super::weights::Ffn;
    use candle_core::DType;
    let src = tiny_dir("qwen3");
    let reference = crate::test_support::fixture_json("tiny-models/qwen3/reference.json");
    let s = &reference["sequences"][2];
    let input = ids(&s["input_ids"]);
    let theirs = floats(&s["last_logits"]);
    let tensors =
        candle_core::safetensors::load(src.join("model.safetensors"), &Device::Cpu).expect("load");
    let first_matrix = |m: &Model| -> DType {
        match &m.weights.layers[0].ffn {
            Ffn::Dense {
                down:
                    Linear {
                        base: Matrix::Dense(t),
                        ..
                    },
                ..
            } => t.dtype(),
            other => panic!("expected a dense down projection, got {other:?}"),
        }
    };
    for (dtype, tol) in [(DType::F16, 5e-3f32), (DType::BF16, 3e-2)] {
        let dir = tempfile::tempdir().expect("tmp");
        let half: std::collections::HashMap<String, candle_core::Tensor> = tensors
            .iter()
            .map(|(k, v)| (k.clone(), v.to_dtype(dtype).expect("cast")))
            .collect();
        candle_core::safetensors::save(&half, dir.path().join("model.safetensors")).expect("save");
        std::fs::copy(src.join("config.json"), dir.path().join("config.json")).expect("cfg");
        let m = load_model(dir.path());
        assert_eq!(first_matrix(&m), dtype);
        assert_eq!(m.kv_layout().dtype, super::KvDtype::F16);
        let d = rel_diff(&all_logits(&m, &input)[input.len() - 1], &theirs);
        eprintln!("{dtype:?}: relative logit difference {d:.2e}");
        assert!(d <= tol, "{dtype:?}: {d}");
    }
    let opts = LoadOptions {
        device: Device::Cpu,
        matrices: MatrixPolicy {
            kernels: Kernels::Native,
            quantize: Quantize::Q8_0,
        },
    };
    let m = load(&src, &opts).expect("q8_0").model;
    assert!(matches!(
        m.weights.layers[0].qkv.0.as_slice(),
        [Linear {
            base: Matrix::Cpu(inferd_kernels::CpuMatrix::Ggml(_)),
            parts,
        }] if parts.len() == 3
    ));
    let d = rel_diff(&all_logits(&m, &input)[input.len() - 1], &theirs);
    eprintln!("Q8_0: relative logit difference {d:.2e}");
    // Q8_0 rounds weights and (as ggml) activations to 8 bits: 3.4e-2 measured.
    assert!(d <= 6e-2, "q8_0: {d}");
}
