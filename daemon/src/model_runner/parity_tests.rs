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
    load_gguf(&default_model_path(), &opts).expect("load default model").model
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

/// Greedy generation through the runner; stops after EOS id 2 or `n` tokens. Also
/// returns the logit gap between the two best tokens at each step.
fn greedy(runner: &mut ModelRunner, seq: SeqId, prompt: &[u32], n: usize) -> (Vec<u32>, Vec<f32>) {
    let mut out = Vec::new();
    let mut gaps = Vec::new();
    let mut next = prompt.to_vec();
    for _ in 0..n {
        let step = runner.run(RunBatch {
            free: vec![],
            items: vec![BatchItem { seq, tokens: next }],
        });
        let logits = step.items.into_iter().next().expect("one item").logits.expect("logits");
        let t = argmax(&logits);
        let mut sorted = logits.clone();
        sorted.sort_by(|a, b| b.total_cmp(a));
        gaps.push(sorted[0] - sorted[1]);
        out.push(t);
        if t == 2 {
            break;
        }
        next = vec![t];
    }
    runner.run(RunBatch {
        free: vec![seq],
        items: vec![],
    });
    (out, gaps)
}

fn ids(v: &serde_json::Value) -> Vec<u32> {
    v.as_array()
        .expect("array")
        .iter()
        .map(|x| x.as_u64().expect("id") as u32)
        .collect()
}

/// Compares our greedy ids with llama.cpp's for every reference prompt; returns the
/// names of the ones that differ with the first differing step.
fn compare(policy: Q4_1Policy) -> Vec<String> {
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
    let mut diffs = Vec::new();
    for (i, (name, prompt, expected)) in cases.iter().enumerate() {
        let (got, gaps) = greedy(&mut runner, SeqId(1000 + i as u64), prompt, expected.len());
        if &got != expected {
            let step = got.iter().zip(expected).position(|(a, b)| a != b).unwrap_or(got.len().min(expected.len()));
            diffs.push(format!(
                "{name}: first difference at step {step} (ours {:?}, llama.cpp {:?}, top1-top2 gap there {:.4})",
                got.get(step),
                expected.get(step),
                gaps.get(step).copied().unwrap_or(f32::NAN)
            ));
        }
    }
    diffs
}

/// Our Q4_1 kernel (ggml numerics, f16-rounded KV like llama.cpp's default cache):
/// conversation b and the raw completion match llama.cpp token for token over the
/// compared span; conversation a, whose decisions are near ties under Q4_1 (the fixture
/// notes a first-token gap of 0.08 even between llama.cpp and transformers), follows
/// llama.cpp for its first 15 tokens.
#[test]
fn greedy_matches_llama_cpp_with_native_q4_1() {
    let diffs = compare(Q4_1Policy::Native);
    assert!(diffs.is_empty(), "divergences from llama.cpp: {diffs:#?}");
}
