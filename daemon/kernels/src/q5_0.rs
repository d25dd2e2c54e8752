//! Q5_0 weights × Q8_0 activations (`block_q5_0`, 22 bytes: f16 `d`, 4 bytes `qh` (a
//! little-endian `u32` whose bit `i` is value `i`'s fifth bit), 16 bytes of nibbles (byte
//! `j`: value `j` low, value `j + 16` high); value `d · (q − 16)`, `q` in `0..32`,
//! `dequantize_row_q5_0` in `ggml/src/ggml-quants.c`).
//!
//! ggml's order (`ggml_vec_dot_q5_0_q8_0`, `ggml-cpu/arch/x86/quants.c`, `__AVX2__`
//! branch): per block, `d = f16→f32(d_w) · d_a`, eight lanes of exact 4-product sums of
//! `q − 16` with the activation quants (`mul_sum_i8_pairs_float`), `acc = fma(d, v,
//! acc)`; the result is `hsum_float_8(acc)`.

use crate::half::le_f16;
use crate::lanes::q5_values;
use crate::GgmlType;

/// The Q5_0 weight type.
pub struct Q5_0;

const BYTES: usize = 22;

/// The 32 signed values `q − 16` of a block, in value order.
#[inline(always)]
fn unpack(b: &[u8]) -> [i8; 32] {
    q5_values(&b[2..6], &b[6..BYTES]).map(|q| q as i8 - 16)
}

crate::legacy::legacy_quant!(
    Q5_0,
    GgmlType::Q5_0,
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
    use crate::lanes::x86::{bytes_from_nibbles_32, bytes_from_q5_32};
    use crate::tiles::x86::{signed_dots, LegacyBlock};
    use crate::tiles::RowTile;
    use std::arch::x86_64::*;

    pub(super) struct Avx2;

    impl LegacyBlock for Avx2 {
        const BYTES: usize = BYTES;
        #[inline]
        #[target_feature(enable = "avx2,fma")]
        unsafe fn values(p: *const u8) -> __m256i {
            _mm256_sub_epi8(bytes_from_q5_32(p.add(6), p.add(2)), _mm256_set1_epi8(16))
        }
        /// The same bytes with the high bits as a mask register: byte `j` is the nibble
        /// where bit `j` of `qh` is set, the nibble − 16 where it is not (ggml's
        /// `or(nibbles, andnot(bits, 0xf0))`).
        #[inline]
        #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma")]
        unsafe fn values_512(p: *const u8) -> __m256i {
            let nib = bytes_from_nibbles_32(p.add(6));
            let qh = std::ptr::read_unaligned(p.add(2) as *const u32);
            _mm256_mask_mov_epi8(_mm256_sub_epi8(nib, _mm256_set1_epi8(16)), qh, nib)
        }
    }

    impl BiasedBlock for Avx2 {
        const BIAS: u8 = 16;
        /// `q` itself: the nibble, plus 16 where bit `j` of `qh` is set.
        #[inline]
        #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma")]
        unsafe fn biased(p: *const u8) -> __m256i {
            let nib = bytes_from_nibbles_32(p.add(6));
            let qh = std::ptr::read_unaligned(p.add(2) as *const u32);
            _mm256_mask_add_epi8(nib, qh, nib, _mm256_set1_epi8(16))
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
        crate::testing::check_type::<super::Q5_0>(candle_core::quantized::GgmlDType::Q5_0);
    }

    #[test]
    fn equals_llama_cpp() {
        use crate::testing::{check_golden, golden_legacy};
        check_golden::<super::Q5_0>(
            |n| golden_legacy(n, false, true),
            &[
                (32, 0x3e9d4374),
                (96, 0x3f4123f2),
                (256, 0xbf4b4bbe),
                (1024, 0xbf029ae0),
                (4096, 0xc0b68806),
            ],
        );
    }
}
