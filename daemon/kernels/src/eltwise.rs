//! llama.cpp's element-wise formulas, for GGUF models (the daemon's `Numerics::Ggml`):
//! the operations of ggml's CPU backend as llama.cpp runs them on an AVX-512 machine
//! (GCC, `-march=native`; sources in `ggml/src/ggml-cpu/` of the llama.cpp that the
//! llama-cpp-python 0.3.36 sdist vendors). A quantized model re-quantizes its
//! activations at every matrix, which turns a one-ulp difference into a different
//! quant, so matching llama.cpp's tokens needs these exact roundings, not just
//! equivalent formulas.

use std::sync::OnceLock;

/// The activation of a gated MLP (`act(gate) · up`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Activation {
    /// SiLU (`x · σ(x)`): Llama, Qwen, Phi-3.
    Silu,
    /// GELU with the tanh approximation (`gelu_pytorch_tanh`): Gemma 3.
    GeluTanh,
}

/// `ggml_compute_forward_rms_norm_f32` (`ops.cpp`) followed by the weight multiply:
/// `sum = Σ (f64)(x·x)` in order, `mean = (f32)(sum / n)`, `scale = 1 / sqrtf(mean + ε)`,
/// `y = (x · scale) · w` — where transformers computes `x / √(mean + ε) · w` in f32.
pub fn rms_norm_rows(x: &[f32], w: &[f32], eps: f32, out: &mut Vec<f32>) {
    let e = w.len();
    out.clear();
    for row in x.chunks_exact(e) {
        let sum: f64 = row.iter().map(|&v| f64::from(v * v)).sum();
        let mean = (sum / e as f64) as f32;
        let scale = 1.0 / (mean + eps).sqrt();
        out.extend(row.iter().zip(w).map(|(&v, &a)| v * scale * a));
    }
}

pub use crate::expf::v_expf;

/// One row of `ggml_vec_swiglu_f32` (`vec.cpp`): `silu(g) · u` with `silu(x) = x / (1 +
/// v_expf(−x))` on 16-lane chunks, and `x / (1 + expf(−x))` (libm) for the rest. The
/// chunks are a loop of their own so that it vectorizes (each lane's operations are
/// the same IEEE operations either way, so the bits do not depend on it).
#[inline(always)]
fn swiglu_row(g: &[f32], u: &[f32], out: &mut [f32]) {
    let vec = g.len().min(u.len()).min(out.len()) / 16 * 16;
    let (o16, o_tail) = out.split_at_mut(vec);
    let (g16, g_tail) = g.split_at(vec);
    let (u16, u_tail) = u.split_at(vec);
    for ((d, x), y) in o16
        .chunks_exact_mut(16)
        .zip(g16.chunks_exact(16))
        .zip(u16.chunks_exact(16))
    {
        for j in 0..16 {
            d[j] = x[j] / (1.0 + v_expf(0.0 - x[j])) * y[j];
        }
    }
    for ((d, &x), &y) in o_tail.iter_mut().zip(g_tail).zip(u_tail) {
        *d = x / (1.0 + (-x).exp()) * y;
    }
}

/// ggml's GELU table (`ggml_table_gelu_f16`, filled in `ggml_cpu_init`): for every f16
/// `h`, `f16(gelu(h))` with `gelu(x) = (0.5·x) · (1 + tanhf((√(2/π)·x) · fma(0.044715·x,
/// x, 1)))` (`ggml_gelu_f32` as GCC contracts it).
fn gelu_table() -> &'static [u16] {
    static TABLE: OnceLock<Vec<u16>> = OnceLock::new();
    TABLE.get_or_init(|| {
        const SQRT_2_OVER_PI: f32 = 0.797_884_6;
        const GELU_COEF_A: f32 = 0.044_715;
        (0..=u16::MAX)
            .map(|h| {
                let x = half::f16::from_bits(h).to_f32();
                let inner = (GELU_COEF_A * x).mul_add(x, 1.0);
                let y = 0.5 * x * (1.0 + (SQRT_2_OVER_PI * x * inner).tanh());
                half::f16::from_f32(y).to_bits()
            })
            .collect()
    })
}

/// One row of `ggml_vec_geglu_f32` (`vec.h`, `GGML_GELU_FP16` defined): `0` below −10,
/// `x · u` from 10, otherwise the table's GELU of `f16(x)`, widened, times `u`.
#[inline(always)]
fn geglu_row(g: &[f32], u: &[f32], out: &mut [f32]) {
    let table = gelu_table();
    for ((d, &x), &y) in out.iter_mut().zip(g).zip(u) {
        *d = if x <= -10.0 {
            0.0
        } else if x >= 10.0 {
            x * y
        } else {
            let h = half::f16::from_f32(x).to_bits();
            half::f16::from_bits(table[h as usize]).to_f32() * y
        };
    }
}

/// `act(gate) · up` for one row, as ggml's fused GLU ops compute it.
pub fn glu_row(act: Activation, g: &[f32], u: &[f32], out: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    {
        if std::is_x86_feature_detected!("avx512f") && std::is_x86_feature_detected!("fma") {
            // SAFETY: AVX-512 F, AVX2 (implied) and FMA were detected.
            return unsafe { glu_row_avx512(act, g, u, out) };
        }
        if std::is_x86_feature_detected!("avx2") && std::is_x86_feature_detected!("fma") {
            // SAFETY: AVX2 and FMA were detected.
            return unsafe { glu_row_fma(act, g, u, out) };
        }
    }
    glu_row_body(act, g, u, out);
}

/// [`glu_row`] compiled for AVX-512 (sixteen lanes of `v_expf` per instruction).
///
/// # Safety
/// The CPU must have AVX-512 F, AVX2 and FMA.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx2,fma")]
unsafe fn glu_row_avx512(act: Activation, g: &[f32], u: &[f32], out: &mut [f32]) {
    glu_row_body(act, g, u, out);
}

#[inline(always)]
fn glu_row_body(act: Activation, g: &[f32], u: &[f32], out: &mut [f32]) {
    match act {
        Activation::Silu => swiglu_row(g, u, out),
        Activation::GeluTanh => geglu_row(g, u, out),
    }
}

/// [`glu_row`] compiled with AVX2 and FMA: `v_expf`'s `mul_add`s become instructions
/// instead of libm `fmaf` calls (the same, exactly rounded, results).
///
/// # Safety
/// The CPU must have AVX2 and FMA.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn glu_row_fma(act: Activation, g: &[f32], u: &[f32], out: &mut [f32]) {
    glu_row_body(act, g, u, out);
}

/// `ggml_rope_cache_init` (`ops.cpp`) for positions `0..max_pos`: `θ_scale =
/// powf(base, −2 / dim)`, and per position `θ = p`, for each pair `cos θ / ff`, `sin θ
/// / ff` (`ff` the frequency factor, 1 without), then `θ *= θ_scale` — a running
/// product, where transformers computes `p · base^(−2i/dim)` directly. Returns
/// `(cos, sin)`, `max_pos × dim/2` each.
pub fn rope_tables(
    dim: usize,
    base: f32,
    factors: Option<&[f32]>,
    max_pos: usize,
) -> (Vec<f32>, Vec<f32>) {
    let half = dim / 2;
    let theta_scale = base.powf(-2.0 / dim as f32);
    let mut cos = Vec::with_capacity(max_pos * half);
    let mut sin = Vec::with_capacity(max_pos * half);
    for p in 0..max_pos {
        let mut theta = p as f32;
        for i in 0..half {
            let ff = factors.and_then(|f| f.get(i)).copied().unwrap_or(1.0);
            let t = theta / ff;
            cos.push(t.cos());
            sin.push(t.sin());
            theta *= theta_scale;
        }
    }
    (cos, sin)
}

/// ggml's rotation of one pair (`rotate_pairs` in `ops.cpp` as GCC contracts and
/// vectorizes it, `vfmaddsub`): `(fma(x0, cos, −x1·sin), fma(x0, sin, x1·cos))` — the
/// first element's products fused, the second's rounded (checked against llama.cpp's
/// `Qcur`/`Kcur` tensors with `model::trace_tests`).
#[inline(always)]
pub fn rotate(x0: f32, x1: f32, cos: f32, sin: f32) -> (f32, f32) {
    (x0.mul_add(cos, -(x1 * sin)), x0.mul_add(sin, x1 * cos))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn v_expf_is_close_to_expf_and_saturates() {
        for i in -2000..2000 {
            let x = i as f32 * 0.043;
            let (a, b) = (v_expf(x), x.exp());
            assert!((a - b).abs() <= 2.0 * b * f32::EPSILON, "{x}: {a} vs {b}");
        }
        assert_eq!(v_expf(-200.0), 0.0);
        assert_eq!(v_expf(200.0), f32::INFINITY);
        assert_eq!(v_expf(0.0), 1.0);
        // Subnormal results (below e^−87.3) stay within an ulp of the true value.
        for x in [-87.5f32, -90.0, -95.3, -100.0, -103.0] {
            let (r, e) = (v_expf(x), f64::from(x).exp());
            assert!(r < f32::MIN_POSITIVE, "{x}: {r}");
            assert!((f64::from(r) - e).abs() <= 1.5e-45, "{x}: {r} vs {e}");
        }
    }

    /// The vectorized SwiGLU row (whichever instruction set `glu_row` picks) gives the
    /// bits of the one-value-at-a-time formula: `v_expf` on the 16-lane chunks, libm's
    /// `expf` on the tail (37 values: two chunks and five left over).
    #[test]
    fn swiglu_row_equals_the_scalar_formula() {
        #[inline(never)]
        fn one(i: usize, vec: usize, x: f32, y: f32) -> f32 {
            let e = if i < vec { v_expf(0.0 - x) } else { (-x).exp() };
            x / (1.0 + e) * y
        }
        let g: Vec<f32> = (0..37)
            .map(|i| ((i * 7919) % 241) as f32 * 1.01 - 120.0)
            .chain([-0.0, 88.7, -88.7, 1e-30, -103.5])
            .collect();
        let u: Vec<f32> = (0..g.len()).map(|i| 0.5 + i as f32 * 0.37).collect();
        let mut out = vec![0f32; g.len()];
        glu_row(Activation::Silu, &g, &u, &mut out);
        let vec = g.len() / 16 * 16;
        for (i, ((&x, &y), &o)) in g.iter().zip(&u).zip(&out).enumerate() {
            assert_eq!(o.to_bits(), one(i, vec, x, y).to_bits(), "value {i}: x {x}");
        }
    }

    #[test]
    fn rms_norm_accumulates_in_f64_and_multiplies_by_the_reciprocal() {
        let x = [1.0f32, 2.0, 3.0, 4.0];
        let mut out = Vec::new();
        rms_norm_rows(&x, &[1.0; 4], 0.0, &mut out);
        let scale = 1.0f32 / 7.5f32.sqrt();
        assert_eq!(out, x.iter().map(|v| v * scale).collect::<Vec<_>>());
    }

    #[test]
    fn gelu_table_rounds_through_f16() {
        let mut out = [0f32; 3];
        geglu_row(&[1.0, -11.0, 12.0], &[2.0, 2.0, 2.0], &mut out);
        // gelu(1) = 0.841192 → f16 0.84130859375.
        assert_eq!(out, [0.841_308_6 * 2.0, 0.0, 24.0]);
    }

    #[test]
    fn rope_angles_are_a_running_product() {
        let (cos, sin) = rope_tables(4, 10_000.0, None, 3);
        let s = 10_000f32.powf(-0.5);
        assert_eq!(cos[2 * 2 + 1], (2.0 * s).cos());
        assert_eq!(sin[2], 1f32.sin());
        assert_eq!(cos[0], 1.0);
    }
}
