//! Q8_0 × Q8_0 matrix multiplication on the CPU in ggml's order, for the output
//! projection (and the tied token embedding) of GGUF models.
//!
//! The numerics are those of `quantize_row_q8_0` and `ggml_vec_dot_q8_0_q8_0` in
//! `ggml/src/ggml-cpu/arch/x86/quants.c` as llama.cpp runs them on AVX2 / AVX-512 CPUs:
//!
//! - activations: per 32-value block `amax = max |x|`, `d = f16(amax / 127)`,
//!   `q = round_half_even(x · (127 / amax))` (0 when `amax = 0`);
//! - dot product: per block the eight 4-value integer dot products of weight and
//!   activation quants (exact) are accumulated in eight f32 lanes with
//!   `acc = fma(d_w · d_x, xy, acc)`, and the result is `hsum_float_8(acc)` (lanes
//!   `(4..8) + (0..4)`, then `(l0 + l2) + (l1 + l3)`).
//!
//! Every kernel (portable, AVX2, AVX-512 VNNI) gives the same bits (tested), and rows
//! are independent, so an output never depends on its batch company. Rows are stored
//! in block-interleaved groups of four like [`super::q4_1::Q4_1Matrix`]; the weight
//! quants are kept offset by +128 (u8) so that `vpdpbusd` (u8 × i8) computes
//! `Σ (q + 128) · y` and starts from `-128 · Σ y`, which is exactly `Σ q · y`.

use super::team;
use candle_core::quantized::{GgmlDType, QTensor};
use candle_core::{Result, Tensor};

use super::q4_1::{
    block_amax, f16_bits_to_f32, f32_to_f16_bits, matmul_tensor, transpose, PAR_MIN_BLOCK_DOTS,
};

/// Values per Q8_0 block.
const QK: usize = 32;
/// Bytes of one ggml `block_q8_0`: f16 `d`, then 32 `i8` quants.
const Q8_0_BLOCK_BYTES: usize = 34;
/// Rows interleaved per [`Group4`].
const GROUP_ROWS: usize = 4;

/// Block `b` of four consecutive weight rows: their f16 scales and their quants
/// offset by +128 (`u = q + 128`), 136 bytes (ggml: 4 × 34).
#[derive(Clone, Copy)]
#[repr(C, align(8))]
struct Group4 {
    d: [u16; GROUP_ROWS],
    qs: [[u8; QK]; GROUP_ROWS],
}

/// A Q8_0 weight matrix `(n, k)` for `y = x · Wᵀ`, in ggml's numerics.
pub struct Q8_0Matrix {
    n: usize,
    k: usize,
    /// Blocks per row (`k / 32`).
    nb: usize,
    /// `n.div_ceil(4) * nb` records, group-major; padding rows are zero.
    groups: Vec<Group4>,
}

impl std::fmt::Debug for Q8_0Matrix {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Q8_0Matrix")
            .field("n", &self.n)
            .field("k", &self.k)
            .finish_non_exhaustive()
    }
}

/// Activation rows quantized to Q8_0: `rows * nb` blocks, row-major.
struct Q8_0Rows {
    rows: usize,
    qs: Vec<[i8; QK]>,
    /// Block scales (f16-rounded, as f32).
    d: Vec<f32>,
    /// Per block, the eight lanes' `-128 · Σ_{i=4l}^{4l+3} q_i`: the starting value
    /// that turns `Σ (q_w + 128) · q_x` into `Σ q_w · q_x`.
    bias: Vec<[i32; 8]>,
}

/// Which kernel to run; all give the same bits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kernel {
    /// Portable reference.
    Scalar,
    /// AVX2 + FMA + F16C: ggml's sign trick with `maddubs`.
    #[cfg(target_arch = "x86_64")]
    Avx2,
    /// AVX-512 VNNI (VL) `vpdpbusd` on 256-bit vectors.
    #[cfg(target_arch = "x86_64")]
    Vnni,
    /// AVX-512 (F, BW, VNNI) on 512-bit vectors: two rows per register.
    #[cfg(target_arch = "x86_64")]
    Avx512,
}

impl Kernel {
    fn detect() -> Self {
        #[cfg(target_arch = "x86_64")]
        {
            if is_x86_feature_detected!("avx2")
                && is_x86_feature_detected!("fma")
                && is_x86_feature_detected!("f16c")
            {
                if is_x86_feature_detected!("avx512vnni") && is_x86_feature_detected!("avx512vl") {
                    if is_x86_feature_detected!("avx512f") && is_x86_feature_detected!("avx512bw") {
                        return Kernel::Avx512;
                    }
                    return Kernel::Vnni;
                }
                return Kernel::Avx2;
            }
        }
        Kernel::Scalar
    }
}

impl Q8_0Matrix {
    /// Builds the matrix from a candle `QTensor` of dtype Q8_0 and shape `(n, k)`.
    ///
    /// # Errors
    /// Another dtype, a shape that is not 2-D, or `k % 32 != 0`.
    pub fn from_qtensor(t: &QTensor) -> Result<Self> {
        if t.dtype() != GgmlDType::Q8_0 {
            candle_core::bail!("Q8_0Matrix: expected a Q8_0 tensor, got {:?}", t.dtype());
        }
        let (n, k) = t.shape().dims2()?;
        let data = t.data()?;
        Self::from_ggml_bytes(&data, n, k)
    }

    /// Builds the matrix from raw ggml `block_q8_0` bytes: `n * k / 32` blocks of 34
    /// bytes, each a little-endian f16 `d` and 32 `i8` quants.
    ///
    /// # Errors
    /// `k % 32 != 0` or `data.len() != n * k / 32 * 34`.
    pub fn from_ggml_bytes(data: &[u8], n: usize, k: usize) -> Result<Self> {
        if !k.is_multiple_of(QK) {
            candle_core::bail!("Q8_0Matrix: k = {k} is not a multiple of {QK}");
        }
        let nb = k / QK;
        let expected = n
            .checked_mul(nb)
            .and_then(|b| b.checked_mul(Q8_0_BLOCK_BYTES));
        if expected != Some(data.len()) {
            candle_core::bail!(
                "Q8_0Matrix: {} bytes of data for shape ({n}, {k}), expected {expected:?}",
                data.len()
            );
        }
        let mut groups = vec![
            Group4 {
                d: [0; GROUP_ROWS],
                qs: [[128; QK]; GROUP_ROWS],
            };
            n.div_ceil(GROUP_ROWS) * nb
        ];
        for (i, block) in data.chunks_exact(Q8_0_BLOCK_BYTES).enumerate() {
            let (r, b) = (i / nb, i % nb);
            let rec = &mut groups[(r / GROUP_ROWS) * nb + b];
            let lane = r % GROUP_ROWS;
            rec.d[lane] = u16::from_le_bytes([block[0], block[1]]);
            for (u, &q) in rec.qs[lane].iter_mut().zip(&block[2..]) {
                *u = q ^ 0x80;
            }
        }
        Ok(Self { n, k, nb, groups })
    }

    /// `(n, k)`.
    pub fn shape(&self) -> (usize, usize) {
        (self.n, self.k)
    }

    /// Dequantizes rows `ids` into `(ids.len(), k)` f32 (`d · q` per value, as ggml's
    /// `dequantize_row_q8_0` and candle's `embedding`): the token-embedding lookup when
    /// the output head is tied to it.
    ///
    /// # Errors
    /// An id `≥ n`.
    pub fn rows_dequantized(&self, ids: &[u32]) -> Result<Vec<f32>> {
        let mut out = Vec::with_capacity(ids.len() * self.k);
        for &id in ids {
            let r = id as usize;
            if r >= self.n {
                candle_core::bail!("embedding id {r} is out of range for {} rows", self.n);
            }
            for b in 0..self.nb {
                let rec = &self.groups[(r / GROUP_ROWS) * self.nb + b];
                let lane = r % GROUP_ROWS;
                let d = f16_bits_to_f32(rec.d[lane]);
                out.extend(
                    rec.qs[lane]
                        .iter()
                        .map(|&u| f32::from((u ^ 0x80) as i8) * d),
                );
            }
        }
        Ok(out)
    }

    /// `y = x · Wᵀ` for `x` of shape `(..., k)` f32 on the CPU → `(..., n)` f32.
    ///
    /// # Errors
    /// `x` not f32, not on the CPU, a scalar, or its last dimension not `k`.
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        matmul_tensor("Q8_0Matrix", x, (self.n, self.k), |xs, rows| {
            Ok(self.matmul_host(xs, rows))
        })
    }

    /// `y = x · Wᵀ` on host memory: `xs` `(rows, k)` row-major → `(rows, n)`.
    ///
    /// # Panics
    /// If `xs.len() != rows * k` (a caller bug).
    pub fn matmul_host(&self, xs: &[f32], rows: usize) -> Vec<f32> {
        self.matmul_with(xs, rows, Kernel::detect())
    }

    fn matmul_with(&self, xs: &[f32], rows: usize, kernel: Kernel) -> Vec<f32> {
        assert_eq!(
            xs.len(),
            rows * self.k,
            "Q8_0Matrix::matmul_host: input size"
        );
        let (n, m) = (self.n, rows);
        if m == 0 || n == 0 {
            return vec![0f32; m * n];
        }
        let act = quantize(xs, rows, self.k);
        let n_groups = n.div_ceil(GROUP_ROWS);
        let group_len = GROUP_ROWS * m;
        // Weight-row major: `out_t[r * m + a] = y[a][r]`.
        let mut out_t = vec![0f32; n_groups * group_len];
        let threads = team::threads();
        if n * m * self.nb < PAR_MIN_BLOCK_DOTS || threads <= 1 {
            self.groups_range(&act, 0, &mut out_t, kernel);
        } else {
            let per_task = n_groups.div_ceil(threads * 16).max(1);
            team::for_each_chunk_mut(&mut out_t, per_task * group_len, |i, chunk| {
                self.groups_range(&act, i * per_task, chunk, kernel)
            });
        }
        out_t.truncate(n * m);
        if m == 1 {
            return out_t;
        }
        transpose(&out_t, n, m)
    }

    /// The rows of groups `g0 ..` against every activation row into
    /// `out[(r - 4 g0) * m + a]`.
    fn groups_range(&self, act: &Q8_0Rows, g0: usize, out: &mut [f32], kernel: Kernel) {
        match kernel {
            Kernel::Scalar => self.groups_range_scalar(act, g0, out),
            #[cfg(target_arch = "x86_64")]
            // SAFETY: chosen only after AVX2, FMA and F16C were detected.
            Kernel::Avx2 => unsafe { x86::groups_range_avx2(self, act, g0, out) },
            #[cfg(target_arch = "x86_64")]
            // SAFETY: chosen only after AVX2, FMA, F16C, AVX-512 VNNI and VL were detected.
            Kernel::Vnni => unsafe { x86::groups_range_vnni(self, act, g0, out) },
            #[cfg(target_arch = "x86_64")]
            // SAFETY: chosen only after AVX2, FMA, F16C and AVX-512 F, BW, VL and VNNI
            // were detected.
            Kernel::Avx512 => unsafe { x86::groups_range_avx512(self, act, g0, out) },
        }
    }

    fn groups_range_scalar(&self, act: &Q8_0Rows, g0: usize, out: &mut [f32]) {
        let (m, nb) = (act.rows, self.nb);
        for (i, out_row) in out.chunks_exact_mut(m).enumerate() {
            let r = g0 * GROUP_ROWS + i;
            let (g, lane) = (r / GROUP_ROWS, r % GROUP_ROWS);
            for (a, y) in out_row.iter_mut().enumerate() {
                let mut acc = [0f32; 8];
                for b in 0..nb {
                    let rec = &self.groups[g * nb + b];
                    let x = a * nb + b;
                    let dd = f16_bits_to_f32(rec.d[lane]) * act.d[x];
                    for (l, al) in acc.iter_mut().enumerate() {
                        let mut s = 0i32;
                        for i in 4 * l..4 * l + 4 {
                            let w = i32::from((rec.qs[lane][i] ^ 0x80) as i8);
                            s += w * i32::from(act.qs[x][i]);
                        }
                        *al = dd.mul_add(s as f32, *al);
                    }
                }
                *y = hsum_float_8(acc);
            }
        }
    }
}

/// ggml's `hsum_float_8`: `(4..8) + (0..4)`, then `(l0 + l2) + (l1 + l3)`.
#[inline(always)]
fn hsum_float_8(acc: [f32; 8]) -> f32 {
    let r: [f32; 4] = std::array::from_fn(|i| acc[4 + i] + acc[i]);
    (r[0] + r[2]) + (r[1] + r[3])
}

/// ggml's `quantize_row_q8_0` for `rows` rows of `k` values, plus the VNNI bias.
fn quantize(xs: &[f32], rows: usize, k: usize) -> Q8_0Rows {
    #[cfg(target_arch = "x86_64")]
    if std::is_x86_feature_detected!("fma") && std::is_x86_feature_detected!("sse4.1") {
        // SAFETY: the features were detected.
        return unsafe { quantize_x86(xs, rows, k) };
    }
    quantize_body(xs, rows, k)
}

/// [`quantize`] compiled with FMA and SSE4.1 (`round_ties_even` as `roundps`, not a
/// libm call; the same results).
///
/// # Safety
/// The CPU must have FMA and SSE4.1.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "fma,sse4.1")]
unsafe fn quantize_x86(xs: &[f32], rows: usize, k: usize) -> Q8_0Rows {
    quantize_body(xs, rows, k)
}

#[inline(always)]
fn quantize_body(xs: &[f32], rows: usize, k: usize) -> Q8_0Rows {
    let nb = k / QK;
    let mut act = Q8_0Rows {
        rows,
        qs: vec![[0; QK]; rows * nb],
        d: vec![0f32; rows * nb],
        bias: vec![[0; 8]; rows * nb],
    };
    for (((xb, q), d), bias) in xs
        .chunks_exact(QK)
        .zip(act.qs.iter_mut())
        .zip(act.d.iter_mut())
        .zip(act.bias.iter_mut())
    {
        let amax = block_amax(xb);
        let id = if amax != 0.0 { 127.0 / amax } else { 0.0 };
        for (qv, &xv) in q.iter_mut().zip(xb) {
            *qv = ((xv * id).round_ties_even() as i32).clamp(-128, 127) as i8;
        }
        *d = f16_bits_to_f32(f32_to_f16_bits(amax / 127.0));
        for (l, bl) in bias.iter_mut().enumerate() {
            *bl = -128
                * q[4 * l..4 * l + 4]
                    .iter()
                    .map(|&v| i32::from(v))
                    .sum::<i32>();
        }
    }
    act
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    //! The SIMD kernels; callers check the target features first.

    use super::super::q4_1::store_tile as store;
    use super::{Group4, Q8_0Matrix, Q8_0Rows, GROUP_ROWS};
    use std::arch::x86_64::*;

    /// Records (136 bytes each) fetched ahead of the one being computed.
    const PREFETCH_RECORDS: usize = 40;

    macro_rules! q8_kernel {
        ($rows:ident, $tile:ident, $features:literal, |$u:ident, $y:ident, $bias:ident| $dot:expr) => {
            /// See [`Q8_0Matrix::groups_range`].
            ///
            /// # Safety
            /// The CPU must support the target features; `out.len()` a multiple of
            /// `4 * act.rows` (slice indexing panics on anything out of range).
            #[target_feature(enable = $features)]
            pub(super) unsafe fn $rows(w: &Q8_0Matrix, act: &Q8_0Rows, g0: usize, out: &mut [f32]) {
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

            #[target_feature(enable = $features)]
            #[inline]
            unsafe fn $tile<const A: usize>(
                w: &Q8_0Matrix,
                g: usize,
                act: &Q8_0Rows,
                a0: usize,
            ) -> [[f32; A]; GROUP_ROWS] {
                let nb = w.nb;
                let recs = &w.groups[g * nb..(g + 1) * nb];
                let xq = &act.qs[a0 * nb..(a0 + A) * nb];
                let xd = &act.d[a0 * nb..(a0 + A) * nb];
                let xb = &act.bias[a0 * nb..(a0 + A) * nb];
                let mut acc = [[_mm256_setzero_ps(); A]; GROUP_ROWS];
                for (b, rec) in recs.iter().enumerate() {
                    if A == 1 {
                        // Stream ahead (a hint; never faults).
                        let ahead = (rec as *const Group4).wrapping_add(PREFETCH_RECORDS);
                        _mm_prefetch::<_MM_HINT_T0>(ahead.cast());
                        _mm_prefetch::<_MM_HINT_T0>(ahead.cast::<u8>().wrapping_add(64).cast());
                    }
                    let d4 = _mm_cvtph_ps(_mm_loadl_epi64(rec.d.as_ptr().cast()));
                    let mut d = [0f32; GROUP_ROWS];
                    _mm_storeu_ps(d.as_mut_ptr(), d4);
                    let mut u = [_mm256_setzero_si256(); GROUP_ROWS];
                    for r in 0..GROUP_ROWS {
                        u[r] = _mm256_loadu_si256(rec.qs[r].as_ptr().cast());
                    }
                    for t in 0..A {
                        let x = t * nb + b;
                        let $y = _mm256_loadu_si256(xq[x].as_ptr().cast());
                        let $bias = _mm256_loadu_si256(xb[x].as_ptr().cast());
                        for r in 0..GROUP_ROWS {
                            let $u = u[r];
                            let xy = _mm256_cvtepi32_ps($dot);
                            acc[r][t] =
                                _mm256_fmadd_ps(_mm256_set1_ps(d[r] * xd[x]), xy, acc[r][t]);
                        }
                    }
                }
                let mut out = [[0f32; A]; GROUP_ROWS];
                for r in 0..GROUP_ROWS {
                    for t in 0..A {
                        let mut lanes = [0f32; 8];
                        _mm256_storeu_ps(lanes.as_mut_ptr(), acc[r][t]);
                        out[r][t] = super::hsum_float_8(lanes);
                    }
                }
                out
            }
        };
    }

    // ggml's `mul_sum_i8_pairs_float` without VNNI: back to signed quants, then
    // |x| (u8) × sign(y, x) (i8) pairs, summed to i32 per four values. Quants are in
    // [-127, 127], so `maddubs` never saturates.
    q8_kernel!(
        groups_range_avx2,
        tile_avx2,
        "avx2,fma,f16c",
        |u, y, _bias| {
            let x = _mm256_xor_si256(u, _mm256_set1_epi8(-128));
            _mm256_madd_epi16(
                _mm256_maddubs_epi16(_mm256_sign_epi8(x, x), _mm256_sign_epi8(y, x)),
                _mm256_set1_epi16(1),
            )
        }
    );
    /// [`Q8_0Matrix::groups_range`] on 512-bit registers: rows `2p` and `2p + 1` of a
    /// record share a register (lanes `0..8` and `8..16`), against the activation
    /// block repeated twice; each lane sees ggml's `fma(d_w · d_x, xy, acc)` with its
    /// own row's scale.
    ///
    /// # Safety
    /// The CPU must support AVX2, FMA, F16C and AVX-512 F/BW/VL/VNNI; `out.len()` a
    /// multiple of `4 * act.rows`.
    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
    pub(super) unsafe fn groups_range_avx512(
        w: &Q8_0Matrix,
        act: &Q8_0Rows,
        g0: usize,
        out: &mut [f32],
    ) {
        let m = act.rows;
        for (gi, out_g) in out.chunks_exact_mut(GROUP_ROWS * m).enumerate() {
            let g = g0 + gi;
            let mut a0 = 0;
            while a0 + 4 <= m {
                store(out_g, m, a0, &tile_avx512::<4>(w, g, act, a0));
                a0 += 4;
            }
            if m - a0 >= 2 {
                store(out_g, m, a0, &tile_avx512::<2>(w, g, act, a0));
                a0 += 2;
            }
            if m - a0 >= 1 {
                store(out_g, m, a0, &tile_avx512::<1>(w, g, act, a0));
            }
        }
    }

    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
    #[inline]
    #[allow(clippy::needless_range_loop)] // `t` indexes activations and accumulators
    unsafe fn tile_avx512<const A: usize>(
        w: &Q8_0Matrix,
        g: usize,
        act: &Q8_0Rows,
        a0: usize,
    ) -> [[f32; A]; GROUP_ROWS] {
        let nb = w.nb;
        let recs = &w.groups[g * nb..(g + 1) * nb];
        let xq = &act.qs[a0 * nb..(a0 + A) * nb];
        let xd = &act.d[a0 * nb..(a0 + A) * nb];
        let xb = &act.bias[a0 * nb..(a0 + A) * nb];
        let pair_idx = [
            _mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1),
            _mm512_setr_epi32(2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3),
        ];
        let mut acc = [[_mm512_setzero_ps(); A]; 2];
        for (b, rec) in recs.iter().enumerate() {
            if A == 1 {
                // Stream ahead (a hint; never faults).
                let ahead = (rec as *const Group4).wrapping_add(PREFETCH_RECORDS);
                _mm_prefetch::<_MM_HINT_T0>(ahead.cast());
                _mm_prefetch::<_MM_HINT_T0>(ahead.cast::<u8>().wrapping_add(64).cast());
            }
            let d4 = _mm512_castps128_ps512(_mm_cvtph_ps(_mm_loadl_epi64(rec.d.as_ptr().cast())));
            let dp = [
                _mm512_permutexvar_ps(pair_idx[0], d4),
                _mm512_permutexvar_ps(pair_idx[1], d4),
            ];
            let u = [
                _mm512_loadu_si512(rec.qs[0].as_ptr().cast()),
                _mm512_loadu_si512(rec.qs[2].as_ptr().cast()),
            ];
            for t in 0..A {
                let x = t * nb + b;
                let y = _mm512_broadcast_i64x4(_mm256_loadu_si256(xq[x].as_ptr().cast()));
                let bias = _mm512_broadcast_i64x4(_mm256_loadu_si256(xb[x].as_ptr().cast()));
                let d8 = _mm512_set1_ps(xd[x]);
                for p in 0..2 {
                    let xy = _mm512_cvtepi32_ps(_mm512_dpbusd_epi32(bias, u[p], y));
                    acc[p][t] = _mm512_fmadd_ps(_mm512_mul_ps(dp[p], d8), xy, acc[p][t]);
                }
            }
        }
        let mut out = [[0f32; A]; GROUP_ROWS];
        for t in 0..A {
            for p in 0..2 {
                let mut lanes = [0f32; 16];
                _mm512_storeu_ps(lanes.as_mut_ptr(), acc[p][t]);
                for half in 0..2 {
                    let mut l8 = [0f32; 8];
                    l8.copy_from_slice(&lanes[8 * half..8 * half + 8]);
                    out[2 * p + half][t] = super::hsum_float_8(l8);
                }
            }
        }
        out
    }

    // `vpdpbusd` on the offset quants, starting from `-128 · Σ y`: the same sums.
    q8_kernel!(
        groups_range_vnni,
        tile_vnni,
        "avx2,fma,f16c,avx512vnni,avx512vl",
        |u, y, bias| _mm256_dpbusd_epi32(bias, u, y)
    );
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::quantized::QMatMul;
    use candle_core::{Device, Module};

    fn random(len: usize, seed: u64) -> Vec<f32> {
        let mut state = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
        (0..len)
            .map(|i| {
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                let v = 2.0 * ((state >> 40) as f32 / (1u64 << 24) as f32) - 1.0;
                match i % 101 {
                    0 => 5.0 * v,
                    7 => 0.0,
                    _ => v,
                }
            })
            .collect()
    }

    fn kernels() -> Vec<Kernel> {
        let mut k = vec![Kernel::Scalar];
        #[cfg(target_arch = "x86_64")]
        if is_x86_feature_detected!("avx2")
            && is_x86_feature_detected!("fma")
            && is_x86_feature_detected!("f16c")
        {
            k.push(Kernel::Avx2);
            if is_x86_feature_detected!("avx512vnni") && is_x86_feature_detected!("avx512vl") {
                k.push(Kernel::Vnni);
            }
        }
        if !k.contains(&Kernel::detect()) {
            k.push(Kernel::detect());
        }
        k
    }

    /// Every kernel gives the scalar reference's bits, for odd row counts (padding),
    /// every tile shape and the parallel split; against candle's Q8_0 `QMatMul` (which
    /// quantizes activations rounding half away from zero with `1 / d`) the results
    /// agree within the activation quantization error.
    #[test]
    fn kernels_agree_and_match_candle() {
        for &(n, k) in &[(7usize, 64usize), (130, 576), (2051, 96), (4096, 576)] {
            let w = Tensor::from_vec(random(n * k, n as u64), (n, k), &Device::Cpu).unwrap();
            let qt = QTensor::quantize(&w, GgmlDType::Q8_0).unwrap();
            let ours = Q8_0Matrix::from_qtensor(&qt).unwrap();
            assert_eq!(ours.shape(), (n, k));
            let candle = QMatMul::from_qtensor(qt).unwrap();
            for m in [1usize, 2, 3, 5, 16] {
                let xs = random(m * k, 1000 + m as u64);
                let want = ours.matmul_with(&xs, m, Kernel::Scalar);
                for kernel in kernels() {
                    let got = ours.matmul_with(&xs, m, kernel);
                    for (i, (a, b)) in got.iter().zip(&want).enumerate() {
                        assert_eq!(a.to_bits(), b.to_bits(), "({n},{k}) m={m} {kernel:?} [{i}]");
                    }
                }
                let x = Tensor::from_vec(xs.clone(), (m, k), &Device::Cpu).unwrap();
                let c = candle.forward(&x).unwrap().flatten_all().unwrap();
                let c = c.to_vec1::<f32>().unwrap();
                for (i, (a, b)) in want.iter().zip(&c).enumerate() {
                    // Each activation value moves by at most d/2 under either rounding;
                    // |Δy| ≤ Σ |w| · amax / 127 ≤ k · 5 · 5 / 127 loosely.
                    assert!(
                        (a - b).abs() <= 1e-2 * (k as f32).sqrt(),
                        "[{i}] {a} vs {b}"
                    );
                }
            }
        }
    }

    /// ggml's activation quantization: ties to even (0.5 → 0, -2.5 → -2 at amax 127),
    /// d stored as f16, and the VNNI bias per lane.
    #[test]
    fn activation_quantization_is_ggml() {
        let mut x = vec![0f32; QK];
        x[0] = 127.0;
        x[1] = 0.5;
        x[2] = -2.5;
        x[4] = 3.0;
        let a = quantize(&x, 1, QK);
        assert_eq!((a.qs[0][0], a.qs[0][1], a.qs[0][2]), (127, 0, -2));
        assert_eq!(a.d[0], 1.0);
        assert_eq!(a.bias[0][0], -128 * 125);
        assert_eq!(a.bias[0][1], -128 * 3);
        let zero = quantize(&[0f32; QK], 1, QK);
        assert_eq!((zero.d[0], zero.qs[0]), (0.0, [0; QK]));
    }

    #[test]
    fn embedding_rows_match_candle_and_bad_ids_fail() {
        let (n, k) = (9, 64);
        let w = Tensor::from_vec(random(n * k, 3), (n, k), &Device::Cpu).unwrap();
        let qt = QTensor::quantize(&w, GgmlDType::Q8_0).unwrap();
        let ours = Q8_0Matrix::from_qtensor(&qt).unwrap();
        let ids = [0u32, 8, 5, 5];
        let want = qt
            .embedding(&Tensor::new(&ids, &Device::Cpu).unwrap())
            .unwrap()
            .flatten_all()
            .unwrap()
            .to_vec1::<f32>()
            .unwrap();
        let got = ours.rows_dequantized(&ids).unwrap();
        assert_eq!(got.len(), want.len());
        for (a, b) in got.iter().zip(&want) {
            assert_eq!(a.to_bits(), b.to_bits());
        }
        assert!(ours.rows_dequantized(&[9]).is_err());
        assert!(Q8_0Matrix::from_ggml_bytes(&[0; 34], 1, 40).is_err());
        assert!(Q8_0Matrix::from_ggml_bytes(&[0; 33], 1, 32).is_err());
        let x = Tensor::zeros((2, 63), candle_core::DType::F32, &Device::Cpu).unwrap();
        assert!(ours.forward(&x).is_err());
    }
}
