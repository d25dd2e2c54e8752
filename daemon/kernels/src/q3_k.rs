//! Q3_K weights × Q8_K activations.
//!
//! `block_q3_K` (110 bytes, 256 values): `hmask[32]` (high bits), `qs[64]` (low 2 bits),
//! `scales[12]` (sixteen 6-bit scales, packed), f16 `d`. Value `i = 128 n + 32 j + b`
//! (`n < 2`, `j < 4`, `b < 32`) is `q = ((qs[32 n + b] >> 2 j) & 3) − 4·[bit 4 n + j of
//! hmask[b] clear]` (`−4..4`), with group `g = 8 n + 2 j + b / 16`, and stands for
//! `(d · (sc[g] − 32)) · q` (ggml's `dequantize_row_q3_K`, `ggml/src/ggml-quants.c`).
//! The scales unpack as in ggml (`aux` / `kmask1` / `kmask2`): with `a0, a1, a2` the
//! three little-endian u32 of `scales`, the bytes of `a0 & 0x0f0f0f0f | (a2 & k1) << 4`,
//! `a1 & .. | (a2 >> 2 & k1) << 4`, `a0 >> 4 & .. | (a2 >> 4 & k1) << 4`,
//! `a1 >> 4 & .. | (a2 >> 6 & k1) << 4` (`k1 = 0x03030303`).
//!
//! ggml's order (`ggml_vec_dot_q3_K_q8_K`, `ggml-cpu/arch/x86/quants.c`, `__AVX2__`
//! branch; the function has no AVX-512 branch): per block, `d = d_a · f16→f32(d)` and
//! `acc = fma(d, sumi, acc)` with the scaled integer lanes of
//! [`lanes::k_lanes`](crate::lanes::k_lanes) (ggml forms each i16 pair sum as
//! `maddubs(low bits, q8) − maddubs(4·[high bit clear], q8)`, which equals the pair sum of
//! the signed quants, no i16 overflow); the result is `hsum_float_8(acc)`.

use crate::act::{self, Q8KBlock};
use crate::half::le_f16;
use crate::kbatch::{KBlock, KQuant};
use crate::lanes::{fma_splat, hsum_float_8, k_lanes, to_f32, Lanes};
use crate::{GgmlType, Isa, Quant};

/// The Q3_K weight type.
pub struct Q3K;

const BYTES: usize = 110;
const QS: usize = 32;
const SCALES: usize = 96;
const D: usize = 108;

/// The sixteen scale bytes `0..64` (before ggml's `− 32`), as four little-endian u32.
#[inline(always)]
fn scale_words(b: &[u8]) -> [u32; 4] {
    const KMASK1: u32 = 0x0303_0303;
    const KMASK2: u32 = 0x0f0f_0f0f;
    let s = &b[SCALES..SCALES + 12];
    let a = |i: usize| u32::from_le_bytes([s[4 * i], s[4 * i + 1], s[4 * i + 2], s[4 * i + 3]]);
    let (a0, a1, a2) = (a(0), a(1), a(2));
    [
        (a0 & KMASK2) | ((a2 & KMASK1) << 4),
        (a1 & KMASK2) | (((a2 >> 2) & KMASK1) << 4),
        ((a0 >> 4) & KMASK2) | (((a2 >> 4) & KMASK1) << 4),
        ((a1 >> 4) & KMASK2) | (((a2 >> 6) & KMASK1) << 4),
    ]
}

/// The sixteen signed scales `sc[g] − 32`.
#[inline(always)]
fn scales(b: &[u8]) -> [i32; 16] {
    let w = scale_words(b);
    let mut sc = [0i32; 16];
    for (g, s) in sc.iter_mut().enumerate() {
        *s = ((w[g / 4] >> (8 * (g % 4))) & 0xff) as i32 - 32;
    }
    sc
}

/// The 256 signed quants `−4..4` of a block, in value order.
#[inline(always)]
fn unpack(b: &[u8]) -> [i8; 256] {
    let mut q = [0i8; 256];
    for (v, qv) in q.chunks_exact_mut(32).enumerate() {
        let src = &b[QS + 32 * (v / 4)..QS + 32 * (v / 4) + 32];
        let shift = 2 * (v % 4);
        for ((o, &x), &h) in qv.iter_mut().zip(src).zip(&b[..32]) {
            let high = if h & (1 << v) != 0 { 0 } else { 4 };
            *o = ((x >> shift) & 3) as i8 - high;
        }
    }
    q
}

impl Quant for Q3K {
    const TYPE: GgmlType = GgmlType::Q3K;
    const BLOCK_VALUES: usize = 256;
    const BLOCK_BYTES: usize = BYTES;
    type Act = act::Q8K;

    crate::kbatch::tiled_path_rows!();

    fn dequantize_block(b: &[u8], out: &mut [f32]) {
        let d = le_f16(b, D);
        let sc = scales(b);
        for ((o, q), &s) in out
            .chunks_exact_mut(16)
            .zip(unpack(b).chunks_exact(16))
            .zip(&sc)
        {
            let dl = d * s as f32;
            for (o, &q) in o.iter_mut().zip(q) {
                *o = dl * f32::from(q);
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
            fma_splat(
                &mut acc,
                d,
                &to_f32(&k_lanes(&unpack(wb), &ab.qs, &scales(wb))),
            );
        }
        hsum_float_8(&acc)
    }
}

impl KQuant for Q3K {
    const BIAS: i32 = 4;
    const HAS_MIN: bool = false;
    fn k_block(b: &[u8]) -> KBlock {
        let sc = scales(b);
        KBlock {
            u: unpack(b).map(|q| (q + 4) as u8),
            sc: std::array::from_fn(|g| sc[g] as i16),
            mn: [0; 16],
            d: le_f16(b, D),
            dmin: 0.0,
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod avx2 {
    use super::{scale_words, BYTES, D, QS};
    use crate::act::Q8KBlock;
    use crate::half::le_f16;
    use crate::lanes::x86::{hsum_float_8, scale_shuffle_q3k};
    use std::arch::x86_64::*;

    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn vec_dot(w: &[u8], a: &[Q8KBlock]) -> f32 {
        let m3 = _mm256_set1_epi8(3);
        let mone = _mm256_set1_epi8(1);
        let m32 = _mm_set1_epi8(32);
        let mut acc = _mm256_setzero_ps();
        for (wb, ab) in w.chunks_exact(BYTES).zip(a) {
            let d = ab.d * le_f16(wb, D);

            let sw = scale_words(wb);
            let scales128 = _mm_set_epi32(sw[3] as i32, sw[2] as i32, sw[1] as i32, sw[0] as i32);
            let scales128 = _mm_sub_epi8(scales128, m32);
            let all_scales = _mm256_cvtepi8_epi16(scales128);
            let l_scales = _mm256_extracti128_si256::<0>(all_scales);
            let h_scales = _mm256_extracti128_si256::<1>(all_scales);
            let scales = [
                _mm256_set_m128i(l_scales, l_scales),
                _mm256_set_m128i(h_scales, h_scales),
            ];

            let hbits = _mm256_loadu_si256(wb.as_ptr() as *const __m256i);
            let mut sumi = _mm256_setzero_si256();
            for (j, &sc) in scales.iter().enumerate() {
                let q3bits = _mm256_loadu_si256(wb.as_ptr().add(QS + 32 * j) as *const __m256i);
                let q8 = ab.qs.as_ptr().add(128 * j);
                let mut p = [_mm256_setzero_si256(); 4];
                for (k, pk) in p.iter_mut().enumerate() {
                    let shift = _mm_cvtsi32_si128(2 * k as i32);
                    let bit = _mm_cvtsi32_si128((4 * j + k) as i32);
                    let q3l = _mm256_and_si256(_mm256_srl_epi16(q3bits, shift), m3);
                    // 4 where the high bit is clear, else 0.
                    let clear = _mm256_andnot_si256(hbits, _mm256_sll_epi16(mone, bit));
                    let q3h = _mm256_slli_epi16::<2>(_mm256_srl_epi16(clear, bit));
                    let q8k = _mm256_loadu_si256(q8.add(32 * k) as *const __m256i);
                    let q8s = _mm256_maddubs_epi16(q3h, q8k);
                    let p16 = _mm256_sub_epi16(_mm256_maddubs_epi16(q3l, q8k), q8s);
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
        crate::testing::check_type::<super::Q3K>(candle_core::quantized::GgmlDType::Q3K);
    }
}
