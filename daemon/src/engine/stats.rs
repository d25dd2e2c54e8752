//! The daemon's counters from its engines' own (`[[engines]]`): sums, ratios taken
//! again from the sums, and each engine's share in `engines`.

use crate::request::{EngineShare, EngineStats};

/// `each` (one per engine, in order; `placed[i]`: requests placed on engine `i`) added up; the geometry
/// (`kv_block_size`) and the speculative settings are the first engine's (every
/// engine has the same). With one engine the figures are its own.
pub fn merged(each: &[EngineStats], placed: &[u64]) -> EngineStats {
    let mut total = EngineStats::default();
    for (i, st) in each.iter().enumerate() {
        total.running += st.running;
        total.waiting += st.waiting;
        total.preempted += st.preempted;
        total.preemptions_total += st.preemptions_total;
        total.kv_blocks_used += st.kv_blocks_used;
        total.kv_blocks_total += st.kv_blocks_total;
        total.tokens_generated += st.tokens_generated;
        total.steps += st.steps;
        total.prompt_tokens_computed += st.prompt_tokens_computed;
        let (p, q) = (&mut total.prefix_cache, &st.prefix_cache);
        if i == 0 {
            total.kv_block_size = st.kv_block_size;
            (p.enabled, p.disk_enabled) = (q.enabled, q.disk_enabled);
            let s = &st.speculative;
            total.speculative.method = s.method;
            total.speculative.k = s.k;
            total.speculative.row_cost = s.row_cost;
            total.speculative.draft_cost = s.draft_cost;
        }
        p.prompt_tokens += q.prompt_tokens;
        p.hit_tokens += q.hit_tokens;
        p.memory_hit_tokens += q.memory_hit_tokens;
        p.disk_hit_tokens += q.disk_hit_tokens;
        p.memory_blocks += q.memory_blocks;
        p.memory_evictable_blocks += q.memory_evictable_blocks;
        p.disk_blocks += q.disk_blocks;
        p.disk_bytes += q.disk_bytes;
        p.disk_written_blocks += q.disk_written_blocks;
        p.disk_evicted_blocks += q.disk_evicted_blocks;
        p.disk_dropped_corrupt += q.disk_dropped_corrupt;
        p.disk_dropped_writes += q.disk_dropped_writes;
        p.disk_unreachable_writes += q.disk_unreachable_writes;
        let sp = &mut total.speculative;
        sp.draft_tokens += st.speculative.draft_tokens;
        sp.accepted_tokens += st.speculative.accepted_tokens;
        sp.verification_steps += st.speculative.verification_steps;
        total.lora.running.extend(st.lora.running.iter().cloned());
        total.lora.waiting.extend(st.lora.waiting.iter().cloned());
        total.kv_events.published += st.kv_events.published;
        total.kv_events.dropped += st.kv_events.dropped;
        total.engines.push(EngineShare {
            running: st.running,
            waiting: st.waiting,
            kv_blocks_used: st.kv_blocks_used,
            kv_blocks_total: st.kv_blocks_total,
            placed: placed.get(i).copied().unwrap_or(0),
            prefix_hit_tokens: q.hit_tokens,
        });
    }
    let p = &mut total.prefix_cache;
    p.hit_rate = if p.prompt_tokens == 0 {
        0.0
    } else {
        p.hit_tokens as f64 / p.prompt_tokens as f64
    };
    total.speculative = std::mem::take(&mut total.speculative).with_ratios();
    for names in [&mut total.lora.running, &mut total.lora.waiting] {
        names.sort();
        names.dedup();
    }
    total
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn engines_add_up_and_keep_their_shares() {
        let mut a = EngineStats {
            running: 1,
            waiting: 2,
            kv_blocks_used: 5,
            kv_blocks_total: 100,
            kv_block_size: 16,
            steps: 10,
            ..EngineStats::default()
        };
        a.prefix_cache.enabled = true;
        a.prefix_cache.prompt_tokens = 100;
        a.prefix_cache.hit_tokens = 50;
        a.speculative.method = "ngram";
        a.speculative.add(4, 4);
        a.lora.running = vec!["x".into(), "y".into()];
        let mut b = EngineStats {
            running: 3,
            kv_blocks_used: 7,
            kv_blocks_total: 100,
            kv_block_size: 16,
            steps: 5,
            ..EngineStats::default()
        };
        b.prefix_cache.prompt_tokens = 300;
        b.prefix_cache.hit_tokens = 0;
        b.speculative.add(4, 0);
        b.lora.running = vec!["x".into()];
        let t = merged(&[a, b], &[4, 6]);
        assert_eq!((t.running, t.waiting, t.steps), (4, 2, 15));
        assert_eq!(
            (t.kv_blocks_used, t.kv_blocks_total, t.kv_block_size),
            (12, 200, 16)
        );
        assert!(t.prefix_cache.enabled);
        assert_eq!(t.prefix_cache.hit_rate, 0.125);
        assert_eq!(t.speculative.method, "ngram");
        assert_eq!(t.speculative.acceptance_rate, 0.5);
        assert_eq!(t.lora.running, ["x", "y"]);
        assert_eq!(t.engines.len(), 2);
        assert_eq!(
            t.engines[1],
            EngineShare {
                running: 3,
                waiting: 0,
                kv_blocks_used: 7,
                kv_blocks_total: 100,
                placed: 6,
                prefix_hit_tokens: 0,
            }
        );
        assert_eq!(t.engines[0].prefix_hit_tokens, 50);
    }
}
