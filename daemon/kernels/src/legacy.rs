//! What the five 32-value types share: an f16 scale `d` at byte 0 (and, for Q4_1/Q5_1,
//! an f16 minimum `m` at byte 2), 32 values unpacked per block, ggml's eight-lane
//! `acc = fma(d_w · d_a, Σ₄ q·y, acc)` (plus `summs = fma(m, s_a, summs)` for the types
//! with a minimum), `hsum_float_8`; and the `Quant` impl around them ([`legacy_quant!`]),
//! so each type module holds only its block layout, its unpacking and its AVX2 tile.

use crate::act::Q8Block;
use crate::half::le_f16;
use crate::lanes::{fma_splat, hsum_float_8, quad_dots, to_f32, Lanes};

/// The portable dot product of a type with signed values `d · q` (Q4_0, Q5_0, Q8_0).
#[inline(always)]
pub fn signed_dot(w: &[u8], a: &[Q8Block], bytes: usize, unpack: fn(&[u8]) -> [i8; 32]) -> f32 {
    let mut acc: Lanes = [0.0; 8];
    for (wb, ab) in w.chunks_exact(bytes).zip(a) {
        let d = le_f16(wb, 0) * ab.d;
        fma_splat(&mut acc, d, &to_f32(&quad_dots(&unpack(wb), &ab.qs)));
    }
    hsum_float_8(&acc)
}

/// The portable dot product of a type with values `d · q + m` (Q4_1, Q5_1; Q8_1
/// activations): `hsum_float_8(acc) + Σ fma(m, s_a)`.
#[inline(always)]
pub fn min_dot(w: &[u8], a: &[Q8Block], bytes: usize, unpack: fn(&[u8]) -> [i8; 32]) -> f32 {
    let mut acc: Lanes = [0.0; 8];
    let mut summs = 0f32;
    for (wb, ab) in w.chunks_exact(bytes).zip(a) {
        let d = le_f16(wb, 0) * ab.d;
        summs = le_f16(wb, 2).mul_add(ab.s, summs);
        fma_splat(&mut acc, d, &to_f32(&quad_dots(&unpack(wb), &ab.qs)));
    }
    hsum_float_8(&acc) + summs
}

/// `out[i] = w · a_{rows.start + i}` in the order of llama.cpp's repacked Q4_0 kernels
/// (`gemv_q4_b32_8x8_q8_0_lut_avx` and `gemm_q4_b32_8x8_q8_0_lut_avx`,
/// `ggml-cpu/arch/x86/repack.cpp`; gemm and gemv round alike and their activations are
/// quantized alike, `ggml_quantize_mat_q8_0_4x8` = `quantize_row_q8_0`): per block one
/// exact integer sum `Σ q·y` and `acc = fma(f32(sum), d_w · d_a, acc)` — one chain, no
/// lanes, no horizontal sum.
pub fn repacked_rows(
    w: &[u8],
    a: &crate::Activations<crate::act::Q8_0>,
    rows: std::ops::Range<usize>,
    out: &mut [f32],
    bytes: usize,
    unpack: fn(&[u8]) -> [i8; 32],
) {
    for (o, j) in out.iter_mut().zip(rows) {
        let mut acc = 0f32;
        for (wb, ab) in w.chunks_exact(bytes).zip(a.row(j)) {
            let sum: i32 = quad_dots(&unpack(wb), &ab.qs).iter().sum();
            acc = (sum as f32).mul_add(le_f16(wb, 0) * ab.d, acc);
        }
        *o = acc;
    }
}

/// The `Quant` impl of a 32-value type: `$t` with ggml type `$ggml`, `$bytes` per block,
/// activations `$act` (`Q8_0` for the signed family, `Q8_1` with a minimum), `$unpack`
/// giving the block's 32 values as `i8` (`q − offset` signed, or unsigned `q`), `$deq`
/// the dequantization of one value, and the module's `avx2::Avx2` tile. Optional:
/// `repacked` for the type llama.cpp repacks (Q4_0: its `repacked_rows(isa, w, a, rows,
/// out)`, in [`repacked_rows`]'s order, on its Gemv and Gemm paths); for the signed
/// types `vnni`, their AVX-512 VNNI one-weight-row tile ([`crate::tiles::x86::Vnni`]),
/// and `biased`, their unpacking for the tiles of several weight rows
/// ([`crate::block_tiles::block_rows`], behind `vec_dot_block`).
macro_rules! legacy_quant {
    ($t:ident, $ggml:expr, $bytes:expr, $act:ident, $unpack:path, $dot:path, $deq:expr $(, repacked: $rep:path)? $(, vnni: $vnni:ty, biased: $biased:ty)?) => {
        impl $crate::Quant for $t {
            const TYPE: $crate::GgmlType = $ggml;
            const BLOCK_VALUES: usize = 32;
            const BLOCK_BYTES: usize = $bytes;
            type Act = $crate::act::$act;

            fn dequantize_block(b: &[u8], out: &mut [f32]) {
                let deq: fn(&[u8], i8) -> f32 = $deq;
                for (o, q) in out.iter_mut().zip($unpack(b)) {
                    *o = deq(b, q);
                }
            }

            fn vec_dot(isa: $crate::Isa, w: &[u8], a: &[$crate::act::Q8Block]) -> f32 {
                $(
                #[cfg(target_arch = "x86_64")]
                if isa == $crate::Isa::Avx512 {
                    // SAFETY: `Isa::Avx512` means AVX-512 F/BW/VL/VNNI, AVX2, FMA and F16C.
                    return unsafe { <$vnni as $crate::tiles::RowTile>::dots::<1>(w, [a])[0] };
                }
                )?
                #[cfg(target_arch = "x86_64")]
                if isa.has_avx2() {
                    // SAFETY: `has_avx2` means AVX2, FMA and F16C were detected.
                    return unsafe { <avx2::Avx2 as $crate::tiles::RowTile>::dots::<1>(w, [a])[0] };
                }
                let _ = isa;
                $dot(w, a, $bytes, $unpack)
            }

            fn vec_dot_rows(
                isa: $crate::Isa,
                w: &[u8],
                a: &$crate::Activations<$crate::act::$act>,
                rows: std::ops::Range<usize>,
                out: &mut [f32],
            ) {
                $(
                #[cfg(target_arch = "x86_64")]
                if isa == $crate::Isa::Avx512 {
                    // SAFETY: `Isa::Avx512` means AVX-512 F/BW/VL/VNNI, AVX2, FMA and F16C.
                    return unsafe { $crate::tiles::in_tiles::<_, $vnni>(w, a, rows, out) };
                }
                )?
                #[cfg(target_arch = "x86_64")]
                if isa.has_avx2() {
                    // SAFETY: `has_avx2` means AVX2, FMA and F16C were detected.
                    return unsafe { $crate::tiles::in_tiles::<_, avx2::Avx2>(w, a, rows, out) };
                }
                $crate::tiles::each_row::<Self>(isa, w, a, rows, out);
            }

            $(
            fn vec_dot_block(
                isa: $crate::Isa,
                w: &[u8],
                row_bytes: usize,
                a: &$crate::Activations<$crate::act::$act>,
                rows: std::ops::Range<usize>,
                out: &mut [f32],
                stride: usize,
            ) {
                let n = w.len() / row_bytes.max(1);
                <Self as $crate::Quant>::vec_dot_block_in(
                    isa, w, row_bytes, 1, 0..n, a, rows, out, stride,
                )
            }

            #[allow(clippy::too_many_arguments)]
            fn vec_dot_block_in(
                isa: $crate::Isa,
                w: &[u8],
                row_bytes: usize,
                group: $crate::layout::Interleave,
                features: std::ops::Range<usize>,
                a: &$crate::Activations<$crate::act::$act>,
                rows: std::ops::Range<usize>,
                out: &mut [f32],
                stride: usize,
            ) {
                #[cfg(target_arch = "x86_64")]
                if isa == $crate::Isa::Avx512 && row_bytes % $bytes == 0 {
                    let need = features.len().saturating_sub(1) * stride + rows.len();
                    assert!(out.len() >= need, "output of {} values, {need} needed", out.len());
                    // SAFETY: `Isa::Avx512` means AVX-512 F/BW/VL/VNNI, AVX2, FMA and
                    // F16C; whole blocks per row and the output length are checked here,
                    // the rows inside `w` by `block_rows_in`.
                    return unsafe {
                        $crate::block_tiles::block_rows_in::<$biased>(
                            w, row_bytes, group, features, a, rows, out, stride,
                        )
                    };
                }
                for (i, r) in features.enumerate() {
                    let o = &mut out[i * stride..i * stride + rows.len()];
                    if group > 1 {
                        let wr = $crate::layout::row_of(w, row_bytes, $bytes, group, r);
                        <Self as $crate::Quant>::vec_dot_rows(isa, &wr, a, rows.clone(), o);
                    } else {
                        let wr = &w[r * row_bytes..(r + 1) * row_bytes];
                        <Self as $crate::Quant>::vec_dot_rows(isa, wr, a, rows.clone(), o);
                    }
                }
            }

            #[allow(clippy::too_many_arguments)]
            fn vec_dot_block_rows(
                isa: $crate::Isa,
                w: &[u8],
                row_bytes: usize,
                group: $crate::layout::Interleave,
                features: std::ops::Range<usize>,
                a: &$crate::Activations<$crate::act::$act>,
                rows: std::ops::Range<usize>,
                out: &mut $crate::RowsOut<'_>,
            ) -> bool {
                #[cfg(target_arch = "x86_64")]
                if isa == $crate::Isa::Avx512 && row_bytes % $bytes == 0 {
                    // SAFETY: `Isa::Avx512` means AVX-512 F/BW/VL/VNNI, AVX2, FMA and
                    // F16C; whole blocks per row are checked here, the rows inside `w`
                    // and the outputs by `block_rows_to`.
                    unsafe {
                        $crate::block_tiles::block_rows_to::<$biased>(
                            w, row_bytes, group, features, a, rows, out,
                        )
                    };
                    return true;
                }
                let _ = (isa, w, row_bytes, group, features, a, rows, out);
                false
            }
            )?

            $(
            fn path_rows(
                isa: $crate::Isa,
                path: $crate::Path,
                w: &[u8],
                a: &$crate::Activations<$crate::act::$act>,
                rows: std::ops::Range<usize>,
                out: &mut [f32],
            ) {
                match path {
                    $crate::Path::Gemv | $crate::Path::Gemm => $rep(isa, w, a, rows, out),
                    $crate::Path::VecDot | $crate::Path::Tiled | $crate::Path::Sgemm => {
                        <Self as $crate::Quant>::vec_dot_rows(isa, w, a, rows, out)
                    }
                }
            }
            )?
        }
    };
}
pub(crate) use legacy_quant;
