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
                    let y_hi = _mm256_broadcastsi128_si256(_mm_load_si128(q[16..].as_ptr().cast()));
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
