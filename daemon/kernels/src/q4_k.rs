//! Q4_K weights × Q8_K activations.
//!
//! `block_q4_K` (144 bytes, 256 values): f16 `d`, f16 `dmin`, `scales[12]` (eight 6-bit
//! scales and eight 6-bit mins, [`lanes::k4_scales_mins`](crate::lanes::k4_scales_mins)),
//! `qs[128]` (nibbles). Value `i = 64 j + 32 h + b` (`j < 4`, `h < 2`, `b < 32`) is
//! `q = qs[32 j + b] & 15` (`h = 0`) or `qs[32 j + b] >> 4` (`h = 1`), and with
//! `s = 2 j + h` stands for `(d · sc[s]) · q − dmin · mn[s]` (ggml's
//! `dequantize_row_q4_K`, `ggml/src/ggml-quants.c`: not fused — ggml-base is built
//! without FMA).
//!
//! ggml's order (`ggml_vec_dot_q4_K_q8_K`, `ggml-cpu/arch/x86/quants.c`, `__AVX2__`
//! branch; the function has no AVX-512 branch): per block, `d = d_a · f16→f32(d)`,
//! `dmin = −d_a · f16→f32(dmin)`; a four-lane accumulator `acc_m = fma(dmin, prod,
//! acc_m)` with the i32 lanes of [`lanes::k4_min_lanes`](crate::lanes::k4_min_lanes),
//! and `acc = fma(d, sumi, acc)` with the scaled integer lanes of
//! [`lanes::k_lanes`](crate::lanes::k_lanes); the result is
//! `hsum_float_8(acc) + ((m0 + m2) + (m1 + m3))`. (llama.cpp repacks Q4_K matrices whose
//! row count is a multiple of 8 on AVX2 CPUs, `ggml-cpu/repack.cpp`, and those take
//! another order.)

use crate::act::{self, Q8KBlock};
use crate::half::le_f16;
use crate::kbatch::{KBlock, KQuant};
use crate::lanes::{
    fma_splat, hsum_float_4, hsum_float_8, k4_min_lanes, k4_scales_mins, k_lanes, to_f32, Lanes,
};
use crate::tiles::each_row;
#[cfg(target_arch = "x86_64")]
use crate::tiles::{in_tiles, RowTile};
use crate::{Activations, GgmlType, Isa, Path, Quant};
use std::ops::Range;

/// The Q4_K weight type.
pub struct Q4K;

const BYTES: usize = 144;
const SCALES: usize = 4;
const QS: usize = 16;

/// The 256 quants `0..16` of a block, in value order.
#[inline(always)]
fn unpack(b: &[u8]) -> [i8; 256] {
    let mut q = [0i8; 256];
    for (j, qj) in q.chunks_exact_mut(64).enumerate() {
        let src = &b[QS + 32 * j..QS + 32 * j + 32];
        for (l, &x) in src.iter().enumerate() {
            qj[l] = (x & 15) as i8;
            qj[l + 32] = (x >> 4) as i8;
        }
    }
    q
}

impl Quant for Q4K {
    const TYPE: GgmlType = GgmlType::Q4K;
    const BLOCK_VALUES: usize = 256;
    const BLOCK_BYTES: usize = BYTES;
    type Act = act::Q8K;

    fn path_rows(
        isa: Isa,
        path: Path,
        w: &[u8],
        a: &Activations<act::Q8K>,
        rows: std::ops::Range<usize>,
        out: &mut [f32],
    ) {
        match path {
            Path::VecDot => Self::vec_dot_rows(isa, w, a, rows, out),
            #[cfg(target_arch = "x86_64")]
            // SAFETY: `has_avx2` means AVX2, FMA and F16C were detected.
            p if isa.has_avx2() => unsafe {
                use avx2::{PathTile, GEMM, GEMV, TILED};
                match p {
                    Path::Gemv => in_tiles::<_, PathTile<GEMV>>(w, a, rows, out),
                    Path::Gemm => in_tiles::<_, PathTile<GEMM>>(w, a, rows, out),
                    _ => in_tiles::<_, PathTile<TILED>>(w, a, rows, out),
                }
            },
            p => crate::kbatch::rows::<Self>(isa, p, w, a, rows, out),
        }
    }

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
        let mut acc_m = [0f32; 4];
        for (wb, ab) in w.chunks_exact(BYTES).zip(a) {
            let d = ab.d * le_f16(wb, 0);
            let dmin = -ab.d * le_f16(wb, 2);
            let (sc, mn) = k4_scales_mins(&wb[SCALES..SCALES + 12]);
            for (m, p) in acc_m.iter_mut().zip(k4_min_lanes(&mn, &ab.bsums)) {
                *m = dmin.mul_add(p as f32, *m);
            }
            let sc16: [i32; 16] = std::array::from_fn(|g| i32::from(sc[g / 2]));
            fma_splat(&mut acc, d, &to_f32(&k_lanes(&unpack(wb), &ab.qs, &sc16)));
        }
        hsum_float_8(&acc) + hsum_float_4(&acc_m)
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

impl KQuant for Q4K {
    const BIAS: i32 = 0;
    const HAS_MIN: bool = true;
    fn k_block(b: &[u8]) -> KBlock {
        crate::kbatch::k4_style_block(b, SCALES, unpack(b))
    }
}

#[cfg(target_arch = "x86_64")]
mod avx2 {
    //! ggml's AVX2 kernel for one weight row against `R` activation rows: each block's
    //! nibbles and scale vectors are unpacked once; per row the same `acc_m` and `acc`
    //! FMAs as the one-row kernel.
    use super::{BYTES, QS, SCALES};
    use crate::act::Q8KBlock;
    use crate::lanes::k4_scales_mins;
    use crate::lanes::x86::{
        f16_pair_at, hsum_float_4, hsum_float_8, hsum_i32_8, scale_shuffle_k4,
    };
    use crate::tiles::{blocks, RowTile};
    use std::arch::x86_64::*;

    pub(super) struct Avx2;

    impl RowTile for Avx2 {
        type Block = Q8KBlock;
        unsafe fn dots<const R: usize>(w: &[u8], a: [&[Q8KBlock]; R]) -> [f32; R] {
            dots(w, a)
        }
    }

    /// A block's nibble vectors `q[v]` (values `32 v..32 v + 32`), their scale vectors
    /// `s[v]`, the eight mins as i16, `d` and `dmin`.
    ///
    /// # Safety
    /// AVX2, FMA and F16C (inlined into the kernels, which enable them; as a function of
    /// its own it returned its sixteen vectors through memory); `wb` readable for a block.
    #[inline(always)]
    unsafe fn block(wb: *const u8) -> ([__m256i; 8], [__m256i; 8], __m128i, f32, f32) {
        let m4 = _mm256_set1_epi8(0xf);
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
        let mut q = [_mm256_setzero_si256(); 8];
        let mut s = [_mm256_setzero_si256(); 8];
        for j in 0..4 {
            let q4bits = _mm256_loadu_si256(wb.add(QS + 32 * j) as *const __m256i);
            q[2 * j] = _mm256_and_si256(q4bits, m4);
            q[2 * j + 1] = _mm256_and_si256(_mm256_srli_epi16::<4>(q4bits), m4);
            s[2 * j] = _mm256_shuffle_epi8(scales, scale_shuffle_k4(2 * j));
            s[2 * j + 1] = _mm256_shuffle_epi8(scales, scale_shuffle_k4(2 * j + 1));
        }
        (q, s, mins, dw, minw)
    }

    /// The four quarter min sums `s2_q` (lane `q`) of activation block `ab`.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn min_sums(mins: __m128i, ab: &Q8KBlock) -> __m128i {
        let q8sums = _mm256_loadu_si256(ab.bsums.as_ptr() as *const __m256i);
        let q8s = _mm_hadd_epi16(
            _mm256_extracti128_si256::<0>(q8sums),
            _mm256_extracti128_si256::<1>(q8sums),
        );
        _mm_madd_epi16(mins, q8s)
    }

    /// The scaled integer lanes of values `64 q..64 q + 64` (quarter `q`).
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn quarter(q: &[__m256i; 8], s: &[__m256i; 8], ab: &Q8KBlock, j: usize) -> __m256i {
        let mut sumi = _mm256_setzero_si256();
        for v in 2 * j..2 * j + 2 {
            let q8 = _mm256_loadu_si256(ab.qs.as_ptr().add(32 * v) as *const __m256i);
            sumi = _mm256_add_epi32(
                sumi,
                _mm256_madd_epi16(s[v], _mm256_maddubs_epi16(q[v], q8)),
            );
        }
        sumi
    }

    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn dots<const R: usize>(w: &[u8], a: [&[Q8KBlock]; R]) -> [f32; R] {
        let mut acc = [_mm256_setzero_ps(); R];
        let mut acc_m = [_mm_setzero_ps(); R];
        for i in 0..blocks(w, BYTES, &a) {
            let (q, s, mins, dw, minw) = block(w.as_ptr().add(i * BYTES));
            for r in 0..R {
                let ab = a[r].get_unchecked(i);
                let d = ab.d * dw;
                let dmin = -ab.d * minw;
                let prod = min_sums(mins, ab);
                acc_m[r] = _mm_fmadd_ps(_mm_set1_ps(dmin), _mm_cvtepi32_ps(prod), acc_m[r]);
                let mut sumi = _mm256_setzero_si256();
                for j in 0..4 {
                    sumi = _mm256_add_epi32(sumi, quarter(&q, &s, ab, j));
                }
                acc[r] = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(sumi), acc[r]);
            }
        }
        let mut out = [0f32; R];
        for r in 0..R {
            out[r] = hsum_float_8(acc[r]) + hsum_float_4(acc_m[r]);
        }
        out
    }

    /// [`crate::kbatch::rows`] for `MODE` [`TILED`], [`GEMV`] or [`GEMM`], with the
    /// same exact sums from ggml's integer lanes.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn path_dots<const MODE: u8, const R: usize>(
        w: &[u8],
        a: [&[Q8KBlock]; R],
    ) -> [f32; R] {
        let mut acc = [0f32; R];
        let mut acc_m = [0f32; R];
        for i in 0..blocks(w, BYTES, &a) {
            let (q, s, mins, dw, minw) = block(w.as_ptr().add(i * BYTES));
            for r in 0..R {
                let ab = a[r].get_unchecked(i);
                let mut m = [0i32; 4];
                _mm_storeu_si128(m.as_mut_ptr() as *mut __m128i, min_sums(mins, ab));
                if MODE == GEMM {
                    // The four quarter totals at once: lane j of `t` is quarter j's.
                    let h01 = _mm256_hadd_epi32(quarter(&q, &s, ab, 0), quarter(&q, &s, ab, 1));
                    let h23 = _mm256_hadd_epi32(quarter(&q, &s, ab, 2), quarter(&q, &s, ab, 3));
                    let h = _mm256_hadd_epi32(h01, h23);
                    let t =
                        _mm_add_epi32(_mm256_castsi256_si128(h), _mm256_extracti128_si256::<1>(h));
                    let mut s1 = [0i32; 4];
                    _mm_storeu_si128(s1.as_mut_ptr() as *mut __m128i, t);
                    let (ds, dm) = (dw * ab.d, minw * ab.d);
                    for (&s1j, &mj) in s1.iter().zip(&m) {
                        acc[r] = (s1j as f32).mul_add(ds, acc[r]);
                        acc_m[r] = (mj as f32).mul_add(dm, acc_m[r]);
                    }
                    continue;
                }
                let mut sumi = _mm256_setzero_si256();
                for j in 0..4 {
                    sumi = _mm256_add_epi32(sumi, quarter(&q, &s, ab, j));
                }
                let (s1, s2) = (hsum_i32_8(sumi), m.iter().sum::<i32>());
                if MODE == GEMV {
                    acc[r] = (s1 as f32).mul_add(dw * ab.d, acc[r]);
                    acc_m[r] = (s2 as f32).mul_add(minw * ab.d, acc_m[r]);
                } else {
                    let res = (-minw).mul_add(s2 as f32, s1 as f32 * dw);
                    acc[r] = res.mul_add(ab.d, acc[r]);
                }
            }
        }
        let mut out = [0f32; R];
        for r in 0..R {
            out[r] = if MODE == TILED {
                acc[r]
            } else {
                acc[r] - acc_m[r]
            };
        }
        out
    }

    /// [`path_dots`] for [`GEMM`] with its float chains across the `R ≤ 8` rows: lane
    /// `r` of `acc` and `acc_m` is row `r`'s accumulator and takes the same fma, in the
    /// same order, as the scalar chain of [`path_dots`] (tested equal).
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn gemm_dots<const R: usize>(w: &[u8], a: [&[Q8KBlock]; R]) -> [f32; R] {
        const { assert!(R <= 8) };
        let mut acc = _mm256_setzero_ps();
        let mut acc_m = _mm256_setzero_ps();
        for i in 0..blocks(w, BYTES, &a) {
            let (q, s, mins, dw, minw) = block(w.as_ptr().add(i * BYTES));
            // Per row the four quarter totals and min sums (lane `j`: quarter `j`).
            let mut t = [_mm_setzero_si128(); 8];
            let mut m = [_mm_setzero_si128(); 8];
            let mut da = [0f32; 8];
            for r in 0..R {
                let ab = a[r].get_unchecked(i);
                m[r] = min_sums(mins, ab);
                let h01 = _mm256_hadd_epi32(quarter(&q, &s, ab, 0), quarter(&q, &s, ab, 1));
                let h23 = _mm256_hadd_epi32(quarter(&q, &s, ab, 2), quarter(&q, &s, ab, 3));
                let h = _mm256_hadd_epi32(h01, h23);
                t[r] = _mm_add_epi32(_mm256_castsi256_si128(h), _mm256_extracti128_si256::<1>(h));
                da[r] = ab.d;
            }
            let da = _mm256_loadu_ps(da.as_ptr());
            let ds = _mm256_mul_ps(_mm256_set1_ps(dw), da);
            let dm = _mm256_mul_ps(_mm256_set1_ps(minw), da);
            let (tq, mq) = (by_quarter(&t), by_quarter(&m));
            for j in 0..4 {
                acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(tq[j]), ds, acc);
                acc_m = _mm256_fmadd_ps(_mm256_cvtepi32_ps(mq[j]), dm, acc_m);
            }
        }
        let mut o = [0f32; 8];
        _mm256_storeu_ps(o.as_mut_ptr(), _mm256_sub_ps(acc, acc_m));
        std::array::from_fn(|r| o[r])
    }

    /// Eight rows' four lanes → four vectors of eight rows (lane `r` of vector `j` is
    /// lane `j` of `rows[r]`).
    #[inline]
    #[target_feature(enable = "avx2")]
    unsafe fn by_quarter(rows: &[__m128i; 8]) -> [__m256i; 4] {
        let half = |x: &[__m128i]| {
            let t0 = _mm_unpacklo_epi32(x[0], x[1]);
            let t1 = _mm_unpacklo_epi32(x[2], x[3]);
            let t2 = _mm_unpackhi_epi32(x[0], x[1]);
            let t3 = _mm_unpackhi_epi32(x[2], x[3]);
            [
                _mm_unpacklo_epi64(t0, t1),
                _mm_unpackhi_epi64(t0, t1),
                _mm_unpacklo_epi64(t2, t3),
                _mm_unpackhi_epi64(t2, t3),
            ]
        };
        let (lo, hi) = (half(&rows[..4]), half(&rows[4..]));
        std::array::from_fn(|j| _mm256_set_m128i(hi[j], lo[j]))
    }

    /// [`path_dots`] as a tile kernel.
    pub(super) struct PathTile<const MODE: u8>;

    impl<const MODE: u8> RowTile for PathTile<MODE> {
        type Block = Q8KBlock;
        unsafe fn dots<const R: usize>(w: &[u8], a: [&[Q8KBlock]; R]) -> [f32; R] {
            if MODE == GEMM && R <= 8 {
                return gemm_dots::<R>(w, a);
            }
            path_dots::<MODE, R>(w, a)
        }
    }

    pub(super) const TILED: u8 = 1;
    pub(super) const GEMV: u8 = 2;
    pub(super) const GEMM: u8 = 3;
}

#[cfg(test)]
mod tests {
    #[test]
    fn kernels_agree_and_match_dequantized_dot() {
        crate::testing::check_type::<super::Q4K>(candle_core::quantized::GgmlDType::Q4K);
    }
}
