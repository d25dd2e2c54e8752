//! transformers' eager attention for an f32 KV cache (Hugging Face weights in f32).

use super::HeadRows;

/// [`super::flash::attend_head`] for an f32 cache with transformers' eager arithmetic
/// (`modeling_llama.eager_attention_forward`): `s_j = (q · k_j) · scale` summed in f32,
/// `w = softmax(s)` with the maximum subtracted, `y = Σ_j w_j v_j`; nothing rounded to
/// f16, so F32 checkpoints match transformers' logits within f32 noise.
pub fn attend_head(kc: &[f32], vc: &[f32], item: &HeadRows<'_>) -> Vec<f32> {
    let (hd, shape) = (item.shape.head_dim, item.shape);
    let first = item.rows.start;
    let mut out = vec![0f32; item.rows.len() * hd];
    let max_keys = item.max_keys();
    let offs = item.offs;
    let mut w = vec![0f32; max_keys];
    for r in item.rows.clone() {
        let keys = item.keys(r);
        let (lo, n_keys) = (keys.start, keys.end);
        let qr = item.q_row(r);
        let mut max = f32::NEG_INFINITY;
        for j in lo..n_keys {
            let k = &kc[offs[j]..offs[j] + hd];
            let s = qr.iter().zip(k).map(|(a, b)| a * b).sum::<f32>() * shape.scale;
            w[j] = s;
            max = max.max(s);
        }
        let mut sum = 0f32;
        for x in &mut w[lo..n_keys] {
            *x = (*x - max).exp();
            sum += *x;
        }
        let acc = &mut out[(r - first) * hd..(r - first + 1) * hd];
        for j in lo..n_keys {
            let p = w[j] / sum;
            for (a, &v) in acc.iter_mut().zip(&vc[offs[j]..offs[j] + hd]) {
                *a += p * v;
            }
        }
    }
    out
}
