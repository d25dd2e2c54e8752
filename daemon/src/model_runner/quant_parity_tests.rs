//! Every quant type against natively built llama.cpp: the default model requantized by
//! `llama-quantize` to Q8_0, Q4_0, Q5_1, Q4_K_M, Q5_K_M, Q6_K and F16, the default Q4_1
//! file, Gemma 3 270M Q4_K_M and Qwen2.5-Coder-1.5B-Instruct Q4_K_M as shipped
//! (`scripts/fetch-model.sh gemma3` / `qwen-coder-1.5b`; `scripts/quant-parity.sh files` makes the
//! requantized files; `daemon/tests/fixtures/quant-parity/<TYPE>.json` holds
//! llama-server's greedy outputs with the top-2 probabilities at every position,
//! `scripts/quant-parity.sh refs` regenerates them).
//!
//! llama.cpp's greedy output is the teacher-forced sequence: the prompt is prefilled, then
//! llama.cpp's tokens are fed one at a time (as llama.cpp decoded them), and at every
//! position our top-1 token and its probability (softmax of the raw logits, what
//! llama-server's `n_probs` reports with `post_sampling_probs: false`) are compared with
//! llama.cpp's. Free-running greedy output is compared up to its first difference.

use std::path::PathBuf;

use candle_core::Device;

use super::parity_tests::argmax;
use crate::model::lora::{AdapterUse, LoraAdapter, LoraBase};
use crate::model::{LoadOptions, MatrixPolicy, Model, SoloKv};
use crate::test_support::{default_model_path, workspace_root};

/// Where `scripts/quant-parity.sh files` puts the requantized files.
fn quant_dir() -> PathBuf {
    if let Some(d) = std::env::var_os("INFERD_QUANT_DIR") {
        return PathBuf::from(d);
    }
    let home = std::env::var_os("HOME")
        .map(PathBuf::from)
        .unwrap_or_default();
    home.join(".cache/inferd/quant-files")
}

/// The model file of a fixture label.
fn model_path(label: &str, file: &str) -> PathBuf {
    match label {
        "Q4_1" => default_model_path(),
        // The LoRA references' bases (`scripts/lora-gguf.sh`).
        l if l.starts_with("smollm2-") => default_model_path(),
        l if l.starts_with("gemma3-") => workspace_root().join("models").join(file),
        "qwen-coder-1.5b-Q4_K_M" => std::env::var_os("INFERD_MODEL_CACHE")
            .map(PathBuf::from)
            .unwrap_or_else(|| quant_dir().with_file_name("models"))
            .join(file),
        _ => quant_dir().join(file),
    }
}

/// Softmax of `logits`: `(argmax, its probability, probability of token t)`, in f64.
fn top1_and_prob(logits: &[f32], t: u32) -> (u32, f64, f64) {
    let best = argmax(logits);
    let max = f64::from(logits[best as usize]);
    let z: f64 = logits.iter().map(|&l| (f64::from(l) - max).exp()).sum();
    let p = |i: u32| (f64::from(logits[i as usize]) - max).exp() / z;
    (best, p(best), p(t))
}

/// Results of one file.
#[derive(Default)]
struct FileResult {
    /// Free-running: tokens equal to llama.cpp's before the first difference, per prompt.
    free: Vec<(usize, usize)>,
    /// Teacher-forced positions and those where our top-1 equals llama.cpp's.
    positions: usize,
    agree: usize,
    /// Disagreements at positions where llama.cpp's top-2 margin exceeded twice the
    /// file's probability bound.
    clear_misses: Vec<String>,
    /// Largest |our p(llama.cpp's top-1) − llama.cpp's p1|.
    max_dp: f64,
}

/// What each file must reach (measured on this commit line; docs/performance.md has
/// the table): `(label, free-running prompts equal in full, max |Δp|)`; teacher-forced
/// top-1 agreement must be ≥ 90 % everywhere.
/// - Q4_1, Q5_1, Q8_0, Q4_0, Q4_K_M, Q5_K_M, Q6_K: every intermediate tensor equals
///   llama.cpp's bit for bit (`model::trace_tests`) — including llama.cpp's repacked
///   Q4_0/Q4_K gemm and gemv and its tiled K-quant kernel, chosen per row as llama.cpp
///   chooses them (`inferd_kernels::paths`, `inferd_kernels::ubatch`) — so every prompt matches
///   in full and the probabilities agree to llama-server's f32 softmax as the JSON
///   records it (≤ 2.5e-4 measured).
/// - F16: the same, with llamafile's tinyBLAS order for the prompt's products.
/// - gemma3-Q4_K_M-swa-full: against llama-server `--swa-full`, which keeps the whole
///   history of the sliding-window layers as our pool does, every tensor is bit-equal
///   (trace) and the probabilities agree to the f32 softmax over 262,144 logits
///   (8.3e-4 measured).
/// - gemma3-Q4_K_M: llama-server's default, a window-sized cache for those layers:
///   every prompt still matches in full, but llama.cpp's own probabilities move by up
///   to 0.043 from its `--swa-full` run (a rounding difference inside llama.cpp that we
///   do not follow: our pool keeps the whole history).
/// - qwen-coder-1.5b-Q4_K_M: the file whose speed counts (169 Q4_K and 29 Q6_K matrices,
///   q/k/v biases, a 151,936-token vocabulary), its Q4_K matrices on the sixteen-row
///   AVX-512 layout (`inferd_kernels::q4_k_x16`) where the CPU has it. Its reference was
///   made on a CPU with AVX512-FP16 (Sapphire Rapids), where llama.cpp's native build does
///   its f16 vector ops (`ggml_vec_dot_f16`, `_mad_f16`, `_scale_f16`, `simd-mappings.h`)
///   in half precision, 32 lanes at a time; our attention follows its f32-converting
///   AVX-512 path (the other files' references, made on a CPU without AVX512-FP16). The
///   op-by-op trace (`model::trace_tests`) shows every matrix product bit-equal and the
///   first difference in layer 0's attention output (one f16 ulp): 5 of 6 prompts match
///   in full, the sixth for 11 of 17 tokens, teacher-forced top-1 166/167, max |Δp|
///   0.061 (measured).
const GOALS: [(&str, usize, f64); 11] = [
    ("Q4_1", 7, 1e-3),
    ("Q5_1", 7, 1e-3),
    ("Q8_0", 7, 1e-3),
    ("F16", 7, 1e-3),
    ("gemma3-Q4_K_M-swa-full", 8, 2e-3),
    ("gemma3-Q4_K_M", 8, 0.06),
    ("Q4_0", 7, 1e-3),
    ("Q4_K_M", 7, 1e-3),
    ("Q5_K_M", 7, 1e-3),
    ("Q6_K", 7, 1e-3),
    ("qwen-coder-1.5b-Q4_K_M", 5, 0.07),
];

fn ids(v: &serde_json::Value) -> Vec<u32> {
    v.as_array()
        .map(|a| {
            a.iter()
                .filter_map(|x| x.as_u64())
                .map(|x| x as u32)
                .collect()
        })
        .unwrap_or_default()
}

fn logits(
    model: &Model,
    tokens: &[u32],
    cache: &mut SoloKv,
    adapter: Option<AdapterUse<'_>>,
) -> Vec<f32> {
    model
        .forward_with(tokens, cache, adapter)
        .and_then(|t| t.to_vec1::<f32>())
        .expect("logits")
}

/// Where `scripts/lora-gguf.sh files` puts the GGUF adapters.
pub(super) fn lora_dir() -> PathBuf {
    std::env::var_os("INFERD_LORA_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| quant_dir().with_file_name("lora"))
}

/// The teacher-forced and free-running comparison of `dir/<label>.json`
/// (`INFERD_PARITY_REFS`: another folder of references, `scripts/quant-parity.sh` with
/// `INFERD_QUANT_REFS`, for experiments against other llama.cpp kernel paths); a fixture whose `meta.adapter` names a GGUF
/// adapter runs with it at `meta.adapter.scale` (`scripts/lora-gguf.sh refs`).
fn check_fixture(dir: &std::path::Path, label: &str, max_dp: f64) -> FileResult {
    let at = dir.join(format!("{label}.json"));
    let text = std::fs::read_to_string(&at).expect("fixture");
    let fixture: serde_json::Value = serde_json::from_str(&text).expect("fixture JSON");
    let file = fixture["meta"]["model_file"].as_str().expect("model_file");
    let path = model_path(label, file);
    assert!(
        path.is_file(),
        "{} missing: run scripts/quant-parity.sh files (the default model and \
         scripts/fetch-model.sh gemma3 / qwen-coder-1.5b for the shipped files)",
        path.display()
    );
    let opts = LoadOptions {
        device: Device::Cpu,
        matrices: MatrixPolicy::default(),
    };
    let model = crate::model::load(&path, &opts).expect("load").model;
    let lora = fixture["meta"].get("adapter").map(|a| {
        let file = lora_dir().join(a["file"].as_str().expect("adapter file"));
        assert!(
            file.is_file(),
            "{} missing: run scripts/lora-gguf.sh files",
            file.display()
        );
        let adapter = LoraAdapter::load(label, &file, &LoraBase::of(&model), None)
            .unwrap_or_else(|e| panic!("{e}"));
        (adapter, a["scale"].as_f64().expect("adapter scale") as f32)
    });
    let adapter = lora.as_ref().map(|(a, scale)| AdapterUse {
        adapter: a,
        scale: *scale,
    });
    let mut r = FileResult::default();
    for prompt in fixture["prompts"].as_array().expect("prompts") {
        let name = prompt["id"].as_str().unwrap_or("?");
        let p = ids(&prompt["prompt_token_ids"]);
        let gen = ids(&prompt["generated_token_ids"]);
        let positions = prompt["positions"].as_array().expect("positions");
        assert_eq!(
            positions.len(),
            gen.len(),
            "{label} {name}: positions per token"
        );
        // Teacher-forced along llama.cpp's tokens.
        let mut cache = SoloKv::new(&model.kv_layout(), model.device()).expect("kv");
        let mut next = p.clone();
        for (i, (&want, pos)) in gen.iter().zip(positions).enumerate() {
            let l = logits(&model, &next, &mut cache, adapter);
            let p1 = pos[1].as_f64().unwrap_or(0.0);
            let p2 = pos[3].as_f64().unwrap_or(0.0);
            let (ours, our_p1, our_p_want) = top1_and_prob(&l, want);
            r.positions += 1;
            r.agree += usize::from(ours == want);
            r.max_dp = r.max_dp.max((our_p_want - p1).abs());
            if std::env::var_os("INFERD_PARITY_TRACE").is_some() && (our_p_want - p1).abs() > 0.01 {
                eprintln!("{label} {name} position {i}: llama.cpp {want} p {p1:.5}; ours p {our_p_want:.5}, top {ours} p {our_p1:.5}");
            }
            // Both probabilities may move by `max_dp`: a lead of more than twice that is
            // not a near tie, and our top-1 must be llama.cpp's there.
            if ours != want && p1 - p2 > 2.0 * max_dp {
                r.clear_misses.push(format!(
                    "{name} position {i}: llama.cpp {want} (p {p1:.4}, runner-up {p2:.4}), ours {ours} (p {our_p1:.4})"
                ));
            }
            next = vec![want];
        }
        // Free-running greedy, to the first difference.
        let mut cache = SoloKv::new(&model.kv_layout(), model.device()).expect("kv");
        let mut next = p;
        let mut matched = 0;
        for &want in &gen {
            let t = argmax(&logits(&model, &next, &mut cache, adapter));
            if t != want {
                break;
            }
            matched += 1;
            next = vec![t];
        }
        r.free.push((matched, gen.len()));
    }
    r
}

fn run(label: &str) {
    let dir = std::env::var_os("INFERD_PARITY_REFS")
        .map(PathBuf::from)
        .unwrap_or_else(|| workspace_root().join("daemon/tests/fixtures/quant-parity"));
    run_goals(&dir, &GOALS, label);
}

/// Checks `dir/<label>.json` against its entry in `goals`
/// `(label, prompts equal in full, max |Δp|)`: no clear miss, teacher-forced top-1
/// agreement ≥ 90 %, at least that many prompts in full, probabilities within the bound.
pub(super) fn run_goals(dir: &std::path::Path, goals: &[(&str, usize, f64)], label: &str) {
    let Some(&(_, min_full, max_dp)) = goals.iter().find(|g| g.0 == label) else {
        panic!("no goal for {label}");
    };
    let r = check_fixture(dir, label, max_dp);
    let full = r.free.iter().filter(|(m, n)| m == n).count();
    let report = format!(
        "{label}: free-running {:?} (matched/total per prompt, {full} in full); teacher-forced \
         top-1 {}/{}; max |Δp| {:.5}",
        r.free, r.agree, r.positions, r.max_dp
    );
    eprintln!("{report}");
    assert!(
        r.clear_misses.is_empty(),
        "{report}: top-1 differs where llama.cpp's is clear: {:#?}",
        r.clear_misses
    );
    assert!(
        r.agree * 10 >= r.positions * 9,
        "{report}: teacher-forced agreement below 90 %"
    );
    assert!(
        full >= min_full,
        "{report}: fewer than {min_full} prompts equal in full"
    );
    assert!(
        r.max_dp <= max_dp,
        "{report}: probability differs by more than {max_dp}"
    );
}

#[test]
fn q4_1_matches_llama_cpp() {
    run("Q4_1");
}

#[test]
fn q8_0_matches_llama_cpp() {
    run("Q8_0");
}

#[test]
fn q4_0_matches_llama_cpp() {
    run("Q4_0");
}

#[test]
fn q5_1_matches_llama_cpp() {
    run("Q5_1");
}

#[test]
fn q4_k_m_matches_llama_cpp() {
    run("Q4_K_M");
}

#[test]
fn q5_k_m_matches_llama_cpp() {
    run("Q5_K_M");
}

#[test]
fn q6_k_matches_llama_cpp() {
    run("Q6_K");
}

#[test]
fn f16_matches_llama_cpp() {
    run("F16");
}

#[test]
fn gemma3_q4_k_m_matches_llama_cpp_swa_full() {
    run("gemma3-Q4_K_M-swa-full");
}

#[test]
fn gemma3_q4_k_m_matches_llama_cpp() {
    run("gemma3-Q4_K_M");
}

#[test]
fn qwen_coder_1_5b_q4_k_m_matches_llama_cpp() {
    run("qwen-coder-1.5b-Q4_K_M");
}
