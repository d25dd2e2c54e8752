//! Which kernel llama.cpp's CPU backend runs for an activation row.
//!
//! llama.cpp does not compute every matrix product with `ggml_vec_dot_*`. On an x86 CPU
//! with AVX2 (and the AVX-512 build this crate follows) its `ggml_compute_forward_mul_mat`
//! takes, per product `W · X` with `X` the micro-batch's activations (`ne11` rows):
//!
//! - **Repacked** weights (`ggml-cpu/repack.cpp`, `ggml_repack_get_optimal_repack_type`):
//!   Q4_0 and Q4_K matrices whose row count `n` is a multiple of 8 (Q2_K too on AVX-512)
//!   are interleaved eight rows at a time at load time. `forward_mul_mat_one_chunk` then
//!   runs `ggml_gemm_*` on the first `ne11 − ne11 % 4` activation rows (quantized four at
//!   a time by `ggml_quantize_mat_*_4x8`) and `ggml_gemv_*` on the remaining ones
//!   ([`Path::Gemm`], [`Path::Gemv`]).
//! - **llamafile's tinyBLAS** (`ggml-cpu/llamafile/sgemm.cpp`, `llamafile_sgemm`): F16
//!   and F32 weights when the micro-batch has at least 2 rows and `k` is a multiple of
//!   the 16-float vector ([`Path::Sgemm`]; BF16 too, with `vdpbf16ps` over 32 values,
//!   not followed here: its rows keep `vec_dot`). The quantized types it also takes
//!   (Q8_0, Q5_0, …) sum as their `vec_dot` does, so they keep that path.
//! - **Tiled** K-quants (`ggml-cpu/tiled/tiled.cpp`, `ggml_compute_forward_mul_mat_tiled`):
//!   Q2_K–Q6_K matrices that are not repacked, when the micro-batch has at least 8 rows
//!   ([`Path::Tiled`]).
//! - Everything else: one `vec_dot` per output ([`Path::VecDot`]).
//!
//! Each path sums the same exact integers but rounds its float accumulation in its own
//! order, so llama.cpp's output for a row depends on the micro-batch the row was in.
//! [`BatchRow`] says where a row was; [`path`] gives llama.cpp's choice for it.

use crate::GgmlType;

/// The kernel llama.cpp runs for one activation row of one matrix product.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Path {
    /// `ggml_vec_dot_<w>_<a>` per output (each module's `vec_dot`).
    VecDot,
    /// The tiled K-quant kernel (`tiled-kernel.cpp`, its AVX-512 VNNI microkernel).
    Tiled,
    /// `ggml_gemv_<w>_8x8_<a>` on repacked weights.
    Gemv,
    /// `ggml_gemm_<w>_8x8_<a>` on repacked weights, activations quantized four rows at a
    /// time (`ggml_quantize_mat_<a>_4x8`).
    Gemm,
    /// llamafile's tinyBLAS: one sixteen-lane accumulator per output, `fma` over steps
    /// of 16 values, then `_mm512_reduce_add_ps` (`tinyBLAS::gemm_bloc`, `hsum`).
    Sgemm,
}

/// One activation row's place in llama.cpp's micro-batch (`ubatch`): row `index` of
/// `len` rows that go through the product together.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BatchRow {
    /// Row within the micro-batch.
    pub index: u32,
    /// Rows in the micro-batch (`ne11` of the product).
    pub len: u32,
}

impl BatchRow {
    /// A row computed alone (a decode step of one sequence).
    pub const SINGLE: BatchRow = BatchRow { index: 0, len: 1 };
}

/// Micro-batch rows from which the tiled kernel runs (`ggml_tiled_min_batch`).
pub const TILED_MIN_ROWS: u32 = 8;

/// Whether llama.cpp repacks a matrix of type `ty` with `n` rows (on AVX-512 x86).
pub fn repacked(ty: GgmlType, n: usize) -> bool {
    matches!(ty, GgmlType::Q4_0 | GgmlType::Q4K | GgmlType::Q2K) && n.is_multiple_of(8)
}

/// llama.cpp's kernel for `row` of a product with a `ty` matrix of `n` rows of `k`
/// values.
pub fn path(ty: GgmlType, n: usize, k: usize, row: BatchRow) -> Path {
    if matches!(ty, GgmlType::F16 | GgmlType::F32) {
        if row.len >= 2 && k.is_multiple_of(16) {
            Path::Sgemm
        } else {
            Path::VecDot
        }
    } else if repacked(ty, n) {
        if row.index < row.len - row.len % 4 {
            Path::Gemm
        } else {
            Path::Gemv
        }
    } else if ty.is_k_quant() && row.len >= TILED_MIN_ROWS {
        Path::Tiled
    } else {
        Path::VecDot
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(index: u32, len: u32) -> BatchRow {
        BatchRow { index, len }
    }

    #[test]
    fn llama_cpp_choices() {
        let path = |ty, n, row| super::path(ty, n, 576, row);
        assert_eq!(path(GgmlType::F16, 576, row(0, 2)), Path::Sgemm);
        assert_eq!(path(GgmlType::F16, 576, BatchRow::SINGLE), Path::VecDot);
        assert_eq!(super::path(GgmlType::F32, 8, 40, row(0, 9)), Path::VecDot);
        assert_eq!(path(GgmlType::Bf16, 576, row(0, 9)), Path::VecDot);
        // Repacked Q4_K (576 rows): gemm for whole groups of four, gemv for the tail.
        assert_eq!(path(GgmlType::Q4K, 576, row(0, 7)), Path::Gemm);
        assert_eq!(path(GgmlType::Q4K, 576, row(3, 7)), Path::Gemm);
        assert_eq!(path(GgmlType::Q4K, 576, row(4, 7)), Path::Gemv);
        assert_eq!(path(GgmlType::Q4K, 576, row(0, 3)), Path::Gemv);
        assert_eq!(path(GgmlType::Q4K, 576, BatchRow::SINGLE), Path::Gemv);
        // Q4_K with a row count that is not a multiple of 8: tiled from 8 rows.
        assert_eq!(path(GgmlType::Q4K, 100, row(0, 8)), Path::Tiled);
        assert_eq!(path(GgmlType::Q4K, 100, row(0, 7)), Path::VecDot);
        assert_eq!(path(GgmlType::Q6K, 576, row(5, 8)), Path::Tiled);
        assert_eq!(path(GgmlType::Q6K, 576, row(0, 7)), Path::VecDot);
        assert_eq!(path(GgmlType::Q4_0, 192, row(0, 4)), Path::Gemm);
        assert_eq!(path(GgmlType::Q4_0, 190, row(0, 4)), Path::VecDot);
        assert_eq!(path(GgmlType::Q8_0, 576, row(0, 64)), Path::VecDot);
        assert_eq!(path(GgmlType::Q5_0, 576, row(0, 64)), Path::VecDot);
    }
}
