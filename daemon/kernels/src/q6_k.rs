//! Q6_K weights × Q8_K activations.
//!
//! `block_q6_K` (210 bytes, 256 values): `ql[128]` (low nibbles), `qh[64]` (high 2-bit
//! pairs), `scales[16]` (`i8`), f16 `d`. Value `i = 128 n + 32 k + b` (`n < 2`, `k < 4`,
//! `b < 32`) is `u = lo | hi << 4` (`0..64`), `hi = (qh[32 n + b] >> 2 k) & 3` and `lo`
//! the low nibble (`k < 2`) or high nibble (`k ≥ 2`) of `ql[64 n + 32 (k % 2) + b]`.
//! With group `g = 8 n + 2 k + b / 16` it stands for `(d · scales[g]) · (u − 32)`
//! (ggml's `dequantize_row_q6_K`, `ggml/src/ggml-quants.c`).
//!
//! ggml's order (`ggml_vec_dot_q6_K_q8_K`, `ggml-cpu/arch/x86/quants.c`, `__AVX2__`
//! branch; the function has no AVX-512 branch): per block, `d = d_a · f16→f32(d)`; the
//! integer lanes are those of [`lanes::k_lanes`](crate::lanes::k_lanes) over the
//! *unsigned* `u`, minus `32 · _mm256_madd_epi16(bsums, scales)` lane by lane (the `− 32`
//! applied through the activation sums, so the lanes differ from those of `u − 32`);
//! `acc = fma(d, sumi, acc)`; the result is `hsum_float_8(acc)`.

use crate::act::{self, Q8KBlock};
use crate::half::le_f16;
use crate::kbatch::{KBlock, KQuant};
use crate::lanes::{fma_splat, hsum_float_8, k_lanes, madd_pairs, to_f32, Lanes};
use crate::tiles::each_row;
#[cfg(target_arch = "x86_64")]
use crate::tiles::{in_tiles, RowTile};
use crate::{Activations, GgmlType, Isa, Quant};
use std::ops::Range;

/// The Q6_K weight type.
pub struct Q6K;

const BYTES: usize = 210;
const QH: usize = 128;
const SCALES: usize = 192;
const D: usize = 208;

/// The 256 unsigned quants `0..64` of a block, in value order.
#[inline(always)]
fn unpack(b: &[u8]) -> [i8; 256] {
    let mut q = [0i8; 256];
    for (v, qv) in q.chunks_exact_mut(32).enumerate() {
        let (n, k) = (v / 4, v % 4);
        let lo = &b[64 * n + 32 * (k % 2)..64 * n + 32 * (k % 2) + 32];
        let hi = &b[QH + 32 * n..QH + 32 * n + 32];
        for ((o, &l), &h) in qv.iter_mut().zip(lo).zip(hi) {
            *o = (((l >> (4 * (k / 2))) & 15) | (((h >> (2 * k)) & 3) << 4)) as i8;
        }
    }
    q
}

/// The sixteen signed scales.
#[inline(always)]
fn scales(b: &[u8]) -> [i8; 16] {
    std::array::from_fn(|g| b[SCALES + g] as i8)
}

impl Quant for Q6K {
    const TYPE: GgmlType = GgmlType::Q6K;
    const BLOCK_VALUES: usize = 256;
    const BLOCK_BYTES: usize = BYTES;
    type Act = act::Q8K;

    crate::kbatch::tiled_path_rows!(avx2::Tiled);

    fn dequantize_block(b: &[u8], out: &mut [f32]) {
        let d = le_f16(b, D);
        for ((o, q), s) in out
            .chunks_exact_mut(16)
            .zip(unpack(b).chunks_exact(16))
            .zip(scales(b))
        {
            let ds = d * f32::from(s);
            for (o, &q) in o.iter_mut().zip(q) {
                *o = ds * f32::from(q - 32);
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
        for (wb, ab) in w.chunks_exact(BYTES).zip(a) {
            let d = ab.d * le_f16(wb, D);
            let sc = scales(wb);
            let sc32: [i32; 16] = std::array::from_fn(|g| i32::from(sc[g]));
            let sc16: [i16; 16] = std::array::from_fn(|g| i16::from(sc[g]));
            let sub = madd_pairs(&ab.bsums, &sc16);
            let mut sumi = k_lanes(&unpack(wb), &ab.qs, &sc32);
            for (s, m) in sumi.iter_mut().zip(sub) {
                *s -= m << 5;
            }
            fma_splat(&mut acc, d, &to_f32(&sumi));
        }
        hsum_float_8(&acc)
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

impl KQuant for Q6K {
    const BIAS: i32 = 32;
    const HAS_MIN: bool = false;
    fn k_block(b: &[u8]) -> KBlock {
        let sc = scales(b);
        KBlock {
            u: unpack(b).map(|q| q as u8),
            sc: std::array::from_fn(|g| i16::from(sc[g])),
            mn: [0; 16],
            d: le_f16(b, D),
            dmin: 0.0,
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod avx2 {
    //! ggml's AVX2 kernel for one weight row against `R` activation rows: each block's
    //! 6-bit values and scale vectors are unpacked once; per row the same integer lanes
    //! and `acc` FMA as the one-row kernel.
    use super::{BYTES, D, QH, SCALES};
    use crate::act::Q8KBlock;
    use crate::lanes::x86::{f16_at, hsum_float_8, hsum_i32_8, scale_shuffle};
    use crate::tiles::{blocks, RowTile};
    use std::arch::x86_64::*;

    pub(super) struct Avx2;

    impl RowTile for Avx2 {
        type Block = Q8KBlock;
        unsafe fn dots<const R: usize>(w: &[u8], a: [&[Q8KBlock]; R]) -> [f32; R] {
            dots::<false, R>(w, a)
        }
    }

    /// [`crate::kbatch::rows`] on [`crate::Path::Tiled`] from the same integer lanes.
    pub(super) struct Tiled;

    impl RowTile for Tiled {
        type Block = Q8KBlock;
        unsafe fn dots<const R: usize>(w: &[u8], a: [&[Q8KBlock]; R]) -> [f32; R] {
            if R <= 8 {
                return tiled_dots::<R>(w, a);
            }
            dots::<true, R>(w, a)
        }
    }

    /// A block's value vectors `q[v]` (values `32 v..32 v + 32`, unsigned `0..64`),
    /// their group-scale vectors `s[v]`, the sixteen scales as i16, and `d`.
    ///
    /// # Safety
    /// AVX2, FMA and F16C (inlined into the kernels, which enable them); `wb` readable for
    /// a block.
    #[inline(always)]
    unsafe fn block(wb: *const u8) -> ([__m256i; 8], [__m256i; 8], __m256i, f32) {
        let m3 = _mm256_set1_epi8(3);
        let m15 = _mm256_set1_epi8(15);
        let dw = f16_at(wb.add(D));
        let scales = _mm_loadu_si128(wb.add(SCALES) as *const __m128i);
        let scales_16 = _mm256_cvtepi8_epi16(scales);
        let mut q = [_mm256_setzero_si256(); 8];
        let mut s = [_mm256_setzero_si256(); 8];
        for j in 0..2 {
            let q4 = wb.add(64 * j);
            let q4bits1 = _mm256_loadu_si256(q4 as *const __m256i);
            let q4bits2 = _mm256_loadu_si256(q4.add(32) as *const __m256i);
            let q4bits_h = _mm256_loadu_si256(wb.add(QH + 32 * j) as *const __m256i);

            let q4h_0 = _mm256_slli_epi16::<4>(_mm256_and_si256(q4bits_h, m3));
            let q4h_1 = _mm256_slli_epi16::<2>(_mm256_and_si256(q4bits_h, _mm256_set1_epi8(12)));
            let q4h_2 = _mm256_and_si256(q4bits_h, _mm256_set1_epi8(48));
            let q4h_3 = _mm256_srli_epi16::<2>(_mm256_and_si256(q4bits_h, _mm256_set1_epi8(-64)));

            q[4 * j] = _mm256_or_si256(_mm256_and_si256(q4bits1, m15), q4h_0);
            q[4 * j + 1] = _mm256_or_si256(_mm256_and_si256(q4bits2, m15), q4h_1);
            q[4 * j + 2] = _mm256_or_si256(
                _mm256_and_si256(_mm256_srli_epi16::<4>(q4bits1), m15),
                q4h_2,
            );
            q[4 * j + 3] = _mm256_or_si256(
                _mm256_and_si256(_mm256_srli_epi16::<4>(q4bits2), m15),
                q4h_3,
            );
            for k in 0..4 {
                let scale = _mm_shuffle_epi8(scales, scale_shuffle(4 * j + k));
                s[4 * j + k] = _mm256_cvtepi8_epi16(scale);
            }
        }
        (q, s, scales_16, dw)
    }

    /// ggml's eight integer lanes of one block and activation row, `− 32 · Σ scale ·
    /// bsum` applied (exact, so their grouping is free).
    ///
    /// # Safety
    /// AVX2 (inlined into the kernels, which enable it).
    #[inline(always)]
    unsafe fn lanes(
        q: &[__m256i; 8],
        s: &[__m256i; 8],
        scales_16: __m256i,
        ab: &Q8KBlock,
    ) -> __m256i {
        let q8sums = _mm256_loadu_si256(ab.bsums.as_ptr() as *const __m256i);
        let q8sclsub = _mm256_slli_epi32::<5>(_mm256_madd_epi16(q8sums, scales_16));
        let mut sumi = _mm256_setzero_si256();
        for v in 0..8 {
            let q8 = _mm256_loadu_si256(ab.qs.as_ptr().add(32 * v) as *const __m256i);
            let p16 = _mm256_madd_epi16(s[v], _mm256_maddubs_epi16(q[v], q8));
            sumi = _mm256_add_epi32(sumi, p16);
        }
        _mm256_sub_epi32(sumi, q8sclsub)
    }

    /// [`dots`] on the tiled path for `R ≤ 8` rows with its float chain across the rows:
    /// the rows' block totals `s1` by one tree of horizontal adds (exact), then lane `r`
    /// takes row `r`'s `res = f32(s1) · d_w`, `acc = fma(res, d_a, acc)` (tested equal).
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn tiled_dots<const R: usize>(w: &[u8], a: [&[Q8KBlock]; R]) -> [f32; R] {
        const { assert!(R <= 8) };
        let mut acc = _mm256_setzero_ps();
        for i in 0..blocks(w, BYTES, &a) {
            let (q, s, scales_16, dw) = block(w.as_ptr().add(i * BYTES));
            let mut v = [_mm256_setzero_si256(); 8];
            let mut da = [0f32; 8];
            for r in 0..R {
                let ab = a[r].get_unchecked(i);
                v[r] = lanes(&q, &s, scales_16, ab);
                da[r] = ab.d;
            }
            // Lane r of `s1`: the sum of `v[r]`'s eight lanes.
            let h = |x: __m256i, y: __m256i| _mm256_hadd_epi32(x, y);
            let h03 = h(h(v[0], v[1]), h(v[2], v[3]));
            let h47 = h(h(v[4], v[5]), h(v[6], v[7]));
            let s1 = _mm256_add_epi32(
                _mm256_permute2x128_si256::<0x20>(h03, h47),
                _mm256_permute2x128_si256::<0x31>(h03, h47),
            );
            let res = _mm256_mul_ps(_mm256_cvtepi32_ps(s1), _mm256_set1_ps(dw));
            acc = _mm256_fmadd_ps(res, _mm256_loadu_ps(da.as_ptr()), acc);
        }
        let mut o = [0f32; 8];
        _mm256_storeu_ps(o.as_mut_ptr(), acc);
        std::array::from_fn(|r| o[r])
    }

    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn dots<const TILED: bool, const R: usize>(w: &[u8], a: [&[Q8KBlock]; R]) -> [f32; R] {
        let mut tiled = [0f32; R];
        let mut acc = [_mm256_setzero_ps(); R];
        for i in 0..blocks(w, BYTES, &a) {
            let (q, s, scales_16, dw) = block(w.as_ptr().add(i * BYTES));

            for r in 0..R {
                let ab = a[r].get_unchecked(i);
                let d = ab.d * dw;
                let sumi = lanes(&q, &s, scales_16, ab);
                if TILED {
                    // The lanes sum to `s1` exactly (`− 32` already applied).
                    let res = hsum_i32_8(sumi) as f32 * dw;
                    tiled[r] = res.mul_add(ab.d, tiled[r]);
                } else {
                    acc[r] = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(sumi), acc[r]);
                }
            }
        }
        if TILED {
            return tiled;
        }
        let mut out = [0f32; R];
        for r in 0..R {
            out[r] = hsum_float_8(acc[r]);
        }
        out
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn kernels_agree_and_match_dequantized_dot() {
        crate::testing::check_type::<super::Q6K>(candle_core::quantized::GgmlDType::Q6K);
    }
}
