//! The per-type kernel test: ggml's reference quantization (candle's quantizers) of
//! random matrices, then
//! 1. our dequantization equals candle's (ggml's `dequantize_row_*`) bit for bit;
//! 2. every instruction set's product equals the portable one bit for bit, for single
//!    and multi-row activations and odd shapes (rows not a multiple of 4 or 8, one
//!    block per row, many blocks);
//! 3. the portable product equals dequantize-then-dot — `Σ deq(w) · deq(a)` in f64 over
//!    the same (quantized) activations — within `1e-5 · Σ |deq(w) · deq(a)|` (only the
//!    f32 summation order differs; 1e-3 for Q8_1 activations, whose `s` is an f16);
//! 4. against the unquantized f32 activations the error stays within the activation
//!    format's rounding (`tol_f32 · Σ |deq(w) · x|`);
//! 5. [`check_rows`]: the multi-row kernels (`vec_dot_rows`) equal one `vec_dot` per row
//!    bit for bit, for every tile size and remainder;
//! 6. [`check_block`]: so do the kernels of several weight rows (`vec_dot_block`).

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
    // Against dequantize-then-dot over the same activations only the summation order
    // differs, except that Q8_1 stores `s = d · Σ q` rounded to f16 (ggml's
    // `block_q8_1`), which the `m · s` term of Q4_1/Q5_1 carries (relative 2^-11).
    let tol_deq = if Q::Act::NAME == "q8_1" { 1e-3 } else { 1e-5 };
    check_rows::<Q>(dtype);
    check_block::<Q>(dtype);
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
                        (got - exact).abs() <= tol_deq * mag + 1e-30,
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

/// `vec_dot_rows` over every range of up to 9 activation rows (starting at 0 and at 2,
/// so tiles of every size and every remainder) equals `vec_dot` per row, bit for bit,
/// for every instruction set and the shapes of [`check_type`].
pub fn check_rows<Q: Quant>(dtype: GgmlDType) {
    for (si, (n, k)) in shapes(Q::BLOCK_VALUES).into_iter().enumerate() {
        let n = n.min(5);
        let (bytes, _) = quantize(&random(n * k, 300 + si as u64), n, k, dtype);
        let x = random(11 * k, 400 + si as u64);
        let act = Activations::<Q::Act>::quantize(&x, 11, k).expect("activations");
        let row_bytes = bytes.len() / n;
        for isa in Isa::available() {
            for (r, w) in bytes.chunks_exact(row_bytes).enumerate() {
                let one: Vec<f32> = (0..11).map(|j| Q::vec_dot(isa, w, act.row(j))).collect();
                for start in [0, 2] {
                    for len in 1..=9 {
                        let mut out = vec![f32::NAN; len];
                        Q::vec_dot_rows(isa, w, &act, start..start + len, &mut out);
                        for (i, (a, b)) in out.iter().zip(&one[start..]).enumerate() {
                            assert_eq!(
                                a.to_bits(),
                                b.to_bits(),
                                "{} {}: rows {start}..{}, row {i}, weight row {r} of ({n}, {k}): {a} vs vec_dot {b}",
                                Q::TYPE.name(),
                                isa.name(),
                                start + len
                            );
                        }
                    }
                }
            }
        }
    }
}

/// `vec_dot_block` over 1 to 11 weight rows and every range of up to 19 activation rows
/// (starting at 0 and at 3: every weight-tile and activation-tile size and remainder,
/// one activation row as decode) equals `vec_dot` per pair, bit for bit, for every
/// instruction set; outputs outside the block stay untouched.
pub fn check_block<Q: Quant>(dtype: GgmlDType) {
    let stride = 23;
    for (si, (_, k)) in shapes(Q::BLOCK_VALUES).into_iter().enumerate().skip(1) {
        let n = 11;
        let (bytes, _) = quantize(&random(n * k, 500 + si as u64), n, k, dtype);
        let x = random(22 * k, 600 + si as u64);
        let act = Activations::<Q::Act>::quantize(&x, 22, k).expect("activations");
        let row_bytes = bytes.len() / n;
        for isa in Isa::available() {
            let one: Vec<Vec<f32>> = bytes
                .chunks_exact(row_bytes)
                .map(|w| (0..22).map(|j| Q::vec_dot(isa, w, act.row(j))).collect())
                .collect();
            for wn in 1..=n {
                for start in [0, 3] {
                    for len in 1..=19 {
                        let mut out = vec![f32::NAN; (wn - 1) * stride + len + 1];
                        let w = &bytes[..wn * row_bytes];
                        Q::vec_dot_block(
                            isa,
                            w,
                            row_bytes,
                            &act,
                            start..start + len,
                            &mut out,
                            stride,
                        );
                        let what = format!(
                            "{} {}: {wn} weight rows × rows {start}..{} of k = {k}",
                            Q::TYPE.name(),
                            isa.name(),
                            start + len
                        );
                        check_written(&out, stride, wn, len, |r, j| one[r][start + j], &what);
                    }
                }
            }
            // The same rows interleaved in groups of four (`layout`), from several first
            // rows: decode (1–3 rows) and prefill tiles.
            let inter = crate::layout::interleave(&bytes, row_bytes, Q::BLOCK_BYTES, 4);
            for f0 in [0usize, 1, 5] {
                for wn in 1..=n - f0 {
                    for len in [1, 2, 3, 4, 9, 19] {
                        let start = 3;
                        let mut out = vec![f32::NAN; (wn - 1) * stride + len + 1];
                        Q::vec_dot_block_in(
                            isa,
                            &inter,
                            row_bytes,
                            4,
                            f0..f0 + wn,
                            &act,
                            start..start + len,
                            &mut out,
                            stride,
                        );
                        let what = format!(
                            "{} {} interleaved: rows {f0}..{} × {start}..{}",
                            Q::TYPE.name(),
                            isa.name(),
                            f0 + wn,
                            start + len
                        );
                        check_written(&out, stride, wn, len, |r, j| one[f0 + r][start + j], &what);
                    }
                }
            }
            // The matrix in the layout chosen for `isa` gives the plain matrix's products
            // and dequantized rows.
            let plain = crate::QuantMatrix::new(Q::TYPE, bytes.clone(), n, k).expect("matrix");
            let fast =
                crate::QuantMatrix::for_isa(isa, Q::TYPE, bytes.clone(), n, k).expect("matrix");
            for rows in [1usize, 2, 7, 22] {
                let xs = &x[..rows * k];
                let a = plain.quantize(xs, rows).expect("act");
                let (mut u, mut v) = (vec![0f32; rows * (n - 2)], vec![0f32; rows * (n - 2)]);
                plain
                    .matmul_range(isa, &a, 1..n - 1, &mut u)
                    .expect("plain");
                fast.matmul_range(isa, &a, 1..n - 1, &mut v)
                    .expect("for_isa");
                let bits = |w: &[f32]| w.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
                assert_eq!(
                    bits(&u),
                    bits(&v),
                    "{} {} for_isa, {rows} rows",
                    Q::TYPE.name(),
                    isa.name()
                );
            }
            let ids = [0u32, 3, 10, 4];
            assert_eq!(
                plain.dequantize_rows(&ids).expect("rows"),
                fast.dequantize_rows(&ids).expect("rows"),
                "{} {}: dequantized rows",
                Q::TYPE.name(),
                isa.name()
            );
        }
    }
}

/// `out[r · stride + j]` for weight rows `r < wn` and activation rows `j < len` equals
/// `want(r, j)` bit for bit; every other value is still NaN (untouched).
fn check_written(
    out: &[f32],
    stride: usize,
    wn: usize,
    len: usize,
    want: impl Fn(usize, usize) -> f32,
    what: &str,
) {
    for (i, o) in out.iter().enumerate() {
        let (r, j) = (i / stride, i % stride);
        if j >= len || r >= wn {
            assert!(o.is_nan(), "{what}: output {i} outside the block written");
            continue;
        }
        let w = want(r, j);
        assert_eq!(
            o.to_bits(),
            w.to_bits(),
            "{what}: weight row {r}, activation row {j}: {o} vs vec_dot {w}"
        );
    }
}

/// The activations of [`check_golden`]: `x_i = ((4099 i mod 1013) / 1013 − 0.45) · 2.3`.
pub fn golden_x(n: usize) -> Vec<f32> {
    (0..n)
        .map(|i| ((i * 4099 % 1013) as f32 / 1013.0 - 0.45) * 2.3)
        .collect()
}

/// The float weights of [`check_golden`]: `w_i = ((7919 i mod 1009) / 1009 − 0.5) · 1.7`.
pub fn golden_w(n: usize) -> Vec<f32> {
    (0..n)
        .map(|i| ((i * 7919 % 1009) as f32 / 1009.0 - 0.5) * 1.7)
        .collect()
}

/// Checks a type against llama.cpp's own results: `golden` holds `(n, bits)` of
/// `ggml_vec_dot_*` from the `libggml-cpu.so` of llama.cpp (GCC 12, `-O3 -march=native`,
/// AVX-512 with VNNI and BF16) for the weight row `weights(n)` and the activations
/// [`golden_x`]`(n)`, converted by ggml's own `from_float`; lengths with leftovers of
/// every kind. Every instruction set must give those bits.
pub fn check_golden<Q: Quant>(weights: impl Fn(usize) -> Vec<u8>, golden: &[(usize, u32)])
where
    Q::Act: Wrap,
{
    for &(n, bits) in golden {
        let m = QuantMatrix::new(Q::TYPE, weights(n), 1, n).expect("matrix");
        for isa in Isa::available() {
            let got = m.matmul(isa, &golden_x(n), 1).expect("matmul")[0];
            assert_eq!(
                got.to_bits(),
                bits,
                "{} {}: n = {n}: {got:e} vs llama.cpp's {:e}",
                Q::TYPE.name(),
                isa.name(),
                f32::from_bits(bits)
            );
        }
    }
}

/// Deterministic legacy blocks for [`check_golden`]: per block `b`, f16 `d = 0.01 + 0.003
/// (b mod 7)`, f16 `m = 0.05 (b mod 9) − 0.2` (when `with_m`), `qh = 2654435761 b` (when
/// `with_qh`, little-endian), `qs_j = 31 b + 17 j` (mod 256).
pub fn golden_legacy(n: usize, with_m: bool, with_qh: bool) -> Vec<u8> {
    let mut out = Vec::new();
    for b in 0..n / 32 {
        let d = 0.01 + 0.003 * (b % 7) as f32;
        out.extend(crate::half::f32_to_f16(d).to_le_bytes());
        if with_m {
            let m = 0.05 * (b % 9) as f32 - 0.2;
            out.extend(crate::half::f32_to_f16(m).to_le_bytes());
        }
        if with_qh {
            out.extend((b as u32).wrapping_mul(2_654_435_761).to_le_bytes());
        }
        out.extend((0..16).map(|j| (31 * b + 17 * j) as u8));
    }
    out
}

/// A sixteen-row layout's AVX-512 kernel on three activation rows
/// ([`crate::q4_k_x16::x86::group_dots`], [`crate::q6_k_x16::x86::group_dots`]).
#[cfg(target_arch = "x86_64")]
pub type SixteenKernel = unsafe fn(&[u8], usize, [&[crate::act::Q8KBlock]; 3], &mut [[f32; 16]; 3]);

/// Where the CPU has AVX-512 VNNI: `kernel` on the stored group `packed` (`nb` blocks)
/// and activation rows `r0 .. r0 + 3` gives, lane `l` of row `r`, the bits of `want(l,
/// row r)` (the layout's portable lane statement).
#[cfg(target_arch = "x86_64")]
pub fn check_sixteen_lanes(
    kernel: SixteenKernel,
    packed: &[u8],
    nb: usize,
    a: &Activations<crate::act::Q8K>,
    r0: usize,
    want: impl Fn(usize, &[crate::act::Q8KBlock]) -> f32,
    what: &str,
) {
    if Isa::detect() != Isa::Avx512 {
        return;
    }
    let mut o = [[0f32; 16]; 3];
    // SAFETY: AVX-512 VNNI detected; `packed` holds a group of `nb` blocks and every
    // activation row `nb` blocks (the callers' sizes).
    unsafe {
        kernel(
            packed,
            nb,
            [a.row(r0), a.row(r0 + 1), a.row(r0 + 2)],
            &mut o,
        )
    };
    for (r, lanes) in o.iter().enumerate() {
        for (l, v) in lanes.iter().enumerate() {
            let w = want(l, a.row(r0 + r));
            assert_eq!(
                v.to_bits(),
                w.to_bits(),
                "{what} avx512 row {l} act {}",
                r0 + r
            );
        }
    }
}
