//! Q2_K weights × Q8_K activations.
//!
//! `block_q2_K` (84 bytes, 256 values): `scales[16]` (byte `g`: low nibble the scale,
//! high nibble the min of the 16 values `16 g .. 16 g + 16`), `qs[64]` (2-bit quants),
//! f16 `d`, f16 `dmin`. Value `i = 128 n + 32 j + b` (`n < 2`, `j < 4`, `b < 32`) is
//! `q = (qs[32 n + b] >> 2 j) & 3` with group `g = 8 n + 2 j + b / 16`, and stands for
//! `(d · (scales[g] & 15)) · q − dmin · (scales[g] >> 4)` (ggml's `dequantize_row_q2_K`,
//! `ggml/src/ggml-quants.c`: two f32 products and a subtraction, not fused — ggml-base is
//! built without FMA).
//!
//! ggml's order (`ggml_vec_dot_q2_K_q8_K`, `ggml-cpu/arch/x86/quants.c`, `__AVX2__`
//! branch; the function has no AVX-512 branch): per block, `d = d_a · f16→f32(d)` and
//! `dmin = −d_a · f16→f32(dmin)`; first `acc = fma(dmin, prod, acc)` with the eight i32
//! lanes `prod = _mm256_madd_epi16(mins, bsums)`, then `acc = fma(d, sumi, acc)` with
//! the scaled integer lanes of [`lanes::k_lanes`](crate::lanes::k_lanes); the result is
//! `hsum_float_8(acc)`. Micro-batches of 8+ rows take the tiled kernel's order
//! ([`crate::kbatch`]). Not followed: llama.cpp repacks Q2_K matrices whose row count is
//! a multiple of 8 on AVX-512 CPUs (`ggml_gemv_q2_K_8x8_q8_K` / `ggml_gemm_…`,
//! `ggml-cpu/repack.cpp`), and those rows keep our `vec_dot` order here.

use crate::act::{self, Q8KBlock};
use crate::half::le_f16;
use crate::kbatch::{KBlock, KQuant};
use crate::lanes::{fma_splat, hsum_float_8, k_lanes, madd_pairs, to_f32, Lanes};
use crate::{GgmlType, Isa, Quant};

/// The Q2_K weight type.
pub struct Q2K;

const BYTES: usize = 84;
const QS: usize = 16;
const D: usize = 80;
const DMIN: usize = 82;

/// The 256 quants `0..4` of a block, in value order.
#[inline(always)]
fn unpack(b: &[u8]) -> [i8; 256] {
    let mut q = [0i8; 256];
    for (v, qv) in q.chunks_exact_mut(32).enumerate() {
        let (src, shift) = (&b[QS + 32 * (v / 4)..QS + 32 * (v / 4) + 32], 2 * (v % 4));
        for (o, &x) in qv.iter_mut().zip(src) {
            *o = ((x >> shift) & 3) as i8;
        }
    }
    q
}

impl Quant for Q2K {
    const TYPE: GgmlType = GgmlType::Q2K;
    const BLOCK_VALUES: usize = 256;
    const BLOCK_BYTES: usize = BYTES;
    type Act = act::Q8K;

    crate::kbatch::tiled_path_rows!();

    fn dequantize_block(b: &[u8], out: &mut [f32]) {
        let (d, min) = (le_f16(b, D), le_f16(b, DMIN));
        for ((g, o), q) in out
            .chunks_exact_mut(16)
            .enumerate()
            .zip(unpack(b).chunks_exact(16))
        {
            let dl = d * f32::from(b[g] & 15);
            let ml = min * f32::from(b[g] >> 4);
            for (o, &q) in o.iter_mut().zip(q) {
                *o = dl * f32::from(q) - ml;
            }
        }
    }

    fn vec_dot(isa: Isa, w: &[u8], a: &[Q8KBlock]) -> f32 {
        #[cfg(target_arch = "x86_64")]
        if isa.has_avx2() {
            // SAFETY: `has_avx2` means AVX2 and FMA were detected.
            return unsafe { avx2::vec_dot(w, a) };
        }
        let _ = isa;
        let mut acc: Lanes = [0.0; 8];
        for (wb, ab) in w.chunks_exact(BYTES).zip(a) {
            let d = ab.d * le_f16(wb, D);
            let dmin = -ab.d * le_f16(wb, DMIN);
            let (mut mins, mut sc) = ([0i16; 16], [0i32; 16]);
            for g in 0..16 {
                sc[g] = i32::from(wb[g] & 15);
                mins[g] = i16::from(wb[g] >> 4);
            }
            fma_splat(&mut acc, dmin, &to_f32(&madd_pairs(&mins, &ab.bsums)));
            fma_splat(&mut acc, d, &to_f32(&k_lanes(&unpack(wb), &ab.qs, &sc)));
        }
        hsum_float_8(&acc)
    }
}

impl KQuant for Q2K {
    const BIAS: i32 = 0;
    const HAS_MIN: bool = true;
    fn k_block(b: &[u8]) -> KBlock {
        KBlock {
            u: unpack(b).map(|q| q as u8),
            sc: std::array::from_fn(|g| i16::from(b[g] & 15)),
            mn: std::array::from_fn(|g| i16::from(b[g] >> 4)),
            d: le_f16(b, D),
            dmin: le_f16(b, DMIN),
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod avx2 {
    use super::{BYTES, D, DMIN, QS};
    use crate::act::Q8KBlock;
    use crate::half::le_f16;
    use crate::lanes::x86::{hsum_float_8, scale_shuffle_q3k};
    use std::arch::x86_64::*;

    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn vec_dot(w: &[u8], a: &[Q8KBlock]) -> f32 {
        let m3 = _mm256_set1_epi8(3);
        let m4 = _mm_set1_epi8(0xf);
        let mut acc = _mm256_setzero_ps();
        for (wb, ab) in w.chunks_exact(BYTES).zip(a) {
            let d = ab.d * le_f16(wb, D);
            let dmin = -ab.d * le_f16(wb, DMIN);

            let mins_and_scales = _mm_loadu_si128(wb.as_ptr() as *const __m128i);
            let scales8 = _mm_and_si128(mins_and_scales, m4);
            let mins8 = _mm_and_si128(_mm_srli_epi16::<4>(mins_and_scales), m4);
            let mins = _mm256_cvtepi8_epi16(mins8);
            let bsums = _mm256_loadu_si256(ab.bsums.as_ptr() as *const __m256i);
            let prod = _mm256_madd_epi16(mins, bsums);
            acc = _mm256_fmadd_ps(_mm256_set1_ps(dmin), _mm256_cvtepi32_ps(prod), acc);

            let all_scales = _mm256_cvtepi8_epi16(scales8);
            let l_scales = _mm256_extracti128_si256::<0>(all_scales);
            let h_scales = _mm256_extracti128_si256::<1>(all_scales);
            let scales = [
                _mm256_set_m128i(l_scales, l_scales),
                _mm256_set_m128i(h_scales, h_scales),
            ];

            let mut sumi = _mm256_setzero_si256();
            for (j, &sc) in scales.iter().enumerate() {
                let q2bits = _mm256_loadu_si256(wb.as_ptr().add(QS + 32 * j) as *const __m256i);
                let q8 = ab.qs.as_ptr().add(128 * j);
                let q2 = [
                    _mm256_and_si256(q2bits, m3),
                    _mm256_and_si256(_mm256_srli_epi16::<2>(q2bits), m3),
                    _mm256_and_si256(_mm256_srli_epi16::<4>(q2bits), m3),
                    _mm256_and_si256(_mm256_srli_epi16::<6>(q2bits), m3),
                ];
                let mut p = [_mm256_setzero_si256(); 4];
                for (k, pk) in p.iter_mut().enumerate() {
                    let q8k = _mm256_loadu_si256(q8.add(32 * k) as *const __m256i);
                    let p16 = _mm256_maddubs_epi16(q2[k], q8k);
                    *pk = _mm256_madd_epi16(_mm256_shuffle_epi8(sc, scale_shuffle_q3k(k)), p16);
                }
                let p01 = _mm256_add_epi32(p[0], p[1]);
                let p23 = _mm256_add_epi32(p[2], p[3]);
                sumi = _mm256_add_epi32(sumi, _mm256_add_epi32(p01, p23));
            }
            acc = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(sumi), acc);
        }
        hsum_float_8(acc)
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn kernels_agree_and_match_dequantized_dot() {
        crate::testing::check_type::<super::Q2K>(candle_core::quantized::GgmlDType::Q2K);
    }
}
