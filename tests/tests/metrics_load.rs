//! The Gateway API Inference Extension's model-server metrics under a known load:
//! N sequences running, M queued, K KV blocks owned, read from `/metrics` through
//! prometheus_client's parser (the protocol's TotalRunningRequests,
//! TotalQueuedRequests and KVCacheUtilization).

use serde_json::{json, Value};

use inferd_e2e::{run_python, Daemon};

/// Running slots (`scheduler.max_running`) and the requests queued behind them.
const RUNNING: usize = 2;
const QUEUED: usize = 3;
/// The test profile's KV pool: 728 blocks of 16 tokens.
const BLOCK_SIZE: usize = 16;
const TOTAL_BLOCKS: usize = 728;
/// Prompt length: two full blocks and one token, so a running sequence owns exactly
/// 3 blocks from its prefill until its 15th generated token.
const PROMPT: usize = 2 * BLOCK_SIZE + 1;

fn sample(m: &Value, key: &str) -> f64 {
    m["samples"][key].as_f64().unwrap_or(-1.0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn running_queued_and_kv_blocks_read_exactly_through_prometheus_client() {
    let env = [("INFERD__SCHEDULER__MAX_RUNNING", RUNNING.to_string())];
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let d = Daemon::start_with_env(&env).expect("daemon");
    let mut c = d.connect().await.expect("connect");
    // Token-id prompts, each its own (no block shared through the prefix cache). The
    // busy_loop fixture slows each step (a few ms of spinning per sequence) so that the
    // 14-token window in which each running sequence owns 3 blocks outlasts the scrape.
    for r in 0..RUNNING + QUEUED {
        let prompt: Vec<u32> = (0..PROMPT as u32)
            .map(|i| 1000 + 50 * r as u32 + i)
            .collect();
        c.send(&json!({
            "type": "generate", "id": format!("r{r}"), "prompt": prompt,
            "max_tokens": 400, "min_tokens": 400, "temperature": 0,
            "plugins": [{"name": "busy_loop", "config": {"iterations": 3_000_000}}],
        }))
        .await
        .expect("send");
    }
    // Both running sequences have their first token: each owns 3 blocks now.
    let mut first = std::collections::BTreeSet::new();
    while first.len() < RUNNING {
        let f = c.recv().await.expect("frame");
        match f["type"].as_str() {
            Some("started") => assert_eq!(f["prompt_tokens"], PROMPT, "{f}"),
            Some("delta") => {
                first.insert(f["id"].as_str().unwrap_or_default().to_string());
            }
            _ => panic!("unexpected frame before the first tokens: {f}"),
        }
    }
    let page = d.http("GET", "/metrics", &[], None).expect("metrics");
    assert_eq!(page.status, 200);
    let m = run_python("parse_metrics.py", &[], Some(&page.body)).expect("parses");
    assert_eq!(m["families"]["inferd_requests_running"], "gauge");
    assert_eq!(m["families"]["inferd_requests_waiting"], "gauge");
    assert_eq!(m["families"]["inferd_kv_cache_usage"], "gauge");
    assert_eq!(sample(&m, "inferd_requests_running"), RUNNING as f64, "{m}");
    assert_eq!(sample(&m, "inferd_requests_waiting"), QUEUED as f64, "{m}");
    let blocks = RUNNING * PROMPT.div_ceil(BLOCK_SIZE);
    assert_eq!(sample(&m, "inferd_kv_blocks_used"), blocks as f64, "{m}");
    assert_eq!(sample(&m, "inferd_kv_blocks_total"), TOTAL_BLOCKS as f64);
    assert_eq!(
        sample(&m, "inferd_kv_cache_usage"),
        blocks as f64 / TOTAL_BLOCKS as f64,
        "{m}"
    );
    assert_eq!(
        sample(
            &m,
            &format!(
                "inferd_cache_config_info{{block_size={BLOCK_SIZE},num_gpu_blocks={TOTAL_BLOCKS}}}"
            )
        ),
        1.0
    );
    // Cancel everything: the gauges fall back to zero.
    for r in 0..RUNNING + QUEUED {
        c.send(&json!({"type": "cancel", "id": format!("r{r}")}))
            .await
            .expect("cancel");
    }
    let mut ended = 0;
    while ended < RUNNING + QUEUED {
        let f = c.recv().await.expect("frame");
        if matches!(f["type"].as_str(), Some("done" | "error")) {
            ended += 1;
        }
    }
    let page = d.http("GET", "/metrics", &[], None).expect("metrics");
    let m = run_python("parse_metrics.py", &[], Some(&page.body)).expect("parses");
    for gauge in [
        "inferd_requests_running",
        "inferd_requests_waiting",
        "inferd_kv_blocks_used",
        "inferd_kv_cache_usage",
    ] {
        assert_eq!(sample(&m, gauge), 0.0, "{gauge}: {m}");
    }
}
