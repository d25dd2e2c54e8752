//! Q4_0 weights × Q8_0 activations (`block_q4_0`: f16 `d`, 16 bytes of nibbles; byte `j`
//! holds value `j` in its low nibble and value `j + 16` in its high one; value
//! `d · (q − 8)`).
//!
//! ggml's order (`ggml_vec_dot_q4_0_q8_0`, `ggml-cpu/arch/x86/quants.c`, AVX2 branch):
//! per block, `d = f16→f32(d_w) · d_a`, eight lanes of exact 4-product sums of `q − 8`
//! with the activation quants, `acc = fma(d, v, acc)`; the result is `hsum_float_8(acc)`.
//! llama.cpp repacks Q4_0 matrices whose row count is a multiple of 8 on AVX2 CPUs
//! (`ggml-cpu/repack.cpp`); their products take [`crate::legacy::repacked_rows`]'s order
//! ([`crate::Path::Gemv`], [`crate::Path::Gemm`]).

use crate::half::le_f16;
use crate::GgmlType;

/// The Q4_0 weight type.
pub struct Q4_0;

const BYTES: usize = 18;

/// The 32 signed values `q − 8` of a block, in value order.
#[inline(always)]
fn unpack(b: &[u8]) -> [i8; 32] {
    let mut q = [0i8; 32];
    for j in 0..16 {
        q[j] = (b[2 + j] & 0x0f) as i8 - 8;
        q[j + 16] = (b[2 + j] >> 4) as i8 - 8;
    }
    q
}

crate::legacy::legacy_quant!(
    Q4_0,
    GgmlType::Q4_0,
    BYTES,
    Q8_0,
    unpack,
    crate::legacy::signed_dot,
    |b, q| f32::from(q) * le_f16(b, 0),
    repacked: crate::legacy::repacked_rows
);

#[cfg(target_arch = "x86_64")]
mod avx2 {
    //! The AVX2 kernel: [`signed_dots`] with this type's block unpacking, for one row
    //! (`vec_dot`) or a tile of rows.
    use super::BYTES;
    use crate::act::Q8Block;
    use crate::lanes::x86::bytes_from_nibbles_32;
    use crate::tiles::x86::{signed_dots, LegacyBlock};
    use crate::tiles::RowTile;
    use std::arch::x86_64::*;

    pub(super) struct Avx2;

    impl LegacyBlock for Avx2 {
        const BYTES: usize = BYTES;
        #[inline]
        #[target_feature(enable = "avx2,fma")]
        unsafe fn values(p: *const u8) -> __m256i {
            _mm256_sub_epi8(bytes_from_nibbles_32(p.add(2)), _mm256_set1_epi8(8))
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
        crate::testing::check_type::<super::Q4_0>(candle_core::quantized::GgmlDType::Q4_0);
    }
}
