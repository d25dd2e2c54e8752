//! The one matrix abstraction: model code holds a [`Matrix`] and calls
//! [`Matrix::forward_host`] or [`Matrix::forward`]; which kernel runs is decided here,
//! once, at load, from the stored type and the [`MatrixPolicy`]. Fusion (QKV, gate/up)
//! happens on the stored form ([`RawMatrix::concat`]) before a kernel is chosen, so it
//! works for every type.

use std::sync::Arc;

use candle_core::quantized::{GgmlDType, QMatMul, QStorage, QTensor};
use candle_core::{DType, Device, Module, Tensor};
use inferd_kernels::{BatchRow, CpuMatrix};

/// Which kernels run the matrices (`model.kernels`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Deserialize, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Kernels {
    /// Our CPU kernels ([`inferd_kernels::CpuMatrix`]) for every ggml type of a GGUF
    /// file, F16/BF16/F32 included (ggml's numerics at SIMD speed); Hugging Face weights
    /// use candle's gemm in their stored dtype (what transformers does); CUDA uses
    /// candle's kernels.
    Native,
    /// candle's `QMatMul` for every quantized type (portable; the reference the native
    /// kernels are tested against).
    Candle,
}

/// Re-quantization at load (`model.quantize`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Deserialize, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Quantize {
    /// Keep the stored type.
    None,
    /// Convert every matrix whose input width is a multiple of 32 to Q8_0 (32-value
    /// blocks, one f16 scale; error ≤ 1/254 of a block's largest magnitude). Halves an
    /// F16/BF16 checkpoint's memory; moves greedy picks of a quantized GGUF away from
    /// llama.cpp's.
    Q8_0,
}

/// How stored matrices become [`Matrix`] kernels.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MatrixPolicy {
    /// Kernel choice.
    pub kernels: Kernels,
    /// Re-quantization.
    pub quantize: Quantize,
}

impl Default for MatrixPolicy {
    fn default() -> Self {
        Self {
            kernels: Kernels::Native,
            quantize: Quantize::None,
        }
    }
}

/// A weight matrix `(out, in)` as a file stores it, before a kernel is chosen.
#[derive(Debug)]
pub enum RawMatrix {
    /// ggml blocks (GGUF; any ggml type, F32/F16 included).
    Quant(QTensor),
    /// A dense candle tensor in its stored dtype (F32, F16 or BF16; Hugging Face).
    Dense(Tensor),
}

impl RawMatrix {
    /// `(out, in)`.
    ///
    /// # Errors
    /// The tensor is not 2-D.
    pub fn dims(&self) -> candle_core::Result<(usize, usize)> {
        match self {
            RawMatrix::Quant(t) => t.shape().dims2(),
            RawMatrix::Dense(t) => t.dims2(),
        }
    }

    /// A short name of the stored type (`q4_k`, `f16`, ...), for logs.
    pub fn type_name(&self) -> String {
        match self {
            RawMatrix::Quant(t) => format!("{:?}", t.dtype()).to_lowercase(),
            RawMatrix::Dense(t) => format!("{:?}", t.dtype()).to_lowercase(),
        }
    }

    /// Stacks matrices with the same input width along the rows (`[a; b; ...]`), or
    /// `None` when their stored types differ (a Q4_K_M file keeps `attn_v` in Q6_K): the
    /// caller then keeps them apart. ggml rows are whole blocks, so stacking quantized
    /// rows is stacking their bytes.
    ///
    /// # Errors
    /// Parts with different input widths, or a device error.
    pub fn concat(parts: Vec<RawMatrix>) -> candle_core::Result<Result<RawMatrix, Vec<RawMatrix>>> {
        let mut k = None;
        for p in &parts {
            let (_, pk) = p.dims()?;
            if *k.get_or_insert(pk) != pk {
                candle_core::bail!("fused matrices have input widths {k:?} and {pk}");
            }
        }
        let same_type = parts.windows(2).all(|w| match (&w[0], &w[1]) {
            (RawMatrix::Quant(a), RawMatrix::Quant(b)) => a.dtype() == b.dtype(),
            (RawMatrix::Dense(a), RawMatrix::Dense(b)) => a.dtype() == b.dtype(),
            _ => false,
        });
        if !same_type || parts.is_empty() {
            return Ok(Err(parts));
        }
        let k = k.unwrap_or(0);
        match &parts[0] {
            RawMatrix::Dense(_) => {
                let ts: Vec<&Tensor> = parts
                    .iter()
                    .filter_map(|p| match p {
                        RawMatrix::Dense(t) => Some(t),
                        RawMatrix::Quant(_) => None,
                    })
                    .collect();
                Ok(Ok(RawMatrix::Dense(Tensor::cat(&ts, 0)?)))
            }
            RawMatrix::Quant(first) => {
                let (dtype, device) = (first.dtype(), first.device());
                let mut bytes = Vec::new();
                let mut n = 0;
                for p in &parts {
                    if let RawMatrix::Quant(t) = p {
                        bytes.extend_from_slice(&t.data()?);
                        n += t.shape().dims2()?.0;
                    }
                }
                let t = qtensor_from_bytes(dtype, &bytes, (n, k), &device)?;
                Ok(Ok(RawMatrix::Quant(t)))
            }
        }
    }

    /// The matrix cut into consecutive row blocks of `widths` rows (ggml rows are
    /// whole blocks, so a quantized matrix is cut between its rows' bytes).
    ///
    /// # Errors
    /// `widths` not summing to the row count, or a device error.
    pub fn split_rows(&self, widths: &[usize]) -> candle_core::Result<Vec<RawMatrix>> {
        let (n, k) = self.dims()?;
        if widths.iter().sum::<usize>() != n {
            candle_core::bail!("cannot cut {n} rows into parts of {widths:?}");
        }
        let mut out = Vec::with_capacity(widths.len());
        let mut at = 0;
        match self {
            RawMatrix::Dense(t) => {
                for &w in widths {
                    out.push(RawMatrix::Dense(t.narrow(0, at, w)?.contiguous()?));
                    at += w;
                }
            }
            RawMatrix::Quant(t) => {
                let data = t.data()?;
                let row = data.len().checked_div(n).unwrap_or(0);
                for &w in widths {
                    let bytes = &data[at * row..(at + w) * row];
                    out.push(RawMatrix::Quant(qtensor_from_bytes(
                        t.dtype(),
                        bytes,
                        (w, k),
                        &t.device(),
                    )?));
                    at += w;
                }
            }
        }
        Ok(out)
    }

    /// A copy (a quantized matrix's bytes copied; a dense tensor shared).
    ///
    /// # Errors
    /// A device error.
    pub fn try_clone(&self) -> candle_core::Result<RawMatrix> {
        let (n, k) = self.dims()?;
        Ok(match self {
            RawMatrix::Dense(t) => RawMatrix::Dense(t.clone()),
            RawMatrix::Quant(t) => RawMatrix::Quant(qtensor_from_bytes(
                t.dtype(),
                &t.data()?,
                (n, k),
                &t.device(),
            )?),
        })
    }

    /// Dequantized to f32 on `device`.
    ///
    /// # Errors
    /// A device error.
    pub fn to_f32(&self, device: &Device) -> candle_core::Result<Tensor> {
        match self {
            RawMatrix::Quant(t) => t.dequantize(device),
            RawMatrix::Dense(t) => t.to_device(device)?.to_dtype(DType::F32),
        }
    }
}

/// A `QTensor` of `dtype` and shape `(n, k)` from raw ggml bytes.
fn qtensor_from_bytes(
    dtype: GgmlDType,
    bytes: &[u8],
    (n, k): (usize, usize),
    device: &Device,
) -> candle_core::Result<QTensor> {
    candle_core::quantized::ggml_file::qtensor_from_ggml(dtype, bytes, vec![n, k], device)
}

/// A weight matrix `(out, in)` applied as `y = x · Wᵀ`, with its kernel chosen.
#[derive(Debug)]
pub enum Matrix {
    /// candle's quantized matmul (ggml types without a native kernel, or on CUDA).
    Quant(QMatMul),
    /// Our CPU kernels, in the layout the stored type's kernel reads ([`CpuMatrix`]).
    Cpu(CpuMatrix),
    /// A dense matrix in its stored dtype (F32/F16/BF16): the activations are cast to
    /// it, multiplied with candle's gemm, and the result cast back to f32 (what
    /// transformers does for a model loaded in that dtype).
    Dense(Tensor),
}

impl Matrix {
    /// Chooses the kernel for `raw` under `policy` on `device`.
    ///
    /// # Errors
    /// A candle error converting or re-quantizing.
    pub fn build(
        raw: RawMatrix,
        policy: MatrixPolicy,
        device: &Device,
    ) -> candle_core::Result<Self> {
        let (_, k) = raw.dims()?;
        let raw = if policy.quantize == Quantize::Q8_0 && k.is_multiple_of(32) {
            let already = matches!(&raw, RawMatrix::Quant(t) if t.dtype() == GgmlDType::Q8_0);
            if already {
                raw
            } else {
                RawMatrix::Quant(QTensor::quantize(
                    &raw.to_f32(&Device::Cpu)?,
                    GgmlDType::Q8_0,
                )?)
            }
        } else {
            raw
        };
        let native = policy.kernels == Kernels::Native && device.is_cpu();
        Ok(match raw {
            RawMatrix::Quant(t) if native && CpuMatrix::supports(t.dtype()) => {
                Matrix::Cpu(CpuMatrix::from_qtensor(&t)?)
            }
            RawMatrix::Quant(t) => match t.dtype() {
                GgmlDType::F32 | GgmlDType::F16 | GgmlDType::BF16 => {
                    Matrix::Dense(dense_of(&t, device)?)
                }
                _ if device.is_cpu() => Matrix::Quant(QMatMul::from_arc(Arc::new(t))?),
                _ => Matrix::Quant(QMatMul::from_arc(Arc::new(move_qtensor(t, device)?))?),
            },
            RawMatrix::Dense(t) => Matrix::Dense(t.to_device(device)?),
        })
    }

    /// `(out, in)`.
    pub fn dims(&self) -> (usize, usize) {
        match self {
            Matrix::Cpu(m) => m.shape(),
            Matrix::Quant(QMatMul::QTensor(t)) => t.shape().dims2().unwrap_or((0, 0)),
            Matrix::Quant(QMatMul::Tensor(t) | QMatMul::TensorF16(t)) | Matrix::Dense(t) => {
                t.dims2().unwrap_or((0, 0))
            }
        }
    }

    /// `x` `(rows, in)` f32 → `(rows, out)` f32, on the matrix's device.
    ///
    /// # Errors
    /// A candle error (shape mismatch, device).
    pub fn forward(&self, x: &Tensor) -> candle_core::Result<Tensor> {
        match self {
            Matrix::Quant(m) => m.forward(x),
            Matrix::Cpu(m) => m.forward(x),
            Matrix::Dense(w) => {
                let y = x.to_dtype(w.dtype())?.matmul(&w.t()?)?;
                y.to_dtype(DType::F32)
            }
        }
    }

    /// `xs` `(rows, in)` row-major on the host → `(rows, out)`.
    ///
    /// # Errors
    /// A candle error (a non-CPU matrix, shape mismatch).
    pub fn forward_host(&self, xs: &[f32], rows: usize) -> candle_core::Result<Vec<f32>> {
        match self {
            Matrix::Cpu(m) => m.matmul_host(xs, rows),
            Matrix::Quant(_) | Matrix::Dense(_) => {
                let k = xs.len().checked_div(rows).unwrap_or(0);
                let x = Tensor::from_slice(xs, (rows, k), &Device::Cpu)?;
                self.forward(&x)?.flatten_all()?.to_vec1::<f32>()
            }
        }
    }

    /// [`Self::forward_host`] with each row on llama.cpp's kernel for its place `batch[j]`
    /// in llama.cpp's micro-batch ([`CpuMatrix::matmul_host_batch`]); only matrices on
    /// our CPU kernels have other kernels than `vec_dot`.
    ///
    /// # Errors
    /// As [`Self::forward_host`]; `batch` neither empty nor `rows` long.
    pub fn forward_host_batch(
        &self,
        xs: &[f32],
        rows: usize,
        batch: &[BatchRow],
    ) -> candle_core::Result<Vec<f32>> {
        match self {
            Matrix::Cpu(m) => m.matmul_host_batch(xs, rows, batch),
            _ => self.forward_host(xs, rows),
        }
    }

    /// Rows `ids` dequantized to f32, `(ids.len(), in)` row-major on the host: an
    /// embedding lookup that reads the output head's copy when the two are tied.
    ///
    /// # Errors
    /// An id out of range, or a candle error.
    pub fn rows_host(&self, ids: &[u32]) -> candle_core::Result<Vec<f32>> {
        let (n, _) = self.dims();
        if let Some(&bad) = ids.iter().find(|&&i| i as usize >= n) {
            candle_core::bail!("token id {bad} is out of range for {n} embedding rows");
        }
        match self {
            Matrix::Cpu(m) => m.rows_dequantized(ids),
            Matrix::Quant(QMatMul::QTensor(t)) => {
                // Dequantize only the rows asked for: one row is whole ggml blocks.
                let (_, k) = t.shape().dims2()?;
                let data = t.data()?;
                let row_bytes = data.len() / n;
                let mut out = Vec::with_capacity(ids.len() * k);
                for &id in ids {
                    let r = id as usize;
                    let row = &data[r * row_bytes..(r + 1) * row_bytes];
                    let q = qtensor_from_bytes(t.dtype(), row, (1, k), &Device::Cpu)?;
                    out.extend(
                        q.dequantize(&Device::Cpu)?
                            .flatten_all()?
                            .to_vec1::<f32>()?,
                    );
                }
                Ok(out)
            }
            Matrix::Quant(QMatMul::Tensor(t) | QMatMul::TensorF16(t)) | Matrix::Dense(t) => {
                let idx = Tensor::new(ids, t.device())?;
                t.index_select(&idx, 0)?
                    .to_dtype(DType::F32)?
                    .to_device(&Device::Cpu)?
                    .flatten_all()?
                    .to_vec1::<f32>()
            }
        }
    }

    /// Whether [`Self::rows_host`] can read rows of this matrix (a few CPU layouts
    /// cannot).
    pub fn rows_readable(&self) -> bool {
        match self {
            Matrix::Cpu(m) => m.rows_readable(),
            _ => true,
        }
    }

    /// Rows `ids` as a device tensor `(ids.len(), in)` f32 (the embedding lookup of the
    /// tensor-ops path).
    ///
    /// # Errors
    /// As [`Self::rows_host`].
    pub fn rows(&self, ids: &[u32], device: &Device) -> candle_core::Result<Tensor> {
        match self {
            Matrix::Dense(t) | Matrix::Quant(QMatMul::Tensor(t) | QMatMul::TensorF16(t)) => {
                let (n, _) = self.dims();
                if let Some(&bad) = ids.iter().find(|&&i| i as usize >= n) {
                    candle_core::bail!("token id {bad} is out of range for {n} embedding rows");
                }
                let idx = Tensor::new(ids, t.device())?;
                t.index_select(&idx, 0)?.to_dtype(DType::F32)
            }
            _ => {
                let (_, k) = self.dims();
                Tensor::from_vec(self.rows_host(ids)?, (ids.len(), k), device)
            }
        }
    }
}

/// An F32/F16/BF16 ggml tensor as a dense tensor of the same dtype on `device`.
fn dense_of(t: &QTensor, device: &Device) -> candle_core::Result<Tensor> {
    let dtype = match t.dtype() {
        GgmlDType::F16 => DType::F16,
        GgmlDType::BF16 => DType::BF16,
        _ => DType::F32,
    };
    let f = t.dequantize(&Device::Cpu)?;
    f.to_dtype(dtype)?.to_device(device)
}

/// A CPU `QTensor` copied to `device` (its ggml bytes, unchanged).
fn move_qtensor(t: QTensor, device: &Device) -> candle_core::Result<QTensor> {
    if t.device().same_device(device) {
        return Ok(t);
    }
    let dims = t.shape().dims().to_vec();
    let dtype = t.dtype();
    let data = t.data()?;
    let storage = QStorage::from_data(data, device, dtype)?;
    QTensor::new(storage, dims)
}
