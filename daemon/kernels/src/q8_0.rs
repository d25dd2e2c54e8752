//! Q8_0 weights × Q8_0 activations (`block_q8_0`: f16 `d`, 32 `i8` quants; value
//! `d · q`).
//!
//! ggml's order (`ggml_vec_dot_q8_0_q8_0`, `ggml-cpu/arch/x86/quants.c`, AVX2 branch):
//! per block, `d = f16→f32(d_w) · d_a` (one f32 product), eight lanes of exact 4-product
//! integer sums `v`, `acc = fma(d, v, acc)`; the result is `hsum_float_8(acc)`.

use crate::half::le_f16;
use crate::GgmlType;

/// The Q8_0 weight type.
pub struct Q8_0;

const BYTES: usize = 34;

/// The 32 quants of a block.
#[inline(always)]
fn unpack(b: &[u8]) -> [i8; 32] {
    std::array::from_fn(|i| b[2 + i] as i8)
}

crate::legacy::legacy_quant!(
    Q8_0,
    GgmlType::Q8_0,
    BYTES,
    Q8_0,
    unpack,
    crate::legacy::signed_dot,
    |b, q| f32::from(q) * le_f16(b, 0),
    vnni: crate::tiles::x86::Vnni<avx2::Avx2>,
    biased: avx2::Avx2
);

#[cfg(target_arch = "x86_64")]
mod avx2 {
    //! The AVX2 kernel: [`signed_dots`] with this type's block unpacking, for one row
    //! (`vec_dot`) or a tile of rows.
    use super::BYTES;
    use crate::act::Q8Block;
    use crate::block_tiles::BiasedBlock;
    use crate::tiles::x86::{signed_dots, LegacyBlock};
    use crate::tiles::RowTile;
    use std::arch::x86_64::*;

    pub(super) struct Avx2;

    impl LegacyBlock for Avx2 {
        const BYTES: usize = BYTES;
        #[inline]
        #[target_feature(enable = "avx2,fma")]
        unsafe fn values(p: *const u8) -> __m256i {
            _mm256_loadu_si256(p.add(2) as *const __m256i)
        }
    }

    impl BiasedBlock for Avx2 {
        const BIAS: u8 = 128;
        /// `q + 128` (quants are in `−127..=127`): the sign bit flipped.
        #[inline]
        #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma")]
        unsafe fn biased(p: *const u8) -> __m256i {
            _mm256_xor_si256(Self::values(p), _mm256_set1_epi8(-128))
        }
        /// The 32 quants in both halves, by one broadcast load.
        #[inline]
        #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma")]
        unsafe fn values_x2(p: *const u8) -> __m512i {
            _mm512_broadcast_i64x4(_mm256_loadu_si256(p.add(2) as *const __m256i))
        }
    }

    impl RowTile for Avx2 {
        type Block = Q8Block;
        unsafe fn dots<const R: usize>(w: &[u8], a: [&[Q8Block]; R]) -> [f32; R] {
            signed_dots::<Self, R>(w, a)
        }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn kernels_agree_and_match_dequantized_dot() {
        crate::testing::check_type::<super::Q8_0>(candle_core::quantized::GgmlDType::Q8_0);
    }
}
