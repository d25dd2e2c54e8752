//! Fast Q4_1 × Q8_1 matrix multiplication on the CPU, with ggml's numerics.
//!
//! candle 0.11's `QMatMul` runs Q4_1 weights through its portable (scalar) kernel on
//! x86. This module does the computation with AVX2 kernels (runtime detected, scalar
//! fallbacks giving the same bits elsewhere) split over output rows on the compute
//! thread team ([`super::team`]). Each
//! activation row is quantized per 32-value block to Q8_1, each output is a sum over
//! blocks of `sumi · d4 · d8 + m4 · s8`, with `sumi` the exact integer dot product of
//! the block's 32 nibbles with its 32 `i8`s.
//!
//! Two orders of the float operations are implemented:
//!
//! - **ggml's** ([`ggml`]; what [`Q4_1Matrix::forward`] runs): `quantize_row_q8_1` and
//!   `ggml_vec_dot_q4_1_q8_1` of `ggml/src/ggml-cpu/arch/x86/quants.c` as llama.cpp runs
//!   them on AVX2/AVX-512 CPUs, eight f32 lanes with FMA. Its lanes are independent, so
//!   the kernel keeps four activation rows' accumulators in registers and unpacks each
//!   weight block once for them, which is what makes batched decode cheap.
//! - **candle's** (the `Scalar` kernel): candle's `BlockQ8_1::from_float` and
//!   `BlockQ4_1::vec_dot`, a sequential sum in block order without FMA; bit-exact with
//!   candle's `QMatMul` (tested), kept as the reference the tests tie our kernels to.
//!
//! Greedy decoding of the real model is chaotic in the f32 summation order (the f16 KV
//! cache and per-layer Q8_1 re-quantization amplify 1e-6 differences into flipped
//! near-tie tokens), so following llama.cpp's order keeps our tokens on its path longer
//! (`model_runner::parity_tests`); every kernel is deterministic and row-independent,
//! so a sequence's output never depends on its batch company.

use super::team;
use candle_core::quantized::{GgmlDType, QTensor};
use candle_core::{DType, Device, Result, Storage, Tensor};

/// Values per Q4_1 / Q8_1 block.
const QK: usize = 32;
/// Bytes of one ggml `block_q4_1`: f16 `d`, f16 `m`, 16 bytes of nibbles.
const Q4_1_BLOCK_BYTES: usize = 20;
/// Below this many block dot products a call runs on the calling thread: waking the
/// other threads costs more than it saves.
pub(super) const PAR_MIN_BLOCK_DOTS: usize = 8 * 1024;
/// Activation rows at or above which the Q8_1 quantization itself is parallelized.
const PAR_QUANTIZE_MIN_ROWS: usize = 16;

/// The 16 nibble bytes of one Q4_1 block: byte `j` holds value `j` in its low nibble
/// and value `j + 16` in its high nibble (ggml layout).
#[derive(Clone, Copy)]
#[repr(C, align(16))]
struct Nibbles([u8; QK / 2]);

/// The 32 signed quants of one Q8_1 block.
#[derive(Clone, Copy)]
#[repr(C, align(32))]
struct Q8Quants([i8; QK]);

/// Rows interleaved per [`Group4`].
const GROUP_ROWS: usize = 4;

/// Block `b` of four consecutive weight rows `4g .. 4g + 4`, interleaved so that one
/// 80-byte record (ggml's 4 × 20 bytes, nothing added) feeds four dot products: the
/// rows' nibbles, then their f16 scales `d` and minimums `m` (`dm = [d0..d3, m0..m3]`,
/// IEEE half bits, converted with one `vcvtph2ps`).
#[derive(Clone, Copy)]
#[repr(C, align(16))]
struct Group4 {
    qs: [Nibbles; GROUP_ROWS],
    dm: [u16; 2 * GROUP_ROWS],
}

/// A Q4_1 weight matrix of shape `(n_rows, k)` (one output feature per row, as GGUF
/// stores linear weights), for `y = x · Wᵀ`.
///
/// Each row is `k / 32` ggml blocks of 32 values; block value `i` is `d * q_i + m`
/// with `q_i` a 4-bit unsigned nibble, `d` and `m` f16. Rows are stored in groups of
/// four, block-interleaved ([`Group4`], record `g * nb + b`), so the kernel streams one
/// array and reuses each activation block for four rows; a last partial group is
/// padded with zero rows whose outputs are dropped. Memory: 20 bytes per block, as in
/// the GGUF file.
pub struct Q4_1Matrix {
    n: usize,
    k: usize,
    /// Blocks per row (`k / 32`).
    nb: usize,
    /// `n.div_ceil(4) * nb` records, group-major.
    groups: Vec<Group4>,
}

impl std::fmt::Debug for Q4_1Matrix {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Q4_1Matrix")
            .field("n", &self.n)
            .field("k", &self.k)
            .finish_non_exhaustive()
    }
}

/// Activation rows quantized to Q8_1: `rows * nb` blocks, row-major.
struct Q8_1Rows {
    rows: usize,
    qs: Vec<Q8Quants>,
    /// Block scales `d` (f16-rounded, as f32).
    d: Vec<f32>,
    /// Block sums `s = f16(sum q) * d` (f16-rounded, as f32).
    s: Vec<f32>,
}

/// Which dot-product kernel to run. The candle-order kernels are the bit-exact
/// reference against candle's `QMatMul` (tests); serving uses ggml's order.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(not(test), allow(dead_code))]
enum Kernel {
    /// Portable code, candle's `vec_dot` order of operations.
    Scalar,
    /// Portable code, ggml's x86 order of operations (see [`ggml`]).
    GgmlScalar,
    /// AVX2 + FMA, ggml's order; bit-identical to `GgmlScalar`.
    #[cfg(target_arch = "x86_64")]
    GgmlAvx2,
    /// `GgmlAvx2` with AVX-512 VNNI for the integer dot products; bit-identical.
    #[cfg(target_arch = "x86_64")]
    GgmlVnni,
    /// 512-bit registers (AVX-512 F/BW/VNNI): four rows' lanes per register;
    /// bit-identical.
    #[cfg(target_arch = "x86_64")]
    GgmlAvx512,
}

impl Kernel {
    /// The fastest kernel this CPU supports, in ggml's order (what [`Q4_1Matrix::forward`]
    /// runs).
    fn detect() -> Self {
        #[cfg(target_arch = "x86_64")]
        {
            if is_x86_feature_detected!("avx2")
                && is_x86_feature_detected!("fma")
                && is_x86_feature_detected!("f16c")
            {
                if is_x86_feature_detected!("avx512vnni") && is_x86_feature_detected!("avx512vl") {
                    if is_x86_feature_detected!("avx512f") && is_x86_feature_detected!("avx512bw") {
                        return Kernel::GgmlAvx512;
                    }
                    return Kernel::GgmlVnni;
                }
                return Kernel::GgmlAvx2;
            }
        }
        Kernel::GgmlScalar
    }
}

impl Q4_1Matrix {
    /// Builds the matrix from a candle `QTensor` of dtype [`GgmlDType::Q4_1`] and shape
    /// `(n, k)`, `k % 32 == 0`, copying its ggml blocks (from any device) into this
    /// struct's own storage.
    ///
    /// # Errors
    /// A candle error for another dtype, a shape that is not 2-D, `k % 32 != 0`, or a
    /// data size that does not match the shape.
    pub fn from_qtensor(t: &QTensor) -> Result<Self> {
        if t.dtype() != GgmlDType::Q4_1 {
            candle_core::bail!("Q4_1Matrix: expected a Q4_1 tensor, got {:?}", t.dtype());
        }
        let (n, k) = t.shape().dims2()?;
        let data = t.data()?;
        Self::from_ggml_bytes(&data, n, k)
    }

    /// Builds the matrix from raw ggml `block_q4_1` bytes (as stored in a GGUF file):
    /// `n * k / 32` blocks of 20 bytes, each little-endian f16 `d`, f16 `m`, then 16
    /// nibble bytes.
    ///
    /// # Errors
    /// A candle error if `k % 32 != 0` or `data.len() != n * k / 32 * 20`.
    pub fn from_ggml_bytes(data: &[u8], n: usize, k: usize) -> Result<Self> {
        if !k.is_multiple_of(QK) {
            candle_core::bail!("Q4_1Matrix: k = {k} is not a multiple of {QK}");
        }
        let nb = k / QK;
        let expected = n
            .checked_mul(nb)
            .and_then(|b| b.checked_mul(Q4_1_BLOCK_BYTES));
        if expected != Some(data.len()) {
            candle_core::bail!(
                "Q4_1Matrix: {} bytes of data for shape ({n}, {k}), expected {expected:?}",
                data.len()
            );
        }
        let n_groups = n.div_ceil(GROUP_ROWS);
        let mut groups = vec![
            Group4 {
                qs: [Nibbles([0; QK / 2]); GROUP_ROWS],
                dm: [0; 2 * GROUP_ROWS],
            };
            n_groups * nb
        ];
        for (i, block) in data.chunks_exact(Q4_1_BLOCK_BYTES).enumerate() {
            let (r, b) = (i / nb, i % nb);
            let rec = &mut groups[(r / GROUP_ROWS) * nb + b];
            let lane = r % GROUP_ROWS;
            rec.dm[lane] = u16::from_le_bytes([block[0], block[1]]);
            rec.dm[GROUP_ROWS + lane] = u16::from_le_bytes([block[2], block[3]]);
            rec.qs[lane].0.copy_from_slice(&block[4..Q4_1_BLOCK_BYTES]);
        }
        Ok(Self { n, k, nb, groups })
    }

    /// Stacks matrices with the same `k` along the rows (`[a; b; ...]`), e.g. the
    /// query, key and value projections into one `(n_q + n_k + n_v, k)` matrix, so one
    /// call quantizes the activations once and runs one parallel pass. Row `r` of the
    /// result computes exactly what row `r` of its part did.
    ///
    /// # Errors
    /// No parts, parts with different `k`, or a part other than the last whose row
    /// count is not a multiple of 4 (its padding would land inside the result).
    pub fn concat(parts: &[&Q4_1Matrix]) -> Result<Self> {
        let Some(first) = parts.first() else {
            candle_core::bail!("Q4_1Matrix::concat: no parts");
        };
        let mut groups = Vec::new();
        let mut n = 0;
        for (i, p) in parts.iter().enumerate() {
            if p.k != first.k {
                candle_core::bail!("Q4_1Matrix::concat: k {} differs from {}", p.k, first.k);
            }
            if i + 1 < parts.len() && !p.n.is_multiple_of(GROUP_ROWS) {
                candle_core::bail!(
                    "Q4_1Matrix::concat: part {i} has {} rows, not a multiple of {GROUP_ROWS}",
                    p.n
                );
            }
            groups.extend_from_slice(&p.groups);
            n += p.n;
        }
        Ok(Self {
            n,
            k: first.k,
            nb: first.nb,
            groups,
        })
    }

    /// Block `b` of row `r`: its nibbles, `d` and `m` (f32, exact).
    #[inline(always)]
    fn block(&self, r: usize, b: usize) -> (&Nibbles, f32, f32) {
        let rec = &self.groups[(r / GROUP_ROWS) * self.nb + b];
        let lane = r % GROUP_ROWS;
        (
            &rec.qs[lane],
            f16_bits_to_f32(rec.dm[lane]),
            f16_bits_to_f32(rec.dm[GROUP_ROWS + lane]),
        )
    }

    /// `(n_rows, k)`: output features, input features.
    pub fn shape(&self) -> (usize, usize) {
        (self.n, self.k)
    }

    /// `y = x · Wᵀ`: `x` of shape `(..., k)` and dtype f32 on the CPU (made contiguous
    /// if it is not) gives `y` of shape `(..., n)`, f32, on the CPU.
    ///
    /// Bit-identical to candle's (portable) `QMatMul` on the same Q4_1 tensor, with
    /// either kernel.
    ///
    /// # Errors
    /// A candle error if `x` is not f32, not on the CPU, is a scalar, or its last
    /// dimension is not `k`.
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        self.forward_with(x, Kernel::detect())
    }

    fn forward_with(&self, x: &Tensor, kernel: Kernel) -> Result<Tensor> {
        matmul_tensor("Q4_1Matrix", x, (self.n, self.k), |xs, rows| {
            Ok(self.matmul_host_with(xs, rows, kernel))
        })
    }

    /// `y = x · Wᵀ` on host memory: `xs` is `(rows, k)` row-major f32, the result
    /// `(rows, n)` row-major. The activations are quantized to Q8_1 once; rows of `y`
    /// are independent of each other (bit-identical alone or in any batch).
    ///
    /// # Panics
    /// If `xs.len() != rows * k` (a caller bug, not a request error).
    pub fn matmul_host(&self, xs: &[f32], rows: usize) -> Vec<f32> {
        self.matmul_host_with(xs, rows, Kernel::detect())
    }

    fn matmul_host_with(&self, xs: &[f32], rows: usize, kernel: Kernel) -> Vec<f32> {
        assert_eq!(
            xs.len(),
            rows * self.k,
            "Q4_1Matrix::matmul_host: input size"
        );
        if rows == 0 || self.n == 0 {
            return vec![0f32; rows * self.n];
        }
        let act = quantize_q8_1(xs, rows, self.k, kernel);
        self.matmul(&act, kernel)
    }

    /// Returns `y` of shape `(act.rows, n)`, row-major.
    fn matmul(&self, act: &Q8_1Rows, kernel: Kernel) -> Vec<f32> {
        let m = act.rows;
        let n = self.n;
        let n_groups = n.div_ceil(GROUP_ROWS);
        // Work is computed weight-row major: `out_t[r * m + a] = y[a][r]`, so that each
        // task reads its weight rows once for all activation rows.
        let mut out_t = vec![0f32; n_groups * GROUP_ROWS * m];
        let work = n * m * self.nb;
        let threads = team::threads();
        let group_len = GROUP_ROWS * m;
        if work < PAR_MIN_BLOCK_DOTS || threads <= 1 {
            self.rows_range(act, 0, &mut out_t, kernel);
        } else {
            // About eight tasks per thread (claimed dynamically), in whole groups of 4
            // weight rows.
            let per_task = n_groups.div_ceil(threads * 8).max(1);
            team::for_each_chunk_mut(&mut out_t, per_task * group_len, |i, chunk| {
                self.rows_range(act, i * per_task, chunk, kernel)
            });
        }
        out_t.truncate(n * m);
        if m == 1 {
            return out_t;
        }
        transpose(&out_t, n, m)
    }

    /// Computes the weight rows of groups `g0 ..` (`out.len() / (4 m)` groups) against
    /// every activation row into `out[(r - 4 g0) * m + a]`; padding rows get 0.
    fn rows_range(&self, act: &Q8_1Rows, g0: usize, out: &mut [f32], kernel: Kernel) {
        match kernel {
            Kernel::Scalar => self.rows_range_scalar(act, g0, out, false),
            Kernel::GgmlScalar => self.rows_range_scalar(act, g0, out, true),
            #[cfg(target_arch = "x86_64")]
            // SAFETY: `Kernel::GgmlAvx2` is only chosen after AVX2 and FMA were detected.
            Kernel::GgmlAvx2 => unsafe { ggml_avx2::rows_range(self, act, g0, out) },
            #[cfg(target_arch = "x86_64")]
            // SAFETY: chosen only after AVX2, FMA, F16C, AVX-512 VNNI and VL were detected.
            Kernel::GgmlVnni => unsafe { ggml_avx2::rows_range_vnni(self, act, g0, out) },
            #[cfg(target_arch = "x86_64")]
            // SAFETY: chosen only after AVX2, FMA, F16C and AVX-512 F, BW, VL and VNNI
            // were detected.
            Kernel::GgmlAvx512 => unsafe { ggml_avx512::rows_range(self, act, g0, out) },
        }
    }

    /// The portable kernels, one output at a time: candle's order, or ggml's when
    /// `ggml_order`.
    fn rows_range_scalar(&self, act: &Q8_1Rows, g0: usize, out: &mut [f32], ggml_order: bool) {
        let m = act.rows;
        let nb = self.nb;
        for (i, out_row) in out.chunks_exact_mut(m).enumerate() {
            let r = g0 * GROUP_ROWS + i;
            if r >= self.n {
                out_row.fill(0.0);
                continue;
            }
            for (a, y) in out_row.iter_mut().enumerate() {
                let x = a * nb..(a + 1) * nb;
                let (xq, xd, xs) = (&act.qs[x.clone()], &act.d[x.clone()], &act.s[x]);
                *y = if ggml_order {
                    ggml::vec_dot(self, r, xq, xd, xs)
                } else {
                    vec_dot_scalar(self, r, xq, xd, xs)
                };
            }
        }
    }
}

/// `y = x · Wᵀ` for a weight of shape `(n, k)` through `host` (which maps `(rows, k)`
/// row-major f32 to `(rows, n)`): `x` of shape `(..., k)`, f32, on the CPU (made
/// contiguous if it is not) gives `y` of shape `(..., n)`. `what` names the matrix type
/// in errors.
///
/// # Errors
/// `x` is not f32, not on the CPU, a scalar, or its last dimension is not `k`.
pub(super) fn matmul_tensor(
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

/// Stores a tile computed for the 4 rows of a row group against activation rows
/// `a0 .. a0 + A`: `out_g[r * m + a0 + t] = y[r][t]` (`out_g` weight-row major, `m`
/// activation rows). Shared by the Q4_1 and Q8_0 kernels.
#[inline(always)]
pub(super) fn store_tile<const A: usize>(
    out_g: &mut [f32],
    m: usize,
    a0: usize,
    y: &[[f32; A]; 4],
) {
    for (r, yr) in y.iter().enumerate() {
        out_g[r * m + a0..r * m + a0 + A].copy_from_slice(yr);
    }
}

/// `out[a * n + r] = src[r * m + a]` for `src` of shape `(n, m)`.
pub(super) fn transpose(src: &[f32], n: usize, m: usize) -> Vec<f32> {
    const TILE: usize = 32;
    let mut out = vec![0f32; n * m];
    let body = |a0: usize, dst: &mut [f32]| {
        let a_rows = dst.len() / n;
        for r0 in (0..n).step_by(TILE) {
            let r1 = (r0 + TILE).min(n);
            for da in 0..a_rows {
                let a = a0 + da;
                let dst_row = &mut dst[da * n..(da + 1) * n];
                for r in r0..r1 {
                    dst_row[r] = src[r * m + a];
                }
            }
        }
    };
    if n * m < 64 * 1024 || team::threads() <= 1 {
        body(0, &mut out);
    } else {
        team::for_each_chunk_mut(&mut out, TILE * n, |i, dst| body(i * TILE, dst));
    }
    out
}

/// One output (weight row `r`): ggml's `ggml_vec_dot_q4_1_q8_1` / candle's
/// `BlockQ4_1::vec_dot`, in candle's order of operations.
fn vec_dot_scalar(w: &Q4_1Matrix, r: usize, xq: &[Q8Quants], xd: &[f32], xs: &[f32]) -> f32 {
    let mut sumf = 0f32;
    for b in 0..w.nb {
        let (q, d, m) = w.block(r, b);
        let mut sumi = 0i32;
        for j in 0..QK / 2 {
            let v0 = i32::from(q.0[j] & 0x0f);
            let v1 = i32::from(q.0[j] >> 4);
            sumi += v0 * i32::from(xq[b].0[j]) + v1 * i32::from(xq[b].0[j + QK / 2]);
        }
        sumf += sumi as f32 * d * xd[b] + m * xs[b];
    }
    sumf
}

/// Quantizes `rows` rows of `k` values (`xs.len() == rows * k`, `k % 32 == 0`) to Q8_1.
fn quantize_q8_1(xs: &[f32], rows: usize, k: usize, kernel: Kernel) -> Q8_1Rows {
    let nb = k / QK;
    let mut act = Q8_1Rows {
        rows,
        qs: vec![Q8Quants([0; QK]); rows * nb],
        d: vec![0f32; rows * nb],
        s: vec![0f32; rows * nb],
    };
    if rows >= PAR_QUANTIZE_MIN_ROWS && team::threads() > 1 {
        // Rows in parallel, each into its own buffers, then gathered in row order.
        let parts = team::map(rows, |r| {
            let mut q = vec![Q8Quants([0; QK]); nb];
            let (mut d, mut s) = (vec![0f32; nb], vec![0f32; nb]);
            quantize_row(&xs[r * k..(r + 1) * k], &mut q, &mut d, &mut s, kernel);
            (q, d, s)
        });
        for (r, (q, d, s)) in parts.into_iter().enumerate() {
            act.qs[r * nb..(r + 1) * nb].copy_from_slice(&q);
            act.d[r * nb..(r + 1) * nb].copy_from_slice(&d);
            act.s[r * nb..(r + 1) * nb].copy_from_slice(&s);
        }
    } else {
        xs.chunks(k)
            .zip(act.qs.chunks_mut(nb))
            .zip(act.d.chunks_mut(nb))
            .zip(act.s.chunks_mut(nb))
            .for_each(|(((x, q), d), s)| quantize_row(x, q, d, s, kernel));
    }
    act
}

fn quantize_row(x: &[f32], q: &mut [Q8Quants], d: &mut [f32], s: &mut [f32], kernel: Kernel) {
    match kernel {
        Kernel::Scalar => quantize_row_body(x, q, d, s),
        #[cfg(target_arch = "x86_64")]
        Kernel::GgmlScalar => ggml::quantize_row(x, q, d, s),
        #[cfg(target_arch = "x86_64")]
        // SAFETY: `Kernel::GgmlAvx2` is only chosen after AVX2 and FMA were detected.
        Kernel::GgmlAvx2 | Kernel::GgmlVnni | Kernel::GgmlAvx512 => unsafe {
            ggml_avx2::quantize_row(x, q, d, s)
        },
    }
}

/// candle's `BlockQ8_1::from_float` for one row. Compiled twice (portable, and inside
/// an AVX2 function so that `round` is inlined); IEEE operations give identical bits.
#[inline(always)]
fn quantize_row_body(x: &[f32], q: &mut [Q8Quants], d: &mut [f32], s: &mut [f32]) {
    for (((xb, qb), db), sb) in x.chunks_exact(QK).zip(q).zip(d).zip(s) {
        let amax = block_amax(xb);
        let scale = amax / 127.0;
        let inv = if scale != 0.0 { 1.0 / scale } else { 0.0 };
        let scale_h = f16_round(scale);
        let mut sum = 0i32;
        for (qv, &xv) in qb.0.iter_mut().zip(xb) {
            // `f32 as i32` then clamp is exactly `f32 as i8` (saturating, NaN → 0) but
            // vectorizes.
            *qv = ((xv * inv).round() as i32).clamp(-128, 127) as i8;
            sum += i32::from(*qv);
        }
        *db = scale_h;
        // candle: `f16::from_f32(sum as f32) * d`, an f16 product (computed in f32, rounded).
        *sb = f16_round(f16_round(sum as f32) * scale_h);
    }
}

/// Largest magnitude of a block: eight independent maxima (vectorizable), then combined.
/// `max` ignores NaN and is order independent, so this equals a sequential fold.
#[inline(always)]
pub(super) fn block_amax(xb: &[f32]) -> f32 {
    let mut lanes = [0f32; 8];
    for c in xb.chunks_exact(8) {
        for (l, &v) in lanes.iter_mut().zip(c) {
            *l = l.max(v.abs());
        }
    }
    lanes.iter().fold(0f32, |acc, &v| acc.max(v))
}

/// Rounds an f32 to the nearest f16 (ties to even) and back.
fn f16_round(v: f32) -> f32 {
    f16_bits_to_f32(f32_to_f16_bits(v))
}

/// IEEE f16 → f32 (exact).
pub(super) fn f16_bits_to_f32(h: u16) -> f32 {
    let sign = u32::from(h & 0x8000) << 16;
    let exp = u32::from((h >> 10) & 0x1f);
    let man = u32::from(h & 0x03ff);
    let bits = match exp {
        0 if man == 0 => sign,
        0 => {
            // Subnormal: man · 2^-24, exact in f32.
            let v = man as f32 * f32::from_bits(0x3380_0000);
            sign | v.to_bits()
        }
        0x1f => sign | 0x7f80_0000 | (man << 13),
        _ => sign | ((exp + 112) << 23) | (man << 13),
    };
    f32::from_bits(bits)
}

/// f32 → IEEE f16, round to nearest even (the `half` crate's conversion).
pub(super) fn f32_to_f16_bits(v: f32) -> u16 {
    let x = v.to_bits();
    let sign = x & 0x8000_0000;
    let exp = x & 0x7f80_0000;
    let man = x & 0x007f_ffff;
    let half_sign = sign >> 16;
    if exp == 0x7f80_0000 {
        // Inf or NaN (keep NaN a NaN).
        let nan_bit = if man == 0 { 0 } else { 0x0200 };
        return (half_sign | 0x7c00 | nan_bit | (man >> 13)) as u16;
    }
    let half_exp = ((exp >> 23) as i32) - 127 + 15;
    if half_exp >= 0x1f {
        return (half_sign | 0x7c00) as u16;
    }
    if half_exp <= 0 {
        if 14 - half_exp > 24 {
            return half_sign as u16;
        }
        let man = man | 0x0080_0000;
        let shift = (14 - half_exp) as u32;
        let mut half_man = man >> shift;
        let round_bit = 1u32 << (shift - 1);
        if (man & round_bit) != 0 && (man & (3 * round_bit - 1)) != 0 {
            half_man += 1;
        }
        return (half_sign | half_man) as u16;
    }
    let half_exp = (half_exp as u32) << 10;
    let half_man = man >> 13;
    let round_bit = 0x0000_1000u32;
    let h = half_sign | half_exp | half_man;
    if (man & round_bit) != 0 && (man & (3 * round_bit - 1)) != 0 {
        (h + 1) as u16
    } else {
        h as u16
    }
}

/// ggml's x86 numerics (`ggml/src/ggml-cpu/arch/x86/quants.c`, as llama.cpp runs Q4_1 on
/// AVX2 / AVX-512 CPUs), the default order of [`Q4_1Matrix`]:
///
/// - `quantize_row_q8_1`: `d = amax / 127` (stored as f16), `q = round_half_even(x ·
///   (127 / amax))`, `s = f16(d · Σq)` with the f32 `d`;
/// - `ggml_vec_dot_q4_1_q8_1`: per block, the eight 4-value integer dot products of the
///   32 nibbles with the 32 quants (exact, as `maddubs`+`madd` or `dpbusd` give them)
///   are accumulated in eight f32 lanes with `acc = fma(d4 · d8, xy, acc)`; beside it
///   `summs = fma(m4, s8, summs)` (GCC contracts `summs += m * s`); the result is
///   `hsum_float_8(acc) + summs`, `hsum_float_8` adding lanes `(4..8) + (0..4)`, then
///   `(l0 + l2) + (l1 + l3)`.
///
/// Every operation rounds the same in the scalar and the AVX2 code, which the tests
/// check bit for bit; the eight independent lanes (instead of one sequential sum) are
/// what lets the kernel run at the speed of the integer dot products.
mod ggml {
    use super::{f16_bits_to_f32, f32_to_f16_bits, Nibbles, Q4_1Matrix, Q8Quants, QK};

    /// [`super::quantize_row_body`]'s counterpart in ggml's numerics.
    #[inline(always)]
    pub(super) fn quantize_row(x: &[f32], q: &mut [Q8Quants], d: &mut [f32], s: &mut [f32]) {
        for (((xb, qb), db), sb) in x.chunks_exact(QK).zip(q).zip(d).zip(s) {
            let amax = super::block_amax(xb);
            let dd = amax / 127.0;
            let id = if amax != 0.0 { 127.0 / amax } else { 0.0 };
            let mut sum = 0i32;
            for (qv, &xv) in qb.0.iter_mut().zip(xb) {
                *qv = ((xv * id).round_ties_even() as i32).clamp(-128, 127) as i8;
                sum += i32::from(*qv);
            }
            *db = f16_bits_to_f32(f32_to_f16_bits(dd));
            *sb = f16_bits_to_f32(f32_to_f16_bits(dd * sum as f32));
        }
    }

    /// The eight 4-value integer dot products of one block: lane `l` is
    /// `Σ_{i=4l}^{4l+3} nibble_i · q_i` (nibble `i < 16` is the low half of byte `i`,
    /// nibble `i ≥ 16` the high half of byte `i − 16`).
    #[inline(always)]
    fn lane_dots(w: &Nibbles, a: &Q8Quants) -> [i32; 8] {
        let mut out = [0i32; 8];
        for (l, o) in out.iter_mut().enumerate() {
            for i in 4 * l..4 * l + 4 {
                let nib = if i < 16 {
                    w.0[i] & 0x0f
                } else {
                    w.0[i - 16] >> 4
                };
                *o += i32::from(nib) * i32::from(a.0[i]);
            }
        }
        out
    }

    /// `hsum_float_8(acc) + summs`.
    #[inline(always)]
    pub(super) fn finish(acc: [f32; 8], summs: f32) -> f32 {
        let r: [f32; 4] = std::array::from_fn(|i| acc[4 + i] + acc[i]);
        ((r[0] + r[2]) + (r[1] + r[3])) + summs
    }

    /// One output in ggml's order (portable reference for the AVX2 kernel).
    pub(super) fn vec_dot(
        w: &Q4_1Matrix,
        r: usize,
        xq: &[Q8Quants],
        xd: &[f32],
        xs: &[f32],
    ) -> f32 {
        let mut acc = [0f32; 8];
        let mut summs = 0f32;
        for b in 0..w.nb {
            let (q, d, m) = w.block(r, b);
            summs = m.mul_add(xs[b], summs);
            let d0d1 = d * xd[b];
            for (a, xy) in acc.iter_mut().zip(lane_dots(q, &xq[b])) {
                *a = d0d1.mul_add(xy as f32, *a);
            }
        }
        finish(acc, summs)
    }
}

#[cfg(target_arch = "x86_64")]
mod ggml_avx2 {
    //! The ggml-order kernel with AVX2 + FMA. Callers check both with
    //! `is_x86_feature_detected!` first.

    use super::{store_tile as store, Group4, Q4_1Matrix, Q8_1Rows, GROUP_ROWS, QK};
    use std::arch::x86_64::*;

    /// Records (80 bytes each) fetched ahead of the one being computed.
    const PREFETCH_RECORDS: usize = 64;

    /// See [`super::ggml::quantize_row`].
    ///
    /// # Safety
    /// The CPU must support AVX2 and FMA.
    /// Explicit SIMD (ggml's `quantize_row_q8_1` AVX2 body): the same values as the
    /// portable code for every finite input (tested); a NaN input gives another
    /// (meaningless) quant than the portable code.
    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn quantize_row(
        x: &[f32],
        q: &mut [super::Q8Quants],
        d: &mut [f32],
        s: &mut [f32],
    ) {
        use super::{f16_bits_to_f32, f32_to_f16_bits};
        let sign = _mm256_set1_ps(-0.0);
        let order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
        for (((xb, qb), db), sb) in x.chunks_exact(QK).zip(q).zip(d).zip(s) {
            let p = xb.as_ptr();
            let v = [
                _mm256_loadu_ps(p),
                _mm256_loadu_ps(p.add(8)),
                _mm256_loadu_ps(p.add(16)),
                _mm256_loadu_ps(p.add(24)),
            ];
            // `max(|v|, acc)` returns `acc` for a NaN `v`, like `f32::max`.
            let mut mx = _mm256_setzero_ps();
            for vi in v {
                mx = _mm256_max_ps(_mm256_andnot_ps(sign, vi), mx);
            }
            let m4 = _mm_max_ps(_mm256_extractf128_ps::<1>(mx), _mm256_castps256_ps128(mx));
            let m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
            let m4 = _mm_max_ss(m4, _mm_movehdup_ps(m4));
            let amax = _mm_cvtss_f32(m4);
            let dd = amax / 127.0;
            let id = _mm256_set1_ps(if amax != 0.0 { 127.0 / amax } else { 0.0 });
            let i: [__m256i; 4] = std::array::from_fn(|k| {
                _mm256_cvtps_epi32(_mm256_round_ps::<
                    { _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC },
                >(_mm256_mul_ps(v[k], id)))
            });
            let sum = _mm256_add_epi32(_mm256_add_epi32(i[0], i[1]), _mm256_add_epi32(i[2], i[3]));
            let s4 = _mm_add_epi32(
                _mm256_extracti128_si256::<1>(sum),
                _mm256_castsi256_si128(sum),
            );
            let s4 = _mm_add_epi32(s4, _mm_unpackhi_epi64(s4, s4));
            let s4 = _mm_add_epi32(s4, _mm_shuffle_epi32::<0b01>(s4));
            let total = _mm_cvtsi128_si32(s4);
            let packed = _mm256_packs_epi16(
                _mm256_packs_epi32(i[0], i[1]),
                _mm256_packs_epi32(i[2], i[3]),
            );
            _mm256_store_si256(
                qb.0.as_mut_ptr().cast(),
                _mm256_permutevar8x32_epi32(packed, order),
            );
            *db = f16_bits_to_f32(f32_to_f16_bits(dd));
            *sb = f16_bits_to_f32(f32_to_f16_bits(dd * total as f32));
        }
    }

    /// Generates a `rows_range` / `tile` pair for a set of target features and a way to
    /// compute the eight 4-value integer dot products (identical results either way).
    macro_rules! ggml_kernel {
        ($rows:ident, $tile:ident, $features:literal, |$qx:ident, $qy:ident| $dot:expr) => {
            /// The weight rows of groups `g0 ..` against every activation row into
            /// `out[(r - 4 g0) * m + a]`, in ggml's order. Each [`Group4`] record is
            /// unpacked once per tile of 4, 2 or 1 activation rows; a 4 × 4 tile keeps
            /// its 16 accumulators in registers (AVX-512VL has 32).
            ///
            /// # Safety
            /// The CPU must support the function's target features; `out.len()` a
            /// multiple of `4 * act.rows` and the groups in range (slice indexing
            /// panics otherwise, it cannot read out of bounds).
            #[target_feature(enable = $features)]
            pub(super) unsafe fn $rows(w: &Q4_1Matrix, act: &Q8_1Rows, g0: usize, out: &mut [f32]) {
                let m = act.rows;
                for (gi, out_g) in out.chunks_exact_mut(GROUP_ROWS * m).enumerate() {
                    let g = g0 + gi;
                    let mut a0 = 0;
                    while a0 + 4 <= m {
                        store(out_g, m, a0, &$tile::<4>(w, g, act, a0));
                        a0 += 4;
                    }
                    if m - a0 >= 2 {
                        store(out_g, m, a0, &$tile::<2>(w, g, act, a0));
                        a0 += 2;
                    }
                    if m - a0 >= 1 {
                        store(out_g, m, a0, &$tile::<1>(w, g, act, a0));
                    }
                }
            }

            /// Weight rows `4g .. 4g + 4` against activation rows `a0 .. a0 + A`:
            /// `[row][act]`.
            ///
            /// Rows go in pairs: one 32-byte load holds the nibbles of rows `2p` and
            /// `2p + 1`; masking gives their low nibbles side by side (`lo`) and
            /// shifting their high nibbles (`hi`). Against the activation's first 16
            /// quants in both halves, `lo` yields ggml's lanes 0..4 of row `2p` in lanes
            /// 0..4 and of row `2p + 1` in lanes 4..8; `hi` against the last 16 quants
            /// yields lanes 4..8 of both rows. Each f32 lane thus sees exactly ggml's
            /// operations (`fma(d4 · d8, xy, acc)` with its own row's scale), only
            /// stored in another register.
            #[target_feature(enable = $features)]
            #[inline]
            unsafe fn $tile<const A: usize>(
                w: &Q4_1Matrix,
                g: usize,
                act: &Q8_1Rows,
                a0: usize,
            ) -> [[f32; A]; GROUP_ROWS] {
                let nb = w.nb;
                let low = _mm256_set1_epi8(0x0f);
                let recs = &w.groups[g * nb..(g + 1) * nb];
                let xq = &act.qs[a0 * nb..(a0 + A) * nb];
                let xd = &act.d[a0 * nb..(a0 + A) * nb];
                let xs = &act.s[a0 * nb..(a0 + A) * nb];
                // [pair][act]: lanes as described above.
                let mut acc_lo = [[_mm256_setzero_ps(); A]; 2];
                let mut acc_hi = [[_mm256_setzero_ps(); A]; 2];
                // Lanes 4..8: the four rows' `summs`.
                let mut summs = [_mm256_setzero_ps(); A];
                let pair_idx = [
                    _mm256_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1),
                    _mm256_setr_epi32(2, 2, 2, 2, 3, 3, 3, 3),
                ];
                for (b, rec) in recs.iter().enumerate() {
                    if A == 1 {
                        // Single-row decode streams the weights once: fetch ahead (a
                        // hint; it never faults, and past the end it fetches nothing
                        // useful).
                        let ahead = (rec as *const Group4).wrapping_add(PREFETCH_RECORDS);
                        _mm_prefetch::<_MM_HINT_T0>(ahead.cast());
                    }
                    // [d0 d1 d2 d3 m0 m1 m2 m3], exact f16 → f32.
                    let dm = _mm256_cvtph_ps(_mm_load_si128(rec.dm.as_ptr().cast()));
                    let mut lo = [_mm256_setzero_si256(); 2];
                    let mut hi = [_mm256_setzero_si256(); 2];
                    let mut dpair = [_mm256_setzero_ps(); 2];
                    for p in 0..2 {
                        let v = _mm256_loadu_si256(rec.qs[2 * p].0.as_ptr().cast());
                        lo[p] = _mm256_and_si256(v, low);
                        hi[p] = _mm256_and_si256(_mm256_srli_epi16::<4>(v), low);
                        dpair[p] = _mm256_permutevar8x32_ps(dm, pair_idx[p]);
                    }
                    for t in 0..A {
                        let x = t * nb + b;
                        summs[t] = _mm256_fmadd_ps(dm, _mm256_set1_ps(xs[x]), summs[t]);
                        let d8 = _mm256_set1_ps(xd[x]);
                        let q = &xq[x].0;
                        let y_lo = _mm256_broadcastsi128_si256(_mm_load_si128(q.as_ptr().cast()));
                        let y_hi =
                            _mm256_broadcastsi128_si256(_mm_load_si128(q[16..].as_ptr().cast()));
                        for p in 0..2 {
                            // `d4 · d8` per row, the scalar product ggml broadcasts.
                            let scale = _mm256_mul_ps(dpair[p], d8);
                            let xy_lo = {
                                let ($qx, $qy) = (lo[p], y_lo);
                                _mm256_cvtepi32_ps($dot)
                            };
                            let xy_hi = {
                                let ($qx, $qy) = (hi[p], y_hi);
                                _mm256_cvtepi32_ps($dot)
                            };
                            acc_lo[p][t] = _mm256_fmadd_ps(scale, xy_lo, acc_lo[p][t]);
                            acc_hi[p][t] = _mm256_fmadd_ps(scale, xy_hi, acc_hi[p][t]);
                        }
                    }
                }
                let mut out = [[0f32; A]; GROUP_ROWS];
                for t in 0..A {
                    let mut s = [0f32; 8];
                    _mm256_storeu_ps(s.as_mut_ptr(), summs[t]);
                    for p in 0..2 {
                        let (mut l, mut h) = ([0f32; 8], [0f32; 8]);
                        _mm256_storeu_ps(l.as_mut_ptr(), acc_lo[p][t]);
                        _mm256_storeu_ps(h.as_mut_ptr(), acc_hi[p][t]);
                        for half in 0..2 {
                            let r = 2 * p + half;
                            let lanes: [f32; 8] = std::array::from_fn(|i| {
                                if i < 4 {
                                    l[4 * half + i]
                                } else {
                                    h[4 * half + i - 4]
                                }
                            });
                            out[r][t] = super::ggml::finish(lanes, s[4 + r]);
                        }
                    }
                }
                let _ = QK;
                out
            }
        };
    }

    // `maddubs` (u8 × i8 pairs → i16; at most 2 · 15 · 127, no saturation) then `madd`
    // with ones (→ i32 per 4 values), as ggml's `mul_sum_us8_pairs_float` without VNNI.
    ggml_kernel!(rows_range, tile, "avx2,fma,f16c", |qx, qy| {
        _mm256_madd_epi16(_mm256_maddubs_epi16(qx, qy), _mm256_set1_epi16(1))
    });
    // `vpdpbusd`: the same four-product sums in one instruction.
    ggml_kernel!(
        rows_range_vnni,
        tile_vnni,
        "avx2,fma,f16c,avx512vnni,avx512vl",
        |qx, qy| _mm256_dpbusd_epi32(_mm256_setzero_si256(), qx, qy)
    );
}

#[cfg(target_arch = "x86_64")]
mod ggml_avx512 {
    //! ggml's order on 512-bit registers. Callers check AVX2, FMA, F16C and AVX-512
    //! F/BW/VL/VNNI first.

    use super::{store_tile as store, Group4, Q4_1Matrix, Q8_1Rows, GROUP_ROWS};
    use std::arch::x86_64::*;

    /// Records (80 bytes each) fetched ahead in single-row (decode) tiles.
    const PREFETCH_RECORDS: usize = 64;

    /// See `ggml_avx2::rows_range_vnni`; same contract and results.
    ///
    /// # Safety
    /// The CPU must support the target features; `out.len()` a multiple of
    /// `4 * act.rows` (slice indexing panics on anything out of range).
    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
    pub(super) unsafe fn rows_range(w: &Q4_1Matrix, act: &Q8_1Rows, g0: usize, out: &mut [f32]) {
        let m = act.rows;
        for (gi, out_g) in out.chunks_exact_mut(GROUP_ROWS * m).enumerate() {
            let g = g0 + gi;
            let mut a0 = 0;
            while a0 + 4 <= m {
                store(out_g, m, a0, &tile::<4>(w, g, act, a0));
                a0 += 4;
            }
            if m - a0 >= 2 {
                store(out_g, m, a0, &tile::<2>(w, g, act, a0));
                a0 += 2;
            }
            if m - a0 >= 1 {
                store(out_g, m, a0, &tile::<1>(w, g, act, a0));
            }
        }
    }

    /// Weight rows `4g .. 4g + 4` against activation rows `a0 .. a0 + A`.
    ///
    /// One 64-byte load holds the record's four rows of nibbles; masked, they are the
    /// rows' low nibbles side by side, shifted and masked their high nibbles. Against
    /// the activation's first (last) 16 quants repeated four times, `vpdpbusd` gives
    /// ggml's lanes 0..4 (4..8) of row `r` in lanes `4r .. 4r + 4`. Each f32 lane then
    /// sees exactly ggml's `fma(d4 · d8, xy, acc)` with its own row's scale.
    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
    #[inline]
    unsafe fn tile<const A: usize>(
        w: &Q4_1Matrix,
        g: usize,
        act: &Q8_1Rows,
        a0: usize,
    ) -> [[f32; A]; GROUP_ROWS] {
        let nb = w.nb;
        let low = _mm512_set1_epi8(0x0f);
        let quad = _mm512_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3);
        let recs = &w.groups[g * nb..(g + 1) * nb];
        let xq = &act.qs[a0 * nb..(a0 + A) * nb];
        let xd = &act.d[a0 * nb..(a0 + A) * nb];
        let xs = &act.s[a0 * nb..(a0 + A) * nb];
        let mut acc_lo = [_mm512_setzero_ps(); A];
        let mut acc_hi = [_mm512_setzero_ps(); A];
        // Lanes 4..8: the four rows' `summs`.
        let mut summs = [_mm256_setzero_ps(); A];
        for (b, rec) in recs.iter().enumerate() {
            if A == 1 {
                // A hint; never faults.
                let ahead = (rec as *const Group4).wrapping_add(PREFETCH_RECORDS);
                _mm_prefetch::<_MM_HINT_T0>(ahead.cast());
            }
            // [d0 d1 d2 d3 m0 m1 m2 m3], exact f16 → f32.
            let dm = _mm256_cvtph_ps(_mm_load_si128(rec.dm.as_ptr().cast()));
            let d4 = _mm512_permutexvar_ps(quad, _mm512_castps256_ps512(dm));
            let v = _mm512_loadu_si512(rec.qs.as_ptr().cast());
            let lo = _mm512_and_si512(v, low);
            let hi = _mm512_and_si512(_mm512_srli_epi16::<4>(v), low);
            for t in 0..A {
                let x = t * nb + b;
                summs[t] = _mm256_fmadd_ps(dm, _mm256_set1_ps(xs[x]), summs[t]);
                let q = &xq[x].0;
                let y_lo = _mm512_broadcast_i32x4(_mm_load_si128(q.as_ptr().cast()));
                let y_hi = _mm512_broadcast_i32x4(_mm_load_si128(q[16..].as_ptr().cast()));
                // `d4 · d8` per row, the scalar product ggml broadcasts.
                let scale = _mm512_mul_ps(d4, _mm512_set1_ps(xd[x]));
                let zero = _mm512_setzero_si512();
                let xy_lo = _mm512_cvtepi32_ps(_mm512_dpbusd_epi32(zero, lo, y_lo));
                let xy_hi = _mm512_cvtepi32_ps(_mm512_dpbusd_epi32(zero, hi, y_hi));
                acc_lo[t] = _mm512_fmadd_ps(scale, xy_lo, acc_lo[t]);
                acc_hi[t] = _mm512_fmadd_ps(scale, xy_hi, acc_hi[t]);
            }
        }
        let mut out = [[0f32; A]; GROUP_ROWS];
        for t in 0..A {
            let (mut l, mut h, mut sm) = ([0f32; 16], [0f32; 16], [0f32; 8]);
            _mm512_storeu_ps(l.as_mut_ptr(), acc_lo[t]);
            _mm512_storeu_ps(h.as_mut_ptr(), acc_hi[t]);
            _mm256_storeu_ps(sm.as_mut_ptr(), summs[t]);
            for (r, o) in out.iter_mut().enumerate() {
                let lanes: [f32; 8] = std::array::from_fn(|i| {
                    if i < 4 {
                        l[4 * r + i]
                    } else {
                        h[4 * r + i - 4]
                    }
                });
                o[t] = super::ggml::finish(lanes, sm[4 + r]);
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::quantized::QMatMul;
    use candle_core::Module;

    fn random(shape: (usize, usize), seed: u64) -> Tensor {
        // Deterministic xorshift values in [-1, 1), with a few larger outliers.
        let mut state = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
        let data: Vec<f32> = (0..shape.0 * shape.1)
            .map(|i| {
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                let u = (state >> 40) as f32 / (1u64 << 24) as f32;
                let v = 2.0 * u - 1.0;
                if i % 97 == 0 {
                    4.0 * v
                } else {
                    v
                }
            })
            .collect();
        Tensor::from_vec(data, shape, &Device::Cpu).unwrap()
    }

    /// Asserts `a` and `b` have the same shape and bit-identical values.
    fn assert_same_bits(a: &Tensor, b: &Tensor, what: &str) {
        assert_eq!(a.dims(), b.dims(), "{what}");
        let av = a.flatten_all().unwrap().to_vec1::<f32>().unwrap();
        let bv = b.flatten_all().unwrap().to_vec1::<f32>().unwrap();
        for (i, (x, y)) in av.iter().zip(&bv).enumerate() {
            assert_eq!(
                x.to_bits(),
                y.to_bits(),
                "{what}: element {i}: {x:e} vs {y:e}"
            );
        }
    }

    /// The candle-order kernels (bit-exact with candle).
    fn kernels() -> Vec<Kernel> {
        vec![Kernel::Scalar]
    }

    /// The ggml-order kernels this CPU runs (the serving default).
    fn ggml_kernels() -> Vec<Kernel> {
        let mut k = vec![Kernel::GgmlScalar];
        #[cfg(target_arch = "x86_64")]
        if is_x86_feature_detected!("avx2")
            && is_x86_feature_detected!("fma")
            && is_x86_feature_detected!("f16c")
        {
            k.push(Kernel::GgmlAvx2);
            if is_x86_feature_detected!("avx512vnni") && is_x86_feature_detected!("avx512vl") {
                k.push(Kernel::GgmlVnni);
            }
        }
        if !k.contains(&Kernel::detect()) {
            k.push(Kernel::detect());
        }
        k
    }

    /// Our forward vs candle's portable Q4_1 `QMatMul`: same Q8_1 activations, same
    /// integer dot products and the same f32 operations in the same order, so every
    /// kernel must give exactly candle's bits.
    #[test]
    fn matches_candle_qmatmul_and_f32_reference() {
        for (si, &(n, k)) in [(192, 576), (1536, 576), (576, 1536), (8, 64), (7, 192)]
            .iter()
            .enumerate()
        {
            let w = random((n, k), 1 + si as u64);
            let qt = QTensor::quantize(&w, GgmlDType::Q4_1).unwrap();
            let wdq = qt.dequantize(&Device::Cpu).unwrap();
            let ours = Q4_1Matrix::from_qtensor(&qt).unwrap();
            assert_eq!(ours.shape(), (n, k));
            let candle = QMatMul::from_qtensor(qt).unwrap();
            for m in [1usize, 3, 37] {
                let x = random((m, k), 100 + m as u64 + 7 * si as u64);
                let want = candle.forward(&x).unwrap();
                let reference = x.matmul(&wdq.t().unwrap()).unwrap();
                for kernel in kernels().into_iter().chain(ggml_kernels()) {
                    let got = ours.forward_with(&x, kernel).unwrap();
                    assert_eq!(got.dims(), &[m, n]);
                    if kernels().contains(&kernel) {
                        assert_same_bits(&got, &want, &format!("({n},{k}) m={m} {kernel:?}"));
                    }
                    // Against the f32 product with the dequantized weights, the only
                    // error is the Q8_1 rounding of x: |Δx_i| ≤ d8/2 per value (plus
                    // the f16 rounding of d8 and s), so |Δy| ≤ Σ_b (d8_b/2 + 2⁻¹¹·amax_b)
                    // · Σ_i |w_i| summed per block.
                    let xv = x.to_vec2::<f32>().unwrap();
                    let wv = wdq.to_vec2::<f32>().unwrap();
                    let gv = got.to_vec2::<f32>().unwrap();
                    let rv = reference.to_vec2::<f32>().unwrap();
                    for a in 0..m {
                        for r in 0..n {
                            let mut bound = 0f32;
                            for b in 0..k / QK {
                                let xb = &xv[a][b * QK..(b + 1) * QK];
                                let amax = xb.iter().fold(0f32, |acc, v| acc.max(v.abs()));
                                let wsum: f32 =
                                    wv[r][b * QK..(b + 1) * QK].iter().map(|v| v.abs()).sum();
                                bound += (amax / 127.0 * 0.5 + amax / 1024.0) * wsum;
                            }
                            let err = (gv[a][r] - rv[a][r]).abs();
                            assert!(
                                err <= bound * 1.01 + 1e-5,
                                "({n},{k}) m={m} [{a},{r}]: |{} - {}| > {bound}",
                                gv[a][r],
                                rv[a][r]
                            );
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn batched_leading_dims_and_non_contiguous_input() {
        // candle's portable Q4_1 kernel debug-asserts an even block count.
        let (n, k) = (64, 128);
        let qt = QTensor::quantize(&random((n, k), 5), GgmlDType::Q4_1).unwrap();
        let ours = Q4_1Matrix::from_qtensor(&qt).unwrap();
        let candle = QMatMul::from_qtensor(qt).unwrap();
        let x = random((6, k), 9).reshape((2, 3, k)).unwrap();
        let got = ours.forward_with(&x, Kernel::Scalar).unwrap();
        assert_eq!(got.dims(), &[2, 3, n]);
        let want = candle.forward(&x).unwrap();
        assert_same_bits(&got, &want, "batched");
        // A transposed (non-contiguous) input is made contiguous first.
        let xt = random((k, 5), 11).t().unwrap();
        assert!(!xt.is_contiguous());
        let got = ours.forward_with(&xt, Kernel::Scalar).unwrap();
        let want = candle.forward(&xt.contiguous().unwrap()).unwrap();
        assert_same_bits(&got, &want, "transposed");
        // 1-D input: a single row.
        let x1 = random((1, k), 12).flatten_all().unwrap();
        let got = ours.forward(&x1).unwrap();
        assert_eq!(got.dims(), &[n]);
    }

    #[test]
    fn scalar_and_simd_kernels_agree() {
        // Every tile shape (m = 1; odd n; m % 4 != 0; several activation tiles) with
        // the parallel split, and block counts that are whole groups of 8 (8, 48), have a
        // partial last group (18, 17, 23) or only a partial group (1, 3, 7). candle's
        // kernel does not accept odd block counts, so these compare with our scalar
        // kernel, itself checked bit-exact against candle above.
        for &(n, k) in &[
            (1537usize, 576usize),
            (33, 96),
            (67, 256),
            (9, 32),
            (130, 224),
            (65, 544),
            (31, 736),
            (37, 1536),
        ] {
            let qt = QTensor::quantize(&random((n, k), 21 + k as u64), GgmlDType::Q4_1).unwrap();
            let ours = Q4_1Matrix::from_qtensor(&qt).unwrap();
            for m in [1usize, 2, 5, 70, 131] {
                let x = random((m, k), 30 + m as u64);
                let what = format!("({n},{k}) m={m}");
                let scalar = ours.forward_with(&x, Kernel::Scalar).unwrap();
                for kernel in kernels() {
                    assert_same_bits(&ours.forward_with(&x, kernel).unwrap(), &scalar, &what);
                }
                let ggml = ours.forward_with(&x, Kernel::GgmlScalar).unwrap();
                assert_same_bits(&ours.forward(&x).unwrap(), &ggml, &what);
                for kernel in ggml_kernels() {
                    assert_same_bits(&ours.forward_with(&x, kernel).unwrap(), &ggml, &what);
                }
            }
        }
    }

    #[test]
    fn q8_1_quantization_kernels_agree() {
        // The AVX2 build of the quantizer against the portable one, bit for bit, on
        // rows with zeros, ties at .5 and large magnitudes.
        let k = 32 * 24;
        let rows = 20;
        let mut xs = random((rows, k), 8)
            .flatten_all()
            .unwrap()
            .to_vec1::<f32>()
            .unwrap();
        for (i, v) in xs.iter_mut().enumerate() {
            match i % 211 {
                0..=31 => *v = 0.0,
                40 => *v *= 1e4,
                41 => *v = 0.5,
                42 => *v = -2.5,
                _ => {}
            }
        }
        for (reference, family) in [
            (Kernel::Scalar, kernels()),
            (Kernel::GgmlScalar, ggml_kernels()),
        ] {
            let want = quantize_q8_1(&xs, rows, k, reference);
            for kernel in family {
                let got = quantize_q8_1(&xs, rows, k, kernel);
                for b in 0..rows * k / QK {
                    assert_eq!(got.d[b].to_bits(), want.d[b].to_bits(), "d {b}");
                    assert_eq!(got.s[b].to_bits(), want.s[b].to_bits(), "s {b}");
                    assert_eq!(got.qs[b].0, want.qs[b].0, "q {b}");
                }
            }
        }
        // ggml rounds x · (127 / amax) half to even: 0.5 → 0, -2.5 → -2 when the block's
        // amax is 127 (candle rounds half away from zero: 1 and -3).
        let mut x = vec![0f32; QK];
        x[0] = 127.0;
        x[1] = 0.5;
        x[2] = -2.5;
        let g = quantize_q8_1(&x, 1, QK, Kernel::GgmlScalar);
        let c = quantize_q8_1(&x, 1, QK, Kernel::Scalar);
        assert_eq!((g.qs[0].0[1], g.qs[0].0[2]), (0, -2));
        assert_eq!((c.qs[0].0[1], c.qs[0].0[2]), (1, -3));
    }

    #[test]
    fn q8_1_quantization_matches_candle_bits() {
        // candle's Q8_1 blocks for the same values, read back through its raw data.
        let k = 256;
        let x = random((3, k), 42);
        let x = (x * 3.0).unwrap();
        let q = QTensor::quantize(&x, GgmlDType::Q8_1).unwrap();
        let raw = q.data().unwrap();
        let xs = x.flatten_all().unwrap().to_vec1::<f32>().unwrap();
        for kernel in kernels() {
            let act = quantize_q8_1(&xs, 3, k, kernel);
            for (bi, block) in raw.chunks_exact(36).enumerate() {
                let d = f16_bits_to_f32(u16::from_le_bytes([block[0], block[1]]));
                let s = f16_bits_to_f32(u16::from_le_bytes([block[2], block[3]]));
                assert_eq!(d.to_bits(), act.d[bi].to_bits(), "d of block {bi}");
                assert_eq!(s.to_bits(), act.s[bi].to_bits(), "s of block {bi}");
                for j in 0..QK {
                    assert_eq!(block[4 + j] as i8, act.qs[bi].0[j], "q {bi}/{j}");
                }
            }
        }
    }

    #[test]
    fn f16_conversions_match_candle() {
        // Every f16 bit pattern → f32.
        let bits: Vec<u8> = (0..=u16::MAX).flat_map(|h| h.to_le_bytes()).collect();
        let t = Tensor::from_raw_buffer(&bits, DType::F16, &[1 << 16], &Device::Cpu).unwrap();
        let f = t.to_dtype(DType::F32).unwrap().to_vec1::<f32>().unwrap();
        for (h, want) in (0..=u16::MAX).zip(&f) {
            let got = f16_bits_to_f32(h);
            assert!(
                got.to_bits() == want.to_bits() || (got.is_nan() && want.is_nan()),
                "{h:#06x}"
            );
        }
        // f32 → f16 on values around every rounding boundary and range edge.
        let mut vals: Vec<f32> = vec![0.0, -0.0, 65504.0, 65519.0, 65520.0, 1e-8, 3e-8, 6e-8];
        let mut state = 7u32;
        for _ in 0..200_000 {
            state ^= state << 13;
            state ^= state >> 17;
            state ^= state << 5;
            // Finite exponents from 2^-30 to 2^17, random mantissas.
            let exp = 97 + (state >> 27) % 48;
            vals.push(f32::from_bits((state & 0x807f_ffff) | (exp << 23)));
        }
        for h in 0..0x7bffu16 {
            let v = f16_bits_to_f32(h);
            let next = f16_bits_to_f32(h + 1);
            vals.push((v + next) / 2.0); // exact tie
            vals.push(f32::from_bits(((v + next) / 2.0).to_bits() + 1));
        }
        let t = Tensor::from_vec(vals.clone(), vals.len(), &Device::Cpu).unwrap();
        let h = t
            .to_dtype(DType::F16)
            .unwrap()
            .to_dtype(DType::F32)
            .unwrap();
        for (v, want) in vals.iter().zip(h.to_vec1::<f32>().unwrap()) {
            assert_eq!(f16_round(*v).to_bits(), want.to_bits(), "{v:e}");
        }
    }

    #[test]
    fn bad_inputs_are_errors() {
        // k not a multiple of 32.
        assert!(Q4_1Matrix::from_ggml_bytes(&[0u8; 40], 1, 40).is_err());
        // Wrong data size.
        assert!(Q4_1Matrix::from_ggml_bytes(&[0u8; 39], 1, 64).is_err());
        // Wrong dtype.
        let w = random((4, 64), 3);
        let q8 = QTensor::quantize(&w, GgmlDType::Q8_0).unwrap();
        assert!(Q4_1Matrix::from_qtensor(&q8).is_err());
        // Not 2-D.
        let w3 = w.reshape((2, 2, 64)).unwrap();
        let q3 = QTensor::quantize(&w3, GgmlDType::Q4_1).unwrap();
        assert!(Q4_1Matrix::from_qtensor(&q3).is_err());
        // x last dim ≠ k, wrong dtype, scalar.
        let ours =
            Q4_1Matrix::from_qtensor(&QTensor::quantize(&w, GgmlDType::Q4_1).unwrap()).unwrap();
        assert!(ours.forward(&random((2, 63), 1)).is_err());
        assert!(ours.forward(&random((2, 96), 1)).is_err());
        assert!(ours.forward(&random((2, 64), 1).t().unwrap()).is_err());
        let x16 = random((2, 64), 1).to_dtype(DType::F16).unwrap();
        assert!(ours.forward(&x16).is_err());
        assert!(ours
            .forward(&Tensor::new(1f32, &Device::Cpu).unwrap())
            .is_err());
        // Zero rows is fine.
        let empty = Tensor::zeros((0, 64), DType::F32, &Device::Cpu).unwrap();
        assert_eq!(ours.forward(&empty).unwrap().dims(), &[0, 4]);
    }

    /// Mean ns per call of `f`, over about 0.3 s after a warm-up.
    fn time_ns(mut f: impl FnMut()) -> f64 {
        let start = std::time::Instant::now();
        f();
        let once = start.elapsed().as_nanos().max(1);
        let iters = (300_000_000 / once).clamp(3, 20_000) as u32;
        for _ in 0..iters / 10 + 1 {
            f();
        }
        let start = std::time::Instant::now();
        for _ in 0..iters {
            f();
        }
        start.elapsed().as_nanos() as f64 / f64::from(iters)
    }

    /// `cargo test -p inferd --release --lib model::q4_1::tests::timing -- --ignored --nocapture`
    #[test]
    #[ignore]
    fn timing() {
        // Streaming: a 40 MB matrix (more than L2, as a decode step's weights), one
        // activation row, kernel only, single thread vs the team.
        let (n, k) = (110_000usize, 576usize);
        let data: Vec<u8> = (0..n * k / 32 * 20)
            .map(|i| (i * 7 % 251) as u8 & 0x3b)
            .collect();
        let w = Q4_1Matrix::from_ggml_bytes(&data, n, k).unwrap();
        let xs: Vec<f32> = (0..k).map(|i| (i as f32 * 0.37).sin()).collect();
        let act = quantize_q8_1(&xs, 1, k, Kernel::detect());
        let mut out = vec![0f32; n.div_ceil(4) * 4];
        let bytes = (n * k / 32 * 20) as f64;
        let t_one = time_ns(|| w.rows_range(&act, 0, &mut out, Kernel::detect()));
        let t2 = time_ns(|| {
            std::hint::black_box(w.matmul(&act, Kernel::detect()));
        });
        // A decode step's shapes: 30 layers of qkv (960, 576), o (576, 576), gate/up
        // (3072, 576), down (576, 1536), each its own allocation.
        let shapes = [(960usize, 576usize), (576, 576), (3072, 576), (576, 1536)];
        let mats: Vec<Q4_1Matrix> = (0..30 * 4)
            .map(|i| {
                let (n, k) = shapes[i % 4];
                let data: Vec<u8> = (0..n * k / 32 * 20)
                    .map(|j| ((i + j) * 7 % 251) as u8 & 0x3b)
                    .collect();
                Q4_1Matrix::from_ggml_bytes(&data, n, k).unwrap()
            })
            .collect();
        let total: usize = mats.iter().map(|m| m.n * m.k / 32 * 20).sum();
        let rows: usize = std::env::var("TIMING_ROWS")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(1);
        let xs: Vec<f32> = (0..1536 * rows).map(|i| (i as f32 * 0.37).sin()).collect();
        let acts: Vec<Q8_1Rows> = [576usize, 1536]
            .iter()
            .map(|&k| quantize_q8_1(&xs[..k * rows], rows, k, Kernel::detect()))
            .collect();
        let t = time_ns(|| {
            for m in &mats {
                let a = if m.k == 576 { &acts[0] } else { &acts[1] };
                std::hint::black_box(m.matmul(a, Kernel::detect()));
            }
        });
        let t1 = time_ns(|| {
            for m in &mats {
                let a = if m.k == 576 { &acts[0] } else { &acts[1] };
                let mut out = vec![0f32; m.n.div_ceil(4) * 4 * rows];
                m.rows_range(a, 0, &mut out, Kernel::detect());
                std::hint::black_box(out);
            }
        });
        println!(
            "decode-step shapes ({} MB in 120 matrices), {rows} rows: team {:.2} GB/s ({:.0} us), 1 thread {:.2} GB/s",
            total / 1_000_000,
            total as f64 / t,
            t / 1e3,
            total as f64 / t1
        );
        println!(
            "({n},{k}) m=1 kernel: 1 thread {:.2} GB/s ({:.2} ns/block), team of {} {:.2} GB/s",
            bytes / t_one,
            t_one / (n * k / 32) as f64,
            team::threads(),
            bytes / t2
        );
        for &(n, k) in &[(1536usize, 576usize), (576, 1536), (192, 576)] {
            let w = random((n, k), 77);
            let q41 = QTensor::quantize(&w, GgmlDType::Q4_1).unwrap();
            let ours = Q4_1Matrix::from_qtensor(&q41).unwrap();
            let wdq = q41.dequantize(&Device::Cpu).unwrap();
            let candle41 = QMatMul::from_qtensor(q41).unwrap();
            let q80 = QTensor::quantize(&wdq, GgmlDType::Q8_0).unwrap();
            let candle80 = QMatMul::from_qtensor(q80).unwrap();
            for m in [1usize, 8, 128] {
                let x = random((m, k), 5);
                let t_ours = time_ns(|| {
                    ours.forward(&x).unwrap();
                });
                let t_scalar = time_ns(|| {
                    ours.forward_with(&x, Kernel::Scalar).unwrap();
                });
                let t41 = time_ns(|| {
                    candle41.forward(&x).unwrap();
                });
                let t80 = time_ns(|| {
                    candle80.forward(&x).unwrap();
                });
                println!(
                    "({n:4},{k:4}) m={m:3}: q4_1 {kernel:?} {t_ours:9.0} ns | ours scalar {t_scalar:9.0} ns | candle Q4_1 {t41:9.0} ns | candle Q8_0 {t80:9.0} ns | threads {}",
                    team::threads(),
                    kernel = Kernel::detect(),
                );
            }
        }
    }
}
