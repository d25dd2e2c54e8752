//! Q4_0 weights × Q8_0 activations (`block_q4_0`: f16 `d`, 16 bytes of nibbles; byte `j`
//! holds value `j` in its low nibble and value `j + 16` in its high one; value
//! `d · (q − 8)`).
//!
//! ggml's order (`ggml_vec_dot_q4_0_q8_0`, `ggml-cpu/arch/x86/quants.c`, AVX2 branch):
//! per block, `d = f16→f32(d_w) · d_a`, eight lanes of exact 4-product sums of `q − 8`
//! with the activation quants, `acc = fma(d, v, acc)`; the result is `hsum_float_8(acc)`.
//! llama.cpp repacks Q4_0 matrices whose row count is a multiple of 8 on AVX2 CPUs
//! (`ggml-cpu/repack.cpp`); their products take `legacy::repacked_rows`'s order
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
    repacked: repacked_rows,
    vnni: crate::tiles::x86::Vnni<avx2::Avx2>,
    biased: avx2::Avx2
);

/// `legacy::repacked_rows`, through the AVX2 tile when the CPU has it.
fn repacked_rows(
    isa: crate::Isa,
    w: &[u8],
    a: &crate::Activations<crate::act::Q8_0>,
    rows: std::ops::Range<usize>,
    out: &mut [f32],
) {
    #[cfg(target_arch = "x86_64")]
    if isa.has_avx2() {
        // SAFETY: `has_avx2` means AVX2, FMA and F16C were detected.
        return unsafe { crate::tiles::in_tiles::<_, avx2::Repacked>(w, a, rows, out) };
    }
    let _ = isa;
    crate::legacy::repacked_rows(w, a, rows, out, BYTES, unpack);
}

#[cfg(target_arch = "x86_64")]
mod avx2 {
    //! The AVX2 kernel: [`signed_dots`] with this type's block unpacking, for one row
    //! (`vec_dot`) or a tile of rows.
    use super::BYTES;
    use crate::act::Q8Block;
    use crate::block_tiles::BiasedBlock;
    use crate::lanes::x86::bytes_from_nibbles_32;
    use crate::tiles::x86::{repacked_dots, signed_dots, LegacyBlock};
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

    impl BiasedBlock for Avx2 {
        const BIAS: u8 = 8;
        /// `q` itself: the nibble.
        #[inline]
        #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma")]
        unsafe fn biased(p: *const u8) -> __m256i {
            bytes_from_nibbles_32(p.add(2))
        }
    }

    impl RowTile for Avx2 {
        type Block = Q8Block;
        unsafe fn dots<const R: usize>(w: &[u8], a: [&[Q8Block]; R]) -> [f32; R] {
            signed_dots::<Self, R>(w, a)
        }
    }

    /// The repacked kernels' order ([`repacked_dots`]).
    pub(super) struct Repacked;

    impl RowTile for Repacked {
        type Block = Q8Block;
        unsafe fn dots<const R: usize>(w: &[u8], a: [&[Q8Block]; R]) -> [f32; R] {
            repacked_dots::<Avx2, R>(w, a)
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::{Activations, Isa, Path, Quant};

    #[test]
    fn repacked_path_is_the_same_on_every_isa() {
        use crate::testing::{quantize, random};
        let (n, k, r) = (3, 160, 13);
        let (w, _) = quantize(
            &random(n * k, 1),
            n,
            k,
            candle_core::quantized::GgmlDType::Q4_0,
        );
        let a = Activations::<crate::act::Q8_0>::quantize(&random(r * k, 2), r, k).expect("a");
        for wr in w.chunks_exact(w.len() / n) {
            let mut want = vec![0f32; r];
            crate::legacy::repacked_rows(wr, &a, 0..r, &mut want, super::BYTES, super::unpack);
            for isa in Isa::available() {
                for p in [Path::Gemv, Path::Gemm] {
                    let mut got = vec![0f32; r];
                    super::Q4_0::path_rows(isa, p, wr, &a, 0..r, &mut got);
                    assert_eq!(got, want, "{} {p:?}", isa.name());
                }
            }
        }
    }

    #[test]
    fn kernels_agree_and_match_dequantized_dot() {
        crate::testing::check_type::<super::Q4_0>(candle_core::quantized::GgmlDType::Q4_0);
    }
}
