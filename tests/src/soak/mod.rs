//! The soak scenario (issue 21): the real daemon under a realistic mix of traffic on
//! `connections` connections for `minutes`, sampled every `sample_s` seconds, then
//! checked for what a months-long service must not do — leave requests running or KV
//! blocks owned, keep file descriptors or threads it no longer needs, or grow its
//! resident memory after warm-up.
//!
//! Run by `inferd-soak` (`tests/src/bin/inferd-soak.rs`, the long runs whose figures go in
//! docs/performance.md) and by `tests/tests/soak.rs` (one minute, in the test command).

pub mod plot;
pub mod probe;
pub mod workload;

use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use serde::Serialize;
use serde_json::{json, Value};

use crate::{Client, Daemon};
use probe::Sample;
use workload::Workload;

/// What to run and how to judge it.
#[derive(Debug, Clone)]
pub struct Options {
    /// Concurrent client connections (each runs one action at a time).
    pub connections: usize,
    /// Length of the workload.
    pub duration: Duration,
    /// Seconds between samples.
    pub sample_s: f64,
    /// Share of the run counted as warm-up: the RSS slope is fitted over the rest.
    pub warmup_fraction: f64,
    /// Width of the stretches whose lowest RSS sample makes the floor, minutes.
    pub floor_bucket_min: f64,
    /// Largest accepted growth of the allocated bytes between the idle readings before
    /// and after the workload, MB (`None`: not checked).
    pub max_idle_allocated_growth_mb: Option<f64>,
    /// Largest accepted slope of the RSS floor after warm-up, MB per minute.
    pub max_rss_slope_mb_per_min: f64,
    /// Whether the prefix store (the disk tier) is on.
    pub prefix_store: bool,
    /// The config file (`configs/inferd.toml`, the defaults, unless given).
    pub config: PathBuf,
    /// Extra `INFERD__...` settings.
    pub env: Vec<(String, String)>,
    /// Seed of the traffic mix.
    pub seed: u64,
}

/// Everything a run measured (written as JSON).
#[derive(Debug, Serialize)]
pub struct Report {
    /// The options, as given.
    pub connections: usize,
    /// Minutes of workload.
    pub minutes: f64,
    /// Seconds between samples.
    pub sample_s: f64,
    /// Minutes counted as warm-up.
    pub warmup_min: f64,
    /// Whether the disk tier was on.
    pub prefix_store: bool,
    /// RSS slope over the samples after warm-up, MB per minute (least squares).
    pub rss_slope_mb_per_min: f64,
    /// Standard error of `rss_slope_mb_per_min` (`None` for fewer than three samples).
    pub rss_slope_se_mb_per_min: Option<f64>,
    /// Points the floor slope was fitted to (at least two are needed for a check).
    pub floor_points: usize,
    /// Slope of the RSS floor after warm-up (the lowest sample of each
    /// `floor_bucket_min`), MB per
    /// minute: the figure checked against the bound. RSS swings by tens of MB with the
    /// work in flight (prefill activations of long prompts, decoded frames queued), so
    /// the slope over every sample is known only to about ±0.3 MB/min over 24 minutes;
    /// the floor follows what stays resident between those swings.
    pub rss_floor_slope_mb_per_min: f64,
    /// Its intercept, MB (for the plot).
    pub rss_intercept_mb: f64,
    /// Slope of the allocator's allocated bytes over the same window, MB per minute
    /// (`None` without allocator statistics): RSS growing with this flat is memory the
    /// allocator keeps, not a leak.
    pub allocated_slope_mb_per_min: Option<f64>,
    /// The bound of the idle allocated growth, MB.
    pub max_idle_allocated_growth_mb: Option<f64>,
    /// The bound it was checked against.
    pub max_rss_slope_mb_per_min: f64,
    /// Open fds and threads with no client connected, before and after the workload.
    pub idle_before: Idle,
    /// After the workload, once the engine is idle and the clients are gone.
    pub idle_after: Idle,
    /// The engine's state after the workload.
    pub final_stats: Value,
    /// Counted outcomes.
    pub outcomes: Value,
    /// The first failures, if any.
    pub failure_log: Vec<String>,
    /// The series.
    pub samples: Vec<Sample>,
}

/// fds and threads of the daemon with no client connected.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct Idle {
    /// Open file descriptors.
    pub fds: usize,
    /// Threads.
    pub threads: usize,
    /// MB the daemon holds from its allocator (`inferd_allocator_allocated_bytes`, read
    /// last): unlike RSS it counts the KV pool whole from the start, so between two idle
    /// readings it grows only by what the daemon keeps.
    pub allocated_mb: Option<f64>,
}

/// The daemon's `/v1/models` id.
fn model_id(d: &Daemon) -> Result<String> {
    let r = d.http("GET", "/v1/models", &[], None)?;
    r.json()["data"][0]["id"]
        .as_str()
        .map(str::to_string)
        .context("no model id in /v1/models")
}

/// `GET /metrics` of the daemon at `addr`, as text.
async fn metrics(addr: &str) -> Result<String> {
    let addr = addr.to_string();
    let r = tokio::task::spawn_blocking(move || crate::http(&addr, "GET", "/metrics", &[], None))
        .await??;
    Ok(r.body)
}

async fn stats(url: &str) -> Result<Value> {
    let mut c = Client::connect(url).await?;
    let s = c.stats().await;
    let _ = c.close().await;
    s
}

/// fds and threads once they settle (tokio's idle blocking threads linger 10 s): the
/// lowest reading over `settle`.
async fn idle(pid: u32, addr: &str, settle: Duration) -> Result<Idle> {
    let end = Instant::now() + settle;
    let first = probe::process(pid)?;
    let (mut fds, mut threads) = (first.fds, first.threads);
    while Instant::now() < end {
        tokio::time::sleep(Duration::from_millis(500)).await;
        let p = probe::process(pid)?;
        fds = fds.min(p.fds);
        threads = threads.min(p.threads);
    }
    let allocated_mb =
        probe::metric(&metrics(addr).await?, "inferd_allocator_allocated_bytes").map(|b| b / 1e6);
    Ok(Idle {
        fds,
        threads,
        allocated_mb,
    })
}

/// Waits until no request runs or waits; returns the last `stats`.
async fn wait_idle(url: &str, timeout: Duration) -> Result<Value> {
    let end = Instant::now() + timeout;
    loop {
        let s = stats(url).await?;
        if s["running"] == 0 && s["waiting"] == 0 && s["kv_blocks_used"] == 0 {
            return Ok(s);
        }
        if Instant::now() > end {
            bail!("the engine is not idle {timeout:?} after the workload: {s}");
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// Starts the daemon, runs the workload, samples, and returns the report (unchecked).
///
/// # Errors
/// When the daemon does not start, or cannot be sampled.
pub async fn run(opts: &Options) -> Result<Report> {
    let store = tempfile::tempdir().context("store dir")?;
    let mut env: Vec<(String, String)> = vec![
        (
            "INFERD__PREFIX_STORE__PATH".into(),
            store.path().display().to_string(),
        ),
        (
            "INFERD__PREFIX_STORE__ENABLED".into(),
            opts.prefix_store.to_string(),
        ),
        ("INFERD__LOG__LEVEL".into(), "warn".into()),
    ];
    env.extend(opts.env.iter().cloned());
    let env_ref: Vec<(&str, &str)> = env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    let daemon = Daemon::start_config(&opts.config, &[], &env_ref)?;
    let pid = daemon.pid();
    let url = daemon.url.clone();
    let w = Arc::new(Workload::new(
        url.clone(),
        daemon.addr(),
        model_id(&daemon)?,
        opts.seed,
    ));
    // One request per connection first (loads the tokenizer's and the plugins' first
    // instances), then the idle baseline.
    warm_up(&w, opts.connections.min(8)).await;
    let idle_before = idle(pid, &w.addr, Duration::from_secs(12)).await?;

    let start = Instant::now();
    let deadline = start + opts.duration;
    let mut workers = Vec::new();
    for i in 0..opts.connections {
        let w = w.clone();
        let seed = opts.seed.wrapping_mul(1_000_003).wrapping_add(i as u64);
        workers.push(tokio::spawn(async move {
            workload::connection(&w, seed, deadline).await;
        }));
    }
    let mut samples = Vec::new();
    let period = Duration::from_secs_f64(opts.sample_s);
    let mut next = start;
    while Instant::now() < deadline {
        let s = stats(&url).await?;
        let m = metrics(&w.addr).await?;
        let t = start.elapsed().as_secs_f64();
        samples.push(probe::sample(t, pid, &s, &m, store.path())?);
        next += period;
        tokio::time::sleep_until(tokio::time::Instant::from_std(next)).await;
    }
    for wk in workers {
        let _ = wk.await;
    }
    let final_stats = wait_idle(&url, Duration::from_secs(120)).await?;
    let m = metrics(&w.addr).await?;
    let t = start.elapsed().as_secs_f64();
    samples.push(probe::sample(t, pid, &final_stats, &m, store.path())?);
    let idle_after = idle(pid, &w.addr, Duration::from_secs(12)).await?;

    let minutes = opts.duration.as_secs_f64() / 60.0;
    let warmup_min = minutes * opts.warmup_fraction;
    let window: Vec<(f64, f64)> = samples
        .iter()
        .map(|s| (s.t_s / 60.0, s.rss_mb))
        .filter(|p| p.0 >= warmup_min && p.0 <= minutes)
        .collect();
    let slope = probe::slope(&window);
    let floor_points = probe::floor(&window, opts.floor_bucket_min);
    let floor_slope = probe::slope(&floor_points);
    let allocated: Vec<(f64, f64)> = samples
        .iter()
        .filter_map(|s| s.allocated_mb.map(|a| (s.t_s / 60.0, a)))
        .filter(|p| p.0 >= warmup_min && p.0 <= minutes)
        .collect();
    let allocated_slope = (allocated.len() >= 2).then(|| probe::slope(&allocated));
    let n = window.len().max(1) as f64;
    let intercept = window.iter().map(|p| p.1).sum::<f64>() / n
        - slope * window.iter().map(|p| p.0).sum::<f64>() / n;
    let o = &w.outcomes;
    let outcomes = json!({
        "finished": o.finished.load(Ordering::Relaxed),
        "cancelled": o.cancelled.load(Ordering::Relaxed),
        "dropped": o.dropped.load(Ordering::Relaxed),
        "bad_frames_answered": o.bad_frames_answered.load(Ordering::Relaxed),
        "tokenized": o.tokenized.load(Ordering::Relaxed),
        "http_streams": o.http_streams.load(Ordering::Relaxed),
        "cached_tokens": o.cached_tokens.load(Ordering::Relaxed),
        "failures": o.failures.load(Ordering::Relaxed),
    });
    let failure_log = w.failure_log.lock().map(|l| l.clone()).unwrap_or_default();
    drop(daemon);
    Ok(Report {
        connections: opts.connections,
        minutes,
        sample_s: opts.sample_s,
        warmup_min,
        prefix_store: opts.prefix_store,
        rss_slope_mb_per_min: slope,
        rss_slope_se_mb_per_min: probe::slope_standard_error(&window),
        floor_points: floor_points.len(),
        rss_floor_slope_mb_per_min: floor_slope,
        rss_intercept_mb: intercept,
        allocated_slope_mb_per_min: allocated_slope,
        max_rss_slope_mb_per_min: opts.max_rss_slope_mb_per_min,
        max_idle_allocated_growth_mb: opts.max_idle_allocated_growth_mb,
        idle_before,
        idle_after,
        final_stats,
        outcomes,
        failure_log,
        samples,
    })
}

async fn warm_up(w: &Arc<Workload>, n: usize) {
    let mut tasks = Vec::new();
    for i in 0..n {
        let w = w.clone();
        tasks.push(tokio::spawn(async move {
            // A deadline this close runs one action per connection.
            let deadline = Instant::now() + Duration::from_millis(1);
            workload::connection(&w, u64::MAX - i as u64, deadline).await;
        }));
    }
    for t in tasks {
        let _ = t.await;
    }
}

impl Report {
    /// What the run got wrong, one line each (empty: it passed). fds may end at most
    /// `FD_SLACK` above their idle level before the workload, threads at most
    /// `THREAD_SLACK`.
    pub fn problems(&self) -> Vec<String> {
        const FD_SLACK: usize = 2;
        const THREAD_SLACK: usize = 2;
        let mut p = Vec::new();
        let fail = self.outcomes["failures"].as_u64().unwrap_or(0);
        if fail > 0 {
            p.push(format!(
                "{fail} actions failed, first: {:?}",
                self.failure_log
            ));
        }
        if self.outcomes["finished"].as_u64().unwrap_or(0) == 0 {
            p.push("no request finished".into());
        }
        let s = &self.final_stats;
        if s["running"] != 0 || s["waiting"] != 0 || s["kv_blocks_used"] != 0 {
            p.push(format!("the engine is not idle at the end: {s}"));
        }
        if self.idle_after.fds > self.idle_before.fds + FD_SLACK {
            p.push(format!(
                "open fds {} -> {} (idle, before and after; at most +{FD_SLACK})",
                self.idle_before.fds, self.idle_after.fds
            ));
        }
        if self.idle_after.threads > self.idle_before.threads + THREAD_SLACK {
            p.push(format!(
                "threads {} -> {} (idle, before and after; at most +{THREAD_SLACK})",
                self.idle_before.threads, self.idle_after.threads
            ));
        }
        if let (Some(bound), Some(a), Some(b)) = (
            self.max_idle_allocated_growth_mb,
            self.idle_before.allocated_mb,
            self.idle_after.allocated_mb,
        ) {
            if b - a > bound {
                p.push(format!(
                    "allocated bytes idle before / after the workload {a:.1} / {b:.1} MB \
                     (at most +{bound} MB)"
                ));
            }
        }
        if self.floor_points < 2 {
            p.push(format!(
                "the RSS floor after warm-up has {} point(s), too few to fit a slope: run \
                 longer or lower --floor-bucket-min",
                self.floor_points
            ));
        } else if self.rss_floor_slope_mb_per_min > self.max_rss_slope_mb_per_min {
            p.push(format!(
                "RSS floor slope after warm-up {:.3} MB/min > bound {} MB/min",
                self.rss_floor_slope_mb_per_min, self.max_rss_slope_mb_per_min
            ));
        }
        p
    }

    /// Writes `soak.json` and `soak-rss.svg` into `dir`; returns their paths.
    ///
    /// # Errors
    /// When a file cannot be written.
    pub fn write(&self, dir: &Path) -> Result<(PathBuf, PathBuf)> {
        std::fs::create_dir_all(dir)?;
        let json_path = dir.join("soak.json");
        std::fs::write(&json_path, serde_json::to_string_pretty(self)?)?;
        let points: Vec<(f64, f64)> = self
            .samples
            .iter()
            .map(|s| (s.t_s / 60.0, s.rss_mb))
            .collect();
        let title = format!(
            "inferd soak: {} connections, {:.0} min, prefix store {}",
            self.connections,
            self.minutes,
            if self.prefix_store { "on" } else { "off" }
        );
        let svg = plot::rss_svg(
            &points,
            self.warmup_min,
            (self.rss_slope_mb_per_min, self.rss_intercept_mb),
            &title,
        );
        let svg_path = dir.join("soak-rss.svg");
        std::fs::write(&svg_path, svg)?;
        Ok((json_path, svg_path))
    }

    /// A short table of the run for the terminal.
    pub fn table(&self) -> String {
        let first = self.samples.first();
        let last = self.samples.last();
        let f = |s: Option<&Sample>| s.map_or(0.0, |s| s.rss_mb);
        format!(
            "| connections | minutes | RSS first / last (MB) | RSS slope after warm-up, all samples ± s.e. / floor (MB/min) | allocated slope (MB/min) | fds idle before / after | threads idle before / after | disk blocks | outcomes |\n|---|---|---|---|---|---|---|---|---|\n| {} | {:.1} | {:.1} / {:.1} | {:+.3} ± {} / {:+.3} (bound {}) | {} | {} / {} | {} / {} | {} | {} |",
            self.connections,
            self.minutes,
            f(first),
            f(last),
            self.rss_slope_mb_per_min,
            self.rss_slope_se_mb_per_min
                .map_or_else(|| "-".to_string(), |e| format!("{e:.3}")),
            self.rss_floor_slope_mb_per_min,
            self.max_rss_slope_mb_per_min,
            self.allocated_slope_mb_per_min
                .map_or_else(|| "-".to_string(), |a| format!("{a:+.3}")),
            self.idle_before.fds,
            self.idle_after.fds,
            self.idle_before.threads,
            self.idle_after.threads,
            last.map_or(0, |s| s.disk_blocks),
            self.outcomes
        )
    }
}
