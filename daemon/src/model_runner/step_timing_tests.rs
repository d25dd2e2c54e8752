//! In-process timing of one sequence's prefill and decode steps on a real file (an
//! `#[ignore]`d test), for comparing kernel changes on a noisy machine: the minimum and
//! quartiles over many steps move far less between runs than the serving benchmark's
//! means (which also hold the scheduler, the socket and the client).
//!
//! ```text
//! INFERD_STEP_MODEL=FILE cargo test --release -p inferd --lib step_timing -- --ignored --nocapture
//! ```
//!
//! Timing goals live in the serving benchmark (`clients/bench`); this prints only.

use std::time::Instant;

use candle_core::Device;

use super::parity_tests::argmax;
use crate::model::{LoadOptions, MatrixPolicy, SoloKv};
use crate::test_support::default_model_path;

/// Milliseconds at the given quantiles of `v` (sorted in place).
fn quantiles(v: &mut [f64], qs: &[f64]) -> Vec<f64> {
    v.sort_by(f64::total_cmp);
    qs.iter()
        .map(|q| v[((v.len() - 1) as f64 * q).round() as usize] * 1e3)
        .collect()
}

/// `INFERD_STEP_MODEL` (default: the default model) on the CPU, default kernels.
fn load_step_model() -> (std::path::PathBuf, crate::model::Model) {
    let path = std::env::var_os("INFERD_STEP_MODEL")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(default_model_path);
    let opts = LoadOptions {
        device: Device::Cpu,
        matrices: MatrixPolicy::default(),
    };
    let model = crate::model::load(&path, &opts).expect("load").model;
    (path, model)
}

#[test]
#[ignore = "timing on a real file; prints only"]
fn step_timing() {
    let (path, model) = load_step_model();
    let prompt: Vec<u32> = (0..512u32).map(|i| 200 + (i * 37) % 5000).collect();
    let (mut prefill, mut decode) = (Vec::new(), Vec::new());
    for _ in 0..3 {
        let mut cache = SoloKv::new(&model.kv_layout(), model.device()).expect("kv");
        let t = Instant::now();
        model.forward(&prompt, &mut cache).expect("prefill");
        prefill.push(t.elapsed().as_secs_f64());
        // Decode after a 16-token prompt (the serving benchmark's decode phase).
        let mut cache = SoloKv::new(&model.kv_layout(), model.device()).expect("kv");
        let l = model.forward(&prompt[..16], &mut cache).expect("prompt");
        let mut tok = argmax(&l.to_vec1::<f32>().expect("logits"));
        for _ in 0..64 {
            let t = Instant::now();
            let l = model.forward(&[tok], &mut cache).expect("decode");
            let v = l.to_vec1::<f32>().expect("logits");
            decode.push(t.elapsed().as_secs_f64());
            tok = argmax(&v);
        }
    }
    let p = quantiles(&mut prefill, &[0.0]);
    let d = quantiles(&mut decode, &[0.0, 0.25, 0.5]);
    println!(
        "{}: prefill 512 min {:.1} ms ({:.0} tok/s); decode step at 16-80 cached min {:.2} / p25 {:.2} / median {:.2} ms ({:.0} tok/s at p25)",
        path.display(),
        p[0],
        512e3 / p[0],
        d[0],
        d[1],
        d[2],
        1e3 / d[1]
    );
}

/// Cost of speculative verification rows: `b` sequences decoding at once after 64-token
/// prompts, each running `r` rows (its pending token plus `r − 1` drafts) with a logits
/// row each, as the scheduler batches them. Prints the p25 step time and its ratio to
/// the one-row step of the same batch; `ROW_COST` in `scheduler::speculative` and the
/// default `speculative.max_running` come from this table (docs/performance.md).
///
/// ```text
/// cargo test --release -p inferd --lib verification_step_timing -- --ignored --nocapture
/// ```
#[test]
#[ignore = "timing on a real file; prints only"]
fn verification_step_timing() {
    use super::runner::{BatchItem, ModelRunner, RunBatch};
    use crate::model::KvBlockPool;
    use crate::request::SeqId;

    let (_, model) = load_step_model();
    let (bs, per_seq) = (16usize, 8usize);
    let pool = KvBlockPool::new(&model.kv_layout(), bs, 16 * per_seq, &Device::Cpu).expect("pool");
    let mut runner = ModelRunner::new(model, pool);
    let item = |s: usize, tokens: Vec<u32>, start_pos: usize, rows: usize| BatchItem {
        images: Vec::new(),
        seq: SeqId(s as u64),
        tokens,
        start_pos,
        block_table: (0..per_seq).map(|b| (s * per_seq + b) as u32).collect(),
        logit_rows: rows,
        prompt_len: 64,
        persist: Vec::new(),
        draft: None,
        adapter: None,
    };
    let prompt = |s: usize| -> Vec<u32> {
        (0..64u32)
            .map(|i| 200 + (i * 37 + s as u32 * 101) % 5000)
            .collect()
    };
    let items = (0..16).map(|s| item(s, prompt(s), 0, 1)).collect();
    runner.run(RunBatch {
        items,
        ..RunBatch::default()
    });
    println!("batch  rows/seq  p25 ms  vs 1 row  ms per extra row / 1-row step");
    for b in [1usize, 2, 4, 8, 16] {
        let mut base = 0.0;
        for r in [1usize, 2, 3, 5, 9] {
            let mut times = Vec::new();
            for rep in 0..24 {
                // Positions 64 .. 64 + r, rewritten each rep (the cached context stays 64).
                let items = (0..b)
                    .map(|s| item(s, vec![300 + rep as u32; r], 64, r))
                    .collect();
                let t = Instant::now();
                runner.run(RunBatch {
                    items,
                    ..RunBatch::default()
                });
                times.push(t.elapsed().as_secs_f64());
            }
            let p25 = quantiles(&mut times, &[0.25])[0];
            if r == 1 {
                base = p25;
            }
            let per_row = if r > 1 {
                (p25 / base - 1.0) / (r - 1) as f64
            } else {
                0.0
            };
            println!(
                "{b:>5}  {r:>8}  {p25:>6.2}  {:>8.2}  {per_row:>6.3}",
                p25 / base
            );
        }
    }
}
