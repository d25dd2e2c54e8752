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
//! in key order; the output is `acc · (1 / S)`. Rows are independent of each other.

use half::f16;
use half::slice::HalfFloatSliceExt;

use super::ggml_ops::v_expf;
use super::kv_pool::ForwardSeq;
use super::transformer::AttnShape;

/// Query rows from which llama.cpp tiles, and the key tile length.
pub const TILE: usize = 64;

/// Attention of query head `h` for rows `rows` of `seq` in the tiled kernel's
/// arithmetic; `q` starts at the sequence's first row, `offs[j]` is key `j`'s offset in
/// `kc`/`vc`. Returns `(rows.len(), head_dim)`.
#[allow(clippy::too_many_arguments)]
pub(super) fn attend_head_tiled(
    kc: &[f16],
    vc: &[f16],
    offs: &[usize],
    seq: &ForwardSeq<'_>,
    h: usize,
    rows: std::ops::Range<usize>,
    q: &[f32],
    shape: AttnShape,
) -> Vec<f32> {
    #[cfg(target_arch = "x86_64")]
    if is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma") {
        // SAFETY: FMA was detected; the function only changes how `mul_add` compiles.
        return unsafe { tiled_fma(kc, vc, offs, seq, h, rows, q, shape) };
    }
    tiled(kc, vc, offs, seq, h, rows, q, shape)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
#[allow(clippy::too_many_arguments)]
unsafe fn tiled_fma(
    kc: &[f16],
    vc: &[f16],
    offs: &[usize],
    seq: &ForwardSeq<'_>,
    h: usize,
    rows: std::ops::Range<usize>,
    q: &[f32],
    shape: AttnShape,
) -> Vec<f32> {
    tiled(kc, vc, offs, seq, h, rows, q, shape)
}

#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn tiled(
    kc: &[f16],
    vc: &[f16],
    offs: &[usize],
    seq: &ForwardSeq<'_>,
    h: usize,
    rows: std::ops::Range<usize>,
    q: &[f32],
    shape: AttnShape,
) -> Vec<f32> {
    let hd = shape.head_dim;
    let row_width = shape.n_head * hd;
    let first = rows.start;
    let n_rows = rows.len();
    let mut out = vec![0f32; n_rows * hd];
    // Per row: running maximum and sum.
    let mut m = vec![f32::NEG_INFINITY; n_rows];
    let mut sum = vec![0f32; n_rows];
    // One key tile in f32: K transposed (`[d][key]`, keys contiguous as in ggml's
    // `K_f32`), V as `[key][d]`.
    let mut kt = vec![0f32; hd * TILE];
    let mut vt = vec![0f32; TILE * hd];
    let mut s = [0f32; TILE];
    let mut krow = vec![0f32; hd];
    let max_keys = seq.start_pos + rows.end;
    // Keys any row of this range can see.
    let lo_all = shape
        .window
        .map_or(0, |w| (seq.start_pos + first + 1).saturating_sub(w));
    for t0 in (lo_all / TILE * TILE..max_keys).step_by(TILE) {
        let kv = TILE.min(max_keys - t0);
        for tk in 0..kv {
            let j = t0 + tk;
            // Slice conversions (F16C where the CPU has it; exact either way).
            kc[offs[j]..offs[j] + hd].convert_to_f32_slice(&mut krow);
            for (d, &x) in krow.iter().enumerate() {
                kt[d * TILE + tk] = x;
            }
            vc[offs[j]..offs[j] + hd].convert_to_f32_slice(&mut vt[tk * hd..(tk + 1) * hd]);
        }
        for r in rows.clone() {
            let n_keys = seq.start_pos + r + 1;
            let lo = shape.window.map_or(0, |w| n_keys.saturating_sub(w));
            if t0 >= n_keys || t0 + TILE <= lo {
                continue; // every key of the tile masked: ggml skips it
            }
            let qr = &q[r * row_width + h * hd..r * row_width + (h + 1) * hd];
            // `simd_gemm`: each score a sequential fma chain over d.
            s.fill(0.0);
            for (d, &x) in qr.iter().enumerate() {
                let krow = &kt[d * TILE..(d + 1) * TILE];
                for (sv, &k) in s.iter_mut().zip(krow) {
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
            if tile_max == f32::NEG_INFINITY {
                continue;
            }
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
                tile_sum += f64::from(inferd_kernels::lanes::reduce_add_16(&lanes));
            }
            sum[i] = (f64::from(sum[i]) + tile_sum) as f32;
            for (tk, &p) in s.iter().enumerate().take(kv) {
                if p == 0.0 {
                    continue; // fma(v, 0, a) leaves a unchanged
                }
                for (a, &v) in acc.iter_mut().zip(&vt[tk * hd..(tk + 1) * hd]) {
                    *a = v.mul_add(p, *a);
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

/// Whether llama-server computes the attention of the prompt row at `pos` (of a prompt
/// of `prompt_len` tokens) with the tiled kernel: the row's micro-batch has at least
/// [`TILE`] rows (`neq1 >= Q_TILE_SZ` in `ggml_compute_forward_flash_attn_ext_f16`).
pub fn tiled_row(pos: usize, prompt_len: usize) -> bool {
    super::ubatch::batch_row(pos, prompt_len).len as usize >= TILE
}
