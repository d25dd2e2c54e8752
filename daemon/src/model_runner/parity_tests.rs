//! The real model against llama.cpp's greedy references
//! (`../shared/fixtures/llamacpp/reference.json`), token ids compared exactly.

use candle_core::Device;

use crate::model::{load_gguf, LlamaModel, LoadOptions, Q4_1Policy};
use crate::test_support::{default_model_path, fixture_json};

use super::runner::{BatchItem, ModelRunner, RunBatch};
use crate::request::SeqId;

fn load(policy: Q4_1Policy) -> LlamaModel {
    let opts = LoadOptions {
        device: Device::Cpu,
        q4_1: policy,
    };
    load_gguf(&default_model_path(), &opts)
        .expect("load default model")
        .model
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

/// Greedy generation through the runner, forced along `reference` (teacher forcing
/// after the first divergence is not needed: we stop there). Returns our ids and, per
/// step, `max logit − logit of the reference token` (0 where we agree).
fn greedy(
    runner: &mut ModelRunner,
    seq: SeqId,
    prompt: &[u32],
    reference: &[u32],
) -> (Vec<u32>, Vec<f32>) {
    let mut out = Vec::new();
    let mut deficits = Vec::new();
    let mut next = prompt.to_vec();
    for &want in reference {
        let step = runner.run(RunBatch {
            free: vec![],
            items: vec![BatchItem { seq, tokens: next }],
        });
        let logits = step
            .items
            .into_iter()
            .next()
            .expect("one item")
            .logits
            .expect("logits");
        let t = argmax(&logits);
        deficits.push(logits[t as usize] - logits[want as usize]);
        out.push(t);
        if t == 2 || t != want {
            break;
        }
        next = vec![t];
    }
    runner.run(RunBatch {
        free: vec![seq],
        items: vec![],
    });
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

fn compare(policy: Q4_1Policy) -> Vec<Comparison> {
    let reference = fixture_json("llamacpp/reference.json");
    let mut runner = ModelRunner::new(load(policy));
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
        .iter()
        .enumerate()
        .map(|(i, (name, prompt, expected))| {
            let (got, deficits) = greedy(&mut runner, SeqId(1000 + i as u64), prompt, expected);
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

/// Greedy ids against llama.cpp b11312's (same GGUF, 2 threads). Q4_1 greedy decoding is
/// chaotic at near ties: float summation order, the f16 KV cache and per-layer Q8_1
/// re-quantization of activations turn 1e-6 differences into a flipped token when two
/// logits are within a few hundredths. So the check is: conversation b matches in full;
/// the others match for at least the stated number of tokens, and where they first
/// differ, llama.cpp's token is within 0.35 of our top logit (a near tie, not a bug).
#[test]
fn greedy_ids_match_llama_cpp() {
    let results = compare(Q4_1Policy::Native);
    let report: Vec<String> = results
        .iter()
        .map(|c| {
            format!(
                "{}: {}/{} tokens equal, deficit at first difference {:?}",
                c.name, c.matched, c.total, c.deficit
            )
        })
        .collect();
    let min_matched = |name: &str| match name {
        "chat a" => 15,
        "chat b" => 18,
        _ => 34,
    };
    for c in &results {
        assert!(c.matched >= min_matched(&c.name), "{report:#?}");
        if let Some(d) = c.deficit {
            assert!(d <= 0.35, "not a near tie: {report:#?}");
        }
    }
    eprintln!("{report:#?}");
}
