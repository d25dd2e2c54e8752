//! Q5_K weights × Q8_K activations.
//!
//! `block_q5_K` (176 bytes, 256 values): f16 `d`, f16 `dmin`, `scales[12]` (eight 6-bit
//! scales and eight 6-bit mins, [`lanes::k4_scales_mins`](crate::lanes::k4_scales_mins)),
//! `qh[32]` (high bits), `qs[128]` (low nibbles). Value `i = 64 j + 32 h + b` (`j < 4`,
//! `h < 2`, `b < 32`) with `s = 2 j + h` is `q = (qs[32 j + b] >> 4 h) & 15 + 16 · (bit s
//! of qh[b])` (`0..32`), and stands for `(d · sc[s]) · q − dmin · mn[s]` (ggml's
//! `dequantize_row_q5_K`, `ggml/src/ggml-quants.c`: not fused — ggml-base is built
//! without FMA).
//!
//! ggml's order (`ggml_vec_dot_q5_K_q8_K`, `ggml-cpu/arch/x86/quants.c`, `__AVX2__`
//! branch; the function has no AVX-512 branch): per block, `d = d_a · f16→f32(d)`,
//! `dmin = −d_a · f16→f32(dmin)`; the min term is one scalar,
//! `summs = fma(dmin, (float) Σ prod, summs)` (the C `summs += dmin * <int>`, which GCC
//! contracts to an FMA under `-ffp-contract=fast`), with `prod` the exact lanes of
//! [`lanes::k4_min_lanes`](crate::lanes::k4_min_lanes); and `acc = fma(d, sumi, acc)`
//! with the scaled integer lanes of [`lanes::k_lanes`](crate::lanes::k_lanes). The
//! result is `hsum_float_8(acc) + summs`.

use crate::act::{self, Q8KBlock};
use crate::half::le_f16;
use crate::kbatch::{KBlock, KQuant};
use crate::lanes::{fma_splat, hsum_float_8, k4_min_lanes, k4_scales_mins, k_lanes, to_f32, Lanes};
use crate::tiles::each_row;
#[cfg(target_arch = "x86_64")]
use crate::tiles::{in_tiles, RowTile};
use crate::{Activations, GgmlType, Isa, Quant};
use std::ops::Range;

/// The Q5_K weight type.
pub struct Q5K;

const BYTES: usize = 176;
const SCALES: usize = 4;
const QH: usize = 16;
const QS: usize = 48;

/// The 256 quants `0..32` of a block, in value order.
#[inline(always)]
fn unpack(b: &[u8]) -> [i8; 256] {
    let mut q = [0i8; 256];
    let qh = &b[QH..QH + 32];
    for (s, qv) in q.chunks_exact_mut(32).enumerate() {
        let (j, h) = (s / 2, s % 2);
        let src = &b[QS + 32 * j..QS + 32 * j + 32];
        for ((o, &x), &hb) in qv.iter_mut().zip(src).zip(qh) {
            *o = (((x >> (4 * h)) & 15) | (((hb >> s) & 1) << 4)) as i8;
        }
    }
    q
}

impl Quant for Q5K {
    const TYPE: GgmlType = GgmlType::Q5K;
    const BLOCK_VALUES: usize = 256;
    const BLOCK_BYTES: usize = BYTES;
    type Act = act::Q8K;

    crate::kbatch::tiled_path_rows!();

    fn dequantize_block(b: &[u8], out: &mut [f32]) {
        let (d, min) = (le_f16(b, 0), le_f16(b, 2));
        let (sc, mn) = k4_scales_mins(&b[SCALES..SCALES + 12]);
        for (s, (o, q)) in out
            .chunks_exact_mut(32)
            .zip(unpack(b).chunks_exact(32))
            .enumerate()
        {
            let dl = d * f32::from(sc[s]);
            let ml = min * f32::from(mn[s]);
            for (o, &q) in o.iter_mut().zip(q) {
                *o = dl * f32::from(q) - ml;
            }
        }
    }

    fn vec_dot(isa: Isa, w: &[u8], a: &[Q8KBlock]) -> f32 {
        #[cfg(target_arch = "x86_64")]
        if isa.has_avx2() {
            // SAFETY: `has_avx2` means AVX2, FMA and F16C were detected.
            return unsafe { avx2::Avx2::dots::<1>(w, [a])[0] };
        }
        let _ = isa;
        let mut acc: Lanes = [0.0; 8];
        let mut summs = 0f32;
        for (wb, ab) in w.chunks_exact(BYTES).zip(a) {
            let d = ab.d * le_f16(wb, 0);
            let dmin = -ab.d * le_f16(wb, 2);
            let (sc, mn) = k4_scales_mins(&wb[SCALES..SCALES + 12]);
            let prod: i32 = k4_min_lanes(&mn, &ab.bsums).iter().sum();
            summs = dmin.mul_add(prod as f32, summs);
            let sc16: [i32; 16] = std::array::from_fn(|g| i32::from(sc[g / 2]));
            fma_splat(&mut acc, d, &to_f32(&k_lanes(&unpack(wb), &ab.qs, &sc16)));
        }
        hsum_float_8(&acc) + summs
    }

    fn vec_dot_rows(
        isa: Isa,
        w: &[u8],
        a: &Activations<act::Q8K>,
        rows: Range<usize>,
        out: &mut [f32],
    ) {
        #[cfg(target_arch = "x86_64")]
        if isa.has_avx2() {
            // SAFETY: `has_avx2` means AVX2, FMA and F16C were detected.
            return unsafe { in_tiles::<_, avx2::Avx2>(w, a, rows, out) };
        }
        each_row::<Self>(isa, w, a, rows, out);
    }
}

impl KQuant for Q5K {
    const BIAS: i32 = 0;
    const HAS_MIN: bool = true;
    fn k_block(b: &[u8]) -> KBlock {
        crate::kbatch::k4_style_block(b, SCALES, unpack(b))
    }
}

#[cfg(target_arch = "x86_64")]
mod avx2 {
    //! ggml's AVX2 kernel for one weight row against `R` activation rows: each block's
    //! 5-bit values and scale vectors are unpacked once; per row the same `summs` and
    //! `acc` FMAs as the one-row kernel.
    use super::{BYTES, QH, QS, SCALES};
    use crate::act::Q8KBlock;
    use crate::lanes::k4_scales_mins;
    use crate::lanes::x86::{f16_pair_at, hsum_float_8, scale_shuffle_k4};
    use crate::tiles::{blocks, RowTile};
    use std::arch::x86_64::*;

    pub(super) struct Avx2;

    impl RowTile for Avx2 {
        type Block = Q8KBlock;
        unsafe fn dots<const R: usize>(w: &[u8], a: [&[Q8KBlock]; R]) -> [f32; R] {
            dots(w, a)
        }
    }

    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn dots<const R: usize>(w: &[u8], a: [&[Q8KBlock]; R]) -> [f32; R] {
        let m4 = _mm256_set1_epi8(0xf);
        let mzero = _mm_setzero_si128();
        let mone = _mm256_set1_epi8(1);
        let mut acc = [_mm256_setzero_ps(); R];
        let mut summs = [0f32; R];
        for i in 0..blocks(w, BYTES, &a) {
            let wb = w.as_ptr().add(i * BYTES);
            let (dw, minw) = f16_pair_at(wb);

            // ggml's `utmp`: the eight scales, then the eight mins.
            let (sc, mn) = k4_scales_mins(std::slice::from_raw_parts(wb.add(SCALES), 12));
            let mut utmp = [0u8; 16];
            utmp[..8].copy_from_slice(&sc);
            utmp[8..].copy_from_slice(&mn);
            let mins_and_scales =
                _mm256_cvtepu8_epi16(_mm_loadu_si128(utmp.as_ptr() as *const __m128i));
            let mins = _mm256_extracti128_si256::<1>(mins_and_scales);
            let sc128 = _mm256_extracti128_si256::<0>(mins_and_scales);
            let scales = _mm256_set_m128i(sc128, sc128);

            // Value vector `v = 2 j + h` (values `32 v..32 v + 32`, `0..32`) and its
            // scale, for every row.
            let hbits = _mm256_loadu_si256(wb.add(QH) as *const __m256i);
            let mut q = [_mm256_setzero_si256(); 8];
            let mut s = [_mm256_setzero_si256(); 8];
            for j in 0..4 {
                let q5bits = _mm256_loadu_si256(wb.add(QS + 32 * j) as *const __m256i);
                let bit0 = _mm_cvtsi32_si128(2 * j as i32);
                let bit1 = _mm_cvtsi32_si128(2 * j as i32 + 1);
                let hmask0 = _mm256_sll_epi16(mone, bit0);
                let hmask1 = _mm256_sll_epi16(mone, bit1);
                let q5h_0 =
                    _mm256_slli_epi16::<4>(_mm256_srl_epi16(_mm256_and_si256(hbits, hmask0), bit0));
                let q5h_1 =
                    _mm256_slli_epi16::<4>(_mm256_srl_epi16(_mm256_and_si256(hbits, hmask1), bit1));
                q[2 * j] = _mm256_add_epi8(_mm256_and_si256(q5bits, m4), q5h_0);
                q[2 * j + 1] =
                    _mm256_add_epi8(_mm256_and_si256(_mm256_srli_epi16::<4>(q5bits), m4), q5h_1);
                s[2 * j] = _mm256_shuffle_epi8(scales, scale_shuffle_k4(2 * j));
                s[2 * j + 1] = _mm256_shuffle_epi8(scales, scale_shuffle_k4(2 * j + 1));
            }

            for r in 0..R {
                let ab = a[r].get_unchecked(i);
                let d = ab.d * dw;
                let dmin = -ab.d * minw;
                let q8sums = _mm256_loadu_si256(ab.bsums.as_ptr() as *const __m256i);
                let q8s = _mm_hadd_epi16(
                    _mm256_extracti128_si256::<0>(q8sums),
                    _mm256_extracti128_si256::<1>(q8sums),
                );
                let prod = _mm_madd_epi16(mins, q8s);
                let hsum = _mm_hadd_epi32(_mm_hadd_epi32(prod, mzero), mzero);
                // `summs += dmin * _mm_extract_epi32(hsum, 0)`, contracted by GCC.
                summs[r] = dmin.mul_add(_mm_extract_epi32::<0>(hsum) as f32, summs[r]);

                let mut sumi = _mm256_setzero_si256();
                for v in 0..8 {
                    let q8 = _mm256_loadu_si256(ab.qs.as_ptr().add(32 * v) as *const __m256i);
                    let p16 = _mm256_madd_epi16(s[v], _mm256_maddubs_epi16(q[v], q8));
                    sumi = _mm256_add_epi32(sumi, p16);
                }
                acc[r] = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(sumi), acc[r]);
            }
        }
        let mut out = [0f32; R];
        for r in 0..R {
            out[r] = hsum_float_8(acc[r]) + summs[r];
        }
        out
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn kernels_agree_and_match_dequantized_dot() {
        crate::testing::check_type::<super::Q5K>(candle_core::quantized::GgmlDType::Q5K);
    }
}
