//! Q8_0 weights × Q8_0 activations (`block_q8_0`: f16 `d`, 32 `i8` quants; value
//! `d · q`).
//!
//! ggml's order (`ggml_vec_dot_q8_0_q8_0`, `ggml-cpu/arch/x86/quants.c`, AVX2 branch):
//! per block, `d = f16→f32(d_w) · d_a` (one f32 product), eight lanes of exact 4-product
//! integer sums `v`, `acc = fma(d, v, acc)`; the result is `hsum_float_8(acc)`.

use crate::act::{self, Q8Block};
use crate::half::le_f16;
use crate::lanes::{fma_splat, hsum_float_8, quad_dots, to_f32, Lanes};
use crate::{GgmlType, Isa, Quant};

/// The Q8_0 weight type.
pub struct Q8_0;

const BYTES: usize = 34;

impl Quant for Q8_0 {
    const TYPE: GgmlType = GgmlType::Q8_0;
    const BLOCK_VALUES: usize = 32;
    const BLOCK_BYTES: usize = BYTES;
    type Act = act::Q8_0;

    fn dequantize_block(b: &[u8], out: &mut [f32]) {
        let d = le_f16(b, 0);
        for (o, &q) in out.iter_mut().zip(&b[2..BYTES]) {
            *o = f32::from(q as i8) * d;
        }
    }

    fn vec_dot(isa: Isa, w: &[u8], a: &[Q8Block]) -> f32 {
        #[cfg(target_arch = "x86_64")]
        if isa.has_avx2() {
            // SAFETY: `has_avx2` means AVX2 and FMA were detected.
            return unsafe { avx2::vec_dot(w, a) };
        }
        let _ = isa;
        let mut acc: Lanes = [0.0; 8];
        for (wb, ab) in w.chunks_exact(BYTES).zip(a) {
            let d = le_f16(wb, 0) * ab.d;
            let mut q = [0i8; 32];
            for (q, &b) in q.iter_mut().zip(&wb[2..]) {
                *q = b as i8;
            }
            fma_splat(&mut acc, d, &to_f32(&quad_dots(&q, &ab.qs)));
        }
        hsum_float_8(&acc)
    }
}

#[cfg(target_arch = "x86_64")]
mod avx2 {
    use super::BYTES;
    use crate::act::Q8Block;
    use crate::half::le_f16;
    use crate::lanes::x86::{hsum_float_8, mul_sum_i8_pairs_float};
    use std::arch::x86_64::*;

    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn vec_dot(w: &[u8], a: &[Q8Block]) -> f32 {
        let mut acc = _mm256_setzero_ps();
        for (wb, ab) in w.chunks_exact(BYTES).zip(a) {
            let d = _mm256_set1_ps(le_f16(wb, 0) * ab.d);
            let qx = _mm256_loadu_si256(wb.as_ptr().add(2) as *const __m256i);
            let qy = _mm256_loadu_si256(ab.qs.as_ptr() as *const __m256i);
            acc = _mm256_fmadd_ps(d, mul_sum_i8_pairs_float(qx, qy), acc);
        }
        hsum_float_8(acc)
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn kernels_agree_and_match_dequantized_dot() {
        crate::testing::check_type::<super::Q8_0>(candle_core::quantized::GgmlDType::Q8_0);
    }
}
