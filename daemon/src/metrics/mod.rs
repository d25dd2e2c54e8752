//! Prometheus metrics for `GET /metrics` (text exposition format 0.0.4, rendered by the
//! `prometheus` crate).
//!
//! Per-request figures are recorded at the edge, by [`crate::server`]'s request tracker,
//! from the events every request's stream carries (so WebSocket and HTTP requests count
//! the same way). Engine-wide figures (running and waiting sequences, KV blocks, prefill
//! work, prefix cache hits) are read from the scheduler's [`EngineStats`] at scrape time.
//!
//! Names follow Prometheus conventions (base units: seconds; `_total` for counters) and
//! mirror vLLM's where one exists (`vllm:time_to_first_token_seconds` →
//! `inferd_time_to_first_token_seconds`, ...).

mod engines;

use std::sync::{Arc, LazyLock};

use prometheus::{
    Gauge, GaugeVec, Histogram, HistogramOpts, IntCounter, IntCounterVec, IntGauge, IntGaugeVec,
    Opts, Registry, TextEncoder,
};

use crate::adapters::AdapterRegistry;
use crate::error::ErrorKind;
use crate::request::EngineStats;
use engines::EngineFamilies;

/// Histogram buckets for time to first token and end-to-end latency, seconds.
const LATENCY_BUCKETS: &[f64] = &[
    0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0,
];
/// Histogram buckets for inter-token latency, seconds.
const ITL_BUCKETS: &[f64] = &[
    0.001, 0.0025, 0.005, 0.01, 0.015, 0.02, 0.025, 0.03, 0.04, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3,
    0.5, 1.0, 2.5,
];

/// Every metric the daemon exports, registered in one [`Registry`].
pub struct Metrics {
    registry: Registry,
    /// Finished requests by `finish_reason` (`stop`, `length`, `cancelled`, or `error`).
    pub requests: IntCounterVec,
    /// Failed requests by error type (`validation`, `plugin_trap`, ...).
    pub request_errors: IntCounterVec,
    /// Prompt tokens of finished requests.
    pub prompt_tokens: IntCounter,
    /// Generated tokens of finished requests.
    pub generation_tokens: IntCounter,
    /// Time to first token, seconds (the engine's figure: acceptance to first sample).
    pub ttft: Histogram,
    /// Time between consecutive tokens of one request as streamed, seconds.
    pub itl: Histogram,
    /// Acceptance to the final event, seconds.
    pub e2e: Histogram,
    /// Requests that failed with `plugin_trap` (trap, deadline, limit, bad answer).
    pub plugin_traps: IntCounter,
    /// TCP connections refused at accept because `server.max_connections` were open.
    pub connections_refused: IntCounter,
    /// TCP connections open (HTTP, keep-alive and WebSocket), each holding one of the
    /// `server.max_connections` slots.
    pub connections_open: IntGauge,
    /// Connections closed because a request's headers did not arrive within
    /// `server.header_timeout_ms` (slowloris, or idle keep-alive).
    pub connection_header_timeouts: IntCounter,
    /// Prompt images the vision tower encoded.
    pub images_encoded: IntCounter,
    /// Vision-tower time per step that encoded images, seconds.
    pub image_encode: Histogram,
    running: IntGauge,
    waiting: IntGauge,
    kv_blocks_used: IntGauge,
    kv_blocks_total: IntGauge,
    kv_cache_usage: Gauge,
    cache_config: IntGaugeVec,
    prefix_prompt_tokens: IntCounter,
    prefix_hit_tokens: IntCounterVec,
    prefill_tokens: IntCounter,
    kv_events_published: IntCounter,
    kv_events_dropped: IntCounter,
    spec_drafts: IntCounter,
    spec_draft_tokens: IntCounter,
    spec_accepted_tokens: IntCounter,
    spec_acceptance_rate: Gauge,
    spec_tokens_per_verification: Gauge,
    allocator_allocated: IntGaugeVec,
    allocator_resident: IntGaugeVec,
    allocator_large: IntCounterVec,
    lora_requests: IntCounterVec,
    lora_info: GaugeVec,
    engines: EngineFamilies,
}

fn registered<C: prometheus::core::Collector + Clone + 'static>(r: &Registry, c: C) -> C {
    // Names are constants and distinct: registration cannot fail.
    r.register(Box::new(c.clone()))
        .expect("metric names are unique");
    c
}

impl Metrics {
    fn new() -> Result<Self, prometheus::Error> {
        let m = Self::define()?;
        // Every label value exists from the start, at zero, so that rates and alerts
        // work before the first occurrence.
        for reason in ["stop", "length", "cancelled", "error"] {
            m.requests.with_label_values(&[reason]);
        }
        for kind in [
            ErrorKind::Validation,
            ErrorKind::ContextLengthExceeded,
            ErrorKind::Overloaded,
            ErrorKind::PluginTrap,
            ErrorKind::Cancelled,
            ErrorKind::Internal,
            ErrorKind::ModelNotFound,
        ] {
            m.request_errors.with_label_values(&[kind.as_str()]);
        }
        for tier in ["memory", "disk"] {
            m.prefix_hit_tokens.with_label_values(&[tier]);
        }
        Ok(m)
    }

    fn define() -> Result<Self, prometheus::Error> {
        let r = Registry::new_custom(Some("inferd".into()), None)?;
        let hist = |name: &str, help: &str, buckets: &[f64]| {
            Histogram::with_opts(HistogramOpts::new(name, help).buckets(buckets.to_vec()))
        };
        Ok(Self {
            requests: registered(
                &r,
                IntCounterVec::new(
                    Opts::new("requests_total", "Finished requests by finish reason"),
                    &["finish_reason"],
                )?,
            ),
            request_errors: registered(
                &r,
                IntCounterVec::new(
                    Opts::new("request_errors_total", "Failed requests by error type"),
                    &["type"],
                )?,
            ),
            prompt_tokens: registered(
                &r,
                IntCounter::new("prompt_tokens_total", "Prompt tokens of finished requests")?,
            ),
            generation_tokens: registered(
                &r,
                IntCounter::new(
                    "generation_tokens_total",
                    "Generated tokens of finished requests",
                )?,
            ),
            ttft: registered(
                &r,
                hist(
                    "time_to_first_token_seconds",
                    "Time to first token",
                    LATENCY_BUCKETS,
                )?,
            ),
            itl: registered(
                &r,
                hist(
                    "inter_token_latency_seconds",
                    "Time between consecutive streamed tokens",
                    ITL_BUCKETS,
                )?,
            ),
            e2e: registered(
                &r,
                hist(
                    "e2e_request_latency_seconds",
                    "Request acceptance to its final event",
                    LATENCY_BUCKETS,
                )?,
            ),
            images_encoded: registered(
                &r,
                IntCounter::new(
                    "images_encoded_total",
                    "Prompt images the vision tower encoded",
                )?,
            ),
            image_encode: registered(
                &r,
                hist(
                    "image_encode_seconds",
                    "Vision-tower time of each step that encoded images",
                    LATENCY_BUCKETS,
                )?,
            ),
            plugin_traps: registered(
                &r,
                IntCounter::new(
                    "plugin_traps_total",
                    "Requests ended by a plugin trap, deadline or limit",
                )?,
            ),
            connections_refused: registered(
                &r,
                IntCounter::new(
                    "connections_refused_total",
                    "Connections refused at accept because server.max_connections were open",
                )?,
            ),
            connections_open: registered(
                &r,
                IntGauge::new(
                    "connections_open",
                    "TCP connections open (HTTP and WebSocket)",
                )?,
            ),
            connection_header_timeouts: registered(
                &r,
                IntCounter::new(
                    "connection_header_timeouts_total",
                    "Connections closed because request headers did not arrive within \
                     server.header_timeout_ms",
                )?,
            ),
            running: registered(
                &r,
                IntGauge::new("requests_running", "Sequences running (holding KV blocks)")?,
            ),
            waiting: registered(
                &r,
                IntGauge::new("requests_waiting", "Sequences waiting for admission")?,
            ),
            kv_blocks_used: registered(
                &r,
                IntGauge::new("kv_blocks_used", "KV cache blocks owned by sequences")?,
            ),
            kv_blocks_total: registered(
                &r,
                IntGauge::new("kv_blocks_total", "KV cache blocks in the pool")?,
            ),
            kv_cache_usage: registered(
                &r,
                Gauge::new(
                    "kv_cache_usage",
                    "Fraction of the KV cache blocks owned by sequences, 0 to 1 (the Gateway \
                     API Inference Extension's KVCacheUtilization; vLLM's kv_cache_usage_perc)",
                )?,
            ),
            cache_config: registered(
                &r,
                IntGaugeVec::new(
                    Opts::new(
                        "cache_config_info",
                        "The KV cache's geometry as labels (tokens per block, blocks in the \
                         pool; vLLM's cache_config_info label names); the value is 1",
                    ),
                    &["block_size", "num_gpu_blocks"],
                )?,
            ),
            prefix_prompt_tokens: registered(
                &r,
                IntCounter::new(
                    "prefix_cache_queried_tokens_total",
                    "Prompt tokens looked up in the prefix cache",
                )?,
            ),
            prefix_hit_tokens: registered(
                &r,
                IntCounterVec::new(
                    Opts::new(
                        "prefix_cache_hit_tokens_total",
                        "Prompt tokens served from the prefix cache, by tier",
                    ),
                    &["tier"],
                )?,
            ),
            kv_events_published: registered(
                &r,
                IntCounter::new(
                    "kv_events_published_total",
                    "KV-cache event messages sent on the ZeroMQ PUB socket ([kv_events])",
                )?,
            ),
            kv_events_dropped: registered(
                &r,
                IntCounter::new(
                    "kv_events_dropped_total",
                    "KV-cache event messages that left the replay buffer before they were sent",
                )?,
            ),
            prefill_tokens: registered(
                &r,
                IntCounter::new(
                    "prefill_tokens_total",
                    "Prompt positions run through the model (cached ones not counted)",
                )?,
            ),
            spec_drafts: registered(
                &r,
                IntCounter::new(
                    "spec_decode_num_drafts_total",
                    "Sequence steps that verified speculative drafts",
                )?,
            ),
            spec_draft_tokens: registered(
                &r,
                IntCounter::new(
                    "spec_decode_num_draft_tokens_total",
                    "Draft tokens verified by the model",
                )?,
            ),
            spec_accepted_tokens: registered(
                &r,
                IntCounter::new(
                    "spec_decode_num_accepted_tokens_total",
                    "Draft tokens accepted",
                )?,
            ),
            spec_acceptance_rate: registered(
                &r,
                Gauge::new(
                    "spec_decode_acceptance_rate",
                    "Accepted over verified draft tokens since start",
                )?,
            ),
            spec_tokens_per_verification: registered(
                &r,
                Gauge::new(
                    "spec_decode_tokens_per_verification",
                    "Tokens a verifying sequence step produced on average since start",
                )?,
            ),
            allocator_allocated: registered(
                &r,
                IntGaugeVec::new(
                    Opts::new(
                        "allocator_allocated_bytes",
                        "Bytes the daemon holds from its allocator (crate::allocator)",
                    ),
                    &["allocator"],
                )?,
            ),
            allocator_resident: registered(
                &r,
                IntGaugeVec::new(
                    Opts::new(
                        "allocator_resident_bytes",
                        "Bytes the allocator keeps in memory, in use or free",
                    ),
                    &["allocator"],
                )?,
            ),
            allocator_large: registered(
                &r,
                IntCounterVec::new(
                    Opts::new(
                        "allocator_large_mappings_total",
                        "Allocations of 128 KiB or more by what the allocator did: mapped \
                         fresh (faulting its pages in), reused from its cache, or unmapped \
                         (crate::allocator::large)",
                    ),
                    &["event"],
                )?,
            ),
            lora_requests: registered(
                &r,
                IntCounterVec::new(
                    Opts::new(
                        "lora_requests_total",
                        "Requests that named each LoRA adapter since start",
                    ),
                    &["adapter"],
                )?,
            ),
            lora_info: registered(
                &r,
                GaugeVec::new(
                    Opts::new(
                        "lora_requests_info",
                        "LoRA adapters of running and waiting requests (comma-separated \
                         labels, the Gateway API Inference Extension's LoRA metric); the \
                         value is the Unix time of this update",
                    ),
                    &["max_lora", "running_lora_adapters", "waiting_lora_adapters"],
                )?,
            ),
            engines: EngineFamilies::define(&r)?,
            registry: r,
        })
    }

    /// The text exposition of every metric, after copying the engine-wide figures
    /// from `stats` (`None` while the model loads: they stay at zero).
    pub fn render(&self, stats: Option<&EngineStats>, adapters: &[Arc<AdapterRegistry>]) -> String {
        if let (Some(st), Some(reg)) = (stats, adapters.first()) {
            let mut by_name = std::collections::BTreeMap::<String, u64>::new();
            for (name, total) in adapters.iter().flat_map(|r| r.requests_by_name()) {
                *by_name.entry(name).or_default() += total;
            }
            for (name, total) in by_name {
                follow(
                    &self.lora_requests.with_label_values(&[name.as_str()]),
                    total,
                );
            }
            // One series: its labels change with the adapters in use.
            self.lora_info.reset();
            let now = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0.0, |d| d.as_secs_f64());
            self.lora_info
                .with_label_values(&[
                    reg.max_loras().to_string().as_str(),
                    st.lora.running.join(",").as_str(),
                    st.lora.waiting.join(",").as_str(),
                ])
                .set(now);
        }
        if let Some(st) = stats {
            let gauge = |g: &IntGauge, v: usize| g.set(i64::try_from(v).unwrap_or(i64::MAX));
            gauge(&self.running, st.running);
            gauge(&self.waiting, st.waiting);
            gauge(&self.kv_blocks_used, st.kv_blocks_used);
            gauge(&self.kv_blocks_total, st.kv_blocks_total);
            self.kv_cache_usage.set(if st.kv_blocks_total == 0 {
                0.0
            } else {
                st.kv_blocks_used as f64 / st.kv_blocks_total as f64
            });
            // One series: the pool's geometry is fixed for the process.
            self.cache_config.reset();
            self.cache_config
                .with_label_values(&[
                    st.kv_block_size.to_string().as_str(),
                    st.kv_blocks_total.to_string().as_str(),
                ])
                .set(1);
            // The engine's counters only grow: move ours up to them.
            follow(&self.prefill_tokens, st.prompt_tokens_computed);
            follow(&self.kv_events_published, st.kv_events.published);
            follow(&self.kv_events_dropped, st.kv_events.dropped);
            let p = &st.prefix_cache;
            follow(&self.prefix_prompt_tokens, p.prompt_tokens);
            follow(
                &self.prefix_hit_tokens.with_label_values(&["memory"]),
                p.memory_hit_tokens,
            );
            follow(
                &self.prefix_hit_tokens.with_label_values(&["disk"]),
                p.disk_hit_tokens,
            );
            let sp = &st.speculative;
            follow(&self.spec_drafts, sp.verification_steps);
            follow(&self.spec_draft_tokens, sp.draft_tokens);
            follow(&self.spec_accepted_tokens, sp.accepted_tokens);
            self.spec_acceptance_rate.set(sp.acceptance_rate);
            self.spec_tokens_per_verification
                .set(sp.tokens_per_verification);
            self.engines.follow(&st.engines);
        }
        if let Some(a) = crate::allocator::stats() {
            let set = |g: &IntGaugeVec, v: u64| {
                g.with_label_values(&[a.allocator])
                    .set(i64::try_from(v).unwrap_or(i64::MAX));
            };
            set(&self.allocator_allocated, a.allocated);
            set(&self.allocator_resident, a.resident);
        }
        #[cfg(all(not(feature = "jemalloc"), target_os = "linux"))]
        {
            let l = crate::allocator::large::stats();
            for (event, v) in [
                ("mapped", l.mapped),
                ("reused", l.reused),
                ("unmapped", l.unmapped),
            ] {
                follow(&self.allocator_large.with_label_values(&[event]), v as u64);
            }
        }
        TextEncoder::new()
            .encode_to_string(&self.registry.gather())
            .unwrap_or_else(|e| format!("# metrics encoding failed: {e}\n"))
    }
}

/// Moves counter `c` up to `total`, a figure kept elsewhere that only grows (a
/// smaller `total` leaves `c` as it is: Prometheus counters never go down).
pub(super) fn follow(c: &IntCounter, total: u64) {
    c.inc_by(total.saturating_sub(c.get()));
}

static METRICS: LazyLock<Metrics> =
    LazyLock::new(|| Metrics::new().expect("metric definitions are valid"));

/// The model runner encoded `images` prompt images in `time`.
pub fn record_images_encoded(images: usize, time: std::time::Duration) {
    let m = metrics();
    m.images_encoded.inc_by(images as u64);
    m.image_encode.observe(time.as_secs_f64());
}

/// The daemon's metrics.
pub fn metrics() -> &'static Metrics {
    &METRICS
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn render_names_every_family_and_follows_engine_counters() {
        let m = Metrics::new().expect("metrics");
        m.requests.with_label_values(&["stop"]).inc();
        m.ttft.observe(0.2);
        m.connections_refused.inc_by(5);
        m.connections_open.set(2);
        let mut st = EngineStats {
            running: 3,
            waiting: 2,
            kv_blocks_used: 7,
            kv_blocks_total: 728,
            kv_block_size: 16,
            prompt_tokens_computed: 40,
            ..EngineStats::default()
        };
        st.prefix_cache.prompt_tokens = 100;
        st.prefix_cache.memory_hit_tokens = 64;
        st.speculative.add(4, 3);
        st.speculative.add(2, 0);
        st.speculative = st.speculative.with_ratios();
        st.engines = vec![
            crate::request::EngineShare {
                running: 1,
                kv_blocks_used: 3,
                kv_blocks_total: 364,
                placed: 9,
                ..Default::default()
            },
            crate::request::EngineShare {
                running: 2,
                waiting: 2,
                kv_blocks_used: 4,
                kv_blocks_total: 364,
                placed: 11,
                prefix_hit_tokens: 64,
            },
        ];
        let text = m.render(Some(&st), &[]);
        for line in [
            "inferd_requests_total{finish_reason=\"stop\"} 1",
            "inferd_time_to_first_token_seconds_bucket{le=\"0.25\"} 1",
            "inferd_requests_running 3",
            "inferd_connections_refused_total 5",
            "inferd_connections_open 2",
            "inferd_connection_header_timeouts_total 0",
            "inferd_requests_waiting 2",
            "inferd_kv_blocks_used 7",
            "inferd_kv_blocks_total 728",
            "inferd_kv_cache_usage 0.009615384615384616",
            "inferd_cache_config_info{block_size=\"16\",num_gpu_blocks=\"728\"} 1",
            "inferd_prefix_cache_queried_tokens_total 100",
            "inferd_prefix_cache_hit_tokens_total{tier=\"memory\"} 64",
            "inferd_prefill_tokens_total 40",
            "inferd_spec_decode_num_drafts_total 2",
            "inferd_spec_decode_num_draft_tokens_total 6",
            "inferd_spec_decode_num_accepted_tokens_total 3",
            "inferd_spec_decode_acceptance_rate 0.5",
            "inferd_spec_decode_tokens_per_verification 2.5",
            "inferd_engine_requests_running{engine=\"0\"} 1",
            "inferd_engine_requests_running{engine=\"1\"} 2",
            "inferd_engine_requests_waiting{engine=\"1\"} 2",
            "inferd_engine_kv_blocks_total{engine=\"0\"} 364",
            "inferd_engine_kv_cache_usage{engine=\"1\"} 0.01098901098901099",
            "inferd_engine_requests_placed_total{engine=\"1\"} 11",
            "inferd_engine_prefix_cache_hit_tokens_total{engine=\"1\"} 64",
        ] {
            assert!(text.lines().any(|l| l == line), "no {line:?} in\n{text}");
        }
        if crate::allocator::stats().is_some() {
            let name = if cfg!(feature = "jemalloc") {
                "jemalloc"
            } else {
                "glibc"
            };
            for family in ["allocated", "resident"] {
                let want = format!("inferd_allocator_{family}_bytes{{allocator=\"{name}\"}} ");
                assert!(
                    text.lines().any(|l| l.starts_with(&want)),
                    "no {want:?} in\n{text}"
                );
            }
        }
        if cfg!(all(not(feature = "jemalloc"), target_os = "linux")) {
            for event in ["mapped", "reused", "unmapped"] {
                let want = format!("inferd_allocator_large_mappings_total{{event=\"{event}\"}} ");
                assert!(
                    text.lines().any(|l| l.starts_with(&want)),
                    "no {want:?} in\n{text}"
                );
            }
        }
        st.prefix_cache.memory_hit_tokens = 80;
        let text = m.render(Some(&st), &[]);
        assert!(text
            .lines()
            .any(|l| l == "inferd_prefix_cache_hit_tokens_total{tier=\"memory\"} 80"));
    }
}
