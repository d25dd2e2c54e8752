//! Tiles of several weight rows × several activation rows for the signed 32-value types
//! (Q4_0, Q5_0, Q8_0 against Q8_0 activations) on AVX-512 VNNI.
//!
//! ggml's `vec_dot` for these types (`ggml_vec_dot_{q4_0,q5_0,q8_0}_q8_0`,
//! `ggml-cpu/arch/x86/quants.c`; llamafile's `tinyBLAS_Q0_AVX` computes the same
//! operations for several rows) is, per block, eight i32 lanes of exact 4-product sums
//! `Σ₄ q·y`, converted to f32, and `acc = fma(f16→f32(d_w) · d_a, lanes, acc)`; the
//! result is `hsum_float_8(acc)`. The tiles here compute each output with exactly those
//! float operations; what differs is how the exact integer lanes are formed and how
//! many independent outputs share a loop:
//!
//! - **Biased bytes.** `vpdpbusd` multiplies unsigned by signed bytes. ggml makes the
//!   weights unsigned per pair of rows with `|q|` and `sign(y, q)` (two instructions for
//!   every weight × activation pair). Here one side is offset instead, once per block,
//!   and the offset taken out exactly with the other side's 4-value sums: for one to
//!   three activation rows (decode) the weights as `u = q + B` (`B` = 8, 16, 128, the
//!   type's offset, so that `u` is in `0..=255`) and per activation block `c = −B · Σ₄
//!   y`, `vpdpbusd(c, u, y) = Σ₄ q·y`; for more rows (prefill) the activations as `y +
//!   128` (prepared once per tile) and per weight block `c = −128 · Σ₄ q`,
//!   `vpdpbusd(c, y + 128, q) = Σ₄ q·y`. No term leaves i32; one instruction per pair.
//! - **Weight rows × activation rows.** A tile keeps `W · R` accumulators: each weight
//!   block is unpacked once for `R` activation rows and each activation block loaded
//!   once for `W` weight rows. One activation row (decode) gets `W` independent FMA
//!   chains instead of one, which hides the FMA latency that bounds a one-row
//!   `vec_dot`.
//! - **Two activation rows per register** (prefill, `pair_dots`): an output's eight
//!   lanes take half a 512-bit register, so rows `2p` and `2p + 1` share one: their
//!   biased quants side by side (one load from the prepared tile), the weight block in
//!   both halves, and the scales `d_a` of the two rows as lanes 0–7 and 8–15. Each lane
//!   sees the operations it had in a 256-bit register (`vpdpbusd`, conversion, the
//!   scale product, one `fma`), so the bits are unchanged and the instructions halve.
//!   An odd last row goes as a pair with itself (its copy's products dropped).
//! - **Row-major outputs** ([`block_rows_to`]): the tiles write each output where the
//!   caller's `(rows, n)` result holds it ([`crate::RowsOut`]), so no scratch buffer is
//!   transposed afterwards.
//!
//! Measured on the development machine (AMD EPYC Zen 4, one thread,
//! `INFERD_TIMING_PATHS=1 cargo test --release -p inferd-kernels -- --ignored timing`),
//! against the one-weight-row tiles of `tiles::x86` they replace: Q5_0 1.7× (one row,
//! 50 GFLOP/s) and 1.75× (16 or 512 rows, 123 GFLOP/s), Q8_0 1.9× (many rows).

//! The results equal [`crate::Quant::vec_dot`] bit for bit (`testing` checks every
//! tile shape against it).

use std::ops::Range;

use crate::act::{Activations, Q8Block, Q8_0};
use crate::lanes::x86::{f16_splat8, hsum_float_8};
use crate::layout::{Interleave, PREFILL_MIN};
use crate::tiles::x86::LegacyBlock;
use crate::RowsOut;
use std::arch::x86_64::*;

/// A signed 32-value block that can be unpacked with a non-negative offset.
pub trait BiasedBlock: LegacyBlock {
    /// The offset `B`: `q + B` is in `0..=255` for every value `q` of the type.
    const BIAS: u8;
    /// The block's 32 values `q + B` as unsigned bytes, in value order.
    ///
    /// # Safety
    /// AVX-512 F/BW/VL, AVX2 and FMA; `p` readable for `BYTES` bytes.
    unsafe fn biased(p: *const u8) -> __m256i;
    /// The block's signed values ([`LegacyBlock::values_512`]) in both 256-bit halves.
    ///
    /// # Safety
    /// As [`Self::biased`].
    #[inline(always)]
    unsafe fn values_x2(p: *const u8) -> __m512i {
        let v = Self::values_512(p);
        _mm512_inserti64x4::<1>(_mm512_castsi256_si512(v), v)
    }
}

/// `len` weight rows, from row `first`, of a matrix at `p` with rows of `row_bytes`
/// bytes ([`Interleave`]).
#[derive(Clone, Copy)]
struct Rows {
    p: *const u8,
    row_bytes: usize,
    first: usize,
    len: usize,
    /// Rows per interleaved group (1: ggml's row-major rows).
    group: usize,
    /// Bytes per block.
    block: usize,
}

impl Rows {
    /// Block 0 of row `i` (`i < len`); block `b` is `b · self.stride()` bytes on.
    #[inline(always)]
    fn at(self, i: usize) -> *const u8 {
        let r = self.first + i;
        let g = self.group;
        self.p
            .wrapping_add(r / g * g * self.row_bytes + r % g * self.block)
    }

    /// Bytes from one block of a row to its next.
    #[inline(always)]
    fn stride(self) -> usize {
        self.group * self.block
    }
}

/// Weight rows per tile for one to three activation rows (decode): independent FMA
/// chains for one activation row.
const W_DECODE: usize = 4;
/// How far ahead of a decode tile (bytes) its weights are prefetched: the hardware
/// prefetcher follows one stream well but not a tile's interleaved rows.
const AHEAD_BYTES: usize = 4096;

/// `out[i · stride + (j − rows.start)] = vec_dot(w_i, a_j)` for the weight rows `w_i`
/// of `w` (`row_bytes` each) and the activation rows `j` in `rows`.
///
/// # Safety
/// The CPU must have AVX-512 F/BW/VL/VNNI, AVX2, FMA and F16C; `row_bytes` must be a
/// multiple of `U::BYTES`; `out` must hold `(w rows − 1) · stride + rows.len()` values.
pub unsafe fn block_rows<U: BiasedBlock>(
    w: &[u8],
    row_bytes: usize,
    a: &Activations<Q8_0>,
    rows: Range<usize>,
    out: &mut [f32],
    stride: usize,
) {
    block_rows_in::<U>(
        w,
        row_bytes,
        1,
        0..w.len() / row_bytes,
        a,
        rows,
        out,
        stride,
    )
}

/// [`block_rows`] for the weight rows `features` of a whole matrix `w` stored in groups
/// of `group` rows ([`Interleave`]; 1: ggml's layout):
/// `out[(r − features.start) · stride + (j − rows.start)] = vec_dot(w_r, a_j)`.
///
/// # Safety
/// As [`block_rows`] (the rows `features` are checked to lie inside `w`).
#[allow(clippy::too_many_arguments)]
pub unsafe fn block_rows_in<U: BiasedBlock>(
    w: &[u8],
    row_bytes: usize,
    group: Interleave,
    features: Range<usize>,
    a: &Activations<Q8_0>,
    rows: Range<usize>,
    out: &mut [f32],
    stride: usize,
) {
    let dst = Dst {
        p: out.as_mut_ptr(),
        f_stride: stride,
        j_stride: 1,
    };
    tiles_to::<U>(w, row_bytes, group, features, a, rows, dst);
}

/// [`block_rows_in`] written row-major into `out`, which must hold `features` × `rows`
/// (checked).
///
/// # Safety
/// As [`block_rows_in`], but `out` in place of the strided slice.
#[allow(clippy::too_many_arguments)]
pub unsafe fn block_rows_to<U: BiasedBlock>(
    w: &[u8],
    row_bytes: usize,
    group: Interleave,
    features: Range<usize>,
    a: &Activations<Q8_0>,
    rows: Range<usize>,
    out: &mut RowsOut<'_>,
) {
    if features.is_empty() || rows.is_empty() {
        return;
    }
    // Both corners held, so every output between them is.
    let _ = out.at(rows.end - 1, features.end - 1);
    let (p, ld) = out.at(rows.start, features.start);
    let dst = Dst {
        p,
        f_stride: 1,
        j_stride: ld,
    };
    tiles_to::<U>(w, row_bytes, group, features, a, rows, dst);
}

/// Where the tiles write: output (weight row `i`, activation row `j`), both counted
/// from the first of the call, at `p + i · f_stride + j · j_stride`.
#[derive(Clone, Copy)]
struct Dst {
    p: *mut f32,
    f_stride: usize,
    j_stride: usize,
}

impl Dst {
    /// Stores `v` as output `(i, j)`.
    ///
    /// # Safety
    /// `(i, j)` inside the outputs the caller was given.
    #[inline(always)]
    unsafe fn put(self, i: usize, j: usize, v: f32) {
        *self.p.add(i * self.f_stride + j * self.j_stride) = v;
    }
}

/// The decode or prefill tiles of the weight rows `features` (of `w`, in groups of
/// `group`) × the activation rows `rows` into `dst`.
///
/// # Panics
/// If the groups holding `features` are not inside `w`.
#[allow(clippy::too_many_arguments)]
#[inline(always)]
unsafe fn tiles_to<U: BiasedBlock>(
    w: &[u8],
    row_bytes: usize,
    group: Interleave,
    features: Range<usize>,
    a: &Activations<Q8_0>,
    rows: Range<usize>,
    dst: Dst,
) {
    let group = group.max(1);
    assert!(
        features.end.div_ceil(group) * group * row_bytes <= w.len(),
        "rows {features:?} beyond the matrix"
    );
    let n = (row_bytes / U::BYTES).min(a.k() / 32);
    let wrows = Rows {
        p: w.as_ptr(),
        row_bytes,
        first: features.start,
        len: features.len(),
        group,
        block: U::BYTES,
    };
    if rows.len() >= PREFILL_MIN {
        prefill_rows::<U>(wrows, n, a, rows, dst);
    } else {
        decode_rows::<U>(wrows, n, a, rows, dst);
    }
}

/// [`block_rows`] for one to three activation rows: tiles of [`W_DECODE`] (then 2, 1)
/// weight rows, each over the activation rows in tiles of 2 and 1.
#[inline(always)]
unsafe fn decode_rows<U: BiasedBlock>(
    wrows: Rows,
    n: usize,
    a: &Activations<Q8_0>,
    rows: Range<usize>,
    dst: Dst,
) {
    // The first tiles' bytes, which no tile before them prefetches.
    let head = AHEAD_BYTES.min(wrows.len * wrows.row_bytes);
    for l in (0..head).step_by(64) {
        _mm_prefetch::<_MM_HINT_T0>(wrows.at(0).wrapping_add(l) as *const i8);
    }
    let mut i = 0;
    macro_rules! weight_tiles {
        ($w:expr) => {
            while wrows.len - i >= $w {
                let ws: [*const u8; $w] = std::array::from_fn(|t| wrows.at(i + t));
                // The bytes `AHEAD_BYTES` on (at most to the last rows of `w`: those
                // after it are another task's), prefetched while this tile is computed.
                let ahead = AHEAD_BYTES.min((wrows.len - i - $w) * wrows.row_bytes);
                let mut j = rows.start;
                macro_rules! act_tiles {
                    ($r:expr) => {
                        while rows.end - j >= $r {
                            let acts: [&[Q8Block]; $r] = std::array::from_fn(|t| a.row(j + t));
                            let v = decode_dots::<U, $w, $r>(ws, wrows.stride(), n, ahead, acts);
                            for (t, vt) in v.iter().enumerate() {
                                for (r, &x) in vt.iter().enumerate() {
                                    dst.put(i + t, j - rows.start + r, x);
                                }
                            }
                            j += $r;
                        }
                    };
                }
                act_tiles!(2);
                act_tiles!(1);
                i += $w;
            }
        };
    }
    weight_tiles!(W_DECODE);
    weight_tiles!(2);
    weight_tiles!(1);
}

/// The `W × R` products of the weight rows at `ws` (`n` blocks each) with the
/// activation rows `a` (at least `n` blocks each): per block the weight values `u = q +
/// B` and, per activation row, `c = −B · Σ₄ y` and `vpdpbusd(c, u, y) = Σ₄ q·y`. Each
/// weight row's bytes `ahead` on are prefetched.
///
/// # Safety
/// As [`block_rows`]; each `ws[t]` readable for `n · U::BYTES` bytes.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn decode_dots<U: BiasedBlock, const W: usize, const R: usize>(
    ws: [*const u8; W],
    bs: usize,
    n: usize,
    ahead: usize,
    a: [&[Q8Block]; R],
) -> [[f32; R]; W] {
    debug_assert!(a.iter().all(|r| r.len() >= n));
    let bias = _mm256_set1_epi8(U::BIAS as i8);
    let mut acc = [[_mm256_setzero_ps(); R]; W];
    // The tile `ahead` bytes on is contiguous (`W` consecutive rows): prefetched as one
    // stream, `W · BYTES` bytes a block.
    let pf = ws[0].wrapping_add(ahead);
    for i in 0..n {
        let mut u = [_mm256_setzero_si256(); W];
        let mut dw = [_mm256_setzero_ps(); W];
        let q = pf.wrapping_add(i * W * U::BYTES);
        let mut l = 0;
        while l < W * U::BYTES {
            _mm_prefetch::<_MM_HINT_T0>(q.wrapping_add(l) as *const i8);
            l += 64;
        }
        for t in 0..W {
            let p = ws[t].add(i * bs);
            u[t] = U::biased(p);
            dw[t] = f16_splat8(p);
        }
        for r in 0..R {
            let ab = a[r].get_unchecked(i);
            let da = _mm256_set1_ps(ab.d);
            let y = _mm256_load_si256(ab.qs.as_ptr() as *const __m256i);
            // −B · Σ₄ y per lane.
            let c = _mm256_sub_epi32(
                _mm256_setzero_si256(),
                _mm256_dpbusd_epi32(_mm256_setzero_si256(), bias, y),
            );
            for t in 0..W {
                let v = _mm256_cvtepi32_ps(_mm256_dpbusd_epi32(c, u[t], y));
                // f16→f32(d_w) · d_a in every lane (one product, as ggml's scalar).
                acc[t][r] = _mm256_fmadd_ps(_mm256_mul_ps(dw[t], da), v, acc[t][r]);
            }
        }
    }
    let mut out = [[0f32; R]; W];
    for t in 0..W {
        for r in 0..R {
            out[t][r] = hsum_float_8(acc[t][r]);
        }
    }
    out
}

/// Activation rows per tile of [`prefill_rows`], and weight rows.
const R_PREFILL: usize = 8;
const W_PREFILL: usize = 2;

/// [`block_rows`] for several activation rows: tiles of [`R_PREFILL`] (then 4 and 2)
/// activation rows, each prepared once ([`ActTile`]) and run against all weight rows in
/// tiles of [`W_PREFILL`] (then 1); an odd last row goes as a pair with itself, its
/// copy's products dropped.
#[inline(always)]
unsafe fn prefill_rows<U: BiasedBlock>(
    wrows: Rows,
    n: usize,
    a: &Activations<Q8_0>,
    rows: Range<usize>,
    dst: Dst,
) {
    TILE.with_borrow_mut(|tile| {
        tile.reserve(n);
        prefill_tiles::<U>(tile, wrows, a, rows, dst)
    });
}

thread_local! {
    /// Each thread's [`ActTile`], grown to the longest rows it has seen.
    static TILE: std::cell::RefCell<ActTile> = const {
        std::cell::RefCell::new(ActTile { n: 0, y: Vec::new(), dp: Vec::new() })
    };
}

/// The tiles of [`prefill_rows`] with `tile` reserved for the rows' blocks.
#[inline(always)]
unsafe fn prefill_tiles<U: BiasedBlock>(
    tile: &mut ActTile,
    wrows: Rows,
    a: &Activations<Q8_0>,
    rows: Range<usize>,
    dst: Dst,
) {
    let mut j = rows.start;
    macro_rules! tiles {
        ($r:expr) => {
            while rows.end - j >= $r {
                let acts: [&[Q8Block]; $r] = std::array::from_fn(|t| a.row(j + t));
                tile.prepare::<$r>(acts);
                weight_tiles::<U, { $r / 2 }>(wrows, tile, dst, j - rows.start, $r);
                j += $r;
            }
        };
    }
    tiles!(R_PREFILL);
    tiles!(4);
    tiles!(2);
    if j < rows.end {
        tile.prepare::<2>([a.row(j), a.row(j)]);
        weight_tiles::<U, 1>(wrows, tile, dst, j - rows.start, 1);
    }
}

/// `R` activation rows prepared for [`pair_dots`]: per block the `R` quant vectors as
/// unsigned bytes `y + 128`, and per pair of rows their scales `d_a`.
struct ActTile {
    n: usize,
    y: Vec<__m256i>,
    /// Per block and pair of rows `(2p, 2p + 1)`: `d_a` of row `2p` in lanes 0–7 and of
    /// row `2p + 1` in lanes 8–15.
    dp: Vec<__m512>,
}

impl ActTile {
    /// Sets the block count to `n`, growing the tables if they are shorter.
    fn reserve(&mut self, n: usize) {
        self.n = n;
        if self.y.len() < n * R_PREFILL {
            // SAFETY: all-zero `__m256i` and `__m512` are valid values (no instruction
            // runs).
            self.y = vec![unsafe { std::mem::zeroed::<__m256i>() }; n * R_PREFILL];
            self.dp = vec![unsafe { std::mem::zeroed::<__m512>() }; n * R_PREFILL / 2];
        }
    }

    /// Fills the tables for the rows `a` (an even number, at least `n` blocks each).
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
    unsafe fn prepare<const R: usize>(&mut self, a: [&[Q8Block]; R]) {
        let flip = _mm256_set1_epi8(-128);
        for i in 0..self.n {
            for (r, row) in a.iter().enumerate() {
                let y = _mm256_load_si256(row.get_unchecked(i).qs.as_ptr() as *const __m256i);
                *self.y.get_unchecked_mut(i * R + r) = _mm256_xor_si256(y, flip);
            }
            for p in 0..R / 2 {
                let (lo, hi) = (a[2 * p].get_unchecked(i).d, a[2 * p + 1].get_unchecked(i).d);
                *self.dp.get_unchecked_mut(i * (R / 2) + p) =
                    _mm512_mask_blend_ps(0xff00, _mm512_set1_ps(lo), _mm512_set1_ps(hi));
            }
        }
    }
}

/// The `2 · P` rows prepared in `tile` against every weight row of `wrows`, in tiles of
/// [`W_PREFILL`] weight rows, then 1, through [`pair_dots`]; the first `used` rows'
/// products go to `dst` from activation row `j0` on.
#[inline(always)]
unsafe fn weight_tiles<U: BiasedBlock, const P: usize>(
    wrows: Rows,
    tile: &mut ActTile,
    dst: Dst,
    j0: usize,
    used: usize,
) {
    let mut i = 0;
    macro_rules! tiles {
        ($w:expr) => {
            while wrows.len - i >= $w {
                let ws: [*const u8; $w] = std::array::from_fn(|t| wrows.at(i + t));
                let next: [*const u8; $w] =
                    std::array::from_fn(|t| wrows.at((i + $w + t).min(wrows.len - 1)));
                let v = pair_dots::<U, $w, P>(ws, next, wrows.stride(), tile);
                for (t, vt) in v.iter().enumerate() {
                    for (r, &x) in vt.as_flattened()[..used].iter().enumerate() {
                        dst.put(i + t, j0 + r, x);
                    }
                }
                i += $w;
            }
        };
    }
    tiles!(W_PREFILL);
    tiles!(1);
}

/// The `W × 2P` products of the weight rows at `ws` with the `P` pairs of rows `(2p, 2p
/// + 1)` prepared in `tile`, two rows per 512-bit register: row `2p`'s eight lanes are
/// lanes 0–7, row `2p + 1`'s lanes 8–15. Per block, each lane is ggml's `vec_dot`
/// lane: `vpdpbusd(c, y + 128, q) = Σ₄ q·y` with the weights' offset `c = −128 · Σ₄ q`,
/// the conversion to f32, the scale product `f16→f32(d_w) · d_a` and one `fma`; the
/// two halves' horizontal sums are `hsum_float_8`'s. Each weight row's next rows
/// (`next`) are prefetched.
///
/// # Safety
/// As [`block_rows`]; each `ws[t]` readable for `tile.n · U::BYTES` bytes; `tile`
/// prepared for `2 · P` rows.
#[allow(clippy::needless_range_loop)]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn pair_dots<U: BiasedBlock, const W: usize, const P: usize>(
    ws: [*const u8; W],
    next: [*const u8; W],
    bs: usize,
    tile: &ActTile,
) -> [[[f32; 2]; P]; W] {
    let n = tile.n;
    let k128 = _mm512_set1_epi8(-128);
    let zero = _mm512_setzero_si512();
    let y = tile.y.as_ptr();
    let dp = tile.dp.as_ptr();
    let mut acc = [[_mm512_setzero_ps(); P]; W];
    for i in 0..n {
        let mut q = [zero; W];
        let mut c = [zero; W];
        let mut dw = [_mm512_setzero_ps(); W];
        for t in 0..W {
            let p = ws[t].add(i * bs);
            _mm_prefetch::<_MM_HINT_T0>(next[t].add(i * bs) as *const i8);
            q[t] = U::values_x2(p);
            c[t] = _mm512_sub_epi32(zero, _mm512_dpbusd_epi32(zero, k128, q[t]));
            dw[t] = _mm512_broadcastss_ps(_mm256_castps256_ps128(f16_splat8(p)));
        }
        for p in 0..P {
            // Rows 2p and 2p + 1 of block i, adjacent in the tile.
            let yy = _mm512_loadu_si512(y.add(i * 2 * P + 2 * p) as *const __m512i);
            let da = *dp.add(i * P + p);
            for t in 0..W {
                let v = _mm512_cvtepi32_ps(_mm512_dpbusd_epi32(c[t], yy, q[t]));
                acc[t][p] = _mm512_fmadd_ps(_mm512_mul_ps(dw[t], da), v, acc[t][p]);
            }
        }
    }
    let mut out = [[[0f32; 2]; P]; W];
    for t in 0..W {
        for p in 0..P {
            let a = acc[t][p];
            let hi = _mm512_extractf64x4_pd::<1>(_mm512_castps_pd(a));
            out[t][p] = [
                hsum_float_8(_mm512_castps512_ps256(a)),
                hsum_float_8(_mm256_castpd_ps(hi)),
            ];
        }
    }
    out
}
