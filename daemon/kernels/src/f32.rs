//! F32 weights × f32 activations (one little-endian f32 per value; "blocks" of one value,
//! dequantized unchanged).
//!
//! ggml's order (`ggml_vec_dot_f32`, `ggml-cpu/vec.cpp`, the `GGML_SIMD` branch with
//! `__AVX512F__`'s mappings of `ggml-cpu/simd-mappings.h`), as GCC 12 `-O3 -march=native`
//! compiles it (checked against the disassembly of llama.cpp's `libggml-cpu.so`):
//! - `np = n & !63`; four sixteen-lane accumulators, `sum[j] = fma(x, y, sum[j])` over
//!   values `i + 16 j .. i + 16 j + 16` of each step `i` of 64;
//! - `GGML_F32x16_REDUCE`: `s0 += s2; s1 += s3; s0 += s1`, then GCC's
//!   `_mm512_reduce_add_ps` ([`crate::lanes::f32x16_reduce`]);
//! - the leftovers `sumf += x[i] * y[i]` (f32) in order, which GCC vectorizes as an
//!   in-order reduction: all but the last `(n − np) % 8` products are rounded
//!   (`vmulps`) and then added one by one (`vaddss`); only those last ones, left to the
//!   scalar epilogue, are contracted into `fma(x, y, sumf)`.

use crate::lanes::{f32x16_dot_main, sgemm_dot};
use crate::{act, Activations, GgmlType, Isa, Path, Quant};

/// The F32 weight type.
pub struct F32Weights;

#[inline(always)]
fn value(w: &[u8], i: usize) -> f32 {
    f32::from_le_bytes([w[4 * i], w[4 * i + 1], w[4 * i + 2], w[4 * i + 3]])
}

/// ggml's leftovers from `np` on, after the main loop's sum `s` (see the module docs).
#[inline(always)]
fn tail(mut s: f32, w: &[u8], a: &[f32], np: usize) -> f32 {
    let n = a.len();
    let split = n - (n - np) % 8;
    for (i, &y) in a.iter().enumerate().take(split).skip(np) {
        s += value(w, i) * y;
    }
    for (i, &y) in a.iter().enumerate().skip(split) {
        s = value(w, i).mul_add(y, s);
    }
    s
}

impl Quant for F32Weights {
    const TYPE: GgmlType = GgmlType::F32;
    const BLOCK_VALUES: usize = 1;
    const BLOCK_BYTES: usize = 4;
    type Act = act::F32;

    fn dequantize_block(b: &[u8], out: &mut [f32]) {
        out[0] = value(b, 0);
    }

    fn vec_dot(isa: Isa, w: &[u8], a: &[f32]) -> f32 {
        let np = a.len() & !63;
        assert!(
            w.len() >= 4 * a.len(),
            "weight row shorter than the activations"
        );
        #[cfg(target_arch = "x86_64")]
        {
            if isa == Isa::Avx512 {
                // SAFETY: `Isa::Avx512` means AVX-512 F (with AVX2 and FMA) was detected;
                // the loads stay within the first `np` values of both rows.
                return tail(unsafe { x86::main_avx512(w, a, np) }, w, a, np);
            }
            if isa.has_avx2() {
                // SAFETY: `has_avx2` means AVX2 and FMA were detected; as above.
                return tail(unsafe { x86::main_avx2(w, a, np) }, w, a, np);
            }
        }
        let _ = isa;
        tail(f32x16_dot_main(np, |i| value(w, i), |i| a[i]), w, a, np)
    }

    /// [`Path::Sgemm`]: llamafile's tinyBLAS order ([`sgemm_dot`]), one portable loop
    /// (sixteen independent lanes the compiler vectorizes).
    fn path_rows(
        isa: Isa,
        path: Path,
        w: &[u8],
        a: &Activations<act::F32>,
        rows: std::ops::Range<usize>,
        out: &mut [f32],
    ) {
        if path != Path::Sgemm {
            return Self::vec_dot_rows(isa, w, a, rows, out);
        }
        for (o, j) in out.iter_mut().zip(rows) {
            let y = a.row(j);
            *o = sgemm_dot(y.len(), |i| value(w, i), |i| y[i]);
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use crate::lanes::x86::{f32x16_reduce, f32x16_reduce_512};
    use crate::lanes::{F32X16_ARR, F32X16_STEP};
    use std::arch::x86_64::*;

    /// The main loop with each sixteen-lane accumulator as two `__m256`.
    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn main_avx2(w: &[u8], a: &[f32], np: usize) -> f32 {
        let (x, y) = (w.as_ptr() as *const f32, a.as_ptr());
        let mut sum = [[_mm256_setzero_ps(); 2]; F32X16_ARR];
        for i in (0..np).step_by(F32X16_STEP) {
            for (j, s) in sum.iter_mut().enumerate() {
                for (h, acc) in s.iter_mut().enumerate() {
                    let e = i + 16 * j + 8 * h;
                    let (vx, vy) = (_mm256_loadu_ps(x.add(e)), _mm256_loadu_ps(y.add(e)));
                    *acc = _mm256_fmadd_ps(vx, vy, *acc);
                }
            }
        }
        f32x16_reduce(&sum)
    }

    /// ggml's own main loop (`__m512`).
    #[target_feature(enable = "avx512f,avx2,fma")]
    pub(super) unsafe fn main_avx512(w: &[u8], a: &[f32], np: usize) -> f32 {
        let (x, y) = (w.as_ptr() as *const f32, a.as_ptr());
        let mut sum = [_mm512_setzero_ps(); F32X16_ARR];
        for i in (0..np).step_by(F32X16_STEP) {
            for (j, acc) in sum.iter_mut().enumerate() {
                let e = i + 16 * j;
                let (vx, vy) = (_mm512_loadu_ps(x.add(e)), _mm512_loadu_ps(y.add(e)));
                *acc = _mm512_fmadd_ps(vx, vy, *acc);
            }
        }
        f32x16_reduce_512(&sum)
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn kernels_agree_and_match_dequantized_dot() {
        crate::testing::check_type::<super::F32Weights>(candle_core::quantized::GgmlDType::F32);
    }

    #[test]
    fn equals_llama_cpp() {
        use crate::testing::{golden_w, quantize};
        crate::testing::check_golden::<super::F32Weights>(
            |n| quantize(&golden_w(n), 1, n, candle_core::quantized::GgmlDType::F32).0,
            &[
                (7, 0x3f1b0c39),
                (13, 0x3de41c32),
                (64, 0x403b744f),
                (71, 0x3fe08aec),
                (85, 0x3fba5ddd),
                (100, 0x3fbcd9de),
                (200, 0x40025ce6),
                (333, 0xbe1f24f4),
            ],
        );
    }
}
