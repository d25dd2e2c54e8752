//! BF16 weights × bf16 activations (one little-endian bf16 per value — the upper half of
//! an f32; "blocks" of one value, dequantized by exact widening).
//!
//! ggml's order (`ggml_vec_dot_bf16`, `ggml-cpu/vec.cpp`, the `__AVX512BF16__` branch;
//! checked against the disassembly of llama.cpp's `libggml-cpu.so`):
//! - two sixteen-lane f32 accumulators `c1`, `c2`; per step of 64 values `i` (while `i +
//!   64 ≤ n`), `c1 = _mm512_dpbf16_ps(c1, x[i..i+32], y[i..i+32])` and `c2` likewise over
//!   `i + 32 .. i + 64`. `vdpbf16ps` (Intel's pseudo-code): lane `l` of the accumulator
//!   takes the pair of values `2 l`, `2 l + 1`: `acc = fma(x[2l+1], y[2l+1], acc)`, then
//!   `acc = fma(x[2l], y[2l], acc)`, each an f32 FMA rounded to nearest even, with
//!   denormal inputs read as zero (DAZ) and denormal results flushed to zero (FTZ),
//!   whatever MXCSR says ([`dp_lane`]);
//! - `sumf` (f64) `+= f64(_mm512_reduce_add_ps(c1))`, then the same for `c2` (GCC's
//!   reduction, [`crate::lanes::reduce_add_16`]);
//! - the leftovers in order, `sumf += f64(x[i] · y[i])` (a plain f32 product, widened);
//!   the result is `sumf` rounded to f32.
//!
//! The AVX-512 path runs `vdpbf16ps` itself where the CPU has AVX512_BF16; the portable
//! and AVX2 paths emulate it as above.

use crate::half::{bf16_to_f32, le_u16};
use crate::lanes::reduce_add_16;
use crate::{act, GgmlType, Isa, Quant};

/// The BF16 weight type.
pub struct Bf16Weights;

/// Values per step of ggml's loop (two `vdpbf16ps` of 32 values).
const STEP: usize = 64;

/// A bf16 widened, a denormal read as zero of its sign (`vdpbf16ps`'s DAZ).
#[inline(always)]
fn daz(b: u16) -> f32 {
    ftz(bf16_to_f32(b))
}

/// A denormal f32 flushed to zero of its sign (`vdpbf16ps`'s FTZ).
#[inline(always)]
fn ftz(v: f32) -> f32 {
    let u = v.to_bits();
    if u & 0x7f80_0000 == 0 {
        f32::from_bits(u & 0x8000_0000)
    } else {
        v
    }
}

/// One lane of `vdpbf16ps`: `acc` plus the products of the pair `(x0, y0)` (even
/// element) and `(x1, y1)` (odd element), the odd one first.
#[inline(always)]
pub fn dp_lane(acc: f32, x0: u16, x1: u16, y0: u16, y1: u16) -> f32 {
    let acc = ftz(daz(x1).mul_add(daz(y1), acc));
    ftz(daz(x0).mul_add(daz(y0), acc))
}

/// ggml's leftovers from `nb` on and the final rounding, after the two reductions
/// `r1`, `r2` (see the module docs).
#[inline(always)]
fn finish(r1: f32, r2: f32, w: &[u8], a: &[u16], nb: usize) -> f32 {
    let mut sumf = 0f64;
    sumf += f64::from(r1);
    sumf += f64::from(r2);
    for (i, &y) in a.iter().enumerate().skip(nb) {
        sumf += f64::from(bf16_to_f32(le_u16(w, 2 * i)) * bf16_to_f32(y));
    }
    sumf as f32
}

impl Quant for Bf16Weights {
    const TYPE: GgmlType = GgmlType::Bf16;
    const BLOCK_VALUES: usize = 1;
    const BLOCK_BYTES: usize = 2;
    type Act = act::Bf16;

    fn dequantize_block(b: &[u8], out: &mut [f32]) {
        out[0] = bf16_to_f32(le_u16(b, 0));
    }

    fn vec_dot(isa: Isa, w: &[u8], a: &[u16]) -> f32 {
        let nb = a.len() / STEP * STEP;
        assert!(
            w.len() >= 2 * a.len(),
            "weight row shorter than the activations"
        );
        #[cfg(target_arch = "x86_64")]
        {
            if isa == Isa::Avx512 && std::is_x86_feature_detected!("avx512bf16") {
                // SAFETY: AVX-512 F and BF16 were detected; the loads stay within the
                // first `nb` values of both rows.
                let (r1, r2) = unsafe { x86::main_avx512bf16(w, a, nb) };
                return finish(r1, r2, w, a, nb);
            }
            if isa.has_avx2() {
                // SAFETY: `has_avx2` means AVX2 and FMA were detected; as above.
                let (r1, r2) = unsafe { x86::main_avx2(w, a, nb) };
                return finish(r1, r2, w, a, nb);
            }
        }
        let _ = isa;
        let mut c = [[0f32; 16]; 2];
        for i in (0..nb).step_by(STEP) {
            for (h, acc) in c.iter_mut().enumerate() {
                for (l, v) in acc.iter_mut().enumerate() {
                    let e = i + 32 * h + 2 * l;
                    let (x0, x1) = (le_u16(w, 2 * e), le_u16(w, 2 * e + 2));
                    *v = dp_lane(*v, x0, x1, a[e], a[e + 1]);
                }
            }
        }
        finish(reduce_add_16(&c[0]), reduce_add_16(&c[1]), w, a, nb)
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use super::STEP;
    use crate::lanes::x86::{reduce_add_16, reduce_add_ps_512};
    use std::arch::x86_64::*;

    /// Lanes whose exponent bits are zero (zero or denormal) become zero of their sign.
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn flush(v: __m256i) -> __m256i {
        let exp = _mm256_and_si256(v, _mm256_set1_epi32(0x7f80_0000));
        let tiny = _mm256_cmpeq_epi32(exp, _mm256_setzero_si256());
        _mm256_andnot_si256(_mm256_and_si256(tiny, _mm256_set1_epi32(0x7fff_ffff)), v)
    }

    /// The odd bf16 of each pair of `v`, widened, DAZ.
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn odd(v: __m256i) -> __m256 {
        let hi = _mm256_set1_epi32(0xffff_0000u32 as i32);
        _mm256_castsi256_ps(flush(_mm256_and_si256(v, hi)))
    }

    /// The even bf16 of each pair of `v`, widened, DAZ.
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn even(v: __m256i) -> __m256 {
        _mm256_castsi256_ps(flush(_mm256_slli_epi32::<16>(v)))
    }

    /// `fma(a, b, acc)`, FTZ.
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn fma_ftz(a: __m256, b: __m256, acc: __m256) -> __m256 {
        _mm256_castsi256_ps(flush(_mm256_castps_si256(_mm256_fmadd_ps(a, b, acc))))
    }

    /// `vdpbf16ps` on eight lanes: `acc` and the sixteen bf16 values at `x`, `y`.
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn dp8(acc: __m256, x: *const u8, y: *const u16) -> __m256 {
        let vx = _mm256_loadu_si256(x as *const __m256i);
        let vy = _mm256_loadu_si256(y as *const __m256i);
        let acc = fma_ftz(odd(vx), odd(vy), acc);
        fma_ftz(even(vx), even(vy), acc)
    }

    /// Thirty-two bf16 values at `p`.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bf16")]
    unsafe fn load32(p: *const u8) -> __m512bh {
        std::mem::transmute::<__m512i, __m512bh>(_mm512_loadu_si512(p as *const _))
    }

    /// The main loop, `vdpbf16ps` emulated with each sixteen-lane accumulator as two
    /// `__m256`; returns the two reductions.
    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn main_avx2(w: &[u8], a: &[u16], nb: usize) -> (f32, f32) {
        let (x, y) = (w.as_ptr(), a.as_ptr());
        let mut c = [[_mm256_setzero_ps(); 2]; 2];
        for i in (0..nb).step_by(STEP) {
            for (h, acc) in c.iter_mut().enumerate() {
                for (q, v) in acc.iter_mut().enumerate() {
                    let e = i + 32 * h + 16 * q;
                    *v = dp8(*v, x.add(2 * e), y.add(e));
                }
            }
        }
        (
            reduce_add_16(c[0][0], c[0][1]),
            reduce_add_16(c[1][0], c[1][1]),
        )
    }

    /// ggml's own main loop (`_mm512_dpbf16_ps`); returns the two reductions.
    #[target_feature(enable = "avx512f,avx512bf16,avx2,fma")]
    pub(super) unsafe fn main_avx512bf16(w: &[u8], a: &[u16], nb: usize) -> (f32, f32) {
        let (x, y) = (w.as_ptr(), a.as_ptr());
        let (mut c1, mut c2) = (_mm512_setzero_ps(), _mm512_setzero_ps());
        for i in (0..nb).step_by(STEP) {
            let (xp, yp) = (x.add(2 * i), y.add(i) as *const u8);
            c1 = _mm512_dpbf16_ps(c1, load32(xp), load32(yp));
            c2 = _mm512_dpbf16_ps(c2, load32(xp.add(64)), load32(yp.add(64)));
        }
        (reduce_add_ps_512(c1), reduce_add_ps_512(c2))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kernels_agree_and_match_dequantized_dot() {
        crate::testing::check_type::<super::Bf16Weights>(candle_core::quantized::GgmlDType::BF16);
    }

    #[test]
    fn equals_llama_cpp() {
        use crate::testing::{golden_w, quantize};
        crate::testing::check_golden::<super::Bf16Weights>(
            |n| quantize(&golden_w(n), 1, n, candle_core::quantized::GgmlDType::BF16).0,
            &[
                (7, 0x3f19fea0),
                (13, 0x3ddd1c00),
                (64, 0x403b63fa),
                (71, 0x3fe0c9f4),
                (85, 0x3fba2b72),
                (100, 0x3fbd1847),
                (200, 0x4002b8ed),
                (333, 0xbe170cf0),
            ],
        );
    }

    /// bf16 bits of `2^e` (`e` in `-126..128`) and of the denormal `2^e` (`e` in `-133..-126`).
    fn pow2(e: i32) -> u16 {
        if e >= -126 {
            ((e + 127) as u16) << 7
        } else {
            1 << (e + 133)
        }
    }

    /// One step's lane-0 values: `(x_even, x_odd, y_even, y_odd)`.
    type Step = (u16, u16, u16, u16);

    /// `vdpbf16ps`'s rounding, denormal handling and pair order on lane 0 (every other
    /// lane zero, so the result is lane 0 exactly), for every instruction set — on a CPU
    /// with AVX512_BF16 that includes the instruction itself.
    #[test]
    fn dpbf16_semantics() {
        let one = pow2(0);
        let neg_one = one | 0x8000;
        // (steps, expected lane 0).
        let cases: [(&[Step], f32); 6] = [
            // DAZ on the even input: 2^-119 + 2^-127 (denormal) → 2^-119.
            (&[(pow2(-127), pow2(-119), one, one)], 2f32.powi(-119)),
            // DAZ on the odd input: denormal 2^-127 · 2^10 → 0, not 2^-117.
            (&[(0, pow2(-127), 0, pow2(10))], 0.0),
            // FTZ on the first FMA: 2^-130 → 0, then + 2^-120.
            (
                &[(pow2(-60), pow2(-65), pow2(-60), pow2(-65))],
                2f32.powi(-120),
            ),
            // FTZ on the second FMA: 2^-130 → 0.
            (&[(pow2(-65), 0, pow2(-65), 0)], 0.0),
            // The odd product first: 2^24 + 1 → 2^24, − 1 → 2^24 − 1 (even first, or one
            // rounding of both products, would give 2^24).
            (
                &[(0, pow2(12), 0, pow2(12)), (neg_one, one, one, one)],
                16_777_215.0,
            ),
            // Each FMA rounds: (2^24 + 1) + 1 → 2^24 + 2 only with one rounding.
            (
                &[(0, pow2(12), 0, pow2(12)), (one, one, one, one)],
                16_777_216.0,
            ),
        ];
        for (steps, expected) in cases {
            let n = STEP * steps.len();
            let (mut w, mut a) = (vec![0u8; 2 * n], vec![0u16; n]);
            for (s, &(x0, x1, y0, y1)) in steps.iter().enumerate() {
                let e = s * STEP;
                w[2 * e..2 * e + 2].copy_from_slice(&x0.to_le_bytes());
                w[2 * e + 2..2 * e + 4].copy_from_slice(&x1.to_le_bytes());
                (a[e], a[e + 1]) = (y0, y1);
            }
            for isa in Isa::available() {
                let got = Bf16Weights::vec_dot(isa, &w, &a);
                assert_eq!(
                    got.to_bits(),
                    expected.to_bits(),
                    "{steps:?} on {isa:?}: {got:e}"
                );
            }
        }
    }
}
