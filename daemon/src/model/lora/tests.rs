//! LoRA against transformers + PEFT: the PEFT adapters of
//! `daemon/tests/fixtures/lora-peft/` (rank 8, alpha 16, made by
//! `scripts/make-lora-fixtures.py`) on the seven tiny models give PEFT's f32 logits
//! within 1e-4 of the largest |logit| at every recorded position, and its greedy
//! continuation token for token; rsLoRA and `layers_to_transform` once each. A batch
//! mixing adapters gives every row its solo bits; bad adapters are refused by name.

use std::path::{Path, PathBuf};

use candle_core::Device;

use super::{AdapterUse, LoraAdapter, LoraBase, LoraError};
use crate::model::reference_tests::{
    all_logits_with, check_with, ids, load_model, rel_diff, tiny_dir, tiny_gguf, ARCHS,
};
use crate::model::{ForwardSeq, KvBlockPool, Model, SoloKv};
use crate::test_support::workspace_root;

/// Relative tolerance, as the base models' reference tests.
const REL_TOL: f32 = 1e-4;
/// GGUF conversions run ggml's GELU (see `reference_tests::REL_TOL_GGML_GELU`).
const REL_TOL_GGML_GELU: f32 = 1e-3;

pub(crate) fn peft_dir(name: &str) -> PathBuf {
    workspace_root()
        .join("daemon/tests/fixtures/lora-peft")
        .join(name)
}

fn reference(name: &str) -> serde_json::Value {
    let p = peft_dir(name).join("reference.json");
    serde_json::from_str(&std::fs::read_to_string(&p).expect("reference")).expect("json")
}

fn adapter(name: &str, model: &Model) -> LoraAdapter {
    LoraAdapter::load(name, &peft_dir(name), &LoraBase::of(model), None)
        .unwrap_or_else(|e| panic!("loading {name}: {e}"))
}

fn use_of(a: &LoraAdapter) -> Option<AdapterUse<'_>> {
    Some(AdapterUse {
        adapter: a,
        scale: 1.0,
    })
}

#[test]
fn peft_adapters_match_transformers_peft_on_every_architecture() {
    let mut report = Vec::new();
    for (name, base) in ARCHS
        .iter()
        .map(|a| (*a, *a))
        .chain([("llama-rslora", "llama"), ("llama-layers", "llama")])
    {
        let model = load_model(&tiny_dir(base));
        let a = adapter(name, &model);
        let r = reference(name);
        let worst = check_with(&model, &r, &format!("{name} (HF)"), REL_TOL, use_of(&a));
        report.push(format!("{name}: {worst:.2e}"));
    }
    eprintln!("PEFT adapters on HF directories, worst relative logit difference: {report:?}");
}

/// The same adapters on the tiny models' GGUF conversions (ggml numerics).
#[test]
fn peft_adapters_match_on_gguf_conversions() {
    let mut report = Vec::new();
    for arch in ARCHS {
        let model = load_model(&tiny_gguf(arch));
        let a = adapter(arch, &model);
        let tol = if arch == "gemma3" {
            REL_TOL_GGML_GELU
        } else {
            REL_TOL
        };
        let worst = check_with(
            &model,
            &reference(arch),
            &format!("{arch} (GGUF)"),
            tol,
            use_of(&a),
        );
        report.push(format!("{arch}: {worst:.2e}"));
    }
    eprintln!("PEFT adapters on GGUF conversions, worst relative logit difference: {report:?}");
}

/// The scale is the PEFT scaling times the request's: at 0 the base model's logits come
/// back bit for bit, and the adapter really moves them at 1.
#[test]
fn scale_zero_is_the_base_model() {
    let model = load_model(&tiny_dir("qwen2"));
    let a = adapter("qwen2", &model);
    let r = reference("qwen2");
    let input = ids(&r["sequences"][1]["input_ids"]);
    let base = all_logits_with(&model, &input, None);
    let zero = all_logits_with(
        &model,
        &input,
        Some(AdapterUse {
            adapter: &a,
            scale: 0.0,
        }),
    );
    assert_eq!(base, zero);
    let one = all_logits_with(&model, &input, use_of(&a));
    assert_ne!(base, one);
    assert_eq!(a.scale(1.0), 2.0);
    assert_eq!(a.scale(0.5), 1.0);
}

/// One forward pass over the base and two adapters (and one adapter at two scales):
/// each sequence's logits equal what it gets alone, bit for bit on ggml's kernels
/// (GGUF); within 1e-6 of the largest |logit| on candle's gemm (HF weights), whose
/// summation blocking depends on the row count, for the base model too.
#[test]
fn a_batch_mixing_adapters_gives_each_row_its_solo_logits() {
    for path in [tiny_dir("llama"), tiny_gguf("llama")] {
        let model = load_model(&path);
        let a = adapter("llama", &model);
        let b = adapter("llama-rslora", &model);
        let r = reference("llama");
        let prompt = ids(&r["sequences"][2]["input_ids"]);
        let uses = [
            None,
            use_of(&a),
            use_of(&b),
            Some(AdapterUse {
                adapter: &a,
                scale: 0.5,
            }),
        ];
        // Alone: the prompt's last logits only, as in the batch (candle's gemm, which the
        // PEFT pairs run on, may round differently for another row count).
        let solo: Vec<Vec<f32>> = uses
            .iter()
            .map(|u| {
                let mut kv = SoloKv::new(&model.kv_layout(), model.device()).expect("kv");
                model
                    .forward_with(&prompt, &mut kv, *u)
                    .and_then(|t| t.to_vec1::<f32>())
                    .expect("solo")
            })
            .collect();
        let layout = model.kv_layout();
        let mut pool = KvBlockPool::new(&layout, 16, 16, &Device::Cpu).expect("pool");
        let tables: Vec<Vec<u32>> = (0..4u32)
            .map(|i| vec![4 * i, 4 * i + 1, 4 * i + 2])
            .collect();
        let seqs: Vec<ForwardSeq<'_>> = uses
            .iter()
            .zip(&tables)
            .map(|(u, t)| ForwardSeq {
                tokens: &prompt,
                start_pos: 0,
                block_table: t,
                logit_rows: 1,
                prompt_len: prompt.len(),
                adapter: *u,
                media: None,
            })
            .collect();
        let rows = model
            .forward_batch(&seqs, &mut pool)
            .expect("forward")
            .expect("logits")
            .to_vec2::<f32>()
            .expect("rows");
        let gguf = path.extension().is_some_and(|e| e == "gguf");
        for (i, (row, want)) in rows.iter().zip(&solo).enumerate() {
            if gguf {
                assert_eq!(row, want, "{}: sequence {i}", path.display());
            } else {
                let d = rel_diff(row, want);
                assert!(d <= 1e-6, "{}: sequence {i}: {d}", path.display());
            }
        }
        assert_ne!(solo[0], solo[1]);
        assert_ne!(solo[1], solo[2]);
        assert_ne!(solo[1], solo[3]);
    }
}

/// A copy of a fixture adapter with `edit` applied to its config.
fn edited(
    name: &str,
    edit: impl FnOnce(&mut serde_json::Map<String, serde_json::Value>),
) -> tempfile::TempDir {
    let dir = tempfile::tempdir().expect("tmp");
    let src = peft_dir(name);
    let mut cfg: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(src.join("adapter_config.json")).expect("cfg"),
    )
    .expect("json");
    edit(cfg.as_object_mut().expect("object"));
    std::fs::write(dir.path().join("adapter_config.json"), cfg.to_string()).expect("write");
    std::fs::copy(
        src.join("adapter_model.safetensors"),
        dir.path().join("adapter_model.safetensors"),
    )
    .expect("copy");
    dir
}

fn refused(path: &Path, model: &Model) -> LoraError {
    match LoraAdapter::load("bad", path, &LoraBase::of(model), None) {
        Ok(_) => panic!("{} loaded", path.display()),
        Err(e) => e,
    }
}

#[test]
fn unimplemented_or_unfitting_adapters_are_refused_by_name() {
    let model = load_model(&tiny_dir("llama"));
    let check = |dir: &tempfile::TempDir, want: &[&str]| {
        let e = refused(dir.path(), &model);
        let msg = e.to_string();
        assert_eq!(e.adapter, "bad");
        assert!(msg.starts_with("LoRA adapter `bad`: "), "{msg}");
        for w in want {
            assert!(msg.contains(w), "{msg:?} lacks {w:?}");
        }
        assert!(!msg.contains('\n'), "{msg}");
    };
    let set = |k: &'static str, v: serde_json::Value| {
        edited("llama", move |c| {
            c.insert(k.into(), v);
        })
    };
    check(
        &set("use_dora", true.into()),
        &["use_dora = true is not implemented"],
    );
    check(&set("lora_bias", true.into()), &["lora_bias"]);
    check(
        &set("modules_to_save", serde_json::json!(["lm_head"])),
        &["modules_to_save = [\"lm_head\"] is not"],
    );
    check(
        &set("bias", "all".into()),
        &["bias = \"all\" is not implemented (only \"none\")"],
    );
    check(
        &set("rank_pattern", serde_json::json!({"q_proj": 4})),
        &["rank_pattern"],
    );
    check(&set("peft_type", "IA3".into()), &["peft_type", "IA3"]);
    check(
        &set("r", 4.into()),
        &["rank 8 (A) and 8 (B) where the adapter's rank is 4"],
    );
    check(
        &set("r", 0.into()),
        &["r must be an integer in 1..=65536, found 0"],
    );
    check(
        &set("lora_alpha", "x".into()),
        &["lora_alpha must be a finite number"],
    );
    check(
        &set("layers_to_transform", serde_json::json!([0])),
        &["layer 1 is not in layers_to_transform [0]"],
    );
    check(
        &set("target_modules", serde_json::json!(["k_proj"])),
        &["module \"model.layers.0.mlp.down_proj\" is not in target_modules"],
    );
    check(
        &set("target_modules", "(".into()),
        &["target_modules \"(\" is not a regular expression"],
    );
    // A regular expression as PEFT matches it (the whole path).
    let ok = set("target_modules", ".*\\.(q|k|v|o|gate|up|down)_proj".into());
    LoraAdapter::load("ok", ok.path(), &LoraBase::of(&model), None).expect("regex targets");
    // The rank bound.
    let e = LoraAdapter::load("big", &peft_dir("llama"), &LoraBase::of(&model), Some(4))
        .expect_err("bound");
    assert!(
        e.to_string().contains("rank 8 exceeds lora.max_rank = 4"),
        "{e}"
    );
    // Missing and damaged weights.
    let d = set("r", 8.into());
    std::fs::remove_file(d.path().join("adapter_model.safetensors")).expect("rm");
    check(&d, &["adapter_model.safetensors is missing"]);
    std::fs::write(
        d.path().join("adapter_model.safetensors"),
        b"\x08\0\0\0\0\0\0\0{}garbage",
    )
    .expect("write");
    check(&d, &["is not a valid safetensors file"]);
    std::fs::remove_file(d.path().join("adapter_config.json")).expect("rm");
    check(&d, &["adapter_config.json"]);
    // An adapter made for other shapes: the tiny llama's adapter on the 3-layer-wider
    // phi3 would fit; the qwen3_moe adapter's projections fit too. The MoE model has no
    // dense MLP sites for the llama adapter's gate/up/down.
    let moe = load_model(&tiny_dir("qwen3_moe"));
    let e = refused(&peft_dir("llama"), &moe);
    assert!(
        e.to_string()
            .contains("the MoE experts and router take no adapter"),
        "{e}"
    );
}

/// Shapes are checked against the base: a model of another width refuses the
/// adapter, naming the tensor and both shapes.
#[test]
fn an_adapter_for_other_shapes_is_refused_naming_both() {
    let model = load_model(&tiny_dir("qwen3"));
    // qwen3's heads are 16 wide like llama's, but edit the saved A of q_proj to the
    // wrong input width.
    let dir = tempfile::tempdir().expect("tmp");
    let src = peft_dir("llama");
    std::fs::copy(
        src.join("adapter_config.json"),
        dir.path().join("adapter_config.json"),
    )
    .expect("cfg");
    let mut t = candle_core::safetensors::load(src.join("adapter_model.safetensors"), &Device::Cpu)
        .expect("load");
    let key = "base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight";
    t.insert(
        key.into(),
        candle_core::Tensor::zeros((8, 32), candle_core::DType::F32, &Device::Cpu).expect("z"),
    );
    candle_core::safetensors::save(&t, dir.path().join("adapter_model.safetensors")).expect("save");
    let e = refused(dir.path(), &model);
    assert_eq!(
        e.message,
        "tensor `layers.0.q_proj`: A (r, in) × B (out, r) adapt a (64, 64) matrix, but the \
         adapter's are A (8, 32) and B (64, 8)"
    );
}

/// The tensor-ops backend (CUDA's path), here on the CPU with a tensor-backed f16 KV
/// pool: every architecture's adapter gives PEFT's last logits of the 33-token
/// sequence within 2e-3 of the largest |logit| (f16 K/V) and the same argmax.
#[test]
fn tensor_backend_applies_adapters_on_every_architecture() {
    for arch in ARCHS {
        let model = load_model(&tiny_dir(arch));
        let a = adapter(arch, &model);
        let r = reference(arch);
        let s = &r["sequences"][2];
        let input = ids(&s["input_ids"]);
        let mut pool =
            KvBlockPool::new_tensor_backed(&model.kv_layout(), 16, 4, &Device::Cpu).expect("pool");
        let seq = ForwardSeq {
            tokens: &input,
            start_pos: 0,
            block_table: &[3, 0, 2],
            logit_rows: 1,
            prompt_len: 0,
            adapter: use_of(&a),
            media: None,
        };
        let ours = model
            .forward_batch_ops(&[seq], &mut pool)
            .expect("forward")
            .expect("logits")
            .to_vec2::<f32>()
            .expect("rows")
            .remove(0);
        let theirs = crate::model::reference_tests::floats(&s["last_logits"]);
        let d = rel_diff(&ours, &theirs);
        assert!(d <= 2e-3, "{arch}: {d}");
        let argmax = |v: &[f32]| {
            v.iter()
                .enumerate()
                .max_by(|x, y| x.1.total_cmp(y.1))
                .map(|(i, _)| i)
        };
        assert_eq!(argmax(&ours), argmax(&theirs), "{arch}");
    }
}

/// Timing probe (by hand): decode steps of the default model alone and with a GGUF
/// adapter, `INFERD_LORA_PROBE=path/to/adapter.gguf cargo test --release -p inferd --lib
/// lora_decode_probe -- --ignored --nocapture` (`INFERD_TEST_MODEL` for another model,
/// `INFERD_LORA_PROBE_PROMPT` for another prompt length than 128,
/// `INFERD_LORA_PROBE_ONLY=base|lora` for one side alone, as under `perf stat`).
#[test]
#[ignore = "a timing probe, run by hand"]
fn lora_decode_probe() {
    let Some(path) = std::env::var_os("INFERD_LORA_PROBE") else {
        return;
    };
    let model = load_model(&crate::test_support::default_model_path());
    let a = LoraAdapter::load(
        "probe",
        std::path::Path::new(&path),
        &LoraBase::of(&model),
        None,
    )
    .expect("adapter");
    let n_prompt: u32 = std::env::var("INFERD_LORA_PROBE_PROMPT")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(128);
    let only = std::env::var("INFERD_LORA_PROBE_ONLY").ok();
    for round in 0..3 {
        for (what, u) in [("base", None), ("lora", use_of(&a))] {
            if only.as_deref().is_some_and(|o| o != what) {
                continue;
            }
            let mut kv = SoloKv::new(&model.kv_layout(), model.device()).expect("kv");
            let prompt: Vec<u32> = (0..n_prompt).map(|i| 100 + i).collect();
            let t0 = std::time::Instant::now();
            model.forward_with(&prompt, &mut kv, u).expect("prefill");
            let pf = t0.elapsed().as_secs_f64();
            let t1 = std::time::Instant::now();
            for i in 0..32 {
                model.forward_with(&[200 + i], &mut kv, u).expect("decode");
            }
            let dc = t1.elapsed().as_secs_f64();
            eprintln!(
                "round {round} {what}: prefill {:.1} tok/s, decode {:.1} tok/s",
                f64::from(n_prompt) / pf,
                32.0 / dc
            );
        }
    }
}
