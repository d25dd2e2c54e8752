//! Q4_K matrices repacked sixteen rows at a time for AVX-512 VNNI: the SIMD lanes are
//! weight rows, so a product needs no horizontal sums.
//!
//! llama.cpp repacks a Q4_K matrix whose row count is a multiple of 8
//! (`ggml-cpu/repack.cpp`, `block_q4_Kx8`) and then computes every activation row with
//! `ggml_gemm_q4_K_8x8_q8_K` or `ggml_gemv_q4_K_8x8_q8_K` ([`crate::paths`]: the
//! [`Path::Gemm`] and [`Path::Gemv`] rows). Their float operations per output are, per
//! block of 256 values, with `t_j` the exact integer total of quarter `j` (values `64 j ..
//! 64 j + 64`: `sc[2j] · Σ q·a` over sub-block `2j` plus `sc[2j+1] · Σ q·a` over sub-block
//! `2j+1`) and `m_j = mn[2j] · B_2j + mn[2j+1] · B_2j+1` (`B_s` the activation sums of
//! sub-block `s`):
//! - gemm: `acc = fma(f32(t_j), d_w · d_a, acc)`, `acc_m = fma(f32(m_j), dmin_w · d_a,
//!   acc_m)` for `j = 0..4`;
//! - gemv: the same once per block with `Σ_j t_j` and `Σ_j m_j`;
//!
//! and the output is `acc − acc_m` — what [`crate::q4_k`]'s `path_dots` computes one weight
//! row at a time. Here one 512-bit register holds the same quantity for sixteen weight
//! rows, each lane's operations those of its row, so the results are the same bits
//! (tested against [`crate::Quant::path_rows`]).
//!
//! The integer sums: `vpdpbusd` of the unsigned 4-bit weights (sixteen rows × four
//! values of one sub-block) with four activation bytes broadcast from memory — no
//! shuffle, one instruction per 64 products; a sub-block's eight such sums accumulate in
//! one register, then are multiplied by the rows' scales.
//!
//! Layout of one block of a group of [`GROUP`] rows ([`BLOCK_BYTES`] bytes, 2.8 % more
//! than the sixteen ggml blocks): `d[16]`, `dmin[16]` (f16), `sc[4][2][16]` and
//! `mn[4][16][2]` (the six-bit scales and mins, one byte each: quarter, half, row and
//! quarter, row, half), then for each quarter `j` and four-value chunk `c < 8` sixty-four
//! bytes: row `r`'s bytes `qs[32 j + 4 c .. 32 j + 4 c + 4]` of the ggml block (low
//! nibbles sub-block `2j`, high nibbles sub-block `2j+1`). The ggml rows are recovered
//! exactly ([`row_of`]).

#[cfg(test)]
use crate::act::Q8KBlock;
use crate::lanes::k4_scales_mins;
use crate::Path;

/// Weight rows per repacked group (the sixteen 32-bit lanes of a 512-bit register).
pub const GROUP: usize = 16;
/// Bytes of one ggml `block_q4_K`.
const GGML_BYTES: usize = 144;
const D: usize = 0;
const DMIN: usize = 2 * GROUP;
const SC: usize = 4 * GROUP;
const MN: usize = SC + 8 * GROUP;
const QS: usize = MN + 8 * GROUP;
/// Bytes of one repacked block of [`GROUP`] rows.
pub const BLOCK_BYTES: usize = QS + 128 * GROUP;

/// The repacked bytes of a ggml Q4_K matrix of `n` rows of `nb` blocks: groups of
/// [`GROUP`] rows (the last padded with zero rows), each `nb` repacked blocks.
pub fn repack(data: &[u8], n: usize, nb: usize) -> Vec<u8> {
    let groups = n.div_ceil(GROUP);
    let mut out = vec![0u8; groups * nb * BLOCK_BYTES];
    for r in 0..n {
        let (g, l) = (r / GROUP, r % GROUP);
        for b in 0..nb {
            let src = &data[(r * nb + b) * GGML_BYTES..(r * nb + b + 1) * GGML_BYTES];
            let dst = &mut out[(g * nb + b) * BLOCK_BYTES..(g * nb + b + 1) * BLOCK_BYTES];
            dst[D + 2 * l..D + 2 * l + 2].copy_from_slice(&src[0..2]);
            dst[DMIN + 2 * l..DMIN + 2 * l + 2].copy_from_slice(&src[2..4]);
            let (sc, mn) = k4_scales_mins(&src[4..16]);
            for j in 0..4 {
                for h in 0..2 {
                    dst[SC + (2 * j + h) * GROUP + l] = sc[2 * j + h];
                    dst[MN + (j * GROUP + l) * 2 + h] = mn[2 * j + h];
                }
                for c in 0..8 {
                    let at = QS + (j * 8 + c) * 4 * GROUP + 4 * l;
                    dst[at..at + 4]
                        .copy_from_slice(&src[16 + 32 * j + 4 * c..16 + 32 * j + 4 * c + 4]);
                }
            }
        }
    }
    out
}

/// Row `r` of a repacked matrix of `nb` blocks a row, in ggml's layout.
pub fn row_of(packed: &[u8], nb: usize, r: usize) -> Vec<u8> {
    let (g, l) = (r / GROUP, r % GROUP);
    let mut out = vec![0u8; nb * GGML_BYTES];
    for (b, dst) in out.chunks_exact_mut(GGML_BYTES).enumerate() {
        let src = &packed[(g * nb + b) * BLOCK_BYTES..(g * nb + b + 1) * BLOCK_BYTES];
        dst[0..2].copy_from_slice(&src[D + 2 * l..D + 2 * l + 2]);
        dst[2..4].copy_from_slice(&src[DMIN + 2 * l..DMIN + 2 * l + 2]);
        let sc: [u8; 8] = std::array::from_fn(|s| src[SC + s * GROUP + l]);
        let mn: [u8; 8] = std::array::from_fn(|s| src[MN + ((s / 2) * GROUP + l) * 2 + s % 2]);
        // The inverse of ggml's `get_scale_min_k4` packing (`k4_scales_mins`).
        let q = &mut dst[4..16];
        for j in 0..4 {
            q[j] = sc[j] | ((sc[j + 4] >> 4) << 6);
            q[j + 4] = mn[j] | ((mn[j + 4] >> 4) << 6);
            q[j + 8] = (sc[j + 4] & 15) | ((mn[j + 4] & 15) << 4);
        }
        for j in 0..4 {
            for c in 0..8 {
                let at = QS + (j * 8 + c) * 4 * GROUP + 4 * l;
                dst[16 + 32 * j + 4 * c..16 + 32 * j + 4 * c + 4].copy_from_slice(&src[at..at + 4]);
            }
        }
    }
    out
}

/// Whether `path` runs on the sixteen-lane kernel (the other paths read the ggml rows
/// back).
pub fn fast(path: Path) -> bool {
    matches!(path, Path::Gemm | Path::Gemv)
}

/// Activation rows per kernel call on `path`: four rows' accumulators fill the registers.
pub fn tile(_path: Path) -> usize {
    4
}

/// The gemm (`GEMM = true`) or gemv float order of the module documentation.
#[cfg(target_arch = "x86_64")]
pub mod x86 {
    use super::{BLOCK_BYTES, D, DMIN, GROUP, MN, QS, SC};
    use crate::act::Q8KBlock;
    use std::arch::x86_64::*;

    /// `out[r][l] = w_l · a[r]` for the [`GROUP`] weight rows `l` of the group whose
    /// `nb` repacked blocks start at `w`, in the gemm (`GEMM`) or gemv float order.
    ///
    /// # Safety
    /// AVX-512 F/BW/VL/VNNI, AVX2, FMA and F16C; `w` holds `nb` blocks; every `a[r]` at
    /// least `nb` blocks.
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
    pub unsafe fn group_dots<const R: usize, const GEMM: bool>(
        w: &[u8],
        nb: usize,
        a: [&[Q8KBlock]; R],
        out: &mut [[f32; GROUP]; R],
    ) {
        let m4 = _mm512_set1_epi8(0x0f);
        let mf0 = _mm512_set1_epi8(0xf0u8 as i8);
        let sixteenth = _mm512_set1_ps(1.0 / 16.0);
        let mut acc = [_mm512_setzero_ps(); R];
        let mut acc_m = [_mm512_setzero_ps(); R];
        for i in 0..nb {
            let blk = w.as_ptr().add(i * BLOCK_BYTES);
            let dw = _mm512_cvtph_ps(_mm256_loadu_si256(blk.add(D) as *const __m256i));
            let dmin = _mm512_cvtph_ps(_mm256_loadu_si256(blk.add(DMIN) as *const __m256i));
            let ab: [&Q8KBlock; R] = std::array::from_fn(|r| a[r].get_unchecked(i));
            let mut tsum = [_mm512_setzero_si512(); R];
            let mut msum = [_mm512_setzero_si512(); R];
            for j in 0..4 {
                // sa: Σ q·a over sub-block 2j; sb16: 16 · Σ q·a over sub-block 2j+1 (the
                // high nibbles masked in place, not shifted down).
                let mut sa = [_mm512_setzero_si512(); R];
                let mut sb16 = [_mm512_setzero_si512(); R];
                for c in 0..8 {
                    let wv = _mm512_loadu_si512(blk.add(QS + (j * 8 + c) * 4 * GROUP) as *const _);
                    let lo = _mm512_and_si512(wv, m4);
                    let hi = _mm512_and_si512(wv, mf0);
                    for r in 0..R {
                        let q = ab[r].qs.as_ptr();
                        let xa = _mm512_set1_epi32(
                            (q.add(64 * j + 4 * c) as *const i32).read_unaligned(),
                        );
                        let xb = _mm512_set1_epi32(
                            (q.add(64 * j + 32 + 4 * c) as *const i32).read_unaligned(),
                        );
                        sa[r] = _mm512_dpbusd_epi32(sa[r], lo, xa);
                        sb16[r] = _mm512_dpbusd_epi32(sb16[r], hi, xb);
                    }
                }
                let sca = _mm512_cvtepu8_epi32(_mm_loadu_si128(
                    blk.add(SC + 2 * j * GROUP) as *const __m128i
                ));
                let scb = _mm512_cvtepu8_epi32(_mm_loadu_si128(
                    blk.add(SC + (2 * j + 1) * GROUP) as *const __m128i
                ));
                let mn = _mm512_cvtepu8_epi16(_mm256_loadu_si256(
                    blk.add(MN + j * 2 * GROUP) as *const __m256i
                ));
                let (sca_f, scb_f) = (
                    _mm512_cvtepi32_ps(sca),
                    _mm512_mul_ps(_mm512_cvtepi32_ps(scb), sixteenth),
                );
                for r in 0..R {
                    // (B_2j, B_2j+1) as an i16 pair in every lane.
                    let b = &ab[r].bsums[4 * j..4 * j + 4];
                    let (b0, b1) = (b[0].wrapping_add(b[1]), b[2].wrapping_add(b[3]));
                    let pair = (b0 as u16 as u32 | ((b1 as u16 as u32) << 16)) as i32;
                    let m = _mm512_madd_epi16(mn, _mm512_set1_epi32(pair));
                    if GEMM {
                        // t_j in floats, exactly: |sa|, |sb16| < 2^20, the scales < 64,
                        // so both products and their sum are integers below 2^24.
                        let t = _mm512_fmadd_ps(
                            _mm512_cvtepi32_ps(sa[r]),
                            sca_f,
                            _mm512_mul_ps(_mm512_cvtepi32_ps(sb16[r]), scb_f),
                        );
                        let da = _mm512_set1_ps(ab[r].d);
                        let (ds, dm) = (_mm512_mul_ps(dw, da), _mm512_mul_ps(dmin, da));
                        acc[r] = _mm512_fmadd_ps(t, ds, acc[r]);
                        acc_m[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(m), dm, acc_m[r]);
                    } else {
                        let t = _mm512_add_epi32(
                            _mm512_mullo_epi32(sa[r], sca),
                            _mm512_mullo_epi32(_mm512_srai_epi32::<4>(sb16[r]), scb),
                        );
                        tsum[r] = _mm512_add_epi32(tsum[r], t);
                        msum[r] = _mm512_add_epi32(msum[r], m);
                    }
                }
            }
            if !GEMM {
                for r in 0..R {
                    let da = _mm512_set1_ps(ab[r].d);
                    let (ds, dm) = (_mm512_mul_ps(dw, da), _mm512_mul_ps(dmin, da));
                    acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(tsum[r]), ds, acc[r]);
                    acc_m[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(msum[r]), dm, acc_m[r]);
                }
            }
        }
        for r in 0..R {
            _mm512_storeu_ps(out[r].as_mut_ptr(), _mm512_sub_ps(acc[r], acc_m[r]));
        }
    }
}

/// The portable statement of [`x86::group_dots`] for one weight row `l` of a group and
/// one activation row (the tests' reference for the lane layout).
#[cfg(test)]
fn lane_dot(w: &[u8], nb: usize, l: usize, a: &[Q8KBlock], path: Path) -> f32 {
    let f16 = |at: usize| crate::half::le_f16(w, at);
    let (mut acc, mut acc_m) = (0f32, 0f32);
    for (i, ab) in a.iter().enumerate().take(nb) {
        let base = i * BLOCK_BYTES;
        let (dw, dmin) = (f16(base + D + 2 * l), f16(base + DMIN + 2 * l));
        let (mut ts, mut ms) = (0i32, 0i32);
        for j in 0..4 {
            let (mut sa, mut sb) = (0i32, 0i32);
            for c in 0..8 {
                for v in 0..4 {
                    let q = w[base + QS + (j * 8 + c) * 4 * GROUP + 4 * l + v];
                    sa += i32::from(q & 15) * i32::from(ab.qs[64 * j + 4 * c + v]);
                    sb += i32::from(q >> 4) * i32::from(ab.qs[64 * j + 32 + 4 * c + v]);
                }
            }
            let sc = |h: usize| i32::from(w[base + SC + (2 * j + h) * GROUP + l]);
            let mn = |h: usize| i32::from(w[base + MN + (j * GROUP + l) * 2 + h]);
            let b = |s: usize| i32::from(ab.bsums[2 * s]) + i32::from(ab.bsums[2 * s + 1]);
            let t = sc(0) * sa + sc(1) * sb;
            let m = mn(0) * b(2 * j) + mn(1) * b(2 * j + 1);
            if path == Path::Gemm {
                acc = (t as f32).mul_add(dw * ab.d, acc);
                acc_m = (m as f32).mul_add(dmin * ab.d, acc_m);
            } else {
                ts += t;
                ms += m;
            }
        }
        if path != Path::Gemm {
            acc = (ts as f32).mul_add(dw * ab.d, acc);
            acc_m = (ms as f32).mul_add(dmin * ab.d, acc_m);
        }
    }
    acc - acc_m
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::act::{self, Activations};
    use crate::{Isa, Quant};

    /// Random ggml Q4_K rows: random bytes with finite f16 scales.
    fn rows(n: usize, nb: usize, seed: u32) -> Vec<u8> {
        let mut x = seed.wrapping_mul(2_654_435_761) | 1;
        let mut next = move || {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            x
        };
        let mut data: Vec<u8> = (0..n * nb * GGML_BYTES).map(|_| next() as u8).collect();
        for blk in data.chunks_exact_mut(GGML_BYTES) {
            let d = half::f16::from_f32((next() % 1000) as f32 * 1e-5).to_le_bytes();
            let m = half::f16::from_f32((next() % 1000) as f32 * 1e-5).to_le_bytes();
            blk[0..2].copy_from_slice(&d);
            blk[2..4].copy_from_slice(&m);
        }
        data
    }

    fn acts(rows: usize, k: usize, seed: u32, gemm: bool) -> Activations<act::Q8K> {
        let xs = crate::testing::random(rows * k, u64::from(seed));
        Activations::quantize_par(&xs, rows, k, |_| gemm, &|n, f| (0..n).for_each(f))
            .expect("quantize")
    }

    #[test]
    fn repacked_rows_round_trip() {
        let (n, nb) = (37, 3);
        let data = rows(n, nb, 1);
        let packed = repack(&data, n, nb);
        assert_eq!(packed.len(), 3 * nb * BLOCK_BYTES);
        for r in 0..n {
            assert_eq!(
                row_of(&packed, nb, r),
                data[r * nb * GGML_BYTES..(r + 1) * nb * GGML_BYTES]
            );
        }
    }

    /// The lane statement and the AVX-512 kernel give the bits of the Q4_K kernels'
    /// gemm and gemv paths on the ggml rows, for every tile height.
    #[test]
    fn sixteen_lanes_equal_the_row_paths() {
        let (n, nb) = (GROUP, 4);
        let k = nb * 256;
        let data = rows(n, nb, 7);
        let packed = repack(&data, n, nb);
        for path in [Path::Gemm, Path::Gemv] {
            let a = acts(5, k, 11, path == Path::Gemm);
            for l in 0..n {
                let row = &data[l * nb * GGML_BYTES..(l + 1) * nb * GGML_BYTES];
                let mut want = vec![0f32; 5];
                crate::q4_k::Q4K::path_rows(Isa::Avx2, path, row, &a, 0..5, &mut want);
                for (j, w) in want.iter().enumerate() {
                    let got = lane_dot(&packed, nb, l, a.row(j), path);
                    assert_eq!(got.to_bits(), w.to_bits(), "{path:?} row {l} act {j}");
                }
            }
            #[cfg(target_arch = "x86_64")]
            {
                let kernel: crate::testing::SixteenKernel = if path == Path::Gemm {
                    x86::group_dots::<3, true>
                } else {
                    x86::group_dots::<3, false>
                };
                let want = |l: usize, row: &[Q8KBlock]| lane_dot(&packed, nb, l, row, path);
                crate::testing::check_sixteen_lanes(
                    kernel,
                    &packed,
                    nb,
                    &a,
                    2,
                    want,
                    &format!("{path:?}"),
                );
            }
        }
    }
}
