//! ggml's eight-lane f32 accumulation, shared by the portable kernels and the AVX2 helpers.
//!
//! ggml's AVX2 dot products keep eight f32 lanes (`__m256`), add into them with
//! `_mm256_fmadd_ps` or `_mm256_add_ps`, and finish with `hsum_float_8`
//! (`ggml/src/ggml-cpu/arch/x86/quants.c`). The portable functions here do the same
//! operations lane by lane, so portable and SIMD results are identical.

/// Eight f32 lanes, lane `l` being element `l` of ggml's `__m256`.
pub type Lanes = [f32; 8];

/// `acc = fma(d, v, acc)` per lane (`_mm256_fmadd_ps(set1(d), v, acc)`).
#[inline(always)]
pub fn fma_splat(acc: &mut Lanes, d: f32, v: &Lanes) {
    for l in 0..8 {
        acc[l] = d.mul_add(v[l], acc[l]);
    }
}

/// `acc = fma(a, b, acc)` per lane (`_mm256_fmadd_ps(a, b, acc)`).
#[inline(always)]
pub fn fma_lanes(acc: &mut Lanes, a: &Lanes, b: &Lanes) {
    for l in 0..8 {
        acc[l] = a[l].mul_add(b[l], acc[l]);
    }
}

/// The eight i32 lanes of an exact integer dot product, converted to f32
/// (`_mm256_cvtepi32_ps`).
#[inline(always)]
pub fn to_f32(v: &[i32; 8]) -> Lanes {
    let mut o = [0f32; 8];
    for l in 0..8 {
        o[l] = v[l] as f32;
    }
    o
}

/// ggml's `hsum_float_8`: lanes `(4..8) + (0..4)`, then `(r0 + r2) + (r1 + r3)`.
#[inline(always)]
pub fn hsum_float_8(x: &Lanes) -> f32 {
    let r = [x[4] + x[0], x[5] + x[1], x[6] + x[2], x[7] + x[3]];
    (r[0] + r[2]) + (r[1] + r[3])
}

/// The integer dot products of ggml's `mul_sum_i8_pairs_float` / `mul_sum_us8_pairs_float`
/// for 32 values: lane `l` is `Σ_{i in 4l..4l+4} x_i · y_i` (exact).
#[inline(always)]
pub fn quad_dots(x: &[i8; 32], y: &[i8]) -> [i32; 8] {
    let mut o = [0i32; 8];
    for l in 0..8 {
        let mut s = 0i32;
        for i in 4 * l..4 * l + 4 {
            s += i32::from(x[i]) * i32::from(y[i]);
        }
        o[l] = s;
    }
    o
}

#[cfg(target_arch = "x86_64")]
pub mod x86 {
    //! AVX2 counterparts of the portable helpers (ggml's helpers of the same names).
    use std::arch::x86_64::*;

    /// ggml's `hsum_float_8`.
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn hsum_float_8(x: __m256) -> f32 {
        let mut res = _mm256_extractf128_ps(x, 1);
        res = _mm_add_ps(res, _mm256_castps256_ps128(x));
        res = _mm_add_ps(res, _mm_movehl_ps(res, res));
        res = _mm_add_ss(res, _mm_movehdup_ps(res));
        _mm_cvtss_f32(res)
    }

    /// ggml's `mul_sum_i8_pairs_float` without the VNNI instruction: eight lanes of
    /// 4-product sums of signed bytes, as f32 (exact integers).
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn mul_sum_i8_pairs_float(x: __m256i, y: __m256i) -> __m256 {
        let ax = _mm256_sign_epi8(x, x);
        let sy = _mm256_sign_epi8(y, x);
        mul_sum_us8_pairs_float(ax, sy)
    }

    /// ggml's `mul_sum_us8_pairs_float`: unsigned × signed bytes, 4-product sums per lane.
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn mul_sum_us8_pairs_float(ax: __m256i, sy: __m256i) -> __m256 {
        let dot = _mm256_maddubs_epi16(ax, sy);
        let summed = _mm256_madd_epi16(_mm256_set1_epi16(1), dot);
        _mm256_cvtepi32_ps(summed)
    }

    /// ggml's `bytes_from_nibbles_32`: 16 bytes of nibbles → 32 bytes, the low nibbles
    /// first (values `0..16`), then the high ones (`16..32`).
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn bytes_from_nibbles_32(p: *const u8) -> __m256i {
        let tmp = _mm_loadu_si128(p as *const __m128i);
        let bytes = _mm256_insertf128_si256(_mm256_castsi128_si256(tmp), _mm_srli_epi16(tmp, 4), 1);
        _mm256_and_si256(_mm256_set1_epi8(0x0f), bytes)
    }

    /// ggml's `bytes_from_bits_32`: 32 bits → 32 bytes, `0xff` where the bit is set.
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn bytes_from_bits_32(x: *const u8) -> __m256i {
        let x32 = std::ptr::read_unaligned(x as *const u32);
        let shuf_mask = _mm256_set_epi64x(
            0x0303030303030303,
            0x0202020202020202,
            0x0101010101010101,
            0x0000000000000000,
        );
        let mut bytes = _mm256_shuffle_epi8(_mm256_set1_epi32(x32 as i32), shuf_mask);
        let bit_mask = _mm256_set1_epi64x(0x7fbfdfeff7fbfdfe);
        bytes = _mm256_or_si256(bytes, bit_mask);
        _mm256_cmpeq_epi8(bytes, _mm256_set1_epi64x(-1))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hsum_order_is_ggml() {
        // Values chosen so that a sequential sum differs from ggml's tree.
        let x: Lanes = [1e8, 1.0, -1e8, 1.0, 3.0, 0.5, 0.25, 1e-3];
        let r = [x[4] + x[0], x[5] + x[1], x[6] + x[2], x[7] + x[3]];
        assert_eq!(hsum_float_8(&x), (r[0] + r[2]) + (r[1] + r[3]));
        #[cfg(target_arch = "x86_64")]
        if crate::Isa::available().contains(&crate::Isa::Avx2) {
            // SAFETY: AVX2 and FMA were detected.
            let v = unsafe { x86::hsum_float_8(std::arch::x86_64::_mm256_loadu_ps(x.as_ptr())) };
            assert_eq!(v.to_bits(), hsum_float_8(&x).to_bits());
        }
    }
}
