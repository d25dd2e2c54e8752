//! The CPU matrix the model holds: a ggml weight matrix of any implemented type, in
//! the layout its fastest kernel reads, chosen here from the stored type so that model
//! code never names one.

use candle_core::quantized::{GgmlDType, QTensor};
use candle_core::{Result, Tensor};

use crate::{BatchRow, GgmlMatrix, GgmlType, Q4_1Matrix};

/// A weight matrix `(n, k)` for `y = x · Wᵀ` on the CPU, in ggml's arithmetic.
#[derive(Debug)]
pub enum CpuMatrix {
    /// Q4_1 with four rows interleaved per block ([`crate::q4_1x4`]).
    Q4_1x4(Q4_1Matrix),
    /// Any other type on [`crate::QuantMatrix`] ([`GgmlMatrix`]).
    Ggml(GgmlMatrix),
}

impl CpuMatrix {
    /// Whether a stored candle dtype has a kernel here.
    pub fn supports(d: GgmlDType) -> bool {
        crate::tensor::ggml_type(d).is_some()
    }

    /// From a `QTensor` of shape `(n, k)`: its ggml bytes, in the layout this CPU's
    /// kernels read.
    ///
    /// # Errors
    /// A type without a kernel, a non-2-D shape, or bytes that do not match it.
    pub fn from_qtensor(t: &QTensor) -> Result<Self> {
        if crate::tensor::ggml_type(t.dtype()) == Some(GgmlType::Q4_1) {
            return Ok(Self::Q4_1x4(Q4_1Matrix::from_qtensor(t)?));
        }
        Ok(Self::Ggml(GgmlMatrix::from_qtensor(t)?))
    }

    /// `(n, k)`: output features, input features.
    pub fn shape(&self) -> (usize, usize) {
        match self {
            Self::Q4_1x4(m) => m.shape(),
            Self::Ggml(m) => m.shape(),
        }
    }

    /// `x` `(.., k)` f32 on the CPU → `(.., n)`.
    ///
    /// # Errors
    /// A shape mismatch or a non-CPU input.
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        match self {
            Self::Q4_1x4(m) => m.forward(x),
            Self::Ggml(m) => m.forward(x),
        }
    }

    /// `xs` `(rows, k)` row-major → `(rows, n)` row-major, on the thread team.
    ///
    /// # Errors
    /// `xs` is not `rows × k` values.
    pub fn matmul_host(&self, xs: &[f32], rows: usize) -> Result<Vec<f32>> {
        self.matmul_host_batch(xs, rows, &[])
    }

    /// [`Self::matmul_host`] with each row on the kernel llama.cpp runs for its place
    /// `batch[j]` in llama.cpp's micro-batch ([`GgmlMatrix::matmul_host_batch`]; Q4_1
    /// has no kernel but `vec_dot` there, so its rows ignore it).
    ///
    /// # Errors
    /// `xs` is not `rows × k` values, or `batch` is neither empty nor `rows` long.
    pub fn matmul_host_batch(
        &self,
        xs: &[f32],
        rows: usize,
        batch: &[BatchRow],
    ) -> Result<Vec<f32>> {
        match self {
            Self::Q4_1x4(m) => {
                let (_, k) = m.shape();
                if xs.len() != rows * k {
                    candle_core::bail!("{} input values for {rows} rows of {k}", xs.len());
                }
                Ok(m.matmul_host(xs, rows))
            }
            Self::Ggml(m) => m.matmul_host_batch(xs, rows, batch),
        }
    }

    /// Whether [`Self::rows_dequantized`] can read rows (the Q4_1 layout cannot).
    pub fn rows_readable(&self) -> bool {
        matches!(self, Self::Ggml(_))
    }

    /// Rows `ids` dequantized (ggml's `dequantize_row_*`): `ids.len() × k` values.
    ///
    /// # Errors
    /// An id out of range, or a layout that cannot hand out rows.
    pub fn rows_dequantized(&self, ids: &[u32]) -> Result<Vec<f32>> {
        match self {
            Self::Q4_1x4(_) => candle_core::bail!("Q4_1 rows are not readable for embeddings"),
            Self::Ggml(m) => m.rows_dequantized(ids),
        }
    }
}
