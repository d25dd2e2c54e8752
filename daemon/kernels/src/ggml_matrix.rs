//! A GGUF matrix of any ggml type on this crate's kernels ([`QuantMatrix`]), split over
//! output rows on the compute thread team ([`crate::team`]).
//!
//! The kernels follow ggml's arithmetic (activations converted to the type's
//! `vec_dot_type`, per-row dot products in the order of ggml's x86 AVX2 code); the
//! instruction set is chosen once per process ([`isa`]). Q4_1 has a layout of its own
//! as well ([`crate::q4_1x4`], chosen by [`crate::CpuMatrix`]), which gives the same
//! numbers.

use std::sync::{Mutex, OnceLock};

use candle_core::quantized::QTensor;
use candle_core::{Result, Tensor};

use crate::q4_1x4::PAR_MIN_BLOCK_DOTS;
use crate::team;
use crate::tensor::{ggml_type, matmul_tensor};
use crate::{BatchRow, GgmlType, Isa, QuantMatrix, RowsOut};

thread_local! {
    /// Each thread's weight-row-major products of its current task.
    static SCRATCH: std::cell::RefCell<Vec<f32>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// The kernel instruction set of this process ([`Isa::detect`], once).
pub fn isa() -> Isa {
    static ISA: OnceLock<Isa> = OnceLock::new();
    *ISA.get_or_init(Isa::detect)
}

/// A weight matrix `(n, k)` of any implemented ggml type, for `y = x · Wᵀ`.
#[derive(Debug)]
pub struct GgmlMatrix {
    m: QuantMatrix,
}

impl GgmlMatrix {
    /// From a CPU `QTensor`: its ggml bytes, in the layout this CPU's kernels read
    /// ([`QuantMatrix::for_isa`]).
    ///
    /// # Errors
    /// A type without a kernel, a non-2-D shape, or bytes that do not match it.
    pub fn from_qtensor(t: &QTensor) -> Result<Self> {
        let (n, k) = t.shape().dims2()?;
        let Some(ty) = ggml_type(t.dtype()) else {
            candle_core::bail!("{:?} is not a weight type", t.dtype());
        };
        let m = QuantMatrix::for_isa(isa(), ty, t.data()?.into_owned(), n, k)
            .map_err(candle_core::Error::wrap)?;
        Ok(Self { m })
    }

    /// `(n, k)`.
    pub fn shape(&self) -> (usize, usize) {
        self.m.shape()
    }

    /// The stored type.
    pub fn ty(&self) -> GgmlType {
        self.m.ty()
    }

    /// `x` `(.., k)` f32 on the CPU → `(.., n)`.
    ///
    /// # Errors
    /// A shape mismatch or a non-CPU input.
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let shape = self.shape();
        matmul_tensor("GgmlMatrix", x, shape, |xs, rows| {
            self.matmul_host(xs, rows)
        })
    }

    /// `xs` `(rows, k)` row-major → `(rows, n)` row-major, on the thread team; every
    /// row through `vec_dot`.
    ///
    /// # Errors
    /// `xs` is not `rows × k` values.
    pub fn matmul_host(&self, xs: &[f32], rows: usize) -> Result<Vec<f32>> {
        self.matmul_host_batch(xs, rows, &[])
    }

    /// [`Self::matmul_host`] with each row on the kernel llama.cpp runs for it, given
    /// its place `batch[j]` in llama.cpp's micro-batch (`crate::paths`; empty:
    /// `vec_dot` for every row).
    ///
    /// # Errors
    /// `xs` is not `rows × k` values, or `batch` is neither empty nor `rows` long.
    pub fn matmul_host_batch(
        &self,
        xs: &[f32],
        rows: usize,
        batch: &[BatchRow],
    ) -> Result<Vec<f32>> {
        let (n, k) = self.shape();
        let paths = if batch.is_empty() {
            Vec::new()
        } else {
            self.m.paths(batch)
        };
        let act = self
            .m
            .quantize_par(xs, rows, &paths, &|n, f| team::run(n, f))
            .map_err(candle_core::Error::wrap)?;
        if rows == 0 || n == 0 {
            return Ok(Vec::new());
        }
        let isa = isa();
        let threads = team::threads();
        // Work in units of 32-value block dot products, as the Q4_1 kernel counts it.
        let per_task = if n * rows * (k / 32).max(1) < PAR_MIN_BLOCK_DOTS || threads <= 1 {
            n
        } else {
            // About eight tasks per thread, claimed dynamically, in whole weight rows —
            // whole groups of interleaved rows, which the kernels read together.
            let g = self.m.interleave().max(1);
            n.div_ceil(threads * 8).max(1).div_ceil(g) * g
        };
        // Each task writes its columns of the row-major output: straight from the kernel
        // where it has a row-major form, else computed into its thread's scratch
        // (weight-row major, the kernels' layout) and transposed in: no zeroed buffer.
        let mut out: Vec<std::mem::MaybeUninit<f32>> = Vec::with_capacity(n * rows);
        // SAFETY: `MaybeUninit` needs no initialisation; every element is written below
        // before `out` is read (or `out` is dropped unread on an error).
        unsafe { out.set_len(n * rows) };
        let failed = Mutex::new(None);
        team::for_each_column_block(&mut out, n, per_task, |cols, block| {
            let rows_done = self.m.matmul_range_rows(
                isa,
                &act,
                cols.clone(),
                &paths,
                &mut RowsOut::of_block(block),
            );
            let done = rows_done.and_then(|done| {
                if done {
                    return Ok(());
                }
                SCRATCH.with_borrow_mut(|buf| {
                    buf.resize(cols.len() * rows, 0.0);
                    self.m
                        .matmul_range_paths(isa, &act, cols.clone(), &paths, buf)
                        .map(|()| transpose_into(buf, rows, cols.len(), block))
                })
            });
            if let Err(e) = done {
                if let Ok(mut f) = failed.lock() {
                    f.get_or_insert(e);
                }
            }
        });
        if let Some(e) = failed.into_inner().ok().flatten() {
            return Err(candle_core::Error::wrap(e));
        }
        let mut out = std::mem::ManuallyDrop::new(out);
        let (ptr, len, cap) = (out.as_mut_ptr().cast::<f32>(), out.len(), out.capacity());
        // SAFETY: every task succeeded, so every element was written; `MaybeUninit<f32>`
        // and `f32` have the same size and alignment, and the allocation changes hands.
        Ok(unsafe { Vec::from_raw_parts(ptr, len, cap) })
    }

    /// Rows `ids` dequantized (ggml's `dequantize_row_*`): `ids.len() × k` values.
    ///
    /// # Errors
    /// An id out of range.
    pub fn rows_dequantized(&self, ids: &[u32]) -> Result<Vec<f32>> {
        self.m
            .dequantize_rows(ids)
            .map_err(candle_core::Error::wrap)
    }
}

/// `block.row_mut(j)[c] = src[c · rows + j]` for the `cols × rows` weight-row-major
/// `src`: in 8 × 8 tiles (contiguous loads of eight activation rows, stores of eight
/// columns), the edges one value at a time.
fn transpose_into(
    src: &[f32],
    rows: usize,
    cols: usize,
    block: &mut team::ColumnBlock<'_, std::mem::MaybeUninit<f32>>,
) {
    const T: usize = 8;
    let (rows_t, cols_t) = (rows / T * T, cols / T * T);
    for j0 in (0..rows_t).step_by(T) {
        for c0 in (0..cols_t).step_by(T) {
            let mut t = [[0f32; T]; T];
            for (cc, tc) in t.iter_mut().enumerate() {
                let o = (c0 + cc) * rows + j0;
                tc.copy_from_slice(&src[o..o + T]);
            }
            for jj in 0..T {
                let dst = &mut block.row_mut(j0 + jj)[c0..c0 + T];
                for (d, tc) in dst.iter_mut().zip(&t) {
                    *d = std::mem::MaybeUninit::new(tc[jj]);
                }
            }
        }
    }
    for j in 0..rows {
        let dst = block.row_mut(j);
        let c_start = if j < rows_t { cols_t } else { 0 };
        for (c, d) in dst.iter_mut().enumerate().skip(c_start) {
            *d = std::mem::MaybeUninit::new(src[c * rows + j]);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::GgmlMatrix;
    use crate::q4_1x4::Q4_1Matrix;
    use candle_core::quantized::{GgmlDType, QTensor};
    use candle_core::{Device, Tensor};

    /// Every tile and edge of the transposition into column blocks: rows and columns
    /// below, at and past multiples of 8, blocks of several widths.
    #[test]
    fn transpose_into_column_blocks() {
        for (rows, n, chunk) in [
            (13, 19, 19),
            (16, 40, 8),
            (3, 5, 2),
            (9, 37, 12),
            (1, 11, 4),
        ] {
            let src: Vec<f32> = (0..rows * n).map(|i| i as f32).collect();
            let mut out = vec![std::mem::MaybeUninit::new(f32::NAN); rows * n];
            crate::team::for_each_column_block(&mut out, n, chunk, |cols, block| {
                // This block's weight-row-major part of `src^T`.
                let part: Vec<f32> = cols
                    .clone()
                    .flat_map(|c| (0..rows).map(move |j| (j * n + c) as f32))
                    .collect();
                super::transpose_into(&part, rows, cols.len(), block);
            });
            for (i, (o, s)) in out.iter().zip(&src).enumerate() {
                // SAFETY: every element was initialised (NaN, then the transposed value).
                let v = unsafe { o.assume_init() };
                assert_eq!(v, *s, "rows {rows}, n {n}, chunk {chunk}: element {i}");
            }
        }
    }

    fn random(len: usize, seed: u32) -> Vec<f32> {
        let mut s = seed.wrapping_mul(2_654_435_761).wrapping_add(1);
        (0..len)
            .map(|_| {
                s ^= s << 13;
                s ^= s >> 17;
                s ^= s << 5;
                (s as f32 / u32::MAX as f32) * 2.0 - 1.0
            })
            .collect()
    }

    /// The tiled Q4_1 kernel and the kernel crate's give the same bits (both follow
    /// ggml's `ggml_vec_dot_q4_1_q8_1`).
    #[test]
    fn tiled_q4_1_kernel_equals_the_kernel_crate() {
        let (n, k) = (37, 576);
        let w = Tensor::from_vec(random(n * k, 1), (n, k), &Device::Cpu).expect("w");
        let q = QTensor::quantize(&w, GgmlDType::Q4_1).expect("quantize");
        let ours = GgmlMatrix::from_qtensor(&q).expect("matrix");
        let tiled = Q4_1Matrix::from_qtensor(&q).expect("q4_1");
        for rows in [1, 3, 8] {
            let x = random(rows * k, 7 + rows as u32);
            let a = ours.matmul_host(&x, rows).expect("matmul");
            let b = tiled.matmul_host(&x, rows);
            for (i, (u, v)) in a.iter().zip(&b).enumerate() {
                assert_eq!(
                    u.to_bits(),
                    v.to_bits(),
                    "rows {rows} output {i}: {u} vs {v}"
                );
            }
        }
    }
}
