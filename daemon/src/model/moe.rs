//! Mixture-of-experts routing (Qwen3-MoE; transformers `Qwen3MoeSparseMoeBlock`,
//! llama.cpp `build_moe_ffn` with softmax gating): softmax over the router logits, the
//! top `k` experts per token, their weights renormalized to sum 1 when
//! `norm_topk_prob`. Experts then run once each over the tokens routed to them.

use super::spec::MoeSpec;

/// Tokens grouped by expert.
#[derive(Debug, PartialEq)]
pub struct Route {
    /// For expert `e`: `(token row, weight)` in ascending token order.
    pub per_expert: Vec<Vec<(usize, f32)>>,
}

/// Routes `n` tokens given router logits `(n, n_expert)` row-major.
pub fn route(logits: &[f32], n: usize, m: &MoeSpec) -> Route {
    let ne = m.n_expert;
    let mut per_expert = vec![Vec::new(); ne];
    let mut probs = vec![0f32; ne];
    let mut order: Vec<usize> = Vec::with_capacity(ne);
    for t in 0..n {
        let row = &logits[t * ne..(t + 1) * ne];
        let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let mut sum = 0f32;
        for (p, &l) in probs.iter_mut().zip(row) {
            *p = (l - max).exp();
            sum += *p;
        }
        probs.iter_mut().for_each(|p| *p /= sum);
        order.clear();
        order.extend(0..ne);
        // Largest first; equal probabilities keep the lower expert first (stable).
        order.sort_by(|&a, &b| probs[b].total_cmp(&probs[a]));
        let top = &order[..m.n_expert_used];
        let norm = if m.norm_topk_prob {
            top.iter().map(|&e| probs[e]).sum::<f32>()
        } else {
            1.0
        };
        for &e in top {
            per_expert[e].push((t, probs[e] / norm));
        }
    }
    Route { per_expert }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(norm: bool) -> MoeSpec {
        MoeSpec {
            n_expert: 4,
            n_expert_used: 2,
            n_ff_expert: 8,
            norm_topk_prob: norm,
            layers: vec![true],
        }
    }

    #[test]
    fn top_two_of_softmax_renormalized() {
        // Token 0: experts 2 and 0 lead; token 1: experts 3 and 1.
        let logits = [1.0, 0.0, 2.0, -1.0, 0.0, 1.5, 0.0, 3.0];
        let r = route(&logits, 2, &spec(true));
        let (e2, e0) = (2f32.exp(), 1f32.exp());
        let close = |got: &[(usize, f32)], want: f32| {
            got.len() == 1 && got[0].0 == 0 && (got[0].1 - want).abs() < 1e-6
        };
        assert!(close(&r.per_expert[2], e2 / (e2 + e0)), "{r:?}");
        assert!(close(&r.per_expert[0], e0 / (e2 + e0)), "{r:?}");
        assert!(r.per_expert[3][0].0 == 1 && r.per_expert[1][0].0 == 1);
        let s: f32 = [r.per_expert[3][0].1, r.per_expert[1][0].1].iter().sum();
        assert!((s - 1.0).abs() < 1e-6);
        // Without renormalization the weights are the softmax probabilities.
        let r = route(&logits, 2, &spec(false));
        let z: f32 = [1f32, 0.0, 2.0, -1.0].iter().map(|l| (l - 2.0).exp()).sum();
        assert!((r.per_expert[2][0].1 - 1.0 / z).abs() < 1e-6);
    }
}
