//! Wasm plugin overhead, in one run:
//!
//! 1. Per-step cost of a plugin chain (`PluginChain::process`: copy the logits into the
//!    guest, run it, apply its edit) for the `noop` and `ban_words` plugins at
//!    vocabulary sizes 49,152 (SmolLM2), 151,936 (Qwen) and 262,144 (Gemma 3), synthetic
//!    vocabularies and logits; and of the native sampler at the same sizes (greedy
//!    argmax, and temperature 0.8 + top-k 40 + top-p 0.95 + min-p 0.05, the defaults).
//! 2. End-to-end single-stream greedy decode on the default model without a plugin,
//!    with `noop` and with `ban_words` (real vocabulary), in rounds with the order
//!    rotated each round; overhead = the median over rounds of (decode time with the
//!    plugin ÷ time without, same round) − 1, so that slow drift of this shared VM
//!    (±20 % between runs) cancels.
//! 3. Deadline enforcement: how long after its deadline a never-returning plugin
//!    (`busy_loop`) is stopped.
//!
//! ```text
//! bash scripts/build-plugins.sh && cargo bench -p inferd --bench plugin_overhead
//! ```
//! Prints a table and writes `target/bench/plugin_overhead.json`. Plugins from
//! `INFERD_PLUGINS_DIR` or `target/e2e-plugins/`; model from `INFERD_TEST_MODEL` or
//! `models/SmolLM2-135M-Instruct.Q4_1.gguf`; `INFERD_BENCH_DECODE` decode steps per
//! round (default 64), `INFERD_BENCH_REPEATS` rounds (default 21).

mod common;
#[path = "common/plugin_vocab.rs"]
mod plugin_vocab;

use std::path::PathBuf;

use common::{model_path, size};
use plugin_vocab::synthetic_vocab;
use std::sync::Arc;
use std::time::{Duration, Instant};

use candle_core::Device;
use inferd::model::{load, LoadOptions, MatrixPolicy, Model, SoloKv};
use inferd::request::PluginSpec;
use inferd::sampling::argmax;
use inferd::sampling::wasm_plugin::{
    PluginChain, PluginLimits, PluginRegistry, PluginVocab, StepView,
};
use inferd::tokenizer::TextTokenizer;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

fn plugin_dir() -> PathBuf {
    std::env::var_os("INFERD_PLUGINS_DIR").map_or_else(
        || PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target/e2e-plugins"),
        PathBuf::from,
    )
}

fn registry(vocab: PluginVocab, limits: PluginLimits) -> PluginRegistry {
    let (reg, errors) =
        PluginRegistry::load_dir(&plugin_dir(), Arc::new(vocab), limits).expect("engine");
    assert!(errors.is_empty(), "plugin load errors: {errors:?}");
    assert!(
        reg.list().iter().any(|p| p.name == "noop"),
        "no plugins in {} (run scripts/build-plugins.sh)",
        plugin_dir().display()
    );
    reg
}

fn spec(name: &str, config: &str) -> Vec<PluginSpec> {
    vec![PluginSpec {
        name: name.into(),
        config: config.into(),
    }]
}

const BAN_CONFIG: &str = r#"{"words":["Paris","London","the capital"]}"#;

/// Mean time of one `process` call over `steps` steps with a growing generated list.
fn per_step(chain: &mut PluginChain, vocab: usize, steps: usize) -> Duration {
    let mut rng = ChaCha8Rng::seed_from_u64(1);
    let base: Vec<f32> = (0..vocab).map(|_| rng.random_range(-10.0..10.0)).collect();
    let mut logits = base.clone();
    let mut generated: Vec<u32> = Vec::new();
    let mut total = Duration::ZERO;
    for _ in 0..steps {
        logits.copy_from_slice(&base);
        let step = StepView {
            sequence_id: 1,
            prompt_tokens: 32,
            generated: &generated,
        };
        let t = Instant::now();
        chain.process(&step, &mut logits).expect("process");
        total += t.elapsed();
        generated.push(rng.random_range(4..vocab as u32 - 1));
    }
    total / steps as u32
}

struct MicroRow {
    plugin: &'static str,
    vocab: usize,
    per_step_us: f64,
    instantiate_configure_ms: f64,
}

fn micro() -> Vec<MicroRow> {
    let mut rows = Vec::new();
    for vocab in [49_152usize, 151_936, 262_144] {
        for (plugin, params) in [("greedy", 0.0f32), ("sampler", 0.8)] {
            let params = inferd::request::SamplingParams {
                temperature: params,
                top_k: 40,
                top_p: 0.95,
                min_p: 0.05,
                seed: 7,
                max_tokens: 1,
                stop: Vec::new(),
                ..Default::default()
            };
            let mut sampler = inferd::sampling::Sampler::new(&params);
            let mut rng = ChaCha8Rng::seed_from_u64(3);
            let logits: Vec<Vec<f32>> = (0..8)
                .map(|_| (0..vocab).map(|_| rng.random_range(-10.0..10.0)).collect())
                .collect();
            let t = Instant::now();
            let steps = 500;
            for i in 0..steps {
                std::hint::black_box(sampler.sample(&logits[i % 8]).expect("sample"));
            }
            rows.push(MicroRow {
                plugin,
                vocab,
                per_step_us: t.elapsed().as_secs_f64() * 1e6 / steps as f64,
                instantiate_configure_ms: 0.0,
            });
        }
        let reg = registry(synthetic_vocab(vocab), PluginLimits::default());
        for (plugin, config) in [("noop", "{}"), ("ban_words", BAN_CONFIG)] {
            let t = Instant::now();
            let mut chain = reg
                .instantiate(&spec(plugin, config), 1, "bench")
                .expect("instantiate")
                .expect("chain");
            let inst = t.elapsed();
            per_step(&mut chain, vocab, 20); // warm-up
            let d = per_step(&mut chain, vocab, 500);
            rows.push(MicroRow {
                plugin,
                vocab,
                per_step_us: d.as_secs_f64() * 1e6,
                instantiate_configure_ms: inst.as_secs_f64() * 1e3,
            });
        }
    }
    rows
}

/// Greedy decode of `steps` tokens after `prompt`, with `chain` applied to each row.
/// Returns the decode time (prefill excluded).
fn decode(
    model: &Model,
    prompt: &[u32],
    steps: usize,
    mut chain: Option<&mut PluginChain>,
) -> Duration {
    let mut cache = SoloKv::new(&model.kv_layout(), model.device()).expect("KV cache");
    let row = |cache: &mut SoloKv, t: &[u32]| -> Vec<f32> {
        model
            .forward(t, cache)
            .and_then(|x| x.to_vec1::<f32>())
            .expect("forward")
    };
    let mut logits = row(&mut cache, prompt);
    let mut generated = Vec::with_capacity(steps);
    let t = Instant::now();
    for _ in 0..steps {
        if let Some(c) = chain.as_deref_mut() {
            let step = StepView {
                sequence_id: 1,
                prompt_tokens: prompt.len(),
                generated: &generated,
            };
            c.process(&step, &mut logits).expect("process");
        }
        let next = argmax(&logits).expect("argmax");
        generated.push(next);
        logits = row(&mut cache, &[next]);
    }
    t.elapsed()
}

struct E2e {
    steps: usize,
    rounds: usize,
    none_tok_s: f64,
    noop_tok_s: f64,
    ban_tok_s: f64,
    /// Median over rounds of (decode time with noop) / (without), same round.
    noop_time_ratio: f64,
    /// The same for ban_words.
    ban_time_ratio: f64,
}

fn end_to_end() -> E2e {
    let steps = size("INFERD_BENCH_DECODE", 64);
    let rounds = size("INFERD_BENCH_REPEATS", 21).max(1);
    let loaded = load(
        &model_path(),
        &LoadOptions {
            device: Device::Cpu,
            matrices: MatrixPolicy::default(),
        },
    )
    .expect("load model");
    let tok = TextTokenizer::from_gguf(&loaded.metadata).expect("tokenizer");
    let reg = registry(PluginVocab::from_vocab(&tok), PluginLimits::default());
    let prompt = tok
        .encode(
            "The capital of France is Paris. The capital of England is",
            false,
        )
        .expect("encode");
    let model = loaded.model;
    let mut best = [Duration::MAX; 3];
    let mut ratios: [Vec<f64>; 2] = [Vec::new(), Vec::new()];
    for round in 0..rounds {
        // Rotate the order each round so drift (clock, cache, other load) does not
        // favour one variant; compare variants within a round (paired), then take the
        // median over rounds.
        let mut t = [Duration::ZERO; 3];
        for k in 0..3 {
            let v = (round + k) % 3;
            let mut chain = match v {
                0 => None,
                1 => reg
                    .instantiate(&spec("noop", "{}"), 1, "bench")
                    .expect("noop"),
                _ => reg
                    .instantiate(&spec("ban_words", BAN_CONFIG), 1, "bench")
                    .expect("ban_words"),
            };
            t[v] = decode(&model, &prompt, steps, chain.as_mut());
            best[v] = best[v].min(t[v]);
        }
        for (r, with) in ratios.iter_mut().zip(&t[1..]) {
            r.push(with.as_secs_f64() / t[0].as_secs_f64());
        }
    }
    let median = |v: &mut Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    let tok_s = |d: Duration| steps as f64 / d.as_secs_f64();
    E2e {
        steps,
        rounds,
        none_tok_s: tok_s(best[0]),
        noop_tok_s: tok_s(best[1]),
        ban_tok_s: tok_s(best[2]),
        noop_time_ratio: median(&mut ratios[0]),
        ban_time_ratio: median(&mut ratios[1]),
    }
}

/// Time from the start of a `busy_loop` call until its deadline trap, for `deadline`.
fn deadline_latency(deadline: Duration) -> Duration {
    let reg = registry(
        synthetic_vocab(49_152),
        PluginLimits {
            call_deadline: deadline,
            ..PluginLimits::default()
        },
    );
    let mut worst = Duration::ZERO;
    for _ in 0..10 {
        let mut chain = reg
            .instantiate(&spec("busy_loop", "{}"), 1, "bench")
            .expect("instantiate")
            .expect("chain");
        let mut logits = vec![0.0f32; 49_152];
        let step = StepView {
            sequence_id: 1,
            prompt_tokens: 1,
            generated: &[],
        };
        let t = Instant::now();
        let r = chain.process(&step, &mut logits);
        worst = worst.max(t.elapsed());
        assert!(r.is_err(), "busy_loop must time out");
    }
    worst
}

fn main() {
    let micro = micro();
    println!("\nper-step plugin cost (PluginChain::process, synthetic logits; mean of 500 steps)");
    println!(
        "{:<12} {:>8} {:>14} {:>26}",
        "plugin", "vocab", "per step µs", "instantiate+configure ms"
    );
    for r in &micro {
        println!(
            "{:<12} {:>8} {:>14.1} {:>26.2}",
            r.plugin, r.vocab, r.per_step_us, r.instantiate_configure_ms
        );
    }
    let e = end_to_end();
    let step_ms = 1e3 / e.none_tok_s;
    let pct = |ratio: f64| (ratio - 1.0) * 100.0;
    println!(
        "\nend-to-end greedy decode, default model, {} steps x {} rounds (order rotated)",
        e.steps, e.rounds
    );
    println!(
        "{:<12} {:>14} {:>32}",
        "chain", "best tok/s", "median paired time overhead %"
    );
    println!("{:<12} {:>14.1} {:>32}", "none", e.none_tok_s, "-");
    println!(
        "{:<12} {:>14.1} {:>32.2}",
        "noop",
        e.noop_tok_s,
        pct(e.noop_time_ratio)
    );
    println!(
        "{:<12} {:>14.1} {:>32.2}",
        "ban_words",
        e.ban_tok_s,
        pct(e.ban_time_ratio)
    );
    let micro_49k: Vec<(&str, f64)> = micro
        .iter()
        .filter(|r| r.vocab == 49_152)
        .map(|r| (r.plugin, r.per_step_us / 1e3 / step_ms * 100.0))
        .collect();
    for (p, pct) in &micro_49k {
        println!(
            "{p}: per-step cost at vocab 49,152 = {pct:.2} % of a {step_ms:.2} ms decode step"
        );
    }
    let deadline = Duration::from_millis(5);
    let worst = deadline_latency(deadline);
    println!(
        "\nbusy_loop with a {} ms deadline: stopped after at most {:.2} ms (10 calls)",
        deadline.as_millis(),
        worst.as_secs_f64() * 1e3
    );

    let json = serde_json::json!({
        "per_step": micro.iter().map(|r| serde_json::json!({
            "plugin": r.plugin,
            "vocab": r.vocab,
            "per_step_us": r.per_step_us,
            "instantiate_configure_ms": r.instantiate_configure_ms,
        })).collect::<Vec<_>>(),
        "end_to_end": {
            "decode_steps": e.steps,
            "rounds": e.rounds,
            "best_none_tok_s": e.none_tok_s,
            "best_noop_tok_s": e.noop_tok_s,
            "best_ban_words_tok_s": e.ban_tok_s,
            "noop_overhead_pct_median_paired": pct(e.noop_time_ratio),
            "ban_words_overhead_pct_median_paired": pct(e.ban_time_ratio),
        },
        "per_step_pct_of_decode_step_49k": micro_49k.iter().map(|(p, v)| (p.to_string(), *v)).collect::<std::collections::BTreeMap<_, _>>(),
        "deadline_ms": deadline.as_secs_f64() * 1e3,
        "deadline_worst_stop_ms": worst.as_secs_f64() * 1e3,
    });
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target/bench");
    let _ = std::fs::create_dir_all(&dir);
    let path = dir.join("plugin_overhead.json");
    match std::fs::write(&path, format!("{json:#}\n")) {
        Ok(()) => println!("wrote {}", path.display()),
        Err(e) => eprintln!("cannot write {}: {e}", path.display()),
    }
}
