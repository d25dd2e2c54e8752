//! `inferd-soak`: runs the soak scenario (`inferd_e2e::soak`) against the built daemon
//! and the default model, prints a table, writes `soak.json` and `soak-rss.svg`, and
//! exits 1 when a check fails.
//!
//! ```text
//! cargo build --release -p inferd -p inferd-e2e --bins
//! target/release/inferd-soak --connections 64 --minutes 30 --out target/soak
//! ```

use std::path::PathBuf;
use std::time::Duration;

use anyhow::Result;
use clap::Parser;
use inferd_e2e::soak::{self, Options};

/// Soak the daemon: a realistic mix of traffic for a while, then check that it is idle,
/// owns no KV blocks, holds no extra file descriptors or threads, and that its resident
/// memory stayed flat after warm-up.
///
/// Starts `inferd` from beside this binary (or $INFERD_BINARY) on the default model
/// (models/, `scripts/fetch-model.sh`) with the source tree's configs/inferd.toml and a
/// fresh prefix store. Exits 1 when a check fails: an action failed (unexpected frame,
/// status or a 180 s wait), the engine is not idle or owns KV blocks at the end, fds or
/// threads with no client connected end more than 2 above their level before the
/// workload, or the RSS floor (the lowest sample of each --floor-bucket-min) after
/// warm-up rises faster than --max-rss-slope (at least two floor points are needed: run a
/// few minutes). Outcomes in the table: finished (length/stop), cancelled, dropped (the
/// client disconnected mid-stream), bad_frames_answered, tokenized, http_streams (SSE to
/// [DONE]), cached_tokens (prompt tokens served by the prefix cache), failures.
/// docs/performance.md, section Soak, has the figures.
#[derive(Parser)]
struct Args {
    /// Concurrent client connections.
    #[arg(long, default_value_t = 64)]
    connections: usize,
    /// Minutes of traffic.
    #[arg(long, default_value_t = 30.0)]
    minutes: f64,
    /// Seconds between samples.
    #[arg(long, default_value_t = 10.0)]
    sample_s: f64,
    /// Share of the run counted as warm-up (the RSS slope is fitted over the rest).
    #[arg(long, default_value_t = 0.2)]
    warmup_fraction: f64,
    /// Width of the stretches whose lowest RSS sample makes the floor, minutes.
    #[arg(long, default_value_t = 1.0)]
    floor_bucket_min: f64,
    /// Largest accepted growth, MB, of the allocator's allocated bytes between the idle
    /// readings before and after the workload (unset: not checked).
    #[arg(long)]
    max_idle_allocated_growth: Option<f64>,
    /// Largest accepted slope of the RSS floor after warm-up, MB per minute.
    #[arg(long, default_value_t = 0.05)]
    max_rss_slope: f64,
    /// Turn the prefix store (the disk tier of the prefix cache) off.
    #[arg(long)]
    no_prefix_store: bool,
    /// Config file (default: configs/inferd.toml, the shipped defaults).
    #[arg(long)]
    config: Option<PathBuf>,
    /// Extra settings as KEY=VALUE environment variables (`INFERD__SCHEDULER__MAX_RUNNING=8`).
    #[arg(long = "env", value_parser = parse_env)]
    env: Vec<(String, String)>,
    /// Seed of the traffic mix.
    #[arg(long, default_value_t = 21)]
    seed: u64,
    /// Where soak.json and soak-rss.svg go.
    #[arg(long, default_value = "target/soak")]
    out: PathBuf,
}

fn parse_env(s: &str) -> Result<(String, String), String> {
    s.split_once('=')
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .ok_or_else(|| format!("expected KEY=VALUE, got {s:?}"))
}

#[tokio::main]
async fn main() -> Result<()> {
    let a = Args::parse();
    let opts = Options {
        connections: a.connections,
        duration: Duration::from_secs_f64(a.minutes * 60.0),
        sample_s: a.sample_s,
        warmup_fraction: a.warmup_fraction,
        floor_bucket_min: a.floor_bucket_min,
        max_idle_allocated_growth_mb: a.max_idle_allocated_growth,
        max_rss_slope_mb_per_min: a.max_rss_slope,
        prefix_store: !a.no_prefix_store,
        config: a
            .config
            .unwrap_or_else(|| inferd_e2e::workspace_root().join("configs/inferd.toml")),
        env: a.env,
        seed: a.seed,
    };
    let report = soak::run(&opts).await?;
    let (json, svg) = report.write(&a.out)?;
    println!("{}", report.table());
    println!("wrote {} and {}", json.display(), svg.display());
    let problems = report.problems();
    for p in &problems {
        eprintln!("FAIL: {p}");
    }
    if !problems.is_empty() {
        std::process::exit(1);
    }
    Ok(())
}
