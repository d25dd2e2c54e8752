//! The one-minute soak (issue 21) in the test command: 16 connections of mixed traffic
//! (WebSocket and HTTP/SSE, greedy and sampled, plugins, cancels, disconnects, malformed
//! frames, tokenize, prefix-cache hits from memory and disk, long prompts) against the
//! default config with the prefix store on. The 30-minute runs (`inferd-soak`) and their
//! figures are in docs/performance.md, section "Soak".

use std::time::Duration;

use inferd_e2e::soak::{self, Options};

/// What the daemon may keep from one minute of traffic, MB of allocated bytes between
/// the idle readings before and after it: caches that fill once (sled's 8 MiB cache, the
/// tokenizer's, the prefix store's maps of some 700 blocks) fit in it; a leak of 0.5 MB
/// per request, at the 70 or so requests of a run on two cores, does not. (Measured:
/// 211.3 -> 213.1 MB.)
const IDLE_ALLOCATED_GROWTH_BOUND_MB: f64 = 32.0;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_minute_soak_leaves_the_daemon_idle_with_flat_resources() {
    let opts = Options {
        connections: 16,
        duration: Duration::from_secs(60),
        sample_s: 2.0,
        // A KV pool of 64 MiB (180 blocks instead of the default 728): every block has
        // been written (its pages made resident) within the first seconds, so what the
        // fit sees after warm-up is not the pool filling in; it also makes the memory
        // tier evict, so cold documents come back from the disk tier.
        warmup_fraction: 0.3,
        floor_bucket_min: 0.1,
        // One minute is all warm-up (queues, caches, the allocator's arenas) with RSS
        // swinging by tens of MB with the work in flight: its slope is reported, not
        // checked (the 30-minute runs check it); the allocated bytes between two idle
        // readings are, instead.
        max_idle_allocated_growth_mb: Some(IDLE_ALLOCATED_GROWTH_BOUND_MB),
        max_rss_slope_mb_per_min: f64::INFINITY,
        prefix_store: true,
        config: inferd_e2e::workspace_root().join("configs/inferd.toml"),
        env: vec![(
            "INFERD__SCHEDULER__KV_CACHE_BYTES".into(),
            (64u64 << 20).to_string(),
        )],
        seed: 21,
    };
    let report = soak::run(&opts).await.expect("soak run");
    let out = inferd_e2e::workspace_root().join("target/soak-test");
    report.write(&out).expect("write report");
    println!("{}", report.table());
    let o = &report.outcomes;
    // Every kind of traffic happened.
    for k in [
        "finished",
        "cancelled",
        "dropped",
        "bad_frames_answered",
        "tokenized",
        "http_streams",
    ] {
        assert!(o[k].as_u64().unwrap_or(0) > 0, "no {k} in {o}");
    }
    assert!(
        o["cached_tokens"].as_u64().unwrap_or(0) > 0,
        "no prefix cache hits: {o}"
    );
    let pc = &report.final_stats["prefix_cache"];
    assert!(pc["disk_written_blocks"].as_u64().unwrap_or(0) > 0, "{pc}");
    assert!(
        pc["disk_hit_tokens"].as_u64().unwrap_or(0) > 0,
        "no prefix cache hits from disk: {pc}"
    );
    assert!(
        report.samples.len() >= 25,
        "{} samples",
        report.samples.len()
    );
    let problems = report.problems();
    assert!(problems.is_empty(), "{problems:#?}");
}
