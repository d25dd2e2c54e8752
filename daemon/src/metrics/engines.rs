//! Each engine's own figures (`[[engines]]`), labelled `engine="N"` as vLLM labels its
//! data-parallel engines (`engine` = the engine's index). The unlabelled families
//! beside them are the daemon's totals, what a router reads for the pod.

use prometheus::{GaugeVec, IntCounterVec, IntGaugeVec, Opts, Registry};

use super::registered;
use crate::request::EngineShare;

/// The per-engine families.
pub(super) struct EngineFamilies {
    running: IntGaugeVec,
    waiting: IntGaugeVec,
    kv_blocks_used: IntGaugeVec,
    kv_blocks_total: IntGaugeVec,
    kv_cache_usage: GaugeVec,
    placed: IntCounterVec,
    prefix_hit_tokens: IntCounterVec,
}

impl EngineFamilies {
    pub(super) fn define(r: &Registry) -> Result<Self, prometheus::Error> {
        let gauge = |name: &str, help: &str| -> Result<IntGaugeVec, prometheus::Error> {
            Ok(registered(
                r,
                IntGaugeVec::new(Opts::new(name, help), &["engine"])?,
            ))
        };
        let counter = |name: &str, help: &str| -> Result<IntCounterVec, prometheus::Error> {
            Ok(registered(
                r,
                IntCounterVec::new(Opts::new(name, help), &["engine"])?,
            ))
        };
        Ok(Self {
            running: gauge("engine_requests_running", "Sequences running on the engine")?,
            waiting: gauge("engine_requests_waiting", "Sequences waiting on the engine")?,
            kv_blocks_used: gauge(
                "engine_kv_blocks_used",
                "The engine's KV cache blocks owned by sequences",
            )?,
            kv_blocks_total: gauge("engine_kv_blocks_total", "The engine's KV pool blocks")?,
            kv_cache_usage: registered(
                r,
                GaugeVec::new(
                    Opts::new(
                        "engine_kv_cache_usage",
                        "Fraction of the engine's KV cache blocks owned by sequences, 0 to 1",
                    ),
                    &["engine"],
                )?,
            ),
            placed: counter(
                "engine_requests_placed_total",
                "Requests placed on the engine since start (by prefix score and load)",
            )?,
            prefix_hit_tokens: counter(
                "engine_prefix_cache_hit_tokens_total",
                "Prompt tokens the engine served from its prefix cache since start",
            )?,
        })
    }

    /// Copies each engine's share (`engines[i]` is engine `i`).
    pub(super) fn follow(&self, engines: &[EngineShare]) {
        let set = |g: &IntGaugeVec, e: &str, v: usize| {
            g.with_label_values(&[e])
                .set(i64::try_from(v).unwrap_or(i64::MAX));
        };
        let up = |c: &IntCounterVec, e: &str, v: u64| super::follow(&c.with_label_values(&[e]), v);
        for (i, s) in engines.iter().enumerate() {
            let e = i.to_string();
            set(&self.running, &e, s.running);
            set(&self.waiting, &e, s.waiting);
            set(&self.kv_blocks_used, &e, s.kv_blocks_used);
            set(&self.kv_blocks_total, &e, s.kv_blocks_total);
            self.kv_cache_usage
                .with_label_values(&[e.as_str()])
                .set(if s.kv_blocks_total == 0 {
                    0.0
                } else {
                    s.kv_blocks_used as f64 / s.kv_blocks_total as f64
                });
            up(&self.placed, &e, s.placed);
            up(&self.prefix_hit_tokens, &e, s.prefix_hit_tokens);
        }
    }
}
