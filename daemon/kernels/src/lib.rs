//! CPU matrix kernels for ggml's weight types, in ggml's arithmetic order.
//!
//! A GGUF linear weight is a matrix `W` of shape `(n, k)` (one output feature per row),
//! each row `k / B` blocks of `B` values in one of ggml's formats (`ggml/src/ggml-common.h`
//! of llama.cpp). `y = x · Wᵀ` is computed as llama.cpp's CPU backend computes it:
//! the activation rows `x` (`rows × k`, f32) are first converted to the weight type's
//! *activation format* (ggml's `vec_dot_type`: Q8_0, Q8_1, Q8_K, F16, BF16 or F32, see
//! [`act`]), then every output is one dot product of a weight row with an activation row
//! (ggml's `ggml_vec_dot_<w>_<a>`), whose float operations this crate performs in the
//! order llama.cpp's CPU backend performs them on an AVX-512 x86 machine built with
//! `GGML_NATIVE` (GCC, `-march=native`): the `__AVX2__` branches of
//! `ggml/src/ggml-cpu/arch/x86/quants.c` for the quantized types (with `vpdpbusd` where
//! its VNNI build uses it), the AVX-512 `GGML_SIMD` code of `ggml/src/ggml-cpu/vec.cpp`
//! for F16/BF16/F32. Where llama.cpp runs another kernel for a row of a batched product —
//! repacked Q4_0/Q4_K gemm and gemv, the tiled K-quant kernel, llamafile's tinyBLAS —
//! [`paths`] says which, from the row's place in llama.cpp's micro-batch, and
//! [`Quant::path_rows`] computes in that kernel's order ([`kbatch`] for the K-quants).
//!
//! Layout:
//! - [`Quant`]: one weight type — its block, activation format, dequantization (ggml's
//!   `dequantize_row_*`, the reference the tests hold kernels to) and dot product. One
//!   module per type ([`q4_0`], [`q4_1`], …); no module copies another's kernel.
//! - Shared pieces, once: [`isa`] (feature detection, chosen at start-up), [`half`]
//!   (f16/bf16 conversions), [`act`] (activation quantization), [`lanes`] (the 8-lane
//!   f32 accumulator and ggml's horizontal sum), [`tiles`] (one weight row against a tile
//!   of activation rows, for multi-row products).
//! - [`QuantMatrix`]: a weight matrix of any implemented type behind one object-safe
//!   interface ([`Kernel`]), with single-row (decode) and multi-row (prefill, batched
//!   decode) products over any range of output features, for the caller's thread team,
//!   each activation row on its [`Path`] ([`QuantMatrix::paths`],
//!   [`QuantMatrix::matmul_range_paths`]).
//! - What the daemon's model code calls: [`CpuMatrix`] (the layout per stored type:
//!   [`q4_1x4`] for Q4_1, [`GgmlMatrix`] — a [`QuantMatrix`] split over the thread team
//!   — for the others; [`tensor`] is their candle side), [`attention`] (paged attention
//!   over a KV cache's blocks), [`eltwise`] (ggml's element-wise numerics), [`ubatch`]
//!   (llama-server's micro-batch of a row) and [`team`] (the compute threads).
//!
//! Every SIMD path gives the same bits as its portable path (tested per type, odd shapes
//! included): the portable code performs the same float operations in the same order
//! (eight independent lanes, `mul_add` where ggml uses FMA).

pub mod act;
pub mod attention;
#[cfg(target_arch = "x86_64")]
pub mod block_tiles;
pub mod cpu_matrix;
pub mod eltwise;
pub mod expf;
pub mod ggml_matrix;
pub mod half;
pub mod isa;
pub mod kbatch;
pub mod lanes;
pub mod layout;
mod legacy;
mod matrix;
pub mod par;
pub mod paths;
pub mod rows_out;
pub mod team;
pub mod tensor;
pub mod tiles;
pub mod types;
pub mod ubatch;
mod x16_kernel;

pub mod bf16;
pub mod f16;
pub mod f32;
pub mod q2_k;
pub mod q3_k;
pub mod q4_0;
pub mod q4_1;
pub mod q4_1x4;
pub mod q4_k;
pub mod q4_k_x16;
pub mod q5_0;
pub mod q5_1;
pub mod q5_k;
pub mod q6_k;
pub mod q6_k_x16;
pub mod q8_0;

#[cfg(test)]
mod testing;
#[cfg(test)]
mod timing_tests;

pub use act::{ActFormat, Activations};
pub use cpu_matrix::CpuMatrix;
pub use ggml_matrix::GgmlMatrix;
pub use isa::Isa;
pub use matrix::{Kernel, QuantMatrix};
pub use paths::{BatchRow, Path};
pub use q4_1x4::Q4_1Matrix;
pub use rows_out::RowsOut;
pub use types::GgmlType;

/// Errors of this crate; each names what was given and what is allowed.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum KernelError {
    /// The weight type has no kernel here (IQ*, TQ*, MXFP4, …).
    #[error("weight type {0} is not supported (supported: {supported})", supported = GgmlType::SUPPORTED_NAMES)]
    Unsupported(String),
    /// A row length that is not a whole number of blocks.
    #[error("row length {k} is not a multiple of {ty}'s block of {block} values")]
    RowLength {
        ty: &'static str,
        k: usize,
        block: usize,
    },
    /// Weight bytes that do not match the shape.
    #[error("{ty} matrix ({n}, {k}) needs {expected} bytes, got {got}")]
    Bytes {
        ty: &'static str,
        n: usize,
        k: usize,
        expected: usize,
        got: usize,
    },
    /// Activations of the wrong length, format or width for the matrix.
    #[error("activations: {0}")]
    Activations(String),
    /// A row id outside the matrix (embedding lookup).
    #[error("row {id} is outside the matrix of {n} rows")]
    RowId { id: u32, n: usize },
}

/// One ggml weight type: its block layout, activation format, reference dequantization
/// and dot product.
///
/// Implementations live one per module; [`QuantMatrix`] runs any of them through the
/// object-safe [`Kernel`].
pub trait Quant: Send + Sync + 'static {
    /// The ggml type.
    const TYPE: GgmlType;
    /// Values per block (32 for the legacy types, 256 for the K-quants, 1 for floats).
    const BLOCK_VALUES: usize;
    /// Bytes per block, as in the GGUF file.
    const BLOCK_BYTES: usize;
    /// ggml's `vec_dot_type` for this weight type.
    type Act: ActFormat;

    /// ggml's `dequantize_row_<type>` for one block: `block` is `BLOCK_BYTES` bytes,
    /// `out` `BLOCK_VALUES` values.
    fn dequantize_block(block: &[u8], out: &mut [f32]);

    /// The dot product of one weight row (`k / BLOCK_VALUES` blocks of bytes) with one
    /// activation row of the same length `k`, in ggml's order (`ggml_vec_dot_*`).
    fn vec_dot(isa: Isa, w: &[u8], a: &[<Self::Act as ActFormat>::Block]) -> f32;

    /// Dot products of one weight row with several activation rows:
    /// `out[j] = vec_dot(w, a_rows[j])`. Types may override this to unpack a weight
    /// block once for all rows ([`tiles`]); the result must equal the one-row calls bit
    /// for bit.
    fn vec_dot_rows(
        isa: Isa,
        w: &[u8],
        a: &Activations<Self::Act>,
        rows: std::ops::Range<usize>,
        out: &mut [f32],
    ) {
        tiles::each_row::<Self>(isa, w, a, rows, out);
    }

    /// Dot products of several weight rows with several activation rows:
    /// `out[i · stride + (j − rows.start)] = vec_dot(w_i, a_j)` for the weight rows `w_i`
    /// of `w` (`row_bytes` each). Types may override this with tiles of several weight
    /// rows ([`block_tiles`]); the result must equal the one-row calls bit for bit.
    ///
    /// # Panics
    /// If `out` holds fewer than `(w rows − 1) · stride + rows.len()` values.
    fn vec_dot_block(
        isa: Isa,
        w: &[u8],
        row_bytes: usize,
        a: &Activations<Self::Act>,
        rows: std::ops::Range<usize>,
        out: &mut [f32],
        stride: usize,
    ) {
        for (i, wr) in w.chunks_exact(row_bytes).enumerate() {
            let o = &mut out[i * stride..i * stride + rows.len()];
            Self::vec_dot_rows(isa, wr, a, rows.clone(), o);
        }
    }

    /// [`Self::vec_dot_block`] for the weight rows `features` of a whole matrix `w`
    /// stored in groups of `group` rows ([`layout::Interleave`]):
    /// `out[(r − features.start) · stride + (j − rows.start)] = vec_dot(w_r, a_j)`. The
    /// default takes each row back to ggml's layout first (correct for any type and
    /// instruction set; the block-tile types read the groups directly).
    #[allow(clippy::too_many_arguments)]
    fn vec_dot_block_in(
        isa: Isa,
        w: &[u8],
        row_bytes: usize,
        group: layout::Interleave,
        features: std::ops::Range<usize>,
        a: &Activations<Self::Act>,
        rows: std::ops::Range<usize>,
        out: &mut [f32],
        stride: usize,
    ) {
        for (i, r) in features.enumerate() {
            let wr = layout::row_of(w, row_bytes, Self::BLOCK_BYTES, group, r);
            let o = &mut out[i * stride..i * stride + rows.len()];
            Self::vec_dot_rows(isa, &wr, a, rows.clone(), o);
        }
    }

    /// [`Self::vec_dot_block_in`] written row-major into `out` (which must hold
    /// `features` × `rows`): `true`, or `false` with nothing written where the type has
    /// no such kernel for `isa` (the default).
    ///
    /// # Panics
    /// If `out` does not hold those outputs or `w` those rows.
    #[allow(clippy::too_many_arguments)]
    fn vec_dot_block_rows(
        isa: Isa,
        w: &[u8],
        row_bytes: usize,
        group: layout::Interleave,
        features: std::ops::Range<usize>,
        a: &Activations<Self::Act>,
        rows: std::ops::Range<usize>,
        out: &mut RowsOut<'_>,
    ) -> bool {
        let _ = (isa, w, row_bytes, group, features, a, rows, out);
        false
    }

    /// Dot products of one weight row with several activation rows along llama.cpp's
    /// kernel `path` for them ([`paths`]). The default is [`Self::vec_dot_rows`]: types
    /// that llama.cpp computes with `vec_dot` on every path keep it.
    fn path_rows(
        isa: Isa,
        path: Path,
        w: &[u8],
        a: &Activations<Self::Act>,
        rows: std::ops::Range<usize>,
        out: &mut [f32],
    ) {
        let _ = path;
        Self::vec_dot_rows(isa, w, a, rows, out);
    }
}
