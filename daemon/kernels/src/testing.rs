//! The per-type kernel test: ggml's reference quantization (candle's quantizers) of
//! random matrices, then
//! 1. our dequantization equals candle's (ggml's `dequantize_row_*`) bit for bit;
//! 2. every instruction set's product equals the portable one bit for bit, for single
//!    and multi-row activations and odd shapes (rows not a multiple of 4 or 8, one
//!    block per row, many blocks);
//! 3. the portable product equals dequantize-then-dot — `Σ deq(w) · deq(a)` in f64 over
//!    the same (quantized) activations — within `1e-5 · Σ |deq(w) · deq(a)|` (only the
//!    f32 summation order differs);
//! 4. against the unquantized f32 activations the error stays within the activation
//!    format's rounding (`tol_f32 · Σ |deq(w) · x|`).

use crate::act::{ActFormat, Activations};
use crate::matrix::Wrap;
use crate::{Isa, Quant, QuantMatrix};
use candle_core::quantized::{GgmlDType, QTensor};
use candle_core::{Device, Tensor};
use rand::{Rng, SeedableRng};

/// Seeded values in `[-1, 1)` with a few larger outliers (as real weights have).
pub fn random(len: usize, seed: u64) -> Vec<f32> {
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
    (0..len)
        .map(|i| {
            let v: f32 = rng.random_range(-1.0..1.0);
            if i % 97 == 13 {
                v * 6.0
            } else {
                v
            }
        })
        .collect()
}

/// `(bytes, dequantized)` of an `(n, k)` matrix quantized by candle to `dtype`.
pub fn quantize(w: &[f32], n: usize, k: usize, dtype: GgmlDType) -> (Vec<u8>, Vec<f32>) {
    let t = Tensor::from_vec(w.to_vec(), (n, k), &Device::Cpu).expect("tensor");
    let q = QTensor::quantize(&t, dtype).expect("quantize");
    let bytes = q.data().expect("bytes").into_owned();
    let deq = q
        .dequantize(&Device::Cpu)
        .expect("dequantize")
        .flatten_all()
        .expect("flat");
    (bytes, deq.to_vec1::<f32>().expect("values"))
}

/// Shapes `(n, k)` in blocks of `b` values: one block, odd row counts, many blocks.
fn shapes(b: usize) -> Vec<(usize, usize)> {
    let k_max = if b == 1 { 1024 } else { (4096 / b).max(3) * b };
    vec![
        (1, b.max(32)),
        (7, 3 * b.max(32)),
        (13, 5 * b.max(32)),
        (9, k_max),
    ]
}

/// Runs the checks above for type `Q`, whose candle dtype is `dtype`.
pub fn check_type<Q: Quant>(dtype: GgmlDType)
where
    Q::Act: Wrap,
{
    // Relative error of the activation format against f32 inputs.
    let tol_f32 = match Q::Act::NAME {
        "f32" => 1e-5,
        "f16" => 2e-3,
        "bf16" => 1e-2,
        _ => 2e-2,
    };
    for (si, (n, k)) in shapes(Q::BLOCK_VALUES).into_iter().enumerate() {
        let w = random(n * k, 100 + si as u64);
        let (bytes, deq) = quantize(&w, n, k, dtype);
        let m = QuantMatrix::new(Q::TYPE, bytes, n, k).expect("matrix");
        // 1. Dequantization.
        let ids: Vec<u32> = (0..n as u32).collect();
        let ours = m.dequantize_rows(&ids).expect("rows");
        for (i, (a, b)) in ours.iter().zip(&deq).enumerate() {
            assert_eq!(
                a.to_bits(),
                b.to_bits(),
                "{}: dequantized value {i} of ({n}, {k}): {a} vs {b}",
                Q::TYPE.name()
            );
        }
        for rows in [1usize, 3, 10] {
            let x = random(rows * k, 7 + si as u64 * 31 + rows as u64);
            // 2. Every instruction set, bit for bit.
            let portable = m.matmul(Isa::Portable, &x, rows).expect("matmul");
            for isa in Isa::available() {
                let got = m.matmul(isa, &x, rows).expect("matmul");
                for (i, (a, b)) in got.iter().zip(&portable).enumerate() {
                    assert_eq!(
                        a.to_bits(),
                        b.to_bits(),
                        "{} {}: output {i} of {rows}×({n}, {k}): {a} vs portable {b}",
                        Q::TYPE.name(),
                        isa.name()
                    );
                }
            }
            // 3. and 4. Against dequantize-then-dot.
            let act = Activations::<Q::Act>::quantize(&x, rows, k).expect("activations");
            let mut xa = vec![0f32; k];
            for j in 0..rows {
                Q::Act::dequantize_row(act.row(j), &mut xa);
                let xf = &x[j * k..(j + 1) * k];
                for r in 0..n {
                    let wr = &deq[r * k..(r + 1) * k];
                    let exact: f64 = wr
                        .iter()
                        .zip(&xa)
                        .map(|(&a, &b)| f64::from(a) * f64::from(b))
                        .sum();
                    let mag: f64 = wr
                        .iter()
                        .zip(&xa)
                        .map(|(&a, &b)| (f64::from(a) * f64::from(b)).abs())
                        .sum();
                    let got = f64::from(portable[j * n + r]);
                    assert!(
                        (got - exact).abs() <= 1e-5 * mag + 1e-30,
                        "{}: output ({j}, {r}) of ({n}, {k}): {got} vs dequantized dot {exact} (Σ|·| {mag})",
                        Q::TYPE.name()
                    );
                    let full: f64 = wr
                        .iter()
                        .zip(xf)
                        .map(|(&a, &b)| f64::from(a) * f64::from(b))
                        .sum();
                    let magf: f64 = wr
                        .iter()
                        .zip(xf)
                        .map(|(&a, &b)| (f64::from(a) * f64::from(b)).abs())
                        .sum();
                    assert!(
                        (got - full).abs() <= tol_f32 * magf + 1e-30,
                        "{}: output ({j}, {r}) of ({n}, {k}): {got} vs f32 dot {full} (Σ|·| {magf})",
                        Q::TYPE.name()
                    );
                }
            }
        }
    }
}
