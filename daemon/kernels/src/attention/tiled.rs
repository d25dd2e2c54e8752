//! llama.cpp's tiled CPU flash attention (`ggml_compute_forward_flash_attn_ext_tiled` in
//! `ggml/src/ggml-cpu/ops.cpp`), the path llama.cpp takes for an f16 KV cache when a
//! batch has at least [`TILE`] query rows (`GGML_FA_TILE_Q`): a long prompt's prefill.
//!
//! Per query row, the keys are taken in tiles of [`TILE`] positions from position 0
//! (`GGML_FA_TILE_KV`): scores `s = (Σ_d fma(k_d, q_d, ·)) · scale` with `q` in f32 and
//! `k` widened from f16, summed in `d` order (`simd_gemm`); a tile's maximum updates the
//! running maximum `M` (rescaling the f32 value accumulator and the sum by
//! `expf(M_old − M)`), `p = ggml_v_expf(s − M)`, the tile's sum of `p` is GCC's
//! `_mm512_reduce_add_ps` per 16 added in f64 onto `S`; `acc_d = fma(v_jd, p_j, acc_d)`
//! in key order (for every key of the tile: a row that sees none of them adds
//! `fma(v, 0, acc)`, as llama.cpp's zeroed scores do); the output is `acc · (1 / S)`.
//! Rows are independent of each other; [`ROWS`] of them share a key tile's loads
//! ([`super::blocks`]), which leaves every output's operations as they were (tested
//! against the one-row kernel).

use half::f16;
use half::slice::HalfFloatSliceExt;

use super::blocks::{self, Simd};
use super::HeadRows;
use crate::eltwise::v_expf;

/// Query rows from which llama.cpp tiles, and the key tile length.
pub const TILE: usize = 64;

/// Attention of one work item ([`HeadRows`]) in the tiled kernel's arithmetic.
/// Returns `(rows.len(), head_dim)`.
pub fn attend_head(kc: &[f16], vc: &[f16], item: &HeadRows<'_>) -> Vec<f32> {
    #[cfg(target_arch = "x86_64")]
    if is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma") {
        // SAFETY: FMA was detected; the function only changes how `mul_add` compiles.
        return unsafe { tiled_fma(kc, vc, item) };
    }
    tiled(kc, vc, item)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn tiled_fma(kc: &[f16], vc: &[f16], item: &HeadRows<'_>) -> Vec<f32> {
    tiled(kc, vc, item)
}

/// Query rows computed together against a key tile (their scores and value sums in
/// registers, [`super::blocks`]; llama.cpp's `simd_gemm` blocks rows too).
pub const ROWS: usize = 4;

/// One head's query rows and running softmax state, and the current key tile.
struct Tile<'a> {
    simd: Simd,
    item: &'a HeadRows<'a>,
    hd: usize,
    first: usize,
    /// `K` transposed (`[d][key]`, keys contiguous as in ggml's `K_f32`), `V` as
    /// `[key][d]`, both f32; `t0` the tile's first key, `kv` its key count.
    kt: Vec<f32>,
    vt: Vec<f32>,
    t0: usize,
    kv: usize,
    /// Per row: the value sums `(rows, hd)`, the running maximum and sum.
    out: Vec<f32>,
    m: Vec<f32>,
    sum: Vec<f32>,
}

#[inline(always)]
fn tiled<'a>(kc: &[f16], vc: &[f16], item: &'a HeadRows<'a>) -> Vec<f32> {
    let (shape, rows, offs) = (item.shape, item.rows.clone(), item.offs);
    let hd = shape.head_dim;
    let n_rows = rows.len();
    let mut t = Tile {
        simd: Simd::detect(),
        item,
        hd,
        first: rows.start,
        kt: vec![0f32; hd * TILE],
        vt: vec![0f32; TILE * hd],
        t0: 0,
        kv: 0,
        out: vec![0f32; n_rows * hd],
        m: vec![f32::NEG_INFINITY; n_rows],
        sum: vec![0f32; n_rows],
    };
    let mut krow = vec![0f32; hd];
    let max_keys = item.max_keys();
    // Keys any row of this range can see.
    let lo_all = item.keys(rows.start).start;
    for t0 in (lo_all / TILE * TILE..max_keys).step_by(TILE) {
        let kv = TILE.min(max_keys - t0);
        for tk in 0..kv {
            let j = t0 + tk;
            // Slice conversions (F16C where the CPU has it; exact either way).
            kc[offs[j]..offs[j] + hd].convert_to_f32_slice(&mut krow);
            for (d, &x) in krow.iter().enumerate() {
                t.kt[d * TILE + tk] = x;
            }
            vc[offs[j]..offs[j] + hd].convert_to_f32_slice(&mut t.vt[tk * hd..(tk + 1) * hd]);
        }
        (t.t0, t.kv) = (t0, kv);
        let mut r = rows.start;
        while r < rows.end {
            let n = (rows.end - r).min(ROWS);
            match n {
                4 => rows_tile::<4>(&mut t, r),
                3 => rows_tile::<3>(&mut t, r),
                2 => rows_tile::<2>(&mut t, r),
                _ => rows_tile::<1>(&mut t, r),
            }
            r += n;
        }
    }
    for (i, acc) in t.out.chunks_exact_mut(hd).enumerate() {
        let inv = if t.sum[i] == 0.0 { 0.0 } else { 1.0 / t.sum[i] };
        acc.iter_mut().for_each(|a| *a *= inv);
    }
    t.out
}

/// The current key tile for the `R` query rows from `r0`: scores (per score a
/// sequential fma chain over `d`, as `simd_gemm`), masking, the running maximum and
/// sum, `p = ggml_v_expf(s − M)`, then `acc_d = fma(v_jd, p_j, acc_d)` in key order.
/// A row that sees no key of the tile keeps its state, and adds `fma(v, 0, acc)` as
/// llama.cpp (which zeroes its scores) does.
#[inline(always)]
fn rows_tile<const R: usize>(t: &mut Tile<'_>, r0: usize) {
    let (hd, t0, kv, item) = (t.hd, t.t0, t.kv, t.item);
    let shape = item.shape;
    let qs: [&[f32]; R] = std::array::from_fn(|i| item.q_row(r0 + i));
    let mut s = blocks::scores(t.simd, &t.kt, qs, hd);
    // Softmax state per row; `s` becomes the tile's `p`.
    for (i, sr) in s.iter_mut().enumerate() {
        let r = r0 + i;
        let keys = item.keys(r);
        let (lo, n_keys) = (keys.start, keys.end);
        for (tk, sv) in sr.iter_mut().enumerate() {
            let j = t0 + tk;
            *sv = if j < lo || j >= n_keys {
                f32::NEG_INFINITY
            } else {
                *sv * shape.scale
            };
        }
        let tile_max = sr.iter().fold(f32::NEG_INFINITY, |a, &b| a.max(b));
        if tile_max == f32::NEG_INFINITY {
            sr.fill(0.0);
            continue;
        }
        let ri = r - t.first;
        let m_new = t.m[ri].max(tile_max);
        if m_new > t.m[ri] {
            let ms = (t.m[ri] - m_new).exp();
            t.out[ri * hd..(ri + 1) * hd]
                .iter_mut()
                .for_each(|a| *a *= ms);
            t.sum[ri] *= ms;
        }
        t.m[ri] = m_new;
        let mut tile_sum = 0f64;
        for chunk in sr.chunks_exact_mut(16) {
            let mut lanes = [0f32; 16];
            for (l, v) in lanes.iter_mut().zip(chunk.iter_mut()) {
                *v = v_expf(*v - m_new);
                *l = *v;
            }
            tile_sum += f64::from(crate::lanes::reduce_add_16(&lanes));
        }
        t.sum[ri] = (f64::from(t.sum[ri]) + tile_sum) as f32;
    }
    let ri0 = r0 - t.first;
    let mut rows_out = t.out[ri0 * hd..(ri0 + R) * hd].chunks_exact_mut(hd);
    let mut acc: [&mut [f32]; R] = std::array::from_fn(|_| rows_out.next().unwrap_or_default());
    blocks::values(t.simd, &t.vt, hd, kv, &s, &mut acc);
}

/// Whether llama-server computes the attention of the prompt row at `pos` (of a prompt
/// of `prompt_len` tokens) with the tiled kernel: the row's micro-batch has at least
/// [`TILE`] rows (`neq1 >= Q_TILE_SZ` in `ggml_compute_forward_flash_attn_ext_f16`).
pub fn tiled_row(pos: usize, prompt_len: usize) -> bool {
    crate::ubatch::batch_row(pos, prompt_len).len as usize >= TILE
}

#[cfg(test)]
mod tests {
    use super::super::{test_values as values, AttnShape};
    use super::*;

    /// The kernel before its rows were blocked, one query row at a time: the oracle
    /// for the blocked kernel's bits.
    #[allow(clippy::too_many_arguments)]
    fn one_row_at_a_time(
        kc: &[f16],
        vc: &[f16],
        offs: &[usize],
        start_pos: usize,
        h: usize,
        rows: std::ops::Range<usize>,
        q: &[f32],
        shape: AttnShape,
    ) -> Vec<f32> {
        let hd = shape.head_dim;
        let row_width = shape.n_head * hd;
        let first = rows.start;
        let mut out = vec![0f32; rows.len() * hd];
        let mut m = vec![f32::NEG_INFINITY; rows.len()];
        let mut sum = vec![0f32; rows.len()];
        let max_keys = start_pos + rows.end;
        let mut s = [0f32; TILE];
        for t0 in (0..max_keys).step_by(TILE) {
            let kv = TILE.min(max_keys - t0);
            for r in rows.clone() {
                let n_keys = start_pos + r + 1;
                let lo = shape.window.map_or(0, |w| n_keys.saturating_sub(w));
                if t0 >= n_keys || t0 + TILE <= lo {
                    continue;
                }
                let qr = &q[r * row_width + h * hd..r * row_width + (h + 1) * hd];
                s.fill(0.0);
                for (d, &x) in qr.iter().enumerate() {
                    for (tk, sv) in s.iter_mut().enumerate().take(kv) {
                        let k = kc[offs[t0 + tk] + d].to_f32();
                        *sv = k.mul_add(x, *sv);
                    }
                }
                for (tk, sv) in s.iter_mut().enumerate() {
                    let j = t0 + tk;
                    *sv = if j < lo || j >= n_keys {
                        f32::NEG_INFINITY
                    } else {
                        *sv * shape.scale
                    };
                }
                let tile_max = s.iter().fold(f32::NEG_INFINITY, |a, &b| a.max(b));
                let i = r - first;
                let acc = &mut out[i * hd..(i + 1) * hd];
                let m_new = m[i].max(tile_max);
                if m_new > m[i] {
                    let ms = (m[i] - m_new).exp();
                    acc.iter_mut().for_each(|a| *a *= ms);
                    sum[i] *= ms;
                }
                m[i] = m_new;
                let mut tile_sum = 0f64;
                for chunk in s.chunks_exact_mut(16) {
                    let mut lanes = [0f32; 16];
                    for (l, v) in lanes.iter_mut().zip(chunk.iter_mut()) {
                        *v = v_expf(*v - m_new);
                        *l = *v;
                    }
                    tile_sum += f64::from(crate::lanes::reduce_add_16(&lanes));
                }
                sum[i] = (f64::from(sum[i]) + tile_sum) as f32;
                for (tk, &p) in s.iter().enumerate().take(kv) {
                    for (d, a) in acc.iter_mut().enumerate() {
                        *a = vc[offs[t0 + tk] + d].to_f32().mul_add(p, *a);
                    }
                }
            }
        }
        for (i, acc) in out.chunks_exact_mut(hd).enumerate() {
            let inv = if sum[i] == 0.0 { 0.0 } else { 1.0 / sum[i] };
            acc.iter_mut().for_each(|a| *a *= inv);
        }
        out
    }

    /// Row blocks of 4, 3, 2 and 1 rows, several key tiles, a cached prefix, a sliding
    /// window and head sizes 64 and 256: equal to the one-row kernel bit for bit.
    #[test]
    fn blocked_rows_equal_one_row_at_a_time() {
        for (hd, window, start_pos, n_rows) in [
            (64, None, 0, 150),
            (64, Some(70), 20, 133),
            (256, None, 5, 67),
            (96, None, 0, 65),
        ] {
            let n_head = 2;
            let keys = start_pos + n_rows;
            let kc: Vec<f16> = values(keys * hd, 1)
                .iter()
                .map(|&x| f16::from_f32(x))
                .collect();
            let vc: Vec<f16> = values(keys * hd, 2)
                .iter()
                .map(|&x| f16::from_f32(x))
                .collect();
            let offs: Vec<usize> = (0..keys).map(|j| j * hd).collect();
            let q = values(n_rows * n_head * hd, 3);
            let shape = AttnShape {
                n_head,
                n_kv_head: 1,
                head_dim: hd,
                scale: 1.0 / (hd as f32).sqrt(),
                window,
            };
            for (h, rows) in [(0, 0..n_rows), (1, 3..n_rows - 2), (1, 10..11)] {
                let want =
                    one_row_at_a_time(&kc, &vc, &offs, start_pos, h, rows.clone(), &q, shape);
                let item = HeadRows {
                    shape,
                    h,
                    rows: rows.clone(),
                    start_pos,
                    q: &q,
                    offs: &offs,
                    bidirectional: &[],
                };
                let got = attend_head(&kc, &vc, &item);
                assert_eq!(got.len(), want.len());
                for (i, (g, w)) in got.iter().zip(&want).enumerate() {
                    assert_eq!(
                        g.to_bits(),
                        w.to_bits(),
                        "head_dim {hd}, window {window:?}, rows {rows:?}: value {i}: {g} vs {w}"
                    );
                }
            }
        }
    }
}
