//! Activation formats: what ggml converts the f32 activations to before the dot products
//! (the weight type's `vec_dot_type`), with ggml's x86 quantizers.
//!
//! - [`Q8_0`] (`quantize_row_q8_0`, `ggml-cpu/arch/x86/quants.c`, AVX2 branch): per block
//!   of 32, `amax = max |x|`, `d = amax / 127` stored as f16, `q = round_half_even(x ·
//!   (127 / amax))`, all zero when `amax = 0`. For Q4_0, Q5_0 and Q8_0 weights.
//! - [`Q8_1`] (`quantize_row_q8_1`): Q8_0's quants plus `s = f16(d · Σ q)` with the f32
//!   `d`. For Q4_1 and Q5_1 weights.
//! - [`Q8K`] (`quantize_row_q8_K_ref`, `ggml/src/ggml-quants.c`; x86 calls the reference):
//!   per block of 256, `max` = the value of largest magnitude (first one on ties),
//!   `iscale = -127 / max`, `q = min(127, nearest_int(iscale · x))`, `d = 1 / iscale`
//!   (f32), and the 16 sums of 16 quants. For the K-quants.
//! - [`F16`], [`Bf16`], [`F32`]: one value per "block" (`ggml_cpu_fp32_to_fp16`,
//!   `ggml_cpu_fp32_to_bf16`, identity). For F16, BF16 and F32 weights.

use crate::half::{f16_round, f32_to_bf16, f32_to_f16};
use crate::par::SendPtr;
use crate::KernelError;

/// An activation format (ggml's `vec_dot_type`).
pub trait ActFormat: Send + Sync + 'static {
    /// One block of the format.
    type Block: Copy + Send + Sync;
    /// Values per block.
    const BLOCK_VALUES: usize;
    /// ggml's name for the format.
    const NAME: &'static str;
    /// A zeroed block (the initial value of a buffer).
    const ZERO: Self::Block;
    /// Converts one row (`x.len() = out.len() · BLOCK_VALUES`).
    fn quantize_row(x: &[f32], out: &mut [Self::Block]);
    /// Converts one row as llama.cpp quantizes the rows of a repacked product's gemm
    /// ([`crate::Path::Gemm`], `ggml_quantize_mat_*_4x8` in
    /// `ggml-cpu/arch/x86/repack.cpp`); the same as [`Self::quantize_row`] unless a
    /// format says otherwise.
    fn quantize_row_gemm(x: &[f32], out: &mut [Self::Block]) {
        Self::quantize_row(x, out);
    }
    /// [`Self::quantize_row`] (with `gemm`, [`Self::quantize_row_gemm`]) where AVX-512
    /// F/BW/VL and F16C may be used: the same blocks.
    ///
    /// # Safety
    /// The CPU must have AVX-512 F/BW/VL, FMA, SSE4.1 and F16C.
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn quantize_row_avx512(x: &[f32], out: &mut [Self::Block], gemm: bool) {
        portable_row::<Self>(x, out, gemm);
    }
    /// The values a row of blocks stands for (`d · q`, or the widened float), for
    /// reference computations.
    fn dequantize_row(blocks: &[Self::Block], out: &mut [f32]);
}

/// Rows of activations in format `A`: `rows × k` values as `rows × k / A::BLOCK_VALUES`
/// blocks, row-major.
pub struct Activations<A: ActFormat> {
    rows: usize,
    k: usize,
    blocks: Vec<A::Block>,
}

impl<A: ActFormat> Activations<A> {
    /// Converts `rows` rows of `k` f32 values (`xs.len() = rows · k`).
    pub fn quantize(xs: &[f32], rows: usize, k: usize) -> Result<Self, KernelError> {
        Self::quantize_for(xs, rows, k, |_| false)
    }

    /// As [`Self::quantize`], with the rows `j` for which `gemm(j)` holds converted by
    /// [`ActFormat::quantize_row_gemm`].
    pub fn quantize_for(
        xs: &[f32],
        rows: usize,
        k: usize,
        gemm: impl Fn(usize) -> bool + Sync,
    ) -> Result<Self, KernelError> {
        Self::quantize_par(xs, rows, k, gemm, &|n, f| (0..n).for_each(f))
    }

    /// [`Self::quantize_for`] in tasks of [`PAR_ROWS`] rows run by `par` (each row is
    /// converted on its own, so the blocks are the same whatever runs them). A task that
    /// `par` does not run leaves its rows zero; one it runs twice is done once.
    pub fn quantize_par(
        xs: &[f32],
        rows: usize,
        k: usize,
        gemm: impl Fn(usize) -> bool + Sync,
        par: ParFor<'_>,
    ) -> Result<Self, KernelError> {
        if !k.is_multiple_of(A::BLOCK_VALUES) {
            return Err(KernelError::Activations(format!(
                "row length {k} is not a multiple of {}'s block of {}",
                A::NAME,
                A::BLOCK_VALUES
            )));
        }
        if xs.len() != rows * k {
            return Err(KernelError::Activations(format!(
                "{} values given for {rows} rows of {k}",
                xs.len()
            )));
        }
        let per_row = k / A::BLOCK_VALUES;
        let mut blocks = vec![A::ZERO; rows * per_row];
        if per_row == 0 || rows == 0 {
            return Ok(Self { rows, k, blocks });
        }
        #[cfg(target_arch = "x86_64")]
        let x86 = std::is_x86_feature_detected!("fma") && std::is_x86_feature_detected!("sse4.1");
        #[cfg(target_arch = "x86_64")]
        let avx512 = x86
            && std::is_x86_feature_detected!("avx512f")
            && std::is_x86_feature_detected!("avx512bw")
            && std::is_x86_feature_detected!("avx512vl")
            && std::is_x86_feature_detected!("f16c");
        let base = SendPtr(blocks.as_mut_ptr());
        let n_tasks = rows.div_ceil(PAR_ROWS);
        // Each task's rows are written at most once, whatever `par` does.
        let claimed: Vec<std::sync::atomic::AtomicBool> = (0..n_tasks)
            .map(|_| std::sync::atomic::AtomicBool::new(false))
            .collect();
        par(n_tasks, &|t| {
            if claimed[t].swap(true, std::sync::atomic::Ordering::AcqRel) {
                return;
            }
            let (r0, r1) = (t * PAR_ROWS, ((t + 1) * PAR_ROWS).min(rows));
            #[allow(clippy::redundant_locals)]
            let base = base;
            // SAFETY: task `t` (claimed once above) owns rows `r0..r1` of `blocks`,
            // disjoint from every other task's, and `blocks` outlives `par`.
            let out = unsafe {
                std::slice::from_raw_parts_mut(base.0.add(r0 * per_row), (r1 - r0) * per_row)
            };
            let x = &xs[r0 * k..r1 * k];
            let gemm = |j: usize| gemm(r0 + j);
            #[cfg(target_arch = "x86_64")]
            if avx512 {
                // SAFETY: the features were detected.
                unsafe { quantize_rows_avx512::<A>(x, k, per_row, out, &gemm) };
                return;
            }
            #[cfg(target_arch = "x86_64")]
            if x86 {
                // SAFETY: the features were detected.
                unsafe { quantize_rows_x86::<A>(x, k, per_row, out, &gemm) };
                return;
            }
            quantize_rows::<A>(x, k, per_row, out, &gemm, portable_row::<A>);
        });
        Ok(Self { rows, k, blocks })
    }

    /// Number of rows.
    pub fn rows(&self) -> usize {
        self.rows
    }

    /// Values per row.
    pub fn k(&self) -> usize {
        self.k
    }

    /// Row `j`'s blocks.
    #[inline]
    pub fn row(&self, j: usize) -> &[A::Block] {
        let per_row = self.k / A::BLOCK_VALUES;
        &self.blocks[j * per_row..(j + 1) * per_row]
    }
}

/// A parallel for: `par(n, f)` calls `f(0)` … `f(n − 1)`, in any order and on any
/// threads, and returns when all have returned (the daemon passes its compute team).
pub type ParFor<'a> = &'a (dyn Fn(usize, &(dyn Fn(usize) + Sync)) + Sync);

/// Rows per task of [`Activations::quantize_par`].
pub const PAR_ROWS: usize = 32;

/// The rows of [`Activations::quantize_for`], each through `row(x, out, gemm(j))`.
#[inline(always)]
fn quantize_rows<A: ActFormat>(
    xs: &[f32],
    k: usize,
    per_row: usize,
    blocks: &mut [A::Block],
    gemm: &impl Fn(usize) -> bool,
    row: impl Fn(&[f32], &mut [A::Block], bool),
) {
    for (j, (x, out)) in xs
        .chunks_exact(k)
        .zip(blocks.chunks_exact_mut(per_row))
        .enumerate()
    {
        row(x, out, gemm(j));
    }
}

/// [`ActFormat::quantize_row_gemm`] where `gemm`, else [`ActFormat::quantize_row`].
#[inline(always)]
fn portable_row<A: ActFormat + ?Sized>(x: &[f32], out: &mut [A::Block], gemm: bool) {
    if gemm {
        A::quantize_row_gemm(x, out);
    } else {
        A::quantize_row(x, out);
    }
}

/// [`quantize_rows`] compiled with FMA and SSE4.1, so that `mul_add` and
/// `round_ties_even` are instructions instead of libm calls (the same results: both are
/// exactly rounded).
///
/// # Safety
/// The CPU must have FMA and SSE4.1.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "fma,sse4.1")]
unsafe fn quantize_rows_x86<A: ActFormat>(
    xs: &[f32],
    k: usize,
    per_row: usize,
    blocks: &mut [A::Block],
    gemm: &impl Fn(usize) -> bool,
) {
    quantize_rows::<A>(xs, k, per_row, blocks, gemm, portable_row::<A>);
}

/// [`quantize_rows`] with each row's [`ActFormat::quantize_row_avx512`].
///
/// # Safety
/// The CPU must have AVX-512 F/BW/VL, FMA, SSE4.1 and F16C.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,fma,sse4.1,f16c")]
unsafe fn quantize_rows_avx512<A: ActFormat>(
    xs: &[f32],
    k: usize,
    per_row: usize,
    blocks: &mut [A::Block],
    gemm: &impl Fn(usize) -> bool,
) {
    // SAFETY: the caller's features are this function's.
    quantize_rows::<A>(xs, k, per_row, blocks, gemm, |x, out, g| unsafe {
        A::quantize_row_avx512(x, out, g)
    });
}

/// A Q8_0 or Q8_1 block: `d` and `s` already widened from their f16 (as ggml's dot
/// products use them), and the 32 quants.
#[derive(Clone, Copy, Debug, PartialEq)]
#[repr(C, align(32))]
pub struct Q8Block {
    /// The quants.
    pub qs: [i8; 32],
    /// Scale (`GGML_CPU_FP16_TO_FP32(y.d)`).
    pub d: f32,
    /// Q8_1 only: `f16(d · Σ q)` widened; 0 for Q8_0.
    pub s: f32,
}

/// A Q8_K block: f32 scale, 256 quants, 16 sums of 16 quants.
#[derive(Clone, Copy, Debug, PartialEq)]
#[repr(C, align(32))]
pub struct Q8KBlock {
    /// The quants.
    pub qs: [i8; 256],
    /// `Σ qs[16 j .. 16 j + 16]`.
    pub bsums: [i16; 16],
    /// Scale (f32).
    pub d: f32,
}

/// `block_q8_0` activations.
pub struct Q8_0;
/// `block_q8_1` activations.
pub struct Q8_1;
/// `block_q8_K` activations.
pub struct Q8K;
/// f16 activations.
pub struct F16;
/// bf16 activations.
pub struct Bf16;
/// f32 activations (unchanged).
pub struct F32;

/// ggml's AVX2 `quantize_row_q8_0` for one block; returns `(d_f32, quants)`.
#[inline(always)]
fn q8_block(x: &[f32], qs: &mut [i8; 32]) -> f32 {
    let amax = x.iter().fold(0f32, |m, v| m.max(v.abs()));
    let d = amax / 127.0;
    let id = if amax != 0.0 { 127.0 / amax } else { 0.0 };
    for (q, &v) in qs.iter_mut().zip(x) {
        // `_mm256_round_ps(_MM_ROUND_NEAREST)` then `_mm256_cvtps_epi32`: exact.
        *q = (v * id).round_ties_even() as i8;
    }
    d
}

impl ActFormat for Q8_0 {
    type Block = Q8Block;
    const BLOCK_VALUES: usize = 32;
    const NAME: &'static str = "q8_0";
    const ZERO: Q8Block = Q8Block {
        qs: [0; 32],
        d: 0.0,
        s: 0.0,
    };
    #[inline(always)]
    fn quantize_row(x: &[f32], out: &mut [Q8Block]) {
        for (xb, b) in x.chunks_exact(32).zip(out) {
            let d = q8_block(xb, &mut b.qs);
            b.d = f16_round(d);
            b.s = 0.0;
        }
    }
    /// Per block: `amax` by `vmaxps` over the absolute values (exact in any order; a
    /// block with NaN or infinite values takes the portable code),
    /// `d` and `127 / amax` as in `q8_block`, the products rounded to nearest even by
    /// `vcvtps2dq`, narrowed by `vpmovdb` (every quant is within `−127..=127`), and `d`
    /// rounded through f16 by F16C (as ggml's `GGML_FP32_TO_FP16`).
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn quantize_row_avx512(x: &[f32], out: &mut [Q8Block], _gemm: bool) {
        use std::arch::x86_64::*;
        for (xb, b) in x.chunks_exact(32).zip(out) {
            let v0 = _mm512_loadu_ps(xb.as_ptr());
            let v1 = _mm512_loadu_ps(xb.as_ptr().add(16));
            let (a0, a1) = (_mm512_abs_ps(v0), _mm512_abs_ps(v1));
            let inf = _mm512_set1_ps(f32::INFINITY);
            if _mm512_cmp_ps_mask::<_CMP_NLT_UQ>(a0, inf)
                | _mm512_cmp_ps_mask::<_CMP_NLT_UQ>(a1, inf)
                != 0
            {
                // NaN or infinite values: the portable block's own answer.
                let d = q8_block(xb, &mut b.qs);
                b.d = f16_round(d);
                b.s = 0.0;
                continue;
            }
            let amax = _mm512_reduce_max_ps(_mm512_max_ps(a0, a1));
            let d = amax / 127.0;
            let id = if amax != 0.0 { 127.0 / amax } else { 0.0 };
            let mul = _mm512_set1_ps(id);
            let q0 = _mm512_cvtepi32_epi8(_mm512_cvtps_epi32(_mm512_mul_ps(v0, mul)));
            let q1 = _mm512_cvtepi32_epi8(_mm512_cvtps_epi32(_mm512_mul_ps(v1, mul)));
            _mm_storeu_si128(b.qs.as_mut_ptr() as *mut __m128i, q0);
            _mm_storeu_si128(b.qs.as_mut_ptr().add(16) as *mut __m128i, q1);
            let h = _mm_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(_mm_set_ss(d));
            b.d = _mm_cvtss_f32(_mm_cvtph_ps(h));
            b.s = 0.0;
        }
    }
    fn dequantize_row(blocks: &[Q8Block], out: &mut [f32]) {
        for (b, o) in blocks.iter().zip(out.chunks_exact_mut(32)) {
            for (v, &q) in o.iter_mut().zip(&b.qs) {
                *v = b.d * f32::from(q);
            }
        }
    }
}

impl ActFormat for Q8_1 {
    type Block = Q8Block;
    const BLOCK_VALUES: usize = 32;
    const NAME: &'static str = "q8_1";
    const ZERO: Q8Block = Q8Block {
        qs: [0; 32],
        d: 0.0,
        s: 0.0,
    };
    fn quantize_row(x: &[f32], out: &mut [Q8Block]) {
        for (xb, b) in x.chunks_exact(32).zip(out) {
            let d = q8_block(xb, &mut b.qs);
            let sum: i32 = b.qs.iter().map(|&q| i32::from(q)).sum();
            b.d = f16_round(d);
            b.s = f16_round(d * sum as f32);
        }
    }
    fn dequantize_row(blocks: &[Q8Block], out: &mut [f32]) {
        for (b, o) in blocks.iter().zip(out.chunks_exact_mut(32)) {
            for (v, &q) in o.iter_mut().zip(&b.qs) {
                *v = b.d * f32::from(q);
            }
        }
    }
}

/// ggml's `nearest_int(iscale * x)` as llama.cpp's build runs it: `quantize_row_q8_K_ref`
/// lives in libggml-base, which `GGML_NATIVE` does not compile for the host ISA (x86-64
/// baseline, no FMA: `mulps` then `addps` in its disassembly), so the product is rounded
/// to f32 first and `+ 12582912` then rounds it to an integer, half to even; the result
/// is read back from the mantissa bits.
#[inline(always)]
fn nearest_int(iscale: f32, x: f32) -> i32 {
    let val = iscale * x + 12_582_912.0;
    (val.to_bits() & 0x007f_ffff) as i32 - 0x0040_0000
}

impl Q8K {
    /// One block of `quantize_row` or, with `gemm`, of `ggml_quantize_mat_q8_K_4x8`
    /// (`ggml-cpu/arch/x86/repack.cpp`, AVX2). They differ only in the scale's sign when
    /// `+amax` and `−amax` both occur: the reference takes the sign of the first value of
    /// largest magnitude, the 4×8 code `−127 / amax` whenever some value equals `+amax`.
    fn quantize_block(xb: &[f32], b: &mut Q8KBlock, gemm: bool) {
        let (mut max, mut amax) = (0f32, 0f32);
        for &v in xb {
            if v.abs() > amax {
                amax = v.abs();
                max = v;
            }
        }
        if amax == 0.0 {
            *b = Self::ZERO;
            return;
        }
        if gemm && xb.contains(&amax) {
            max = amax;
        }
        let iscale = -127.0 / max;
        for (q, &v) in b.qs.iter_mut().zip(xb) {
            *q = nearest_int(iscale, v).min(127) as i8;
        }
        for (s, c) in b.bsums.iter_mut().zip(b.qs.chunks_exact(16)) {
            *s = c.iter().map(|&q| i16::from(q)).sum();
        }
        b.d = 1.0 / iscale;
    }

    /// [`Self::quantize_block`] in 512-bit registers (a block with NaN or infinite
    /// values takes the portable code): `amax` by `vmaxps` (exact in any order), the scale's sign from the first value of that magnitude (or, for
    /// `gemm`, from whether `+amax` occurs), each `iscale · x` rounded to nearest even
    /// by `vcvtps2dq` (as the `+ 12582912` trick rounds it: every product is within
    /// ±128), capped at 127, and the sums of 16 quants (exact).
    ///
    /// # Safety
    /// The CPU must have AVX-512 F/BW/VL; `xb` holds 256 values.
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn quantize_block_avx512(xb: &[f32], b: &mut Q8KBlock, gemm: bool) {
        use std::arch::x86_64::*;
        debug_assert_eq!(xb.len(), 256);
        let p = xb.as_ptr();
        let mut m = _mm512_setzero_ps();
        let inf = _mm512_set1_ps(f32::INFINITY);
        let mut nonfinite = 0;
        for c in 0..16 {
            let a = _mm512_abs_ps(_mm512_loadu_ps(p.add(16 * c)));
            nonfinite |= _mm512_cmp_ps_mask::<_CMP_NLT_UQ>(a, inf);
            m = _mm512_max_ps(m, a);
        }
        let amax = _mm512_reduce_max_ps(m);
        if amax == 0.0 || nonfinite != 0 {
            // A zero block, or NaN or infinite values: the portable block's own answer.
            return Self::quantize_block(xb, b, gemm);
        }
        let splat = _mm512_set1_ps(amax);
        let mut max = -amax;
        for c in 0..16 {
            let v = _mm512_loadu_ps(p.add(16 * c));
            if gemm {
                if _mm512_cmp_ps_mask::<_CMP_EQ_OQ>(v, splat) != 0 {
                    max = amax;
                    break;
                }
            } else {
                let at = _mm512_cmp_ps_mask::<_CMP_EQ_OQ>(_mm512_abs_ps(v), splat);
                if at != 0 {
                    max = *p.add(16 * c + at.trailing_zeros() as usize);
                    break;
                }
            }
        }
        let iscale = -127.0 / max;
        let mul = _mm512_set1_ps(iscale);
        let cap = _mm512_set1_epi32(127);
        for c in 0..16 {
            let v = _mm512_loadu_ps(p.add(16 * c));
            let q = _mm512_min_epi32(_mm512_cvtps_epi32(_mm512_mul_ps(v, mul)), cap);
            _mm_storeu_si128(
                b.qs.as_mut_ptr().add(16 * c) as *mut __m128i,
                _mm512_cvtepi32_epi8(q),
            );
            b.bsums[c] = _mm512_reduce_add_epi32(q) as i16;
        }
        b.d = 1.0 / iscale;
    }
}

impl ActFormat for Q8K {
    type Block = Q8KBlock;
    const BLOCK_VALUES: usize = 256;
    const NAME: &'static str = "q8_K";
    const ZERO: Q8KBlock = Q8KBlock {
        qs: [0; 256],
        bsums: [0; 16],
        d: 0.0,
    };
    fn quantize_row(x: &[f32], out: &mut [Q8KBlock]) {
        for (xb, b) in x.chunks_exact(256).zip(out) {
            Self::quantize_block(xb, b, false);
        }
    }
    fn quantize_row_gemm(x: &[f32], out: &mut [Q8KBlock]) {
        for (xb, b) in x.chunks_exact(256).zip(out) {
            Self::quantize_block(xb, b, true);
        }
    }
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn quantize_row_avx512(x: &[f32], out: &mut [Q8KBlock], gemm: bool) {
        for (xb, b) in x.chunks_exact(256).zip(out) {
            Self::quantize_block_avx512(xb, b, gemm);
        }
    }
    fn dequantize_row(blocks: &[Q8KBlock], out: &mut [f32]) {
        for (b, o) in blocks.iter().zip(out.chunks_exact_mut(256)) {
            for (v, &q) in o.iter_mut().zip(&b.qs) {
                *v = b.d * f32::from(q);
            }
        }
    }
}

impl ActFormat for F16 {
    type Block = u16;
    const BLOCK_VALUES: usize = 1;
    const NAME: &'static str = "f16";
    const ZERO: u16 = 0;
    fn quantize_row(x: &[f32], out: &mut [u16]) {
        for (o, &v) in out.iter_mut().zip(x) {
            *o = f32_to_f16(v);
        }
    }
    /// Sixteen values at a time with `vcvtps2ph` (round to nearest even: F16C's
    /// conversion, which `f32_to_f16` is too).
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn quantize_row_avx512(x: &[f32], out: &mut [u16], _gemm: bool) {
        use std::arch::x86_64::*;
        let n = x.len().min(out.len());
        let mut i = 0;
        while i + 16 <= n {
            let h =
                _mm512_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(_mm512_loadu_ps(x.as_ptr().add(i)));
            _mm256_storeu_si256(out.as_mut_ptr().add(i) as *mut __m256i, h);
            i += 16;
        }
        for (o, &v) in out[i..n].iter_mut().zip(&x[i..n]) {
            *o = f32_to_f16(v);
        }
    }
    fn dequantize_row(blocks: &[u16], out: &mut [f32]) {
        for (o, &h) in out.iter_mut().zip(blocks) {
            *o = crate::half::f16_to_f32(h);
        }
    }
}

impl ActFormat for Bf16 {
    type Block = u16;
    const BLOCK_VALUES: usize = 1;
    const NAME: &'static str = "bf16";
    const ZERO: u16 = 0;
    fn quantize_row(x: &[f32], out: &mut [u16]) {
        for (o, &v) in out.iter_mut().zip(x) {
            *o = f32_to_bf16(v);
        }
    }
    fn dequantize_row(blocks: &[u16], out: &mut [f32]) {
        for (o, &h) in out.iter_mut().zip(blocks) {
            *o = crate::half::bf16_to_f32(h);
        }
    }
}

impl ActFormat for F32 {
    type Block = f32;
    const BLOCK_VALUES: usize = 1;
    const NAME: &'static str = "f32";
    const ZERO: f32 = 0.0;
    fn quantize_row(x: &[f32], out: &mut [f32]) {
        out.copy_from_slice(x);
    }
    fn dequantize_row(blocks: &[f32], out: &mut [f32]) {
        out.copy_from_slice(blocks);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::quantize;
    use candle_core::quantized::GgmlDType;

    fn ramp(n: usize) -> Vec<f32> {
        (0..n)
            .map(|i| ((i * 37 % 101) as f32 - 50.0) * 0.013)
            .collect()
    }

    #[test]
    fn q8_0_matches_candle_reference_quants() {
        let x = ramp(96);
        let a = Activations::<Q8_0>::quantize(&x, 1, 96).unwrap();
        let (bytes, _) = quantize(&x, 1, 96, GgmlDType::Q8_0);
        for (ours, theirs) in a.row(0).iter().zip(bytes.chunks_exact(34)) {
            assert_eq!(ours.d, crate::half::le_f16(theirs, 0));
            let q: Vec<i8> = theirs[2..].iter().map(|&b| b as i8).collect();
            assert_eq!(ours.qs.to_vec(), q);
        }
    }

    /// The AVX-512 Q8_0 rows give the portable rows' blocks: random values, ties at
    /// `.5` steps of the quant, a zero block, tiny values (a subnormal f16 `d`, and one
    /// that rounds to 0), large ones, and blocks with NaN and ±∞.
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn q8_0_avx512_rows_equal_the_portable_ones() {
        if !crate::Isa::available().contains(&crate::Isa::Avx512) {
            return;
        }
        let mut x = crate::testing::random(32 * 64, 11);
        // amax 127: the quants are the values, halves rounded to even.
        for (i, v) in x[..32].iter_mut().enumerate() {
            *v = i as f32 - 15.5;
        }
        x[0] = -127.0;
        x[32..64].fill(0.0);
        for (i, v) in x[64..96].iter_mut().enumerate() {
            *v = (i as f32 - 16.0) * 1e-4;
        }
        for (i, v) in x[96..128].iter_mut().enumerate() {
            *v = (i as f32 - 16.0) * 1e-12;
        }
        for (i, v) in x[128..160].iter_mut().enumerate() {
            *v = (i as f32 - 16.0) * 3e4;
        }
        // The largest value and a NaN in the same lane of the block's two halves.
        x[163] = 50.0;
        x[179] = f32::NAN;
        x[200] = f32::INFINITY;
        x[231] = f32::NEG_INFINITY;
        let (mut ours, mut theirs) = (vec![Q8_0::ZERO; 64], vec![Q8_0::ZERO; 64]);
        // SAFETY: AVX-512 F/BW/VL/VNNI with AVX2, FMA and F16C (`Isa::Avx512`).
        unsafe { Q8_0::quantize_row_avx512(&x, &mut ours, false) };
        Q8_0::quantize_row(&x, &mut theirs);
        for (i, (u, v)) in ours.iter().zip(&theirs).enumerate() {
            assert_eq!(u.qs, v.qs, "block {i}");
            assert_eq!(u.d.to_bits(), v.d.to_bits(), "block {i}");
        }
        assert!(
            theirs[2].d > 0.0 && theirs[2].d < 6.2e-5,
            "a subnormal f16 d"
        );
        assert_eq!(theirs[3].d, 0.0);
        assert_eq!(theirs[0].qs[..3], [-127, -14, -14]);
    }

    /// The AVX-512 f16 rows equal the portable ones bit for bit: ties, subnormals,
    /// overflow to ±∞, NaN, and a tail shorter than sixteen values.
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn f16_avx512_rows_equal_the_portable_ones() {
        if !crate::Isa::available().contains(&crate::Isa::Avx512) {
            return;
        }
        let mut x = crate::testing::random(16 * 8 + 5, 12);
        let special = [
            1.0 + f32::EPSILON * 4096.0,  // 1 + 2⁻¹¹: halfway, to the even 1
            1.0 + f32::EPSILON * 12288.0, // 1 + 3·2⁻¹¹: halfway, to the even 1 + 2⁻⁹
            3e-7,
            -6.0e-8,
            1e-9,
            65520.0,
            -7e4,
            f32::INFINITY,
            f32::NEG_INFINITY,
            f32::NAN,
            -0.0,
            65504.0,
        ];
        x[3..3 + special.len()].copy_from_slice(&special);
        x[130] = 65520.0;
        let (mut ours, mut theirs) = (vec![0u16; x.len()], vec![0u16; x.len()]);
        // SAFETY: AVX-512 F/BW/VL/VNNI with AVX2, FMA and F16C (`Isa::Avx512`).
        unsafe { F16::quantize_row_avx512(&x, &mut ours, false) };
        F16::quantize_row(&x, &mut theirs);
        assert_eq!(ours, theirs);
        assert_eq!(theirs[3..5], [0x3c00, 0x3c02], "ties round to even");
        assert_eq!(theirs[8], 0x7c00, "65520 overflows to +inf");
    }

    /// The AVX-512 Q8_K blocks equal the portable ones for both row kinds: random
    /// values, `−amax` before `+amax` (the two kinds' scales differ in sign), `−amax`
    /// alone, a zero block, a block whose products hit ties, and one with NaN and ±∞.
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn q8_k_avx512_blocks_equal_the_portable_ones() {
        if !crate::Isa::available().contains(&crate::Isa::Avx512) {
            return;
        }
        let mut x = crate::testing::random(256 * 7, 13);
        x[3] = -9.0;
        x[200] = 9.0;
        x[256 + 100] = -9.0;
        x[512..768].fill(0.0);
        for (i, v) in x[768..1024].iter_mut().enumerate() {
            *v = (i as f32 - 128.0) / 2.0;
        }
        x[1024 + 255] = 9.0;
        x[1024] = -9.0;
        // Block 5: the largest value, then NaN in the same lane of a later 16 (a NaN
        // that `vmaxps` would let drop it); block 6: +∞.
        x[1280 + 3] = 50.0;
        x[1280 + 16 * 5 + 3] = f32::NAN;
        x[1536 + 200] = f32::INFINITY;
        for gemm in [false, true] {
            let (mut ours, mut theirs) = (vec![Q8K::ZERO; 7], vec![Q8K::ZERO; 7]);
            // SAFETY: AVX-512 F/BW/VL/VNNI with AVX2, FMA and F16C (`Isa::Avx512`).
            unsafe { Q8K::quantize_row_avx512(&x, &mut ours, gemm) };
            if gemm {
                Q8K::quantize_row_gemm(&x, &mut theirs);
            } else {
                Q8K::quantize_row(&x, &mut theirs);
            }
            for (i, (u, v)) in ours.iter().zip(&theirs).enumerate() {
                assert_eq!(u.qs, v.qs, "gemm {gemm} block {i}");
                assert_eq!(u.bsums, v.bsums, "gemm {gemm} block {i}");
                assert_eq!(u.d.to_bits(), v.d.to_bits(), "gemm {gemm} block {i}");
            }
            // The sign of the scale where −amax comes first.
            assert_eq!(theirs[0].d > 0.0, !gemm, "gemm {gemm}");
        }
    }

    #[test]
    fn q8_k_matches_candle_reference_quants_and_sums() {
        let x = ramp(512);
        let a = Activations::<Q8K>::quantize(&x, 1, 512).unwrap();
        let (bytes, _) = quantize(&x, 1, 512, GgmlDType::Q8K);
        for (ours, theirs) in a.row(0).iter().zip(bytes.chunks_exact(292)) {
            assert_eq!(ours.d.to_le_bytes(), theirs[0..4]);
            let q: Vec<i8> = theirs[4..260].iter().map(|&b| b as i8).collect();
            assert_eq!(ours.qs.to_vec(), q);
            let s: Vec<i16> = theirs[260..]
                .chunks_exact(2)
                .map(|c| i16::from_le_bytes([c[0], c[1]]))
                .collect();
            assert_eq!(ours.bsums.to_vec(), s);
        }
    }

    /// Rows converted by tasks on other threads, in reverse order, give the serial
    /// blocks; the gemm rows keep their own rule across task boundaries.
    #[test]
    fn parallel_tasks_give_the_serial_blocks() {
        let (rows, k) = (3 * PAR_ROWS + 5, 512);
        let x: Vec<f32> = (0..rows * k)
            .map(|i| ((i * 7919) % 2003) as f32 / 1001.0 - 1.0)
            .collect();
        let gemm = |j: usize| j % 3 == 1;
        let par: ParFor<'_> = &|n, f| {
            std::thread::scope(|s| {
                for i in (0..n).rev() {
                    s.spawn(move || f(i));
                }
            })
        };
        let serial = Activations::<Q8K>::quantize_for(&x, rows, k, gemm).unwrap();
        let tasks = Activations::<Q8K>::quantize_par(&x, rows, k, gemm, par).unwrap();
        for j in 0..rows {
            for (a, b) in serial.row(j).iter().zip(tasks.row(j)) {
                assert_eq!(
                    (a.d.to_bits(), a.qs, a.bsums),
                    (b.d.to_bits(), b.qs, b.bsums),
                    "row {j}"
                );
            }
        }
        let serial = Activations::<Q8_0>::quantize_for(&x, rows, k, gemm).unwrap();
        let tasks = Activations::<Q8_0>::quantize_par(&x, rows, k, gemm, par).unwrap();
        for j in 0..rows {
            assert_eq!(serial.row(j), tasks.row(j), "row {j}");
        }
    }

    #[test]
    fn zero_blocks_and_bad_lengths() {
        let a = Activations::<Q8K>::quantize(&[0.0; 256], 1, 256).unwrap();
        assert_eq!(a.row(0)[0].d, 0.0);
        assert!(matches!(
            Activations::<Q8_0>::quantize(&[0.0; 40], 1, 40),
            Err(KernelError::Activations(m)) if m.contains("40") && m.contains("32")
        ));
        assert!(Activations::<Q8_0>::quantize(&[0.0; 32], 2, 32).is_err());
    }
}
