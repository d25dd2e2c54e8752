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

#[test]
#[ignore = "timing on a real file; prints only"]
fn step_timing() {
    let path = std::env::var_os("INFERD_STEP_MODEL")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(default_model_path);
    let opts = LoadOptions {
        device: Device::Cpu,
        matrices: MatrixPolicy::default(),
    };
    let model = crate::model::load(&path, &opts).expect("load").model;
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
