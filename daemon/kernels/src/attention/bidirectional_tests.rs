//! Bidirectional ranges (Gemma 3's image tokens) against a direct softmax over the
//! keys each row may see.

use half::f16;

use super::{attend, test_values, AttnShape, KvLayer, SeqRows};

/// `softmax(q·k · scale) · v` over `keys` for one head, in f64.
fn direct(
    q: &[f32],
    k: &[f32],
    v: &[f32],
    hd: usize,
    keys: std::ops::Range<usize>,
    scale: f32,
) -> Vec<f32> {
    let s: Vec<f64> = keys
        .clone()
        .map(|j| {
            (0..hd)
                .map(|d| f64::from(q[d]) * f64::from(k[j * hd + d]))
                .sum::<f64>()
                * f64::from(scale)
        })
        .collect();
    let m = s.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    let e: Vec<f64> = s.iter().map(|x| (x - m).exp()).collect();
    let sum: f64 = e.iter().sum();
    (0..hd)
        .map(|d| {
            keys.clone()
                .zip(&e)
                .map(|(j, w)| w / sum * f64::from(v[j * hd + d]))
                .sum::<f64>() as f32
        })
        .collect()
}

#[test]
fn rows_in_a_bidirectional_range_see_its_later_keys_and_no_others() {
    let (hd, n, bs) = (8, 12, 4);
    let ranges = vec![3..5, 5..7];
    for window in [None, Some(3)] {
        let shape = AttnShape {
            n_head: 2,
            n_kv_head: 1,
            head_dim: hd,
            scale: 0.3,
            window,
        };
        // One KV head, blocks 0, 1, 2 in order: position j at offset j · hd.
        let k = test_values(n * hd, 5);
        let v = test_values(n * hd, 6);
        let q = test_values(n * 2 * hd, 7);
        let table = [0u32, 1, 2];
        let seq = SeqRows {
            rows: n,
            start_pos: 0,
            block_table: &table,
            prompt_len: n,
            bidirectional: &ranges,
        };
        let (k16, v16): (Vec<f16>, Vec<f16>) = (
            k.iter().map(|&x| f16::from_f32(x)).collect(),
            v.iter().map(|&x| f16::from_f32(x)).collect(),
        );
        let (kr, vr): (Vec<f32>, Vec<f32>) = (
            k16.iter().map(|x| x.to_f32()).collect(),
            v16.iter().map(|x| x.to_f32()).collect(),
        );
        let exact = attend(KvLayer::F32(&k, &v), bs, &[seq], &q, shape, false);
        let flash = attend(KvLayer::F16(&k16, &v16), bs, &[seq], &q, shape, false);
        for pos in 0..n {
            let end = if (3..5).contains(&pos) {
                5
            } else if (5..7).contains(&pos) {
                7
            } else {
                pos + 1
            };
            let lo = window.map_or(0, |w| (pos + 1).saturating_sub(w));
            for h in 0..2 {
                let qr = &q[(pos * 2 + h) * hd..(pos * 2 + h + 1) * hd];
                let at = (pos * 2 + h) * hd;
                let want = direct(qr, &k, &v, hd, lo..end, 0.3);
                let want16 = direct(qr, &kr, &vr, hd, lo..end, 0.3);
                for d in 0..hd {
                    assert!(
                        (exact[at + d] - want[d]).abs() < 1e-5,
                        "f32 row {pos} head {h} ({window:?}): {} vs {}",
                        exact[at + d],
                        want[d]
                    );
                    assert!(
                        (flash[at + d] - want16[d]).abs() < 2e-3,
                        "f16 row {pos} head {h} ({window:?}): {} vs {}",
                        flash[at + d],
                        want16[d]
                    );
                }
            }
        }
    }
}
