//! Multi-row products: one weight row against a tile of activation rows.
//!
//! A multi-row product (prefill, batched decode) computes `w · a_j` for several
//! activation rows `j` per weight row. The per-type kernels here unpack each weight block
//! once (nibbles, high bits, scales) and use it for every row of a tile, keeping one
//! accumulator per activation row. Each output's float operations are exactly those of
//! the type's single-row `vec_dot` (the same `fma` per block into its own accumulator,
//! the same final horizontal sum); only independent outputs are interleaved, and the
//! exact integer parts are shared. So the results equal the one-row calls bit for bit
//! (`testing` checks this for every type and instruction set).

use std::ops::Range;

use crate::act::{ActFormat, Activations};
use crate::{Isa, Quant};

/// Activation rows per tile: enough independent accumulators to hide the FMA latency
/// and to spread a block's unpacking over many rows, few enough that the accumulators
/// stay in registers (8 timed faster than 4 for Q5_0, Q8_0, Q4_K and Q6_K).
pub const TILE: usize = 8;

/// The portable multi-row product (and the trait's default): `vec_dot` per row.
pub fn each_row<Q: Quant + ?Sized>(
    isa: Isa,
    w: &[u8],
    a: &Activations<Q::Act>,
    rows: Range<usize>,
    out: &mut [f32],
) {
    for (o, j) in out.iter_mut().zip(rows) {
        *o = Q::vec_dot(isa, w, a.row(j));
    }
}

/// A kernel for one weight row against `R` activation rows at once.
pub trait RowTile {
    /// The activation block.
    type Block;
    /// `out[r] = w · a[r]`, bit for bit the type's `vec_dot` of each row.
    ///
    /// # Safety
    /// The CPU must have the kernel's features.
    unsafe fn dots<const R: usize>(w: &[u8], a: [&[Self::Block]; R]) -> [f32; R];
}

/// `out[i] = w · a_{rows.start + i}` through `K` in tiles of [`TILE`] rows, the last
/// `rows.len() % TILE` in tiles of 4, 2 and 1.
///
/// # Safety
/// The CPU must have `K`'s features.
#[inline]
pub unsafe fn in_tiles<A: ActFormat, K: RowTile<Block = A::Block>>(
    w: &[u8],
    a: &Activations<A>,
    rows: Range<usize>,
    out: &mut [f32],
) {
    let out = &mut out[..rows.len()];
    let mut chunks = out.chunks_exact_mut(TILE);
    let mut j = rows.start;
    for o in &mut chunks {
        o.copy_from_slice(&K::dots::<TILE>(w, std::array::from_fn(|i| a.row(j + i))));
        j += TILE;
    }
    // The remainder (under `TILE` rows) as tiles of 4, 2 and 1.
    let mut rest = chunks.into_remainder();
    macro_rules! tail {
        ($r:literal) => {
            if rest.len() >= $r {
                let (o, more) = std::mem::take(&mut rest).split_at_mut($r);
                o.copy_from_slice(&K::dots::<$r>(w, std::array::from_fn(|i| a.row(j + i))));
                j += $r;
                rest = more;
            }
        };
    }
    if TILE > 4 {
        tail!(4);
    }
    tail!(2);
    tail!(1);
    debug_assert!(rest.is_empty() && j == rows.end);
}

/// The number of blocks a kernel reads: those of `w` (`bytes` each) that every
/// activation row also has (as `vec_dot`'s `zip`), so that the kernels may index blocks
/// `0..n` without bounds checks.
#[inline(always)]
pub fn blocks<B, const R: usize>(w: &[u8], bytes: usize, a: &[&[B]; R]) -> usize {
    a.iter().fold(w.len() / bytes, |n, r| n.min(r.len()))
}

#[cfg(target_arch = "x86_64")]
pub mod x86 {
    //! The AVX2 tile kernels shared by the legacy (32-value) types against Q8_0 / Q8_1
    //! activations; each type gives only its block unpacking.
    use super::blocks;
    use crate::act::Q8Block;
    use crate::lanes::x86::{
        f16_at, f16_pair_at, hsum_float_8, hsum_i32_8, mul_sum_us8_pairs_float,
    };
    use std::arch::x86_64::*;

    /// A legacy block whose 32 values the AVX2 code holds as one vector of bytes.
    pub trait LegacyBlock {
        /// Bytes per block.
        const BYTES: usize;
        /// The 32 values of the block at `p`: signed (`q − 8`, `q − 16`, `q`) for the
        /// types against Q8_0, unsigned `q` for those with a min `m` (against Q8_1).
        ///
        /// # Safety
        /// AVX2 and FMA; `p` readable for `BYTES` bytes.
        unsafe fn values(p: *const u8) -> __m256i;
        /// [`Self::values`] where AVX-512 BW/VL may be used (mask registers); the same
        /// bytes.
        ///
        /// # Safety
        /// AVX-512 F/BW/VL, AVX2 and FMA; `p` readable for `BYTES` bytes.
        #[inline]
        unsafe fn values_512(p: *const u8) -> __m256i {
            Self::values(p)
        }
    }

    /// [`signed_dots`] on an AVX-512 VNNI CPU for type `U` (see [`signed_dots_vnni`]).
    pub struct Vnni<U>(std::marker::PhantomData<U>);

    impl<U: LegacyBlock> super::RowTile for Vnni<U> {
        type Block = Q8Block;
        unsafe fn dots<const R: usize>(w: &[u8], a: [&[Q8Block]; R]) -> [f32; R] {
            signed_dots_vnni::<U, R>(w, a)
        }
    }

    /// [`signed_dots`] with the integer lanes from `vpdpbusd` (llama.cpp's AVX-512 VNNI
    /// build computes `mul_sum_us8_pairs_float` so: exact four-product sums, the same
    /// values as `maddubs` + `madd`) and the block's values from
    /// [`LegacyBlock::values_512`]; the float operations are unchanged.
    ///
    /// # Safety
    /// The CPU must have AVX-512 F/BW/VL/VNNI, AVX2, FMA and F16C.
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
    pub unsafe fn signed_dots_vnni<U: LegacyBlock, const R: usize>(
        w: &[u8],
        a: [&[Q8Block]; R],
    ) -> [f32; R] {
        signed_body::<U, R, true>(w, a)
    }

    /// ggml's `ggml_vec_dot_{q4_0,q5_0,q8_0}_q8_0` for `R` activation rows: per block
    /// and row `acc_r = fma(f16→f32(d_w) · d_a, mul_sum_i8_pairs_float(x, y), acc_r)`,
    /// then `hsum_float_8(acc_r)`. `|x|` (`_mm256_sign_epi8(x, x)`) is computed once
    /// per block.
    ///
    /// # Safety
    /// The CPU must have AVX2, FMA and F16C.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn signed_dots<U: LegacyBlock, const R: usize>(
        w: &[u8],
        a: [&[Q8Block]; R],
    ) -> [f32; R] {
        signed_body::<U, R, false>(w, a)
    }

    /// The loop of [`signed_dots`] and [`signed_dots_vnni`], inlined into each so that it
    /// compiles with the caller's instruction set; `VNNI` picks `vpdpbusd` and
    /// [`LegacyBlock::values_512`].
    #[inline(always)]
    unsafe fn signed_body<U: LegacyBlock, const R: usize, const VNNI: bool>(
        w: &[u8],
        a: [&[Q8Block]; R],
    ) -> [f32; R] {
        let n = blocks(w, U::BYTES, &a);
        let mut acc = [_mm256_setzero_ps(); R];
        for i in 0..n {
            let p = w.as_ptr().add(i * U::BYTES);
            let dw = f16_at(p);
            let qx = if VNNI { U::values_512(p) } else { U::values(p) };
            let ax = _mm256_sign_epi8(qx, qx);
            for r in 0..R {
                let ab = a[r].get_unchecked(i);
                let d = _mm256_set1_ps(dw * ab.d);
                let qy = _mm256_loadu_si256(ab.qs.as_ptr() as *const __m256i);
                let sy = _mm256_sign_epi8(qy, qx);
                // = mul_sum_i8_pairs_float(qx, qy), with `ax` shared.
                let v = if VNNI {
                    _mm256_cvtepi32_ps(_mm256_dpbusd_epi32(_mm256_setzero_si256(), ax, sy))
                } else {
                    mul_sum_us8_pairs_float(ax, sy)
                };
                acc[r] = _mm256_fmadd_ps(d, v, acc[r]);
            }
        }
        let mut out = [0f32; R];
        for r in 0..R {
            out[r] = hsum_float_8(acc[r]);
        }
        out
    }

    /// `legacy::repacked_rows`'s order for `R` activation rows: per block the
    /// exact integer `Σ q·y` (the lanes of `mul_sum_i8_pairs`, summed) and `acc_r =
    /// fma(f32(sum), f16→f32(d_w) · d_a, acc_r)`.
    ///
    /// # Safety
    /// The CPU must have AVX2, FMA and F16C.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn repacked_dots<U: LegacyBlock, const R: usize>(
        w: &[u8],
        a: [&[Q8Block]; R],
    ) -> [f32; R] {
        let n = blocks(w, U::BYTES, &a);
        let mut acc = [0f32; R];
        let ones = _mm256_set1_epi16(1);
        for i in 0..n {
            let p = w.as_ptr().add(i * U::BYTES);
            let dw = f16_at(p);
            let qx = U::values(p);
            let ax = _mm256_sign_epi8(qx, qx);
            for r in 0..R {
                let ab = a[r].get_unchecked(i);
                let qy = _mm256_loadu_si256(ab.qs.as_ptr() as *const __m256i);
                let dot = _mm256_maddubs_epi16(ax, _mm256_sign_epi8(qy, qx));
                let sum = hsum_i32_8(_mm256_madd_epi16(ones, dot));
                acc[r] = (sum as f32).mul_add(dw * ab.d, acc[r]);
            }
        }
        acc
    }

    /// ggml's `ggml_vec_dot_{q4_1,q5_1}_q8_1` for `R` activation rows: per block and
    /// row `summs_r = fma(f16→f32(m_w), s_a, summs_r)` and `acc_r =
    /// fma(mul_sum_us8_pairs_float(x, y), f16→f32(d_w) · d_a, acc_r)`, then
    /// `hsum_float_8(acc_r) + summs_r` (Q4_1's `fma(d, v, acc)` is the same operation:
    /// the product is commutative). The f16 `m` follows the f16 `d`.
    ///
    /// # Safety
    /// The CPU must have AVX2, FMA and F16C.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn unsigned_dots<U: LegacyBlock, const R: usize>(
        w: &[u8],
        a: [&[Q8Block]; R],
    ) -> [f32; R] {
        let n = blocks(w, U::BYTES, &a);
        let mut acc = [_mm256_setzero_ps(); R];
        let mut summs = [0f32; R];
        for i in 0..n {
            let p = w.as_ptr().add(i * U::BYTES);
            let (dw, mw) = f16_pair_at(p);
            let qx = U::values(p);
            for r in 0..R {
                let ab = a[r].get_unchecked(i);
                summs[r] = mw.mul_add(ab.s, summs[r]);
                let d = _mm256_set1_ps(dw * ab.d);
                let qy = _mm256_loadu_si256(ab.qs.as_ptr() as *const __m256i);
                acc[r] = _mm256_fmadd_ps(mul_sum_us8_pairs_float(qx, qy), d, acc[r]);
            }
        }
        let mut out = [0f32; R];
        for r in 0..R {
            out[r] = hsum_float_8(acc[r]) + summs[r];
        }
        out
    }
}
