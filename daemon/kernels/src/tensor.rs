//! The candle side of the CPU matrices: ggml dtypes named as this crate's types, and
//! `y = x · Wᵀ` on a candle tensor through a host-memory product.

use candle_core::quantized::GgmlDType;
use candle_core::{DType, Device, Result, Storage, Tensor};

use crate::GgmlType;

/// This crate's type for a candle ggml dtype (`None`: Q8_1/Q8_K, which are activation
/// formats, not weight types).
pub fn ggml_type(d: GgmlDType) -> Option<GgmlType> {
    Some(match d {
        GgmlDType::F32 => GgmlType::F32,
        GgmlDType::F16 => GgmlType::F16,
        GgmlDType::BF16 => GgmlType::Bf16,
        GgmlDType::Q4_0 => GgmlType::Q4_0,
        GgmlDType::Q4_1 => GgmlType::Q4_1,
        GgmlDType::Q5_0 => GgmlType::Q5_0,
        GgmlDType::Q5_1 => GgmlType::Q5_1,
        GgmlDType::Q8_0 => GgmlType::Q8_0,
        GgmlDType::Q2K => GgmlType::Q2K,
        GgmlDType::Q3K => GgmlType::Q3K,
        GgmlDType::Q4K => GgmlType::Q4K,
        GgmlDType::Q5K => GgmlType::Q5K,
        GgmlDType::Q6K => GgmlType::Q6K,
        GgmlDType::Q8_1 | GgmlDType::Q8K => return None,
    })
}

/// `y = x · Wᵀ` for a weight of shape `(n, k)` through `host` (which maps `(rows, k)`
/// row-major f32 to `(rows, n)`): `x` of shape `(..., k)`, f32, on the CPU (made
/// contiguous if it is not) gives `y` of shape `(..., n)`. `what` names the matrix type
/// in errors.
///
/// # Errors
/// `x` is not f32, not on the CPU, a scalar, or its last dimension is not `k`.
pub fn matmul_tensor(
    what: &str,
    x: &Tensor,
    (n, k): (usize, usize),
    host: impl FnOnce(&[f32], usize) -> Result<Vec<f32>>,
) -> Result<Tensor> {
    if x.dtype() != DType::F32 {
        candle_core::bail!("{what}::forward: expected f32 input, got {:?}", x.dtype());
    }
    if !x.device().is_cpu() {
        candle_core::bail!("{what}::forward: input must be on the CPU");
    }
    let dims = x.dims();
    let Some((&last, lead)) = dims.split_last() else {
        candle_core::bail!("{what}::forward: input is a scalar");
    };
    if last != k {
        candle_core::bail!(
            "{what}::forward: input shape {dims:?} incompatible with weight ({n}, {k})"
        );
    }
    let mut out_dims = lead.to_vec();
    out_dims.push(n);
    let rows: usize = lead.iter().product();
    if rows == 0 || n == 0 {
        return Tensor::zeros(out_dims, DType::F32, &Device::Cpu);
    }
    let x = x.contiguous()?;
    let out = {
        let (storage, layout) = x.storage_and_layout();
        let Storage::Cpu(cpu) = &*storage else {
            candle_core::bail!("{what}::forward: input must be on the CPU");
        };
        let Some((start, end)) = layout.contiguous_offsets() else {
            candle_core::bail!("{what}::forward: input is not contiguous");
        };
        let all = cpu.as_slice::<f32>()?;
        let Some(xs) = all.get(start..end) else {
            candle_core::bail!("{what}::forward: input storage is too short");
        };
        host(xs, rows)?
    };
    Tensor::from_vec(out, out_dims, &Device::Cpu)
}
