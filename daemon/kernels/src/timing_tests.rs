//! A short single-thread timing table of [`QuantMatrix::matmul_range`] per weight type,
//! shape and activation-row count (an `#[ignore]`d test):
//!
//! ```text
//! cargo test --release -p inferd-kernels -- --ignored timing --nocapture
//! ```
//!
//! Prints GFLOP/s (`2 · n · k · rows / t`) and weight GB/s (weight bytes read once per
//! product / t) and writes one JSON object per measurement, one a line, to
//! `INFERD_TIMING_JSON` (default `$TMPDIR/inferd-kernels-timing.json`). With
//! `INFERD_TIMING_BASELINE` naming such a file from an earlier run, a column gives the
//! speed-up against it. `INFERD_TIMING_TYPES=q5_0,q4_K` limits the types,
//! `INFERD_TIMING_ROWS=1,16` the activation row counts, `INFERD_TIMING_SHAPES=8960x1536`
//! the `n`x`k` shapes; `INFERD_TIMING_PLAIN=1` times ggml's row layout where the daemon
//! would store another.
//!
//! To keep runs short, the weights are a few quantized rows repeated to the full shape,
//! activations are quantized once outside the timed loop, and products with many rows
//! time a leading range of output features (at most about 0.4 GFLOP per call). For
//! the K-quants `k` is rounded down to whole 256-value blocks (576 and 640 → 512).
//! With `INFERD_TIMING_PATHS=1` the rows are one llama.cpp micro-batch and each takes
//! llama.cpp's kernel for it ([`crate::paths`]: tiled, gemm, gemv) instead of `vec_dot`.

use crate::testing::{quantize, random};
use crate::{BatchRow, GgmlType, Isa, Path, QuantMatrix};
use candle_core::quantized::GgmlDType;
use std::fmt::Write as _;
use std::time::{Duration, Instant};

const TYPES: [(GgmlType, GgmlDType); 10] = [
    (GgmlType::Q5_0, GgmlDType::Q5_0),
    (GgmlType::Q8_0, GgmlDType::Q8_0),
    (GgmlType::Q4K, GgmlDType::Q4K),
    (GgmlType::Q6K, GgmlDType::Q6K),
    (GgmlType::Q5_1, GgmlDType::Q5_1),
    (GgmlType::Q4_0, GgmlDType::Q4_0),
    (GgmlType::Q5K, GgmlDType::Q5K),
    (GgmlType::Q2K, GgmlDType::Q2K),
    (GgmlType::Q3K, GgmlDType::Q3K),
    (GgmlType::Q4_1, GgmlDType::Q4_1),
];

const SHAPES: [(usize, usize); 6] = [
    (576, 576),
    (1536, 576),
    (576, 1536),
    (49152, 576),
    (2048, 640),
    (32768, 640),
];

const ROWS: [usize; 3] = [1, 16, 512];

/// Floating-point operations per timed call, at most (rounded to whole feature rows).
const MAX_FLOP: f64 = 4e8;

/// Best seconds per call of `f` over three runs of at least 25 ms each.
fn best_seconds(mut f: impl FnMut()) -> f64 {
    f();
    let mut best = f64::INFINITY;
    for _ in 0..3 {
        let (t0, mut calls) = (Instant::now(), 0u32);
        while calls == 0 || t0.elapsed() < Duration::from_millis(25) {
            f();
            calls += 1;
        }
        best = best.min(t0.elapsed().as_secs_f64() / f64::from(calls));
    }
    best
}

/// `gflops` of the baseline line for the same measurement, if any.
fn baseline(lines: &[String], key: &str) -> Option<f64> {
    let line = lines.iter().find(|l| l.starts_with(key))?;
    let rest = line.split("\"gflops\":").nth(1)?;
    rest.split([',', '}']).next()?.trim().parse().ok()
}

#[test]
#[ignore = "timing table; run with --release -- --ignored timing --nocapture"]
fn timing() {
    let isa = Isa::detect();
    let only: Option<Vec<String>> = std::env::var("INFERD_TIMING_TYPES")
        .ok()
        .map(|s| s.split(',').map(str::to_string).collect());
    let base: Vec<String> = std::env::var("INFERD_TIMING_BASELINE")
        .ok()
        .and_then(|p| std::fs::read_to_string(p).ok())
        .map(|s| s.lines().map(str::to_string).collect())
        .unwrap_or_default();
    let path = std::env::var("INFERD_TIMING_JSON").unwrap_or_else(|_| {
        let p = std::env::temp_dir().join("inferd-kernels-timing.json");
        p.to_string_lossy().into_owned()
    });
    let by_path = std::env::var_os("INFERD_TIMING_PATHS").is_some();
    let row_counts: Vec<usize> = std::env::var("INFERD_TIMING_ROWS")
        .ok()
        .map(|s| s.split(',').filter_map(|r| r.trim().parse().ok()).collect())
        .unwrap_or_else(|| ROWS.to_vec());
    let shapes: Vec<(usize, usize)> = std::env::var("INFERD_TIMING_SHAPES")
        .ok()
        .map(|s| {
            s.split(',')
                .filter_map(|nk| {
                    let (n, k) = nk.trim().split_once('x')?;
                    Some((n.parse().ok()?, k.parse().ok()?))
                })
                .collect()
        })
        .unwrap_or_else(|| SHAPES.to_vec());
    let mut json = String::new();
    println!("isa {}, one thread", isa.name());
    println!(
        "{:<6} {:>6} {:>5} {:>5} {:>7} {:>8} {:>8} {:>8}",
        "type", "n", "k", "rows", "path", "GFLOP/s", "wGB/s", "vs base"
    );
    for (ty, dtype) in TYPES {
        if only
            .as_ref()
            .is_some_and(|o| !o.iter().any(|t| t == ty.name()))
        {
            continue;
        }
        for &(n, k) in &shapes {
            // K-quant rows are whole 256-value blocks: 576 and 640 become 512.
            let k = k / ty.block().0 * ty.block().0;
            // 64 distinct quantized rows, repeated to `n` rows.
            let (seed_rows, _) = quantize(&random(64 * k, 5), 64, k, dtype);
            let data: Vec<u8> = seed_rows
                .iter()
                .copied()
                .cycle()
                .take(n * ty.row_bytes(k))
                .collect();
            // The layout the daemon stores for this instruction set (sixteen-row K-quants on
            // AVX-512).
            let m = if std::env::var_os("INFERD_TIMING_PLAIN").is_some() {
                QuantMatrix::new(ty, data, n, k)
            } else {
                QuantMatrix::for_isa(isa, ty, data, n, k)
            }
            .expect("matrix");
            for &rows in &row_counts {
                let paths = if by_path {
                    let batch: Vec<BatchRow> = (0..rows as u32)
                        .map(|index| BatchRow {
                            index,
                            len: rows as u32,
                        })
                        .collect();
                    m.paths(&batch)
                } else {
                    Vec::new()
                };
                let path_name = match paths.last().copied().unwrap_or(Path::VecDot) {
                    Path::VecDot => "vec_dot",
                    Path::Tiled => "tiled",
                    Path::Gemv => "gemv",
                    Path::Gemm => "gemm",
                    Path::Sgemm => "sgemm",
                };
                let act = m
                    .quantize_for(&random(rows * k, 9), rows, &paths)
                    .expect("activations");
                let per_feature = 2.0 * (k * rows) as f64;
                let feats = ((MAX_FLOP / per_feature) as usize).clamp(1, n);
                let mut out = vec![0f32; feats * rows];
                let t = best_seconds(|| {
                    m.matmul_range_paths(isa, &act, 0..feats, &paths, &mut out)
                        .expect("matmul");
                    std::hint::black_box(&out);
                });
                let gflops = per_feature * feats as f64 / t / 1e9;
                let wgbs = (feats * ty.row_bytes(k)) as f64 / t / 1e9;
                let key = format!(
                    "{{\"type\":\"{}\",\"n\":{n},\"k\":{k},\"rows\":{rows},\"path\":\"{path_name}\",",
                    ty.name()
                );
                let vs = baseline(&base, &key)
                    .map(|b| format!("{:.2}×", gflops / b))
                    .unwrap_or_default();
                println!(
                    "{:<6} {n:>6} {k:>5} {rows:>5} {path_name:>7} {gflops:>8.2} {wgbs:>8.2} {vs:>8}",
                    ty.name()
                );
                writeln!(
                    json,
                    "{key}\"features\":{feats},\"isa\":\"{}\",\"seconds\":{t:e},\"gflops\":{gflops:.4},\"weight_gbs\":{wgbs:.4}}}",
                    isa.name()
                )
                .expect("write");
            }
        }
    }
    std::fs::write(&path, json).expect("write timing JSON");
    println!("wrote {path}");
}
