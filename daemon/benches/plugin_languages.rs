//! Per-step cost of a plugin in each language it can be written in, in one run: Rust,
//! C, Python (componentize-py) and JavaScript (ComponentizeJS), at vocabulary sizes
//! 49,152 (SmolLM2) and 262,144 (Gemma 3), on synthetic vocabularies and logits.
//!
//! For each language: a sparse edit that does not read the logits (Python and
//! JavaScript through the `context-processor` world, which gets no row; Rust and C
//! through `logits-processor`, whose row the host copies into linear memory), `keep`
//! with the row passed in, and a plugin that reads every logit (`{"scan": true}`); plus
//! one sampler each for Rust and Python. Also, in the same run: the default model's
//! native decode step, so that a cost reads as a share of a step.
//!
//! ```text
//! bash scripts/build-plugins.sh && cargo bench -p inferd --bench plugin_languages
//! ```
//! Prints a table and writes `target/bench/plugin_languages.json`. Plugins from
//! `target/e2e-plugins/` and `target/e2e-lang-plugins/` (or `INFERD_PLUGINS_DIR`,
//! `INFERD_LANG_PLUGINS_DIR`); compiled components cached in
//! `target/plugin-compile-cache/`; model from `INFERD_TEST_MODEL` or the default;
//! `INFERD_BENCH_MS_PER_CASE` the time spent per measured case (default 2,000 ms).

mod common;
#[path = "common/plugin_vocab.rs"]
mod plugin_vocab;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use candle_core::Device;
use common::{model_path, size};
use inferd::model::{load, LoadOptions, MatrixPolicy, SoloKv};
use inferd::request::PluginSpec;
use inferd::sampling::argmax;
use inferd::sampling::wasm_plugin::{
    CompileCache, PluginChain, PluginLimits, PluginRegistry, StepView,
};
use plugin_vocab::synthetic_vocab;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

fn dir(var: &str, default: &str) -> PathBuf {
    std::env::var_os(var).map_or_else(
        || PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(default),
        PathBuf::from,
    )
}

const BAN: &str = r#"{"words":["Paris","London","the capital"]}"#;
const SCAN: &str = r#"{"scan": true}"#;

/// One measured configuration.
struct Case {
    language: &'static str,
    plugin: &'static str,
    config: &'static str,
    /// What a step does.
    what: &'static str,
    sampler: bool,
}

const fn case(
    language: &'static str,
    plugin: &'static str,
    config: &'static str,
    what: &'static str,
) -> Case {
    Case {
        language,
        plugin,
        config,
        what,
        sampler: false,
    }
}

const CASES: &[Case] = &[
    case("Rust", "ban_words", BAN, "sparse ban, row copied in"),
    case("Rust", "noop", "{}", "keep, row copied in"),
    case("Rust", "noop", SCAN, "reads every logit"),
    case(
        "C",
        "min_tokens",
        r#"{"min_tokens": 1000000}"#,
        "sparse ban, row copied in",
    ),
    case(
        "Python",
        "ban_words_py",
        BAN,
        "sparse ban, no row (context)",
    ),
    case("Python", "py_probe", "{}", "keep, row lifted"),
    case("Python", "py_probe", SCAN, "reads every logit"),
    case(
        "JavaScript",
        "no_digits_js",
        "{}",
        "sparse ban, no row (context)",
    ),
    case("JavaScript", "js_probe", "{}", "keep, row lifted"),
    case("JavaScript", "js_probe", SCAN, "reads every logit"),
    Case {
        sampler: true,
        ..case("Rust", "mirostat", "{}", "sampler")
    },
    Case {
        sampler: true,
        ..case(
            "Python",
            "temperature_schedule_py",
            r#"{"start": 1.0, "end": 0.5, "tokens": 64}"#,
            "sampler",
        )
    },
];

/// Loose limits: the benchmark measures, it does not police.
fn limits() -> PluginLimits {
    PluginLimits {
        call_deadline: Duration::from_secs(5),
        configure_deadline: Duration::from_secs(60),
        memory_bytes: 1 << 30,
        instances: 100,
        ..PluginLimits::default()
    }
}

fn registry(vocab: usize) -> PluginRegistry {
    let cache = dir(
        "INFERD_PLUGIN_COMPILE_CACHE",
        "../target/plugin-compile-cache",
    );
    let (reg, mut errors) = PluginRegistry::empty(Arc::new(synthetic_vocab(vocab)), limits())
        .map(|r| r.with_compile_cache(CompileCache::new(Some(cache))))
        .and_then(|r| r.load_all(&dir("INFERD_PLUGINS_DIR", "../target/e2e-plugins")))
        .expect("engine");
    let (reg, more) = reg
        .load_all(&dir(
            "INFERD_LANG_PLUGINS_DIR",
            "../target/e2e-lang-plugins",
        ))
        .expect("engine");
    errors.extend(more);
    assert!(errors.is_empty(), "plugin load errors: {errors:?}");
    for c in CASES {
        assert!(
            reg.list().iter().any(|p| p.name == c.plugin),
            "{} not loaded (run scripts/build-plugins.sh)",
            c.plugin
        );
    }
    reg
}

fn spec(name: &str, config: &str) -> Vec<PluginSpec> {
    vec![PluginSpec {
        name: name.into(),
        config: config.into(),
    }]
}

/// Mean time of one call over `steps` steps with a growing generated list.
fn per_step(chain: &mut PluginChain, sampler: bool, vocab: usize, steps: usize) -> Duration {
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
        if sampler {
            std::hint::black_box(chain.sample(&step, &logits, rng.random()).expect("sample"));
        } else {
            chain.process(&step, &mut logits).expect("process");
        }
        total += t.elapsed();
        generated.push(rng.random_range(14..vocab as u32 - 1));
    }
    total / steps as u32
}

struct Row {
    language: &'static str,
    plugin: &'static str,
    config: &'static str,
    what: &'static str,
    vocab: usize,
    per_step_us: f64,
    instantiate_configure_ms: f64,
}

/// Instantiate + configure, the mean of 5 (the first, which warms caches, excluded).
fn instantiate_ms(reg: &PluginRegistry, name: &str, config: &str) -> (f64, PluginChain) {
    let mut total = Duration::ZERO;
    let mut last = None;
    for i in 0..6 {
        let t = Instant::now();
        let chain = reg
            .instantiate(&spec(name, config), 1, "bench")
            .expect("instantiate")
            .expect("chain");
        if i > 0 {
            total += t.elapsed();
        }
        last = Some(chain);
    }
    (
        total.as_secs_f64() * 1e3 / 5.0,
        last.expect("one instance at least"),
    )
}

fn measure(vocab: usize) -> Vec<Row> {
    let reg = registry(vocab);
    CASES
        .iter()
        .map(|c| {
            let (inst_ms, mut chain) = instantiate_ms(&reg, c.plugin, c.config);
            let warm = per_step(&mut chain, c.sampler, vocab, 5);
            // About INFERD_BENCH_MS_PER_CASE (default 2,000 ms) per case, 20 to 500 steps.
            let budget_s = size("INFERD_BENCH_MS_PER_CASE", 2000) as f64 / 1e3;
            let steps = (budget_s / warm.as_secs_f64().max(1e-7)).clamp(20.0, 500.0) as usize;
            let d = per_step(&mut chain, c.sampler, vocab, steps);
            Row {
                language: c.language,
                plugin: c.plugin,
                config: c.config,
                what: c.what,
                vocab,
                per_step_us: d.as_secs_f64() * 1e6,
                instantiate_configure_ms: inst_ms,
            }
        })
        .collect()
}

/// Mean native greedy decode step of the default model (forward pass + argmax), ms.
fn decode_step_ms() -> f64 {
    let loaded = load(
        &model_path(),
        &LoadOptions {
            device: Device::Cpu,
            matrices: MatrixPolicy::default(),
        },
    )
    .expect("load model");
    let model = loaded.model;
    let mut cache = SoloKv::new(&model.kv_layout(), model.device()).expect("KV cache");
    let mut next = 1u32;
    let steps = 64;
    let mut t = Instant::now();
    for i in 0..steps + 8 {
        if i == 8 {
            t = Instant::now(); // 8 warm-up steps
        }
        let row = model
            .forward(&[next], &mut cache)
            .and_then(|x| x.to_vec1::<f32>())
            .expect("forward");
        next = argmax(&row).expect("argmax");
    }
    t.elapsed().as_secs_f64() * 1e3 / steps as f64
}

fn main() {
    let step_ms = decode_step_ms();
    let rows: Vec<Row> = [49_152usize, 262_144]
        .into_iter()
        .flat_map(measure)
        .collect();
    println!("\nper-step plugin cost by language (synthetic vocabulary and logits)");
    println!(
        "{:<11} {:<24} {:<30} {:>8} {:>12} {:>10} {:>14}",
        "language", "plugin", "step", "vocab", "per step µs", "% of step", "inst+conf ms"
    );
    for r in &rows {
        let name = if r.config == SCAN {
            format!("{} {{scan}}", r.plugin)
        } else {
            r.plugin.to_string()
        };
        println!(
            "{:<11} {:<24} {:<30} {:>8} {:>12.1} {:>10.2} {:>14.2}",
            r.language,
            name,
            r.what,
            r.vocab,
            r.per_step_us,
            r.per_step_us / 1e3 / step_ms * 100.0,
            r.instantiate_configure_ms
        );
    }
    println!("\nnative decode step, default model (greedy, 64 steps): {step_ms:.2} ms");
    let json = serde_json::json!({
        "decode_step_ms": step_ms,
        "per_step": rows.iter().map(|r| serde_json::json!({
            "language": r.language, "plugin": r.plugin, "config": r.config, "step": r.what,
            "vocab": r.vocab, "per_step_us": r.per_step_us,
            "share_of_decode_step": r.per_step_us / 1e3 / step_ms,
            "instantiate_configure_ms": r.instantiate_configure_ms,
        })).collect::<Vec<_>>(),
    });
    let out = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target/bench");
    let path = out.join("plugin_languages.json");
    match std::fs::create_dir_all(&out).and_then(|()| std::fs::write(&path, format!("{json:#}\n")))
    {
        Ok(()) => println!("wrote {}", path.display()),
        Err(e) => eprintln!("cannot write {}: {e}", path.display()),
    }
}
