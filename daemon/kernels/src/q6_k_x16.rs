//! Q6_K matrices stored sixteen rows at a time for AVX-512 VNNI, as
//! [`crate::q4_k_x16`] stores Q4_K: the SIMD lanes are weight rows.
//!
//! llama.cpp does not repack Q6_K; its rows take `ggml_vec_dot_q6_K_q8_K` (decode, small
//! batches: [`Path::VecDot`]) or the tiled K-quant kernel (prompts: [`Path::Tiled`],
//! `ggml-cpu/tiled/`). Per output and block of 256 values (`u` the unsigned six-bit
//! values, `sc[g]` the signed scale of the sixteen values `16 g .. 16 g + 16`, `B_g` the
//! activation sums of the same values):
//! - vec_dot: eight integer lanes, lane `l` = `Σ_v sc[2v + l / 4] · Σ u·a` over values
//!   `32 v + 4 l .. 32 v + 4 l + 4` (`v < 8`) minus `32 · (sc[2l] · B_2l + sc[2l+1] ·
//!   B_2l+1)` ([`crate::q6_k`]), `acc_l = fma(d_w · d_a, f32(lane_l), acc_l)`, the result
//!   `hsum_float_8(acc)`;
//! - tiled: the block total `s = Σ_l lane_l` (exact), `acc = fma(f32(s) · d_w, d_a, acc)`.
//!
//! Here a 512-bit register holds one of those quantities for sixteen weight rows, each
//! lane's operations those of its row, so the results are the same bits (tested against
//! [`crate::Quant::path_rows`] and `vec_dot`).
//!
//! Layout of one block of a group of [`GROUP`] rows ([`BLOCK_BYTES`] bytes, 30 % more
//! than the sixteen ggml blocks: the values are kept one per byte, so that no shuffle
//! stands between a load and its `vpdpbusd`): `d[16]` (f16), `sc[8][16][2]` (`i8`: scale
//! pair `p` = groups `2p`, `2p + 1`, row, member — one `i16` pair per row once widened, for
//! `vpdpwssd` against the pair of activation sums `B_2p`, `B_2p+1`), then for each four-value chunk `c < 64` sixty-four bytes: row `r`'s `u` of values
//! `4 c .. 4 c + 4`. The ggml rows are recovered exactly ([`row_of`]).

#[cfg(test)]
use crate::act::Q8KBlock;
use crate::Path;

/// Weight rows per group.
pub const GROUP: usize = 16;
/// Bytes of one ggml `block_q6_K`.
const GGML_BYTES: usize = 210;
const QH: usize = 128;
const SCALES: usize = 192;
const GGML_D: usize = 208;
const D: usize = 0;
const SC: usize = 2 * GROUP;
const U: usize = SC + 16 * GROUP;
/// Bytes of one stored block of [`GROUP`] rows.
pub const BLOCK_BYTES: usize = U + 256 * GROUP;

/// Offset in a stored block of row `l`'s scale of group `g` (values `16 g .. 16 g + 16`).
const fn sc_at(g: usize, l: usize) -> usize {
    SC + ((g / 2) * GROUP + l) * 2 + g % 2
}

/// Value `i`'s six-bit `u` in a ggml block (`dequantize_row_q6_K`'s indexing).
fn u_of(b: &[u8], i: usize) -> u8 {
    let (n, k, x) = (i / 128, (i % 128) / 32, i % 32);
    let ql = b[64 * n + 32 * (k % 2) + x];
    let lo = if k < 2 { ql & 15 } else { ql >> 4 };
    let hi = (b[QH + 32 * n + x] >> (2 * k)) & 3;
    lo | (hi << 4)
}

/// The stored bytes of a ggml Q6_K matrix of `n` rows of `nb` blocks: groups of
/// [`GROUP`] rows (the last padded with zero rows), each `nb` stored blocks.
pub fn repack(data: &[u8], n: usize, nb: usize) -> Vec<u8> {
    let mut out = vec![0u8; n.div_ceil(GROUP) * nb * BLOCK_BYTES];
    for r in 0..n {
        let (g, l) = (r / GROUP, r % GROUP);
        for b in 0..nb {
            let src = &data[(r * nb + b) * GGML_BYTES..(r * nb + b + 1) * GGML_BYTES];
            let dst = &mut out[(g * nb + b) * BLOCK_BYTES..(g * nb + b + 1) * BLOCK_BYTES];
            dst[D + 2 * l..D + 2 * l + 2].copy_from_slice(&src[GGML_D..GGML_D + 2]);
            for s in 0..16 {
                dst[sc_at(s, l)] = src[SCALES + s];
            }
            for i in 0..256 {
                dst[U + (i / 4) * 4 * GROUP + 4 * l + i % 4] = u_of(src, i);
            }
        }
    }
    out
}

/// Row `r` of a stored matrix of `nb` blocks a row, in ggml's layout.
pub fn row_of(packed: &[u8], nb: usize, r: usize) -> Vec<u8> {
    let (g, l) = (r / GROUP, r % GROUP);
    let mut out = vec![0u8; nb * GGML_BYTES];
    for (b, dst) in out.chunks_exact_mut(GGML_BYTES).enumerate() {
        let src = &packed[(g * nb + b) * BLOCK_BYTES..(g * nb + b + 1) * BLOCK_BYTES];
        dst[GGML_D..GGML_D + 2].copy_from_slice(&src[D + 2 * l..D + 2 * l + 2]);
        for s in 0..16 {
            dst[SCALES + s] = src[sc_at(s, l)];
        }
        for i in 0..256 {
            let u = src[U + (i / 4) * 4 * GROUP + 4 * l + i % 4];
            let (n, k, x) = (i / 128, (i % 128) / 32, i % 32);
            let at = 64 * n + 32 * (k % 2) + x;
            dst[at] |= if k < 2 { u & 15 } else { (u & 15) << 4 };
            dst[QH + 32 * n + x] |= (u >> 4) << (2 * k);
        }
    }
    out
}

/// Whether `path` runs on the sixteen-lane kernel.
pub fn fast(path: Path) -> bool {
    matches!(path, Path::VecDot | Path::Tiled)
}

/// Activation rows per kernel call on `path`: vec_dot keeps eight lane accumulators per
/// row (four rows spill them), the tiled order one.
pub fn tile(path: Path) -> usize {
    if path == Path::VecDot {
        1
    } else {
        4
    }
}

/// The vec_dot (`TILED = false`) and tiled float orders of the module documentation.
#[cfg(target_arch = "x86_64")]
pub mod x86 {
    use super::{BLOCK_BYTES, D, GROUP, SC, U};
    use crate::act::Q8KBlock;
    use std::arch::x86_64::*;

    /// `out[r][l] = w_l · a[r]` for the [`GROUP`] weight rows `l` of the group whose `nb`
    /// stored blocks start at `w`, in the tiled (`TILED`) or vec_dot float order.
    ///
    /// # Safety
    /// AVX-512 F/BW/VL/VNNI, AVX2, FMA and F16C; `w` holds `nb` blocks; every `a[r]` at
    /// least `nb` blocks.
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
    pub unsafe fn group_dots<const R: usize, const TILED: bool>(
        w: &[u8],
        nb: usize,
        a: [&[Q8KBlock]; R],
        out: &mut [[f32; GROUP]; R],
    ) {
        if TILED {
            tiled(w, nb, a, out)
        } else {
            vec_dot(w, nb, a, out)
        }
    }

    /// Scale pair `p` of a stored block: `(sc[2p], sc[2p+1])` as an `i16` pair per row.
    #[inline(always)]
    unsafe fn scale_pair(blk: *const u8, p: usize) -> __m512i {
        _mm512_cvtepi8_epi16(_mm256_loadu_si256(
            blk.add(SC + p * 2 * GROUP) as *const __m256i
        ))
    }

    /// The two members of an `i16` scale pair per row, each widened to `i32`.
    #[inline(always)]
    unsafe fn pair_members(pair: __m512i) -> [__m512i; 2] {
        [
            _mm512_srai_epi32::<16>(_mm512_slli_epi32::<16>(pair)),
            _mm512_srai_epi32::<16>(pair),
        ]
    }

    /// Activation sums `(B_2p, B_2p+1)` as an `i16` pair, in every lane.
    #[inline(always)]
    unsafe fn sum_pair(ab: &Q8KBlock, p: usize) -> __m512i {
        _mm512_set1_epi32((ab.bsums.as_ptr().add(2 * p) as *const i32).read_unaligned())
    }

    /// Four activation bytes of chunk `c`, in every lane.
    #[inline(always)]
    unsafe fn chunk(ab: &Q8KBlock, c: usize) -> __m512i {
        _mm512_set1_epi32((ab.qs.as_ptr().add(4 * c) as *const i32).read_unaligned())
    }

    /// The tiled order: only the exact block total matters, so a group's four chunk
    /// products share one accumulator and one scale multiply, and the offsets
    /// `32 · Σ_g sc[g] · B_g` take one `vpdpwssd` per scale pair.
    #[inline(always)]
    unsafe fn tiled<const R: usize>(
        w: &[u8],
        nb: usize,
        a: [&[Q8KBlock]; R],
        out: &mut [[f32; GROUP]; R],
    ) {
        let mut acc = [_mm512_setzero_ps(); R];
        for i in 0..nb {
            let blk = w.as_ptr().add(i * BLOCK_BYTES);
            let ab: [&Q8KBlock; R] = std::array::from_fn(|r| a[r].get_unchecked(i));
            let mut tot = [_mm512_setzero_si512(); R];
            let mut off = [_mm512_setzero_si512(); R];
            for p in 0..8 {
                let pair = scale_pair(blk, p);
                let scales = pair_members(pair);
                for (h, s) in scales.iter().enumerate() {
                    let mut part = [_mm512_setzero_si512(); R];
                    for c in 8 * p + 4 * h..8 * p + 4 * h + 4 {
                        let wv = _mm512_loadu_si512(blk.add(U + c * 4 * GROUP) as *const _);
                        for r in 0..R {
                            part[r] = _mm512_dpbusd_epi32(part[r], wv, chunk(ab[r], c));
                        }
                    }
                    for r in 0..R {
                        tot[r] = _mm512_add_epi32(tot[r], _mm512_mullo_epi32(part[r], *s));
                    }
                }
                for r in 0..R {
                    off[r] = _mm512_dpwssd_epi32(off[r], pair, sum_pair(ab[r], p));
                }
            }
            let dw = _mm512_cvtph_ps(_mm256_loadu_si256(blk.add(D) as *const __m256i));
            for r in 0..R {
                let t = _mm512_sub_epi32(tot[r], _mm512_slli_epi32::<5>(off[r]));
                let res = _mm512_mul_ps(_mm512_cvtepi32_ps(t), dw);
                acc[r] = _mm512_fmadd_ps(res, _mm512_set1_ps(ab[r].d), acc[r]);
            }
        }
        for r in 0..R {
            _mm512_storeu_ps(out[r].as_mut_ptr(), acc[r]);
        }
    }

    /// The vec_dot order: eight integer lanes and eight float accumulators per row.
    #[inline(always)]
    unsafe fn vec_dot<const R: usize>(
        w: &[u8],
        nb: usize,
        a: [&[Q8KBlock]; R],
        out: &mut [[f32; GROUP]; R],
    ) {
        let mut acc = [[_mm512_setzero_ps(); 8]; R];
        for i in 0..nb {
            let blk = w.as_ptr().add(i * BLOCK_BYTES);
            let dw = _mm512_cvtph_ps(_mm256_loadu_si256(blk.add(D) as *const __m256i));
            let mut lanes = [[_mm512_setzero_si512(); 8]; R];
            for v in 0..8 {
                let pair = scale_pair(blk, v);
                let scales = pair_members(pair);
                for (h, s) in scales.iter().enumerate() {
                    // Chunks 8 v + 4 h .. 8 v + 4 h + 4: lanes l = 4 h .. 4 h + 4, scale 2 v + h.
                    let mut part = [[_mm512_setzero_si512(); 4]; R];
                    for (q, c) in (8 * v + 4 * h..8 * v + 4 * h + 4).enumerate() {
                        let wv = _mm512_loadu_si512(blk.add(U + c * 4 * GROUP) as *const _);
                        for (r, pr) in part.iter_mut().enumerate() {
                            let x = chunk(a[r].get_unchecked(i), c);
                            pr[q] = _mm512_dpbusd_epi32(_mm512_setzero_si512(), wv, x);
                        }
                    }
                    for (lr, pr) in lanes.iter_mut().zip(&part) {
                        for (q, p) in pr.iter().enumerate() {
                            let l = 4 * h + q;
                            lr[l] = _mm512_add_epi32(lr[l], _mm512_mullo_epi32(*p, *s));
                        }
                    }
                }
            }
            for r in 0..R {
                let ab = a[r].get_unchecked(i);
                // Lane l's offset: 32 · (sc[2l] · B_2l + sc[2l+1] · B_2l+1).
                for (l, lane) in lanes[r].iter_mut().enumerate() {
                    let off = _mm512_dpwssd_epi32(
                        _mm512_setzero_si512(),
                        scale_pair(blk, l),
                        sum_pair(ab, l),
                    );
                    *lane = _mm512_sub_epi32(*lane, _mm512_slli_epi32::<5>(off));
                }
                let d = _mm512_mul_ps(_mm512_set1_ps(ab.d), dw);
                for (f, lane) in acc[r].iter_mut().zip(&lanes[r]) {
                    *f = _mm512_fmadd_ps(d, _mm512_cvtepi32_ps(*lane), *f);
                }
            }
        }
        for r in 0..R {
            // `hsum_float_8`: (l4 + l0, l5 + l1, l6 + l2, l7 + l3), then
            // (. + l6+l2, . + l7+l3), then the two added.
            let x = &acc[r];
            let (a0, a1) = (_mm512_add_ps(x[4], x[0]), _mm512_add_ps(x[5], x[1]));
            let (a2, a3) = (_mm512_add_ps(x[6], x[2]), _mm512_add_ps(x[7], x[3]));
            let y = _mm512_add_ps(_mm512_add_ps(a0, a2), _mm512_add_ps(a1, a3));
            _mm512_storeu_ps(out[r].as_mut_ptr(), y);
        }
    }
}

/// The portable statement of [`x86::group_dots`] for weight row `l` of a group and one
/// activation row (the tests' reference for the lane layout).
#[cfg(test)]
fn lane_dot(w: &[u8], nb: usize, row: usize, a: &[Q8KBlock], tiled: bool) -> f32 {
    let mut acc = [0f32; 8];
    for (i, ab) in a.iter().enumerate().take(nb) {
        let base = i * BLOCK_BYTES;
        let dw = crate::half::le_f16(w, base + D + 2 * row);
        let sc = |g: usize| i32::from(w[base + sc_at(g, row)] as i8);
        let mut lanes = [0i32; 8];
        for (l, lane) in lanes.iter_mut().enumerate() {
            for v in 0..8 {
                let c = 8 * v + l;
                let dot: i32 = (0..4)
                    .map(|q| {
                        i32::from(w[base + U + c * 4 * GROUP + 4 * row + q])
                            * i32::from(ab.qs[4 * c + q])
                    })
                    .sum();
                *lane += sc(2 * v + l / 4) * dot;
            }
            *lane -= 32
                * (sc(2 * l) * i32::from(ab.bsums[2 * l])
                    + sc(2 * l + 1) * i32::from(ab.bsums[2 * l + 1]));
        }
        if tiled {
            let s: i32 = lanes.iter().sum();
            acc[0] = (s as f32 * dw).mul_add(ab.d, acc[0]);
        } else {
            let d = ab.d * dw;
            for (f, &lane) in acc.iter_mut().zip(&lanes) {
                *f = d.mul_add(lane as f32, *f);
            }
        }
    }
    if tiled {
        acc[0]
    } else {
        ((acc[4] + acc[0]) + (acc[6] + acc[2])) + ((acc[5] + acc[1]) + (acc[7] + acc[3]))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::act::{self, Activations};
    use crate::{Isa, Quant};

    fn matrix(n: usize, nb: usize, seed: u64) -> Vec<u8> {
        let w = crate::testing::random(n * nb * 256, seed);
        crate::testing::quantize(&w, n, nb * 256, candle_core::quantized::GgmlDType::Q6K).0
    }

    #[test]
    fn stored_rows_round_trip() {
        let (n, nb) = (21, 2);
        let data = matrix(n, nb, 4);
        let packed = repack(&data, n, nb);
        assert_eq!(packed.len(), 2 * nb * BLOCK_BYTES);
        for r in 0..n {
            assert_eq!(
                row_of(&packed, nb, r),
                data[r * nb * GGML_BYTES..(r + 1) * nb * GGML_BYTES]
            );
        }
    }

    /// The lane statement and the AVX-512 kernel give the bits of the Q6_K kernels'
    /// vec_dot and tiled paths on the ggml rows.
    #[test]
    fn sixteen_lanes_equal_the_row_paths() {
        let (n, nb) = (GROUP, 3);
        let k = nb * 256;
        let data = matrix(n, nb, 8);
        let packed = repack(&data, n, nb);
        let a: Activations<act::Q8K> = Activations::quantize_par(
            &crate::testing::random(5 * k, 12),
            5,
            k,
            |_| false,
            &|n, f| (0..n).for_each(f),
        )
        .expect("act");
        for path in [Path::VecDot, Path::Tiled] {
            let tiled = path == Path::Tiled;
            for l in 0..n {
                let row = &data[l * nb * GGML_BYTES..(l + 1) * nb * GGML_BYTES];
                let mut want = vec![0f32; 5];
                crate::q6_k::Q6K::path_rows(Isa::Avx2, path, row, &a, 0..5, &mut want);
                for (j, w) in want.iter().enumerate() {
                    let got = lane_dot(&packed, nb, l, a.row(j), tiled);
                    assert_eq!(got.to_bits(), w.to_bits(), "{path:?} row {l} act {j}");
                }
            }
            #[cfg(target_arch = "x86_64")]
            {
                let kernel: crate::testing::SixteenKernel = if tiled {
                    x86::group_dots::<3, true>
                } else {
                    x86::group_dots::<3, false>
                };
                let want = |l: usize, row: &[Q8KBlock]| lane_dot(&packed, nb, l, row, tiled);
                crate::testing::check_sixteen_lanes(
                    kernel,
                    &packed,
                    nb,
                    &a,
                    1,
                    want,
                    &format!("{path:?}"),
                );
            }
        }
    }
}
