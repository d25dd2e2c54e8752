//! F16 weights × f16 activations (one little-endian IEEE f16 per value; "blocks" of one
//! value, dequantized by exact widening, `ggml_fp16_to_fp32_row`).
//!
//! ggml's order (`ggml_vec_dot_f16`, `ggml-cpu/vec.cpp`, the `GGML_SIMD` branch with
//! `__AVX512F__` and without `__AVX512FP16__`: `GGML_F16_DOT_*` = `GGML_F32Cx16_*` of
//! `ggml-cpu/simd-mappings.h`), as GCC 12 compiles it (checked against the disassembly of
//! llama.cpp's `libggml-cpu.so`):
//! - `np = n & !63`; four sixteen-lane f32 accumulators, `sum[j] = fma(x, y, sum[j])`
//!   over the widened values `i + 16 j .. i + 16 j + 16` of each step `i` of 64
//!   (`_mm512_cvtph_ps`, `_mm512_fmadd_ps`);
//! - `GGML_F32Cx16_REDUCE`: `s0 += s2; s1 += s3; s0 += s1`, then GCC's
//!   `_mm512_reduce_add_ps` ([`crate::lanes::f32x16_reduce`]), widened to the f64 `sumf`;
//! - the leftovers in order, `sumf += f64(x[i] · y[i])` (the f32 product — exact for f16
//!   values — widened, then an f64 sum); the result is `sumf` rounded to f32.

use crate::half::{f16_to_f32, le_f16};
use crate::lanes::{f32x16_dot_main, sgemm_dot};
use crate::{act, layout, Activations, GgmlType, Isa, Path, Quant, RowsOut};

#[cfg(target_arch = "x86_64")]
mod short_rows;

/// The F16 weight type.
pub struct F16Weights;

/// ggml's leftovers from `np` on, after the main loop's sum `s` (see the module docs).
#[inline(always)]
fn tail(s: f32, w: &[u8], a: &[u16], np: usize) -> f32 {
    let mut sumf = f64::from(s);
    for (i, &y) in a.iter().enumerate().skip(np) {
        sumf += f64::from(le_f16(w, 2 * i) * f16_to_f32(y));
    }
    sumf as f32
}

impl Quant for F16Weights {
    const TYPE: GgmlType = GgmlType::F16;
    const BLOCK_VALUES: usize = 1;
    const BLOCK_BYTES: usize = 2;
    type Act = act::F16;

    fn dequantize_block(b: &[u8], out: &mut [f32]) {
        out[0] = le_f16(b, 0);
    }

    fn vec_dot(isa: Isa, w: &[u8], a: &[u16]) -> f32 {
        let np = a.len() & !63;
        assert!(
            w.len() >= 2 * a.len(),
            "weight row shorter than the activations"
        );
        #[cfg(target_arch = "x86_64")]
        {
            if isa == Isa::Avx512 {
                // SAFETY: `Isa::Avx512` means AVX-512 F (with AVX2, FMA and F16C) was
                // detected; the loads stay within the first `np` values of both rows, the
                // leftovers' within both rows (checked above).
                return unsafe { x86::tail_f16c(x86::main_avx512(w, a, np), w, a, np) };
            }
            if isa.has_avx2() {
                // SAFETY: `has_avx2` means AVX2, FMA and F16C were detected; as above.
                return unsafe { x86::tail_f16c(x86::main_avx2(w, a, np), w, a, np) };
            }
        }
        let _ = isa;
        let main = f32x16_dot_main(np, |i| le_f16(w, 2 * i), |i| f16_to_f32(a[i]));
        tail(main, w, a, np)
    }

    /// Rows shorter than 64 values (all leftovers: a LoRA adapter's `B`) eight features
    /// at a time on AVX-512 ([`short_rows`]); other rows and instruction sets keep
    /// `vec_dot` one output at a time.
    fn vec_dot_block_rows(
        isa: Isa,
        w: &[u8],
        row_bytes: usize,
        group: layout::Interleave,
        features: std::ops::Range<usize>,
        a: &Activations<act::F16>,
        rows: std::ops::Range<usize>,
        out: &mut RowsOut<'_>,
    ) -> bool {
        #[cfg(target_arch = "x86_64")]
        if isa == Isa::Avx512 && group <= 1 && row_bytes / 2 < short_rows::MAX_K && row_bytes >= 2 {
            // SAFETY: `Isa::Avx512` means AVX-512 F, AVX2, FMA and F16C were detected;
            // the kernel checks the rows and lengths.
            unsafe { short_rows::rows_avx512(w, row_bytes, features, a, rows, out) };
            return true;
        }
        let _ = (isa, w, row_bytes, group, features, a, rows, out);
        false
    }

    /// [`Path::Sgemm`]: llamafile's tinyBLAS order ([`sgemm_dot`]; AVX2 holds the sixteen
    /// lanes in two registers).
    fn path_rows(
        isa: Isa,
        path: Path,
        w: &[u8],
        a: &Activations<act::F16>,
        rows: std::ops::Range<usize>,
        out: &mut [f32],
    ) {
        if path != Path::Sgemm {
            return Self::vec_dot_rows(isa, w, a, rows, out);
        }
        let k = a.k();
        assert!(w.len() >= 2 * k && k.is_multiple_of(16));
        let (mut o, mut j) = (0, rows.start);
        #[cfg(target_arch = "x86_64")]
        if isa.has_avx2() {
            // Four activation rows at a time against one weight row (independent
            // accumulators, each output in tinyBLAS's order).
            while j + 4 <= rows.end {
                let ys = [a.row(j), a.row(j + 1), a.row(j + 2), a.row(j + 3)];
                // SAFETY: `has_avx2` means AVX2, FMA and F16C were detected; the loads
                // stay within the rows (`k` values each, checked above).
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
            *o = sgemm_dot(y.len(), |i| le_f16(w, 2 * i), |i| f16_to_f32(y[i]));
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use crate::lanes::x86::{f32x16_reduce, f32x16_reduce_512, reduce_add_16};
    use crate::lanes::{F32X16_ARR, F32X16_STEP};
    use std::arch::x86_64::*;

    /// Eight f16 values at `p`, widened.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn load8(p: *const u16) -> __m256 {
        _mm256_cvtph_ps(_mm_loadu_si128(p as *const __m128i))
    }

    /// Sixteen f16 values at `p`, widened.
    #[inline]
    #[target_feature(enable = "avx512f,avx2,fma,f16c")]
    unsafe fn load16(p: *const u16) -> __m512 {
        _mm512_cvtph_ps(_mm256_loadu_si256(p as *const __m256i))
    }

    /// The main loop with each sixteen-lane accumulator as two `__m256`.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn main_avx2(w: &[u8], a: &[u16], np: usize) -> f32 {
        let (x, y) = (w.as_ptr() as *const u16, a.as_ptr());
        let mut sum = [[_mm256_setzero_ps(); 2]; F32X16_ARR];
        for i in (0..np).step_by(F32X16_STEP) {
            for (j, s) in sum.iter_mut().enumerate() {
                for (h, acc) in s.iter_mut().enumerate() {
                    let e = i + 16 * j + 8 * h;
                    *acc = _mm256_fmadd_ps(load8(x.add(e)), load8(y.add(e)), *acc);
                }
            }
        }
        f32x16_reduce(&sum)
    }

    /// tinyBLAS's sixteen lanes as two `__m256`, then `_mm512_reduce_add_ps`'s order, for
    /// `R` activation rows of the same length against one weight row.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn sgemm_avx2<const R: usize>(w: &[u8], a: [&[u16]; R]) -> [f32; R] {
        let x = w.as_ptr() as *const u16;
        let n = a.first().map_or(0, |y| y.len());
        let ys = a.map(|y| y.as_ptr());
        let mut lo = [_mm256_setzero_ps(); R];
        let mut hi = [_mm256_setzero_ps(); R];
        for l in (0..n).step_by(16) {
            let (wl, wh) = (load8(x.add(l)), load8(x.add(l + 8)));
            for r in 0..R {
                lo[r] = _mm256_fmadd_ps(wl, load8(ys[r].add(l)), lo[r]);
                hi[r] = _mm256_fmadd_ps(wh, load8(ys[r].add(l + 8)), hi[r]);
            }
        }
        std::array::from_fn(|r| reduce_add_16(lo[r], hi[r]))
    }

    /// [`super::tail`] with the values widened and multiplied eight at a time: each f32
    /// product (exact for f16 values) is still widened and added to the f64 sum in index
    /// order, so the result is the same bits. The leftovers are all of a row shorter than
    /// 64 values (a LoRA adapter's `B`, whose rows are `r` long).
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn tail_f16c(s: f32, w: &[u8], a: &[u16], np: usize) -> f32 {
        let (x, y) = (w.as_ptr() as *const u16, a.as_ptr());
        let n = a.len();
        let mut sumf = f64::from(s);
        let mut i = np;
        let mut p = [0f32; 8];
        while i + 8 <= n {
            _mm256_storeu_ps(
                p.as_mut_ptr(),
                _mm256_mul_ps(load8(x.add(i)), load8(y.add(i))),
            );
            for v in p {
                sumf += f64::from(v);
            }
            i += 8;
        }
        for (j, &v) in a.iter().enumerate().skip(i) {
            sumf += f64::from(super::le_f16(w, 2 * j) * super::f16_to_f32(v));
        }
        sumf as f32
    }

    /// ggml's own main loop (`__m512`).
    #[target_feature(enable = "avx512f,avx2,fma,f16c")]
    pub(super) unsafe fn main_avx512(w: &[u8], a: &[u16], np: usize) -> f32 {
        let (x, y) = (w.as_ptr() as *const u16, a.as_ptr());
        let mut sum = [_mm512_setzero_ps(); F32X16_ARR];
        for i in (0..np).step_by(F32X16_STEP) {
            for (j, acc) in sum.iter_mut().enumerate() {
                let e = i + 16 * j;
                *acc = _mm512_fmadd_ps(load16(x.add(e)), load16(y.add(e)), *acc);
            }
        }
        f32x16_reduce_512(&sum)
    }
}

#[cfg(test)]
mod tests {
    use crate::{Activations, Isa, Path, Quant};

    #[test]
    fn sgemm_path_is_the_same_on_every_isa() {
        use crate::testing::{quantize, random};
        let (n, k, r) = (3, 96, 5);
        let (w, _) = quantize(
            &random(n * k, 1),
            n,
            k,
            candle_core::quantized::GgmlDType::F16,
        );
        let a = Activations::<crate::act::F16>::quantize(&random(r * k, 2), r, k).expect("a");
        for wr in w.chunks_exact(2 * k) {
            let mut want = vec![0f32; r];
            super::F16Weights::path_rows(Isa::Portable, Path::Sgemm, wr, &a, 0..r, &mut want);
            for isa in Isa::available() {
                let mut got = vec![0f32; r];
                super::F16Weights::path_rows(isa, Path::Sgemm, wr, &a, 0..r, &mut got);
                assert_eq!(got, want, "{}", isa.name());
            }
            // tinyBLAS sums in another order than vec_dot, within f32 rounding of it.
            let v = super::F16Weights::vec_dot(Isa::Portable, wr, a.row(0));
            assert!(
                (v - want[0]).abs() <= 1e-4 * v.abs().max(1.0),
                "{v} vs {}",
                want[0]
            );
        }
    }

    /// Rows shorter than the main loop's step, and leftovers of every length, give the
    /// portable `tail`'s bits on every ISA (the widened products eight at a time).
    #[test]
    fn leftovers_are_the_same_on_every_isa() {
        use crate::testing::{quantize, random};
        for k in [1, 7, 8, 9, 16, 24, 63, 64, 65, 72, 100] {
            let (w, _) = quantize(
                &random(k, k as u64),
                1,
                k,
                candle_core::quantized::GgmlDType::F16,
            );
            let a = Activations::<crate::act::F16>::quantize(&random(k, 99), 1, k).expect("a");
            let want = super::F16Weights::vec_dot(Isa::Portable, &w, a.row(0));
            for isa in Isa::available() {
                let got = super::F16Weights::vec_dot(isa, &w, a.row(0));
                assert_eq!(got.to_bits(), want.to_bits(), "k {k}, {}", isa.name());
            }
        }
    }

    /// Rows shorter than 64 values written row-major (eight features a tile) give
    /// `vec_dot`'s bits for every length, tile edge and activation row count; rows of 64
    /// and more, and tinyBLAS rows, are declined.
    #[test]
    fn short_rows_equal_vec_dot() {
        use crate::{BatchRow, GgmlType, QuantMatrix, RowsOut};
        use candle_core::quantized::GgmlDType;
        // The extremes of f16 (largest, subnormal, infinite) in weights and activations:
        // their products are still exact in f32, so the f64 `fma` gives ggml's sum.
        let extremes = [65504.0, -65504.0, 6e-8, -3e-5, f32::INFINITY, 1e-4];
        for k in [1, 7, 8, 9, 16, 24, 32, 63, 64] {
            let n = 21;
            let mut w = crate::testing::random(n * k, k as u64);
            for (i, &e) in extremes.iter().enumerate() {
                w[(7 * i + 3) % (n * k)] = e;
            }
            let (bytes, _) = crate::testing::quantize(&w, n, k, GgmlDType::F16);
            for isa in Isa::available() {
                let m =
                    QuantMatrix::for_isa(isa, GgmlType::F16, bytes.clone(), n, k).expect("matrix");
                for rows in [1, 3, 4, 5, 9, 17] {
                    let mut xs = crate::testing::random(rows * k, 3 + rows as u64);
                    for (i, &e) in extremes.iter().enumerate() {
                        xs[(5 * i + 1) % (rows * k)] = e;
                    }
                    let a = m.quantize_for(&xs, rows, &[]).expect("act");
                    let Some(act) = <crate::act::F16 as crate::matrix::Wrap>::unwrap(&a) else {
                        panic!("F16 activations");
                    };
                    for f in [0..n, 3..20, 8..16, 20..21] {
                        let mut v = vec![f32::NAN; rows * f.len()];
                        let done = m
                            .matmul_range_rows(
                                isa,
                                &a,
                                f.clone(),
                                &[],
                                &mut RowsOut::new(&mut v, rows, f.clone()),
                            )
                            .expect("row-major");
                        assert_eq!(done, isa == Isa::Avx512 && k < 64, "k {k}, {isa:?}");
                        if !done {
                            continue;
                        }
                        for (c, r) in f.clone().enumerate() {
                            let wr = &bytes[r * 2 * k..(r + 1) * 2 * k];
                            for j in 0..rows {
                                let want =
                                    super::F16Weights::vec_dot(Isa::Portable, wr, act.row(j));
                                assert_eq!(
                                    v[j * f.len() + c].to_bits(),
                                    want.to_bits(),
                                    "k {k}, {rows} rows, features {f:?}: ({j}, {r})"
                                );
                            }
                        }
                    }
                }
                // A micro-batch on tinyBLAS (k a multiple of 16) keeps its own kernel.
                let batch: Vec<_> = (0..4).map(|i| BatchRow { index: i, len: 4 }).collect();
                let paths = m.paths(&batch);
                let a = m
                    .quantize_for(&crate::testing::random(4 * k, 1), 4, &paths)
                    .expect("act");
                let mut v = vec![0f32; 4 * n];
                let done = m
                    .matmul_range_rows(isa, &a, 0..n, &paths, &mut RowsOut::new(&mut v, 4, 0..n))
                    .expect("rows");
                let sgemm = k % 16 == 0;
                assert_eq!(paths.contains(&Path::Sgemm), sgemm, "k {k}");
                assert_eq!(
                    done,
                    isa == Isa::Avx512 && k < 64 && !sgemm,
                    "k {k}, {isa:?}"
                );
            }
        }
    }

    #[test]
    fn kernels_agree_and_match_dequantized_dot() {
        crate::testing::check_type::<super::F16Weights>(candle_core::quantized::GgmlDType::F16);
    }

    #[test]
    fn equals_llama_cpp() {
        use crate::testing::{golden_w, quantize};
        crate::testing::check_golden::<super::F16Weights>(
            |n| quantize(&golden_w(n), 1, n, candle_core::quantized::GgmlDType::F16).0,
            &[
                (7, 0x3f1b1a46),
                (13, 0x3de44ee2),
                (64, 0x403b742e),
                (71, 0x3fe084b0),
                (85, 0x3fba4b0a),
                (100, 0x3fbcbbdf),
                (200, 0x40022f91),
                (333, 0xbe22b1f6),
            ],
        );
    }
}
