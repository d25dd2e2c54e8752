//! Single-stream model speed on the CPU, per Q4_1 policy, in one run:
//! prefill tokens/s for a 512-token prompt and decode tokens/s over 128 greedy tokens.
//!
//! ```text
//! cargo bench -p inferd --bench model_speed            # all policies
//! INFERD_BENCH_POLICIES=native cargo bench -p inferd --bench model_speed
//! ```
//! Prints a table and writes `target/bench/model_speed.json`. Uses `INFERD_TEST_MODEL`
//! or `models/SmolLM2-135M-Instruct.Q4_1.gguf`; threads from `INFERD_BENCH_THREADS`
//! (default: all cores).

mod common;

use std::path::PathBuf;

use common::{model_path, size};
use std::time::Instant;

use candle_core::Device;
use inferd::model::{
    load, Kernels, KvBlockPool, LoadOptions, MatrixPolicy, Model, Quantize, SoloKv,
};
use inferd::model_runner::{BatchItem, ModelRunner, RunBatch};
use inferd::request::SeqId;

fn logits_of(model: &Model, cache: &mut SoloKv, tokens: &[u32]) -> Vec<f32> {
    match model
        .forward(tokens, cache)
        .and_then(|t| t.to_vec1::<f32>())
    {
        Ok(l) => l,
        Err(e) => panic!("forward failed: {e}"),
    }
}

fn argmax(v: &[f32]) -> u32 {
    v.iter()
        .enumerate()
        .fold((0usize, f32::NEG_INFINITY), |(bi, bv), (i, &x)| {
            if x > bv {
                (i, x)
            } else {
                (bi, bv)
            }
        })
        .0 as u32
}

fn sizes() -> (usize, usize, usize) {
    (
        size("INFERD_BENCH_PROMPT", 512),
        size("INFERD_BENCH_DECODE", 128),
        size("INFERD_BENCH_REPEATS", 3).max(1),
    )
}

struct Row {
    policy: &'static str,
    load_s: f64,
    prefill_tok_s: f64,
    decode_tok_s: f64,
    /// (batch size, aggregate decode tokens/s) for batched decode steps.
    batched: Vec<(usize, f64)>,
}

/// Batch sizes for the batched-decode measurement (`INFERD_BENCH_BATCH`, comma
/// separated, default `1,4,16,64`) and decode steps per size (`INFERD_BENCH_BATCH_STEPS`,
/// default 32).
fn batch_sizes() -> (Vec<usize>, usize) {
    let list = std::env::var("INFERD_BENCH_BATCH").unwrap_or_else(|_| "1,4,16,64".into());
    let sizes = list
        .split(',')
        .filter_map(|s| s.trim().parse().ok())
        .collect();
    (sizes, size("INFERD_BENCH_BATCH_STEPS", 32))
}

/// `n` sequences with 32-token prompts prefilled together, then `steps` decode steps
/// of all `n` in one forward pass each (the engine's continuous batching without the
/// WebSocket). Returns aggregate decode tokens/s.
fn batched_decode(runner: &mut ModelRunner, n: usize, steps: usize) -> f64 {
    let block = 16;
    let per_seq = (32 + steps).div_ceil(block);
    let tables: Vec<Vec<u32>> = (0..n)
        .map(|i| ((i * per_seq) as u32..((i + 1) * per_seq) as u32).collect())
        .collect();
    let mut next: Vec<Vec<u32>> = (0..n)
        .map(|i| {
            (0..32u32)
                .map(|t| 300 + (t * 37 + i as u32 * 101) % 20000)
                .collect()
        })
        .collect();
    let mut pos = vec![0usize; n];
    let mut run_step = |next: &mut Vec<Vec<u32>>, pos: &mut Vec<usize>| {
        let items = (0..n)
            .map(|i| BatchItem {
                images: Vec::new(),
                seq: SeqId(i as u64),
                tokens: next[i].clone(),
                start_pos: pos[i],
                block_table: tables[i].clone(),
                logit_rows: 1,
                prompt_len: 32,
                persist: Vec::new(),
                draft: None,
                adapter: None,
            })
            .collect();
        let out = runner.run(RunBatch {
            items,
            ..RunBatch::default()
        });
        for (i, item) in out.items.into_iter().enumerate() {
            let logits = match item.logits {
                Ok(mut rows) if !rows.is_empty() => rows.swap_remove(0),
                other => panic!("forward failed: {other:?}"),
            };
            pos[i] += next[i].len();
            next[i] = vec![argmax(&logits)];
        }
    };
    run_step(&mut next, &mut pos);
    let t = Instant::now();
    for _ in 0..steps {
        run_step(&mut next, &mut pos);
    }
    (n * steps) as f64 / t.elapsed().as_secs_f64()
}

fn bench(policy: MatrixPolicy, name: &'static str) -> Row {
    let (prompt_tokens, decode_tokens, repeats) = sizes();
    let t0 = Instant::now();
    let loaded = load(
        &model_path(),
        &LoadOptions {
            device: Device::Cpu,
            matrices: policy,
        },
    )
    .expect("load model");
    let load_s = t0.elapsed().as_secs_f64();
    let model = loaded.model;
    // A deterministic prompt of ordinary tokens (ids 300..), no special tokens.
    let prompt: Vec<u32> = (0..prompt_tokens as u32)
        .map(|i| 300 + (i * 37) % 20000)
        .collect();
    let mut best_prefill = f64::MAX;
    let mut best_decode = f64::MAX;
    for _ in 0..repeats {
        let mut cache = SoloKv::new(&model.kv_layout(), model.device()).expect("KV cache");
        let t = Instant::now();
        let logits = logits_of(&model, &mut cache, &prompt);
        best_prefill = best_prefill.min(t.elapsed().as_secs_f64());
        let mut next = argmax(&logits);
        let t = Instant::now();
        for _ in 0..decode_tokens {
            next = argmax(&logits_of(&model, &mut cache, &[next]));
        }
        best_decode = best_decode.min(t.elapsed().as_secs_f64());
    }
    let (sizes, steps) = batch_sizes();
    let max_n = sizes.iter().copied().max().unwrap_or(0);
    let mut batched = Vec::new();
    if max_n > 0 {
        let blocks = max_n * (32 + steps).div_ceil(16);
        let pool = KvBlockPool::new(&model.kv_layout(), 16, blocks, model.device()).expect("pool");
        let mut runner = ModelRunner::new(model, pool);
        for &n in &sizes {
            batched.push((n, batched_decode(&mut runner, n, steps)));
        }
    }
    Row {
        policy: name,
        load_s,
        prefill_tok_s: prompt_tokens as f64 / best_prefill,
        decode_tok_s: decode_tokens as f64 / best_decode,
        batched,
    }
}

/// The daemon's allocator (src/main.rs), so that the forward passes' buffers are kept
/// as in the daemon.
#[cfg(all(not(feature = "jemalloc"), target_os = "linux"))]
#[global_allocator]
static GLOBAL: inferd::allocator::large::LargeFirst = inferd::allocator::large::LargeFirst;

fn main() {
    // As the daemon does once the model is loaded (src/app.rs).
    inferd::allocator::keep_freed_buffers();
    let threads = inferd::app::set_compute_threads(
        std::env::var("INFERD_BENCH_THREADS")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or(0),
    );
    let wanted = std::env::var("INFERD_BENCH_POLICIES")
        .unwrap_or_else(|_| "native,requantize_q8_0,candle".into());
    let mut rows = Vec::new();
    for name in wanted.split(',') {
        let (policy, label) = match name.trim() {
            "native" => (MatrixPolicy::default(), "native (our Q4_1 kernel)"),
            "requantize_q8_0" => (
                MatrixPolicy {
                    kernels: Kernels::Native,
                    quantize: Quantize::Q8_0,
                },
                "requantize_q8_0",
            ),
            "candle" => (
                MatrixPolicy {
                    kernels: Kernels::Candle,
                    quantize: Quantize::None,
                },
                "candle portable Q4_1",
            ),
            other => panic!("unknown policy {other}"),
        };
        rows.push(bench(policy, label));
    }
    let (p, d, n) = sizes();
    println!("\nmodel_speed: SmolLM2-135M Q4_1, {threads} threads, best of {n}");
    println!(
        "{:<28} {:>8} {:>18} {:>18}",
        "q4_1 policy",
        "load s",
        format!("prefill-{p} tok/s"),
        format!("decode-{d} tok/s")
    );
    for r in &rows {
        println!(
            "{:<28} {:>8.2} {:>18.1} {:>18.1}",
            r.policy, r.load_s, r.prefill_tok_s, r.decode_tok_s
        );
    }
    for r in &rows {
        for (n, tok_s) in &r.batched {
            println!(
                "{:<28} batched decode, {n:>3} sequences: {tok_s:>8.1} tok/s aggregate",
                r.policy
            );
        }
    }
    if let Some(base) = rows.iter().find(|r| r.policy.starts_with("candle")) {
        for r in &rows {
            println!(
                "{:<28} decode {:.2}x, prefill {:.2}x the candle portable kernel",
                r.policy,
                r.decode_tok_s / base.decode_tok_s,
                r.prefill_tok_s / base.prefill_tok_s
            );
        }
    }
    let json: Vec<String> = rows
        .iter()
        .map(|r| {
            let batched: Vec<String> = r
                .batched
                .iter()
                .map(|(n, t)| format!("{{\"sequences\":{n},\"tok_s\":{t:.2}}}"))
                .collect();
            format!(
                "{{\"policy\":\"{}\",\"threads\":{threads},\"prompt_tokens\":{p},\"decode_tokens\":{d},\"load_s\":{:.3},\"prefill_tok_s\":{:.2},\"decode_tok_s\":{:.2},\"batched_decode\":[{}]}}",
                r.policy, r.load_s, r.prefill_tok_s, r.decode_tok_s, batched.join(",")
            )
        })
        .collect();
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target/bench");
    let _ = std::fs::create_dir_all(&dir);
    let path = dir.join("model_speed.json");
    match std::fs::write(&path, format!("[{}]\n", json.join(","))) {
        Ok(()) => println!("wrote {}", path.display()),
        Err(e) => eprintln!("cannot write {}: {e}", path.display()),
    }
}
