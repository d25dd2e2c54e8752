//! F16 rows shorter than ggml's 64-value step — a LoRA adapter's `B`, whose rows are `r`
//! values long — eight output features at a time.
//!
//! For such a row `ggml_vec_dot_f16` has no main loop: every value is a leftover, and the
//! output is `sumf += f64(x[i] · y[i])` over `i` in order from `sumf = 0`, rounded to f32
//! (see the parent module). One output alone is a chain of dependent f64 additions. Here
//! eight features are summed at once, one per f64 lane of a `__m512d`, each lane in
//! ggml's index order — the same bits — and eight activation rows share each widened
//! weight column.
//!
//! The product of two f16 values is exact in f32 (11 × 11 significant bits, exponents
//! from 2⁻⁴⁸ to 2³², inside f32's normal range), so `f64(f32(x · y))` is the exact
//! product, and `sumf + x · y` rounds once either way: each step is one f64 `fma` of the
//! widened values.

use std::arch::x86_64::*;
use std::ops::Range;

use super::x86::load8;
use crate::{act, Activations, RowsOut};

/// Features per tile: the f64 lanes of a `__m512d`.
const LANES: usize = 8;
/// Rows at least this long go through ggml's main loop (`np = n & !63`), not here.
pub(super) const MAX_K: usize = 64;
/// Activation rows that share a tile's columns at once (independent `fma` chains).
const ROWS: usize = 8;

/// The 8 × 8 transpose of `r` (`out[i][l] = r[l][i]`).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn transpose8(r: [__m256; 8]) -> [__m256; 8] {
    let t0 = _mm256_unpacklo_ps(r[0], r[1]);
    let t1 = _mm256_unpackhi_ps(r[0], r[1]);
    let t2 = _mm256_unpacklo_ps(r[2], r[3]);
    let t3 = _mm256_unpackhi_ps(r[2], r[3]);
    let t4 = _mm256_unpacklo_ps(r[4], r[5]);
    let t5 = _mm256_unpackhi_ps(r[4], r[5]);
    let t6 = _mm256_unpacklo_ps(r[6], r[7]);
    let t7 = _mm256_unpackhi_ps(r[6], r[7]);
    let u0 = _mm256_shuffle_ps::<0x44>(t0, t2);
    let u1 = _mm256_shuffle_ps::<0xEE>(t0, t2);
    let u2 = _mm256_shuffle_ps::<0x44>(t1, t3);
    let u3 = _mm256_shuffle_ps::<0xEE>(t1, t3);
    let u4 = _mm256_shuffle_ps::<0x44>(t4, t6);
    let u5 = _mm256_shuffle_ps::<0xEE>(t4, t6);
    let u6 = _mm256_shuffle_ps::<0x44>(t5, t7);
    let u7 = _mm256_shuffle_ps::<0xEE>(t5, t7);
    [
        _mm256_permute2f128_ps::<0x20>(u0, u4),
        _mm256_permute2f128_ps::<0x20>(u1, u5),
        _mm256_permute2f128_ps::<0x20>(u2, u6),
        _mm256_permute2f128_ps::<0x20>(u3, u7),
        _mm256_permute2f128_ps::<0x31>(u0, u4),
        _mm256_permute2f128_ps::<0x31>(u1, u5),
        _mm256_permute2f128_ps::<0x31>(u2, u6),
        _mm256_permute2f128_ps::<0x31>(u3, u7),
    ]
}

/// `n ≤ 8` f16 values at `p`, widened, the rest zero.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn load_part(p: *const u16, n: usize) -> __m256 {
    let mut t = [0u16; 8];
    std::ptr::copy_nonoverlapping(p, t.as_mut_ptr(), n);
    load8(t.as_ptr())
}

/// `R` activation rows (`av`, widened, `k` apart) against the tile's columns `cols`: the
/// features' f64 sums in index order, rounded to f32.
#[inline]
#[target_feature(enable = "avx512f,avx2,fma,f16c")]
unsafe fn sums<const R: usize>(cols: &[__m512d], av: &[f64], k: usize) -> [__m256; R] {
    let mut acc = [_mm512_setzero_pd(); R];
    for (i, &c) in cols.iter().enumerate() {
        for (r, s) in acc.iter_mut().enumerate() {
            let y = _mm512_set1_pd(*av.get_unchecked(r * k + i));
            *s = _mm512_fmadd_pd(c, y, *s);
        }
    }
    acc.map(|s| _mm512_cvtpd_ps(s))
}

/// Outputs `(j, f)` for the activation rows `rows` and the weight rows `features` of `w`
/// (`row_bytes` = 2k bytes each, ggml's layout), equal bit for bit to
/// `F16Weights::vec_dot`, written row-major into `out`.
///
/// # Safety
/// AVX-512 F, AVX2, FMA and F16C must be available.
///
/// # Panics
/// If `k ≥ 64`, the activations are not `k` long, or `w` / `out` do not hold the rows.
#[target_feature(enable = "avx512f,avx2,fma,f16c")]
pub(super) unsafe fn rows_avx512(
    w: &[u8],
    row_bytes: usize,
    features: Range<usize>,
    a: &Activations<act::F16>,
    rows: Range<usize>,
    out: &mut RowsOut<'_>,
) {
    let k = row_bytes / 2;
    assert!(
        k > 0 && k < MAX_K && a.k() == k && rows.end <= a.rows(),
        "short F16 rows: k {k}, activations {} × {}",
        a.rows(),
        a.k()
    );
    assert!(
        features.end * row_bytes <= w.len(),
        "weight rows past the matrix"
    );
    // The activation rows widened to f64 once (exact).
    let n_rows = rows.len();
    let mut av = vec![0f64; n_rows * k];
    for (j, dst) in rows.clone().zip(av.chunks_exact_mut(k)) {
        let y = a.row(j).as_ptr();
        for i0 in (0..k).step_by(LANES) {
            let v = if i0 + LANES <= k {
                load8(y.add(i0))
            } else {
                load_part(y.add(i0), k - i0)
            };
            let mut t = [0f64; LANES];
            _mm512_storeu_pd(t.as_mut_ptr(), _mm512_cvtps_pd(v));
            let n = LANES.min(k - i0);
            dst[i0..i0 + n].copy_from_slice(&t[..n]);
        }
    }
    let mut cols = [_mm512_setzero_pd(); MAX_K + LANES];
    let mut res = [0f32; LANES];
    for f0 in features.clone().step_by(LANES) {
        let nf = (features.end - f0).min(LANES);
        // The tile's columns: `cols[i][l]` = weight value `i` of feature `f0 + l`.
        for i0 in (0..k).step_by(LANES) {
            let mut r = [_mm256_setzero_ps(); LANES];
            for (l, v) in r.iter_mut().enumerate().take(nf) {
                let p = w.as_ptr().add((f0 + l) * row_bytes + 2 * i0) as *const u16;
                *v = if i0 + LANES <= k {
                    load8(p)
                } else {
                    load_part(p, k - i0)
                };
            }
            for (c, t) in cols[i0..i0 + LANES].iter_mut().zip(transpose8(r)) {
                *c = _mm512_cvtps_pd(t);
            }
        }
        let cols = &cols[..k];
        let mut j = 0;
        while j < n_rows {
            if j + ROWS <= n_rows {
                let s = sums::<ROWS>(cols, &av[j * k..], k);
                for (r, v) in s.iter().enumerate() {
                    _mm256_storeu_ps(res.as_mut_ptr(), *v);
                    out.put(rows.start + j + r, f0, &res[..nf]);
                }
                j += ROWS;
            } else {
                let [v] = sums::<1>(cols, &av[j * k..], k);
                _mm256_storeu_ps(res.as_mut_ptr(), v);
                out.put(rows.start + j, f0, &res[..nf]);
                j += 1;
            }
        }
    }
}
