//! Per-step cost of the native steering processors and of llguidance's mask, at the
//! default model's 49,152-token vocabulary and Gemma 3's 262,144.
//!
//! `cargo bench -p inferd --bench steering_overhead` (release). For each tokenizer
//! (`models/SmolLM2-135M-Instruct.Q4_1.gguf`, `models/gemma-3-270m-q4_k_m.gguf`; a
//! missing file is skipped): the one-off cost of llguidance's token trie and of one
//! schema's compilation, then the median time of one [`SamplerChain::step`] plus
//! `accept` on random logits for: a bare greedy chain; penalties (presence, frequency,
//! repetition over 64 tokens, after 200 generated); 100 `logit_bias` entries;
//! `logprobs` with 20 alternatives; a JSON-schema constraint (the mask computed each
//! step, tokens chosen greedily among the allowed ones until the grammar ends).
//! Prints a table and writes `target/bench/steering_overhead.json`.

mod common;

use std::path::PathBuf;
use std::time::{Duration, Instant};

use candle_core::quantized::gguf_file;
use inferd::request::{ConstraintSpec, SamplingParams};
use inferd::sampling::build::grammar_vocabulary;
use inferd::sampling::constraint::GrammarCompiler;
use inferd::sampling::{SamplerChain, StepContext};
use inferd::tokenizer::TextTokenizer;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde_json::json;

use common::{model_path, size};

fn tokenizer(file: &str) -> Option<TextTokenizer> {
    // Beside the default model (`INFERD_TEST_MODEL` or models/).
    let path = model_path().with_file_name(file);
    let mut f = std::fs::File::open(&path).ok()?;
    let content = gguf_file::Content::read(&mut f).expect("gguf");
    Some(TextTokenizer::from_gguf(&content.metadata).expect("tokenizer"))
}

fn median(mut v: Vec<Duration>) -> f64 {
    v.sort_unstable();
    v.get(v.len() / 2).map_or(0.0, |d| d.as_secs_f64() * 1e6)
}

fn greedy() -> SamplingParams {
    SamplingParams {
        temperature: 0.0,
        ..SamplingParams::default()
    }
}

/// Median µs of `step` + `accept` over `steps` steps of `chain` on random rows.
fn time_chain(mut chain: SamplerChain, vocab: usize, steps: usize, history: usize) -> f64 {
    let mut rng = ChaCha8Rng::seed_from_u64(5);
    let prompt: Vec<u32> = (0..64).map(|_| rng.random_range(0..vocab as u32)).collect();
    let mut generated: Vec<u32> = Vec::new();
    for _ in 0..history {
        let t = rng.random_range(0..vocab as u32);
        chain.accept(t).expect("accept");
        generated.push(t);
    }
    let rows: Vec<Vec<f32>> = (0..8)
        .map(|_| (0..vocab).map(|_| rng.random_range(-10.0..10.0)).collect())
        .collect();
    let mut times = Vec::with_capacity(steps);
    let mut logits = vec![0.0f32; vocab];
    for i in 0..steps {
        logits.copy_from_slice(&rows[i % rows.len()]);
        let start = Instant::now();
        let ctx = StepContext {
            sequence_id: 1,
            prompt: &prompt,
            generated: &generated,
        };
        let s = chain.step(&ctx, &mut logits).expect("step");
        chain.accept(s.token).expect("accept");
        times.push(start.elapsed());
        generated.push(s.token);
    }
    median(times)
}

struct Row {
    vocab: usize,
    trie_ms: f64,
    compile_ms: f64,
    bare_us: f64,
    penalties_us: f64,
    bias_us: f64,
    logprobs_us: f64,
    mask_us: f64,
    mask_steps: usize,
    /// Step time with the mask prepared ahead (what stays on the critical path).
    prepared_path_us: f64,
    /// Time of one mask prepared ahead (overlapped with the forward pass).
    prepare_us: f64,
}

fn measure(tok: &TextTokenizer) -> Row {
    let steps = size("INFERD_BENCH_STEPS", 200);
    let vocab = tok.vocab_size();
    let start = Instant::now();
    let (words, eos) = grammar_vocabulary(tok);
    let compiler = GrammarCompiler::new(&words, eos).expect("compiler");
    let trie_ms = start.elapsed().as_secs_f64() * 1e3;
    let schema = json!({"type": "object", "properties": {
        "name": {"type": "string", "maxLength": 40},
        "tags": {"type": "array", "items": {"type": "string", "maxLength": 12}, "maxItems": 6},
        "score": {"type": "integer"}},
        "required": ["name", "tags", "score"], "additionalProperties": false});
    let spec = ConstraintSpec::JsonSchema(schema);
    let start = Instant::now();
    let constraint = compiler
        .compile(&spec, tok.eog_token_ids())
        .expect("compile");
    let compile_ms = start.elapsed().as_secs_f64() * 1e3;
    let eog = tok.eog_token_ids();
    let bare = time_chain(SamplerChain::new(&greedy(), eog), vocab, steps, 0);
    let pen = SamplingParams {
        presence_penalty: 0.5,
        frequency_penalty: 0.5,
        repetition_penalty: 1.1,
        ..greedy()
    };
    let penalties = time_chain(SamplerChain::new(&pen, eog), vocab, steps, 200);
    let bias = SamplingParams {
        logit_bias: (0..100).map(|i| (i * 37, 1.0)).collect(),
        ..greedy()
    };
    let bias = time_chain(SamplerChain::new(&bias, eog), vocab, steps, 0);
    let lp = SamplingParams {
        logprobs: Some(20),
        ..greedy()
    };
    let logprobs = time_chain(SamplerChain::new(&lp, eog), vocab, steps, 0);
    // The constraint: greedy over random logits among the allowed tokens until the
    // grammar ends (the schema bounds its length); first with the mask computed inside
    // the step, then prepared ahead as the scheduler does while the runner computes.
    let (times, _) = constrained_steps(tok, constraint, false);
    let again = compiler
        .compile(&spec, tok.eog_token_ids())
        .expect("compile");
    let (path, prepared) = constrained_steps(tok, again, true);
    Row {
        vocab,
        trie_ms,
        compile_ms,
        bare_us: bare,
        penalties_us: penalties,
        bias_us: bias,
        logprobs_us: logprobs,
        mask_steps: times.len(),
        mask_us: median(times),
        prepared_path_us: median(path),
        prepare_us: median(prepared),
    }
}

/// Steps a JSON-schema-constrained greedy chain over random logits to the grammar's
/// end; returns the time of each step (sample + accept) and, with `prepare`, of each
/// mask computed ahead of its step.
fn constrained_steps(
    tok: &TextTokenizer,
    constraint: inferd::sampling::constraint::Constraint,
    prepare: bool,
) -> (Vec<Duration>, Vec<Duration>) {
    let vocab = tok.vocab_size();
    let mut chain = SamplerChain::new(&greedy(), tok.eog_token_ids());
    chain.set_constraint(constraint);
    let mut rng = ChaCha8Rng::seed_from_u64(9);
    let (mut times, mut prepared) = (Vec::new(), Vec::new());
    let mut generated = Vec::new();
    let mut logits = vec![0.0f32; vocab];
    while times.len() < 400 {
        logits
            .iter_mut()
            .for_each(|l| *l = rng.random_range(-10.0..10.0));
        if prepare {
            let start = Instant::now();
            chain.prepare();
            prepared.push(start.elapsed());
        }
        let start = Instant::now();
        let ctx = StepContext {
            sequence_id: 1,
            prompt: &[],
            generated: &generated,
        };
        let s = chain.step(&ctx, &mut logits).expect("constrained step");
        chain.accept(s.token).expect("accept");
        times.push(start.elapsed());
        generated.push(s.token);
        if tok.is_eog(s.token) {
            break;
        }
    }
    (times, prepared)
}

fn main() {
    let mut rows = Vec::new();
    for file in [
        "SmolLM2-135M-Instruct.Q4_1.gguf",
        "gemma-3-270m-q4_k_m.gguf",
    ] {
        match tokenizer(file) {
            Some(tok) => rows.push((file, measure(&tok))),
            None => eprintln!("skipping {file}: not in models/"),
        }
    }
    println!(
        "| vocabulary | trie build ms | schema compile ms | bare step µs | + penalties µs | + logit_bias (100) µs | + logprobs (20) µs | + JSON-schema mask µs (steps) | mask prepared ahead: step µs / prepare µs |"
    );
    println!("|---|---|---|---|---|---|---|---|---|");
    for (_, r) in &rows {
        println!(
            "| {} | {:.0} | {:.1} | {:.0} | {:.0} | {:.0} | {:.0} | {:.0} ({}) | {:.0} / {:.0} |",
            r.vocab,
            r.trie_ms,
            r.compile_ms,
            r.bare_us,
            r.penalties_us,
            r.bias_us,
            r.logprobs_us,
            r.mask_us,
            r.mask_steps,
            r.prepared_path_us,
            r.prepare_us
        );
    }
    let json = json!(rows
        .iter()
        .map(|(file, r)| json!({
            "tokenizer_of": file,
            "vocab": r.vocab,
            "trie_build_ms": r.trie_ms,
            "schema_compile_ms": r.compile_ms,
            "median_step_us": {
                "bare_greedy": r.bare_us,
                "penalties": r.penalties_us,
                "logit_bias_100": r.bias_us,
                "logprobs_20": r.logprobs_us,
                "json_schema_mask": r.mask_us,
                "json_schema_prepared_step": r.prepared_path_us,
                "json_schema_prepare": r.prepare_us,
            },
            "json_schema_steps": r.mask_steps,
        }))
        .collect::<Vec<_>>());
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target/bench");
    let _ = std::fs::create_dir_all(&dir);
    let path = dir.join("steering_overhead.json");
    match std::fs::write(&path, format!("{json:#}\n")) {
        Ok(()) => println!("wrote {}", path.display()),
        Err(e) => eprintln!("cannot write {}: {e}", path.display()),
    }
}
