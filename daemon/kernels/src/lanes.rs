//! ggml's eight- and sixteen-lane f32 accumulation, shared by the portable kernels and the
//! SIMD helpers, and the unpacking of the legacy (32-value) blocks.
//!
//! ggml's AVX2 dot products keep eight f32 lanes (`__m256`), add into them with
//! `_mm256_fmadd_ps` or `_mm256_add_ps`, and finish with `hsum_float_8`
//! (`ggml/src/ggml-cpu/arch/x86/quants.c`). The portable functions here do the same
//! operations lane by lane, so portable and SIMD results are identical.
//!
//! ggml's float dot products (`ggml_vec_dot_f32` / `_f16`, `ggml-cpu/vec.cpp`, with
//! `__AVX512F__`) keep four sixteen-lane accumulators (`__m512`) and reduce them with
//! `GGML_F32x16_REDUCE` and GCC's `_mm512_reduce_add_ps` ([`f32x16_reduce`]); the AVX2
//! helpers hold each sixteen-lane vector as two `__m256`.

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
    for (l, o) in o.iter_mut().enumerate() {
        *o = (4 * l..4 * l + 4)
            .map(|i| i32::from(x[i]) * i32::from(y[i]))
            .sum();
    }
    o
}

// ---------------------------------------------------------------------------------------
// K-quants (256-value super-blocks against Q8_K activations).
//
// ggml's AVX2 K-quant dot products (`ggml_vec_dot_q{2..6}_K_q8_K`) treat a block as eight
// 32-byte vectors `v = 0..8` (values `32 v .. 32 v + 32`). `_mm256_maddubs_epi16`
// multiplies the weight quants (unsigned bytes) by the activation quants and adds pairs
// into i16; `_mm256_madd_epi16` multiplies those by an i16 scale vector and adds pairs
// into i32. So i32 lane `l` of a vector holds the 4-product sum of bytes `4 l .. 4 l + 4`,
// and bytes `0..16` (lanes 0..4) / `16..32` (lanes 4..8) of vector `v` are the 16-value
// groups `2 v` / `2 v + 1`, each with its own scale. The i16 pair sums cannot saturate:
// a weight quant is at most 63 (Q6_K) and `|q8| ≤ 128`, so `|pair| ≤ 2 · 63 · 128 <
// 2^15`. The eight i32 lanes are exact; only their conversion to f32 (one rounding per
// lane when above 2^24) and the float accumulation depend on the lane structure, which
// the helpers below reproduce.

/// The eight i32 lanes of a K-quant block's scaled integer sums (ggml's `sumi`):
/// lane `l = Σ_v sc[2 v + l / 4] · Σ_{b in 4 l .. 4 l + 4} q[32 v + b] · y[32 v + b]`,
/// where `sc[g]` is the scale of the 16 values `16 g .. 16 g + 16` (exact).
#[inline(always)]
pub fn k_lanes(q: &[i8; 256], y: &[i8; 256], sc: &[i32; 16]) -> [i32; 8] {
    let mut o = [0i32; 8];
    for v in 0..8 {
        let (qv, yv) = (&q[32 * v..32 * v + 32], &y[32 * v..32 * v + 32]);
        for l in 0..8 {
            let mut s = 0i32;
            for b in 4 * l..4 * l + 4 {
                s += i32::from(qv[b]) * i32::from(yv[b]);
            }
            o[l] += sc[2 * v + l / 4] * s;
        }
    }
    o
}

/// `_mm256_madd_epi16(a, b)`: lane `l = a[2 l] · b[2 l] + a[2 l + 1] · b[2 l + 1]`
/// (exact for the K-quants' ranges: scales or mins times `bsums`).
#[inline(always)]
pub fn madd_pairs(a: &[i16; 16], b: &[i16; 16]) -> [i32; 8] {
    let mut o = [0i32; 8];
    for l in 0..8 {
        o[l] = i32::from(a[2 * l]) * i32::from(b[2 * l])
            + i32::from(a[2 * l + 1]) * i32::from(b[2 * l + 1]);
    }
    o
}

/// The 6-bit scales and mins of Q4_K and Q5_K from their 12 packed bytes `s`:
/// `(scales, mins)`, entry `j` for the 32 values `32 j .. 32 j + 32`. This is ggml's
/// `get_scale_min_k4(j)` (`ggml/src/ggml-quants.c`) for `j = 0..8`, equivalently the
/// `utmp` / `kmask` unpacking of the x86 dot products: `j < 4`: `s[j] & 63`,
/// `s[j + 4] & 63`; `j ≥ 4`: `(s[j + 4] & 15) | (s[j − 4] >> 6) << 4`,
/// `(s[j + 4] >> 4) | (s[j] >> 6) << 4`.
#[inline(always)]
pub fn k4_scales_mins(s: &[u8]) -> ([u8; 8], [u8; 8]) {
    let (mut sc, mut mn) = ([0u8; 8], [0u8; 8]);
    for j in 0..4 {
        sc[j] = s[j] & 63;
        mn[j] = s[j + 4] & 63;
        sc[j + 4] = (s[j + 8] & 15) | ((s[j] >> 6) << 4);
        mn[j + 4] = (s[j + 8] >> 4) | ((s[j + 4] >> 6) << 4);
    }
    (sc, mn)
}

/// Q4_K / Q5_K mins against the activation sums, ggml's four i32 lanes
/// `_mm_madd_epi16(mins, _mm_hadd_epi16(bsums[0..8], bsums[8..16]))`:
/// lane `t = mn[2 t] · (b[4 t] + b[4 t + 1]) + mn[2 t + 1] · (b[4 t + 2] + b[4 t + 3])`.
#[inline(always)]
pub fn k4_min_lanes(mn: &[u8; 8], b: &[i16; 16]) -> [i32; 4] {
    let mut o = [0i32; 4];
    for t in 0..4 {
        let s0 = i32::from(b[4 * t]) + i32::from(b[4 * t + 1]);
        let s1 = i32::from(b[4 * t + 2]) + i32::from(b[4 * t + 3]);
        o[t] = i32::from(mn[2 * t]) * s0 + i32::from(mn[2 * t + 1]) * s1;
    }
    o
}

/// ggml's horizontal sum of four f32 lanes (`_mm_add_ps(x, _mm_movehl_ps(x, x))`, then
/// `_mm_add_ss(.., _mm_movehdup_ps(..))`): `(x0 + x2) + (x1 + x3)`.
#[inline(always)]
pub fn hsum_float_4(x: &[f32; 4]) -> f32 {
    (x[0] + x[2]) + (x[1] + x[3])
}

/// The 32 values `0..16` of a legacy block's 16 nibble bytes `qs` (ggml's
/// `bytes_from_nibbles_32`): byte `j` holds value `j` in its low nibble and value
/// `j + 16` in its high one.
#[inline(always)]
pub fn nibbles_32(qs: &[u8]) -> [u8; 32] {
    let mut q = [0u8; 32];
    for j in 0..16 {
        q[j] = qs[j] & 0x0f;
        q[j + 16] = qs[j] >> 4;
    }
    q
}

/// The 32 five-bit values `0..32` of a Q5_0 / Q5_1 block: the nibbles of `qs` (as
/// [`nibbles_32`]) with bit `i` of the little-endian `u32` `qh` as value `i`'s fifth bit
/// (`dequantize_row_q5_*`'s `xh_0 = ((qh >> j) << 4) & 0x10`, `xh_1 = (qh >> (j + 12)) &
/// 0x10`).
#[inline(always)]
pub fn q5_values(qh: &[u8], qs: &[u8]) -> [u8; 32] {
    let h = u32::from_le_bytes([qh[0], qh[1], qh[2], qh[3]]);
    let mut q = nibbles_32(qs);
    for (i, v) in q.iter_mut().enumerate() {
        *v |= (((h >> i) & 1) as u8) << 4;
    }
    q
}

/// Values `0..128` as the `i8` operand of [`quad_dots`] (the products are the same).
#[inline(always)]
pub fn as_i8(q: [u8; 32]) -> [i8; 32] {
    q.map(|v| v as i8)
}

/// Sixteen f32 lanes, lane `l` being element `l` of ggml's `__m512` (the `GGML_F32x16` /
/// `GGML_F32Cx16` vectors of `ggml-cpu/simd-mappings.h` under `__AVX512F__`).
pub type Lanes16 = [f32; 16];

/// `GGML_F32_ARR`: the accumulators of ggml's AVX-512 float dot products
/// (`GGML_F32_STEP / GGML_F32_EPR = 64 / 16`).
pub const F32X16_ARR: usize = 4;

/// `GGML_F32_STEP`: values per iteration of ggml's AVX-512 float dot products.
pub const F32X16_STEP: usize = 64;

/// GCC 12's `_mm512_reduce_add_ps` (`__MM512_REDUCE_OP(+)` in `avx512fintrin.h`): the
/// upper eight lanes plus the lower eight, then [`hsum_float_8`] of those.
#[inline(always)]
pub fn reduce_add_16(v: &Lanes16) -> f32 {
    let mut t: Lanes = [0.0; 8];
    for l in 0..8 {
        t[l] = v[l + 8] + v[l];
    }
    hsum_float_8(&t)
}

/// llamafile's tinyBLAS order for one output (`tinyBLAS::gemm_bloc` with `KN = 16`,
/// `ggml-cpu/llamafile/sgemm.cpp`): sixteen lanes `acc_l = fma(x_i, y_i, acc_l)` over
/// `i = 16 s + l` for the steps `s` in order, then `_mm512_reduce_add_ps`
/// ([`reduce_add_16`]). `n` must be a multiple of 16.
#[inline(always)]
pub fn sgemm_dot(n: usize, x: impl Fn(usize) -> f32, y: impl Fn(usize) -> f32) -> f32 {
    let mut acc: Lanes16 = [0.0; 16];
    for s in (0..n).step_by(16) {
        for (l, a) in acc.iter_mut().enumerate() {
            *a = x(s + l).mul_add(y(s + l), *a);
        }
    }
    reduce_add_16(&acc)
}

/// `GGML_F32x16_REDUCE` (= `GGML_F32Cx16_REDUCE`) over the four accumulators:
/// `s0 += s2; s1 += s3; s0 += s1`, then `_mm512_reduce_add_ps(s0)`.
#[inline(always)]
pub fn f32x16_reduce(sum: &[Lanes16; F32X16_ARR]) -> f32 {
    let mut s = [0f32; 16];
    for l in 0..16 {
        let s0 = sum[0][l] + sum[2][l];
        let s1 = sum[1][l] + sum[3][l];
        s[l] = s0 + s1;
    }
    reduce_add_16(&s)
}

/// The main loop of ggml's AVX-512 `ggml_vec_dot_f32` / `ggml_vec_dot_f16`
/// (`ggml-cpu/vec.cpp`) over the first `np` values (a multiple of 64):
/// `sum[j][l] = fma(x[i + 16 j + l], y[i + 16 j + l], sum[j][l])` for each step `i`,
/// then [`f32x16_reduce`]. `x` and `y` give value `e` widened to f32.
#[inline(always)]
pub fn f32x16_dot_main(np: usize, x: impl Fn(usize) -> f32, y: impl Fn(usize) -> f32) -> f32 {
    debug_assert_eq!(np % F32X16_STEP, 0);
    let mut sum = [[0f32; 16]; F32X16_ARR];
    for i in (0..np).step_by(F32X16_STEP) {
        for (j, s) in sum.iter_mut().enumerate() {
            for (l, acc) in s.iter_mut().enumerate() {
                let e = i + 16 * j + l;
                *acc = x(e).mul_add(y(e), *acc);
            }
        }
    }
    f32x16_reduce(&sum)
}

#[cfg(target_arch = "x86_64")]
pub mod x86 {
    //! AVX2 counterparts of the portable helpers (ggml's helpers of the same names).
    use std::arch::x86_64::*;

    /// ggml's `hsum_float_8`.
    ///
    /// # Safety
    /// The CPU must have AVX2 and FMA.
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn hsum_float_8(x: __m256) -> f32 {
        let mut res = _mm256_extractf128_ps(x, 1);
        res = _mm_add_ps(res, _mm256_castps256_ps128(x));
        res = _mm_add_ps(res, _mm_movehl_ps(res, res));
        res = _mm_add_ss(res, _mm_movehdup_ps(res));
        _mm_cvtss_f32(res)
    }

    /// The sum of eight i32 lanes (exact, so the order is free).
    ///
    /// # Safety
    /// The CPU must have AVX2.
    #[inline]
    #[target_feature(enable = "avx2")]
    pub unsafe fn hsum_i32_8(v: __m256i) -> i32 {
        let h = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256::<1>(v));
        let h = _mm_add_epi32(h, _mm_shuffle_epi32::<0b01_00_11_10>(h));
        let h = _mm_add_epi32(h, _mm_shuffle_epi32::<0b10_11_00_01>(h));
        _mm_cvtsi128_si32(h)
    }

    /// The little-endian f16 at `p`, widened to f32 with F16C (`_cvtsh_ss`, as ggml's
    /// `GGML_CPU_FP16_TO_FP32`; exact, the same value as [`crate::half::le_f16`]).
    ///
    /// # Safety
    /// The CPU must have AVX2, FMA and F16C. `p` must be readable for 2 bytes.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn f16_at(p: *const u8) -> f32 {
        _mm_cvtss_f32(f16_splat(p))
    }

    /// The little-endian f16 at `p` widened to f32 in all four lanes. The f16 is
    /// broadcast from memory (`vpbroadcastw`, written as assembly): LLVM compiles
    /// `_mm_cvtsi32_si128` or `_mm_set1_epi16` of a loaded value, when only lane 0 is
    /// used, to `vpinsrw` into whatever register held the previous value, which chains
    /// each block's scale to the one before it (about 12 cycles a block).
    ///
    /// # Safety
    /// The CPU must have AVX2, FMA and F16C. `p` must be readable for 2 bytes.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn f16_splat(p: *const u8) -> __m128 {
        _mm_cvtph_ps(f16_broadcast(p))
    }

    /// The two little-endian f16 at `p` and `p + 2` (a block's `d` and `dmin`/`m`),
    /// widened to f32 with one 32-bit load (`vmovd`, which clears the register's other
    /// lanes: no chain to the previous value) and one conversion.
    ///
    /// # Safety
    /// The CPU must have AVX2, FMA and F16C. `p` must be readable for 4 bytes.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn f16_pair_at(p: *const u8) -> (f32, f32) {
        let both = _mm_cvtph_ps(_mm_cvtsi32_si128(std::ptr::read_unaligned(p as *const i32)));
        (_mm_cvtss_f32(both), _mm_cvtss_f32(_mm_movehdup_ps(both)))
    }

    /// [`f16_splat`] in eight lanes.
    ///
    /// # Safety
    /// The CPU must have AVX2, FMA and F16C. `p` must be readable for 2 bytes.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn f16_splat8(p: *const u8) -> __m256 {
        _mm256_cvtph_ps(f16_broadcast(p))
    }

    /// The f16 bits at `p` in all eight 16-bit lanes, by `vpbroadcastw` from memory.
    ///
    /// # Safety
    /// The CPU must have AVX2. `p` must be readable for 2 bytes.
    #[inline]
    #[target_feature(enable = "avx2")]
    unsafe fn f16_broadcast(p: *const u8) -> __m128i {
        let h: __m128i;
        // SAFETY: reads the 2 bytes at `p` (readable by the caller's contract) into a
        // fresh register; AVX2 is enabled.
        std::arch::asm!(
            "vpbroadcastw {h}, word ptr [{p}]",
            h = out(xmm_reg) h,
            p = in(reg) p,
            options(pure, readonly, nostack, preserves_flags)
        );
        h
    }

    /// ggml's `mul_sum_i8_pairs_float` without the VNNI instruction: eight lanes of
    /// 4-product sums of signed bytes, as f32 (exact integers).
    ///
    /// # Safety
    /// The CPU must have AVX2 and FMA.
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn mul_sum_i8_pairs_float(x: __m256i, y: __m256i) -> __m256 {
        let ax = _mm256_sign_epi8(x, x);
        let sy = _mm256_sign_epi8(y, x);
        mul_sum_us8_pairs_float(ax, sy)
    }

    /// ggml's `mul_sum_us8_pairs_float`: unsigned × signed bytes, 4-product sums per lane.
    ///
    /// # Safety
    /// The CPU must have AVX2 and FMA.
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn mul_sum_us8_pairs_float(ax: __m256i, sy: __m256i) -> __m256 {
        let dot = _mm256_maddubs_epi16(ax, sy);
        let summed = _mm256_madd_epi16(_mm256_set1_epi16(1), dot);
        _mm256_cvtepi32_ps(summed)
    }

    /// ggml's `bytes_from_nibbles_32`: 16 bytes of nibbles → 32 bytes, the low nibbles
    /// first (values `0..16`), then the high ones (`16..32`).
    ///
    /// # Safety
    /// The CPU must have AVX2 and FMA. `p` must be readable for 16 bytes.
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn bytes_from_nibbles_32(p: *const u8) -> __m256i {
        let tmp = _mm_loadu_si128(p as *const __m128i);
        let bytes = _mm256_insertf128_si256(_mm256_castsi128_si256(tmp), _mm_srli_epi16(tmp, 4), 1);
        _mm256_and_si256(_mm256_set1_epi8(0x0f), bytes)
    }

    /// The 32 five-bit values of a Q5_0 / Q5_1 block as bytes `0..32` (see
    /// [`super::q5_values`]): ggml's `bytes_from_nibbles_32(qs)` or'd with
    /// `bytes_from_bits_32(qh) & 0x10`. (Q5_0's `andnot(bits, 0xf0)` is this minus 16.)
    ///
    /// # Safety
    /// The CPU must have AVX2 and FMA. `qs` must be readable for 16 bytes, `qh` for 4.
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn bytes_from_q5_32(qs: *const u8, qh: *const u8) -> __m256i {
        let hi = _mm256_and_si256(bytes_from_bits_32(qh), _mm256_set1_epi8(0x10));
        _mm256_or_si256(bytes_from_nibbles_32(qs), hi)
    }

    /// [`super::reduce_add_16`] of the sixteen lanes `lo` (0..8) and `hi` (8..16).
    ///
    /// # Safety
    /// The CPU must have AVX2 and FMA.
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn reduce_add_16(lo: __m256, hi: __m256) -> f32 {
        hsum_float_8(_mm256_add_ps(hi, lo))
    }

    /// [`super::f32x16_reduce`] of four 16-lane accumulators, each as `[lo, hi]`.
    ///
    /// # Safety
    /// The CPU must have AVX2 and FMA.
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn f32x16_reduce(sum: &[[__m256; 2]; super::F32X16_ARR]) -> f32 {
        let mut s = [_mm256_setzero_ps(); 2];
        for (h, v) in s.iter_mut().enumerate() {
            let s0 = _mm256_add_ps(sum[0][h], sum[2][h]);
            let s1 = _mm256_add_ps(sum[1][h], sum[3][h]);
            *v = _mm256_add_ps(s0, s1);
        }
        reduce_add_16(s[0], s[1])
    }

    /// GCC 12's `_mm512_reduce_add_ps` (see [`super::reduce_add_16`]); Rust's own
    /// `_mm512_reduce_add_ps` leaves the order to LLVM, so it is not used.
    ///
    /// # Safety
    /// The CPU must have AVX-512 F, AVX2 and FMA.
    #[inline]
    #[target_feature(enable = "avx512f,avx2,fma")]
    pub unsafe fn reduce_add_ps_512(v: __m512) -> f32 {
        let hi = _mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(_mm512_castps_pd(v)));
        let lo = _mm512_castps512_ps256(v);
        hsum_float_8(_mm256_add_ps(hi, lo))
    }

    /// `GGML_F32x16_REDUCE` of four `__m512` accumulators.
    ///
    /// # Safety
    /// The CPU must have AVX-512 F, AVX2 and FMA.
    #[inline]
    #[target_feature(enable = "avx512f,avx2,fma")]
    pub unsafe fn f32x16_reduce_512(sum: &[__m512; super::F32X16_ARR]) -> f32 {
        let s0 = _mm512_add_ps(sum[0], sum[2]);
        let s1 = _mm512_add_ps(sum[1], sum[3]);
        reduce_add_ps_512(_mm512_add_ps(s0, s1))
    }

    /// ggml's `bytes_from_bits_32`: 32 bits → 32 bytes, `0xff` where the bit is set.
    ///
    /// # Safety
    /// The CPU must have AVX2 and FMA. `x` must be readable for 4 bytes.
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

    /// ggml's four-lane float sum of the Q4_K dot product (`acc_m`): `(x0 + x2) + (x1 + x3)`.
    ///
    /// # Safety
    /// The CPU must have AVX2 and FMA.
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn hsum_float_4(x: __m128) -> f32 {
        let r = _mm_add_ps(x, _mm_movehl_ps(x, x));
        _mm_cvtss_f32(_mm_add_ss(r, _mm_movehdup_ps(r)))
    }

    /// ggml's `get_scale_shuffle_q3k(i)` (Q2_K, Q3_K): applied to 8 i16 scales repeated
    /// in both 128-bit halves, gives scale `2 i` in the low half, `2 i + 1` in the high.
    ///
    /// # Safety
    /// The CPU must have AVX2 and FMA.
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn scale_shuffle_q3k(i: usize) -> __m256i {
        // Byte pairs (4 i, 4 i + 1) in the low half, (4 i + 2, 4 i + 3) in the high one.
        let pair = |b: usize| (b | ((b + 1) << 8)) as i16;
        _mm256_set_m128i(_mm_set1_epi16(pair(4 * i + 2)), _mm_set1_epi16(pair(4 * i)))
    }

    /// ggml's `get_scale_shuffle_k4(i)` (Q4_K, Q5_K): i16 element `i` of each 128-bit
    /// half, in every i16 lane.
    ///
    /// # Safety
    /// The CPU must have AVX2 and FMA.
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn scale_shuffle_k4(i: usize) -> __m256i {
        let b = 2 * i;
        _mm256_set1_epi16((b | ((b + 1) << 8)) as i16)
    }

    /// ggml's `get_scale_shuffle(i)` (Q6_K): byte `2 i` eight times, then byte `2 i + 1`
    /// eight times.
    ///
    /// # Safety
    /// The CPU must have AVX2 and FMA.
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn scale_shuffle(i: usize) -> __m128i {
        let lo = _mm_set1_epi8((2 * i) as i8);
        let hi = _mm_set1_epi8((2 * i + 1) as i8);
        _mm_unpacklo_epi64(lo, hi)
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
