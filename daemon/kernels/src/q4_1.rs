//! Q4_1 weights × Q8_1 activations (`block_q4_1`, 20 bytes: f16 `d`, f16 `m`, 16 bytes
//! of nibbles; byte `j` holds value `j` in its low nibble and value `j + 16` in its high
//! one; value `q · d + m`, `q` in `0..16`, one product and one sum, `dequantize_row_q4_1`
//! in `ggml/src/ggml-quants.c` — ggml-base is built without `-march`, so not an FMA).
//!
//! ggml's order (`ggml_vec_dot_q4_1_q8_1`, `ggml-cpu/arch/x86/quants.c`, `__AVX2__`
//! branch): per block, `d = f16→f32(d_w) · d_a`, `summs = fma(f16→f32(m_w), s_a, summs)`
//! (GCC contracts `summs += m · s`; both being f16 values, the product is exact and the
//! FMA equals the plain sum), eight lanes of exact 4-product sums of `q` with the
//! activation quants (`mul_sum_us8_pairs_float`; VNNI's `vpdpbusd` gives the same
//! integers), `acc = fma(d, v, acc)`; the result is `hsum_float_8(acc) + summs`.

use crate::half::le_f16;
use crate::lanes::{as_i8, nibbles_32};
use crate::GgmlType;

/// The Q4_1 weight type.
pub struct Q4_1;

const BYTES: usize = 20;

/// The 32 unsigned values `q` of a block (as `i8`, all below 16), in value order.
#[inline(always)]
fn unpack(b: &[u8]) -> [i8; 32] {
    as_i8(nibbles_32(&b[4..BYTES]))
}

crate::legacy::legacy_quant!(
    Q4_1,
    GgmlType::Q4_1,
    BYTES,
    Q8_1,
    unpack,
    crate::legacy::min_dot,
    |b, q| f32::from(q) * le_f16(b, 0) + le_f16(b, 2)
);

#[cfg(target_arch = "x86_64")]
mod avx2 {
    //! The AVX2 kernel: [`unsigned_dots`] with this type's block unpacking, for one row
    //! (`vec_dot`) or a tile of rows.
    use super::BYTES;
    use crate::act::Q8Block;
    use crate::lanes::x86::bytes_from_nibbles_32;
    use crate::tiles::x86::{unsigned_dots, LegacyBlock};
    use crate::tiles::RowTile;
    use std::arch::x86_64::*;

    pub(super) struct Avx2;

    impl LegacyBlock for Avx2 {
        const BYTES: usize = BYTES;
        #[inline]
        #[target_feature(enable = "avx2,fma")]
        unsafe fn values(p: *const u8) -> __m256i {
            bytes_from_nibbles_32(p.add(4))
        }
    }

    impl RowTile for Avx2 {
        type Block = Q8Block;
        unsafe fn dots<const R: usize>(w: &[u8], a: [&[Q8Block]; R]) -> [f32; R] {
            unsigned_dots::<Self, R>(w, a)
        }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn kernels_agree_and_match_dequantized_dot() {
        crate::testing::check_type::<super::Q4_1>(candle_core::quantized::GgmlDType::Q4_1);
    }

    #[test]
    fn equals_llama_cpp() {
        use crate::testing::{check_golden, golden_legacy};
        check_golden::<super::Q4_1>(
            |n| golden_legacy(n, true, false),
            &[
                (32, 0x3ede7a53),
                (96, 0x3c0f3000),
                (256, 0x4054bae4),
                (1024, 0x4169f977),
                (4096, 0x427d6a54),
            ],
        );
    }
}
