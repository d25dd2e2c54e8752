//! Fast Q4_1 × Q8_1 matrix multiplication on the CPU, with ggml's numerics.
//!
//! candle 0.11's `QMatMul` runs Q4_1 weights through its portable (scalar) kernel on
//! x86. This module does the computation with AVX2 kernels (runtime detected, scalar
//! fallbacks giving the same bits elsewhere) split over output rows on the compute
//! thread team ([`crate::team`]). Each
//! activation row is quantized per 32-value block to Q8_1, each output is a sum over
//! blocks of `sumi · d4 · d8 + m4 · s8`, with `sumi` the exact integer dot product of
//! the block's 32 nibbles with its 32 `i8`s.
//!
//! Two orders of the float operations are implemented:
//!
//! - **ggml's** (`ggml.rs`; what [`Q4_1Matrix::forward`] runs): `quantize_row_q8_1` and
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

use crate::team;
use candle_core::quantized::{GgmlDType, QTensor};
use candle_core::{Result, Tensor};

use crate::tensor::matmul_tensor;

/// Values per Q4_1 / Q8_1 block.
const QK: usize = 32;
/// Bytes of one ggml `block_q4_1`: f16 `d`, f16 `m`, 16 bytes of nibbles.
const Q4_1_BLOCK_BYTES: usize = 20;
/// Below this many block dot products a call runs on the calling thread: waking the
/// other threads costs more than it saves.
pub(crate) const PAR_MIN_BLOCK_DOTS: usize = 8 * 1024;
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
/// four, block-interleaved (`Group4`, record `g * nb + b`), so the kernel streams one
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
            Kernel::GgmlAvx2 => unsafe { avx2::rows_range(self, act, g0, out) },
            #[cfg(target_arch = "x86_64")]
            // SAFETY: chosen only after AVX2, FMA, F16C, AVX-512 VNNI and VL were detected.
            Kernel::GgmlVnni => unsafe { avx2::rows_range_vnni(self, act, g0, out) },
            #[cfg(target_arch = "x86_64")]
            // SAFETY: chosen only after AVX2, FMA, F16C and AVX-512 F, BW, VL and VNNI
            // were detected.
            Kernel::GgmlAvx512 => unsafe { avx512::rows_range(self, act, g0, out) },
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

/// Stores a tile computed for the 4 rows of a row group against activation rows
/// `a0 .. a0 + A`: `out_g[r * m + a0 + t] = y[r][t]` (`out_g` weight-row major, `m`
/// activation rows). Shared by the Q4_1 and Q8_0 kernels.
#[inline(always)]
pub(crate) fn store_tile<const A: usize>(
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
pub(crate) fn transpose(src: &[f32], n: usize, m: usize) -> Vec<f32> {
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
            avx2::quantize_row(x, q, d, s)
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

#[cfg(target_arch = "x86_64")]
mod avx2;
#[cfg(target_arch = "x86_64")]
mod avx512;
mod ggml;
#[cfg(test)]
mod tests;
