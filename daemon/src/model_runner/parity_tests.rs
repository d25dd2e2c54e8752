//! The real model against llama.cpp's greedy references
//! (`../shared/fixtures/llamacpp/reference.json`), token ids compared exactly.

use candle_core::Device;

use crate::model::{LoadOptions, MatrixPolicy, Model, SoloKv};
use crate::test_support::{default_model_path, fixture_json};

pub(super) fn load(policy: MatrixPolicy) -> Model {
    let opts = LoadOptions {
        device: Device::Cpu,
        matrices: policy,
    };
    crate::model::load(&default_model_path(), &opts)
        .expect("load default model")
        .model
}

pub(super) fn argmax(v: &[f32]) -> u32 {
    let mut best = 0;
    for (i, x) in v.iter().enumerate() {
        if *x > v[best] {
            best = i;
        }
    }
    best as u32
}

/// Greedy generation of one sequence (stopping at the first divergence from
/// `reference`). Returns our ids and, per step, `max logit − logit of the reference
/// token` (0 where we agree).
fn greedy(model: &Model, prompt: &[u32], reference: &[u32]) -> (Vec<u32>, Vec<f32>) {
    let mut cache = SoloKv::new(&model.kv_layout(), model.device()).expect("kv");
    let mut out = Vec::new();
    let mut deficits = Vec::new();
    let mut next = prompt.to_vec();
    for &want in reference {
        let logits = model
            .forward(&next, &mut cache)
            .and_then(|t| t.to_vec1::<f32>())
            .expect("logits");
        let t = argmax(&logits);
        deficits.push(logits[t as usize] - logits[want as usize]);
        out.push(t);
        if t == 2 || t != want {
            break;
        }
        next = vec![t];
    }
    (out, deficits)
}

fn ids(v: &serde_json::Value) -> Vec<u32> {
    v.as_array()
        .expect("array")
        .iter()
        .map(|x| x.as_u64().expect("id") as u32)
        .collect()
}

/// One reference generation compared with ours.
struct Comparison {
    name: String,
    /// Tokens equal to llama.cpp's before the first difference.
    matched: usize,
    /// Reference length.
    total: usize,
    /// At the first difference: our max logit minus our logit of llama.cpp's token.
    deficit: Option<f32>,
}

/// The reference cases: (name, prompt ids, llama.cpp's greedy ids).
fn cases() -> Vec<(String, Vec<u32>, Vec<u32>)> {
    let reference = fixture_json("llamacpp/reference.json");
    let mut cases: Vec<(String, Vec<u32>, Vec<u32>)> = reference["chat"]
        .as_array()
        .expect("chat")
        .iter()
        .map(|c| {
            (
                format!("chat {}", c["id"].as_str().unwrap_or("?")),
                ids(&c["prompt_token_ids"]),
                ids(&c["generated_token_ids"]),
            )
        })
        .collect();
    let raw = &reference["raw_completion"];
    cases.push((
        "raw_completion".into(),
        ids(&raw["prompt_token_ids"]),
        ids(&raw["generated_token_ids"]),
    ));
    cases
}

fn compare(policy: MatrixPolicy) -> Vec<Comparison> {
    let model = load(policy);
    cases()
        .iter()
        .map(|(name, prompt, expected)| {
            let (got, deficits) = greedy(&model, prompt, expected);
            let matched = got.iter().zip(expected).take_while(|(a, b)| a == b).count();
            Comparison {
                name: name.clone(),
                matched,
                total: expected.len(),
                deficit: (matched < expected.len()).then(|| deficits[matched]),
            }
        })
        .collect()
}

/// Teacher-forced comparison: the model is fed llama.cpp's tokens, and at every
/// position our logit of llama.cpp's token is compared with our top logit. Returns
/// (positions where our argmax equals llama.cpp's token, positions, worst deficit).
fn teacher_forced(model: &Model, prompt: &[u32], reference: &[u32]) -> (usize, usize, f32) {
    let mut cache = SoloKv::new(&model.kv_layout(), model.device()).expect("kv");
    let mut next = prompt.to_vec();
    let (mut agree, mut worst) = (0, 0f32);
    for &want in reference {
        let logits = model
            .forward(&next, &mut cache)
            .and_then(|t| t.to_vec1::<f32>())
            .expect("logits");
        let t = argmax(&logits);
        agree += usize::from(t == want);
        worst = worst.max(logits[t as usize] - logits[want as usize]);
        next = vec![want];
    }
    (agree, reference.len(), worst)
}

/// Greedy ids against llama.cpp b11312's (same GGUF, 2 threads). Q4_1 greedy decoding is
/// chaotic at near ties: float summation order, the f16 KV cache and per-layer Q8_1
/// re-quantization of activations turn 1e-6 differences into a flipped token when two
/// logits are within a few hundredths, after which the two generations part ways.
/// So the check is twofold:
/// - free-running greedy: conversation b matches in full, and where another first
///   differs, llama.cpp's token is within 0.35 of our top logit (a near tie, not a bug);
/// - teacher-forced along llama.cpp's tokens (every position of every reference, not
///   only up to the first difference): our top token equals llama.cpp's at ≥ 90 % of
///   positions, and llama.cpp's token is never more than 0.35 below our top logit.
#[test]
fn greedy_ids_match_llama_cpp() {
    let results = compare(MatrixPolicy::default());
    let report: Vec<String> = results
        .iter()
        .map(|c| {
            format!(
                "{}: {}/{} tokens equal, deficit at first difference {:?}",
                c.name, c.matched, c.total, c.deficit
            )
        })
        .collect();
    eprintln!("{report:#?}");
    for c in &results {
        if c.name == "chat b" {
            assert_eq!(c.matched, c.total, "{report:#?}");
        }
        if let Some(d) = c.deficit {
            assert!(d <= 0.35, "not a near tie: {report:#?}");
        }
    }
    let model = load(MatrixPolicy::default());
    let (mut agree, mut total, mut worst) = (0, 0, 0f32);
    for (name, prompt, reference) in cases() {
        let (a, n, w) = teacher_forced(&model, &prompt, &reference);
        eprintln!("{name}: teacher-forced top-1 agreement {a}/{n}, worst deficit {w}");
        agree += a;
        total += n;
        worst = worst.max(w);
    }
    assert!(
        agree * 10 >= total * 9,
        "teacher-forced agreement {agree}/{total} below 90 %"
    );
    assert!(
        worst <= 0.35,
        "llama.cpp's token {worst} below our top logit"
    );
}
