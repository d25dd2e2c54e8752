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

    /// [`Path::Sgemm`]: llamafile's tinyBLAS order ([`sgemm_dot`]; AVX2 holds the sixteen
    /// lanes in two registers, four activation rows per weight row; the same bits as the
    /// portable loop, which without FMA compiled in calls libm's `fmaf` per product).
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
        let k = a.k();
        assert!(w.len() >= 4 * k && k.is_multiple_of(16));
        let (mut o, mut j) = (0, rows.start);
        #[cfg(target_arch = "x86_64")]
        if isa.has_avx2() {
            while j + 4 <= rows.end {
                let ys = [a.row(j), a.row(j + 1), a.row(j + 2), a.row(j + 3)];
                // SAFETY: `has_avx2` means AVX2 and FMA were detected; the loads stay
                // within the rows (`k` values each, checked above).
                out[o..o + 4].copy_from_slice(&unsafe { x86::sgemm_avx2(w, ys) });
                (o, j) = (o + 4, j + 4);
            }
        }
        for (o, j) in out[o..].iter_mut().zip(j..rows.end) {
            let y = a.row(j);
            #[cfg(target_arch = "x86_64")]
            if isa.has_avx2() {
                // SAFETY: as above.
                *o = unsafe { x86::sgemm_avx2(w, [y]) }[0];
                continue;
            }
            *o = sgemm_dot(y.len(), |i| value(w, i), |i| y[i]);
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use crate::lanes::x86::{f32x16_reduce, f32x16_reduce_512, reduce_add_16};
    use crate::lanes::{F32X16_ARR, F32X16_STEP};
    use std::arch::x86_64::*;

    /// tinyBLAS's sixteen lanes as two `__m256`, then `_mm512_reduce_add_ps`'s order, for
    /// `R` activation rows of the same length (a multiple of 16) against one weight row.
    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn sgemm_avx2<const R: usize>(w: &[u8], a: [&[f32]; R]) -> [f32; R] {
        let x = w.as_ptr() as *const f32;
        let n = a.first().map_or(0, |y| y.len());
        let ys = a.map(|y| y.as_ptr());
        let mut lo = [_mm256_setzero_ps(); R];
        let mut hi = [_mm256_setzero_ps(); R];
        for l in (0..n).step_by(16) {
            let (wl, wh) = (_mm256_loadu_ps(x.add(l)), _mm256_loadu_ps(x.add(l + 8)));
            for r in 0..R {
                lo[r] = _mm256_fmadd_ps(wl, _mm256_loadu_ps(ys[r].add(l)), lo[r]);
                hi[r] = _mm256_fmadd_ps(wh, _mm256_loadu_ps(ys[r].add(l + 8)), hi[r]);
            }
        }
        std::array::from_fn(|r| reduce_add_16(lo[r], hi[r]))
    }

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
    use crate::{Activations, Isa, Path, Quant};

    /// The AVX2 tinyBLAS path gives the portable loop's bits, for 1 to 9 activation
    /// rows (the four-row groups and the rows left over).
    #[test]
    fn sgemm_path_is_the_same_on_every_isa() {
        use crate::testing::{quantize, random};
        let (n, k) = (3, 96);
        let (w, _) = quantize(
            &random(n * k, 1),
            n,
            k,
            candle_core::quantized::GgmlDType::F32,
        );
        for r in 1..=9 {
            let a = Activations::<crate::act::F32>::quantize(&random(r * k, 2), r, k).expect("a");
            for wr in w.chunks_exact(4 * k) {
                let mut want = vec![0f32; r];
                super::F32Weights::path_rows(Isa::Portable, Path::Sgemm, wr, &a, 0..r, &mut want);
                for isa in Isa::available() {
                    let mut got = vec![0f32; r];
                    super::F32Weights::path_rows(isa, Path::Sgemm, wr, &a, 0..r, &mut got);
                    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                    assert_eq!(bits(&got), bits(&want), "{} rows, {}", r, isa.name());
                }
                let v = super::F32Weights::vec_dot(Isa::Portable, wr, a.row(0));
                assert!(
                    (v - want[0]).abs() <= 1e-4 * v.abs().max(1.0),
                    "{v} vs {}",
                    want[0]
                );
            }
        }
    }

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
