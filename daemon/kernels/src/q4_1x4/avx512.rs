//! ggml's order on 512-bit registers. Callers check AVX2, FMA, F16C and AVX-512
//! F/BW/VL/VNNI first.

use super::{store_tile as store, Group4, Q4_1Matrix, Q8_1Rows, GROUP_ROWS};
use std::arch::x86_64::*;

/// Records (80 bytes each) fetched ahead in single-row (decode) tiles.
const PREFETCH_RECORDS: usize = 64;

/// See `avx2::rows_range_vnni`; same contract and results.
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
