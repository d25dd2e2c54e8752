//! What the soak samples: the daemon process's resident memory, file descriptors and
//! threads from `/proc/PID` (Linux), the engine's state from the WebSocket `stats`
//! message, and the prefix store's bytes on disk.

use std::path::Path;

use anyhow::{anyhow, Context, Result};
use serde::Serialize;
use serde_json::Value;

/// One sample of the series (every `sample_s` seconds of a soak run).
#[derive(Debug, Clone, Serialize)]
pub struct Sample {
    /// Seconds since the workload started.
    pub t_s: f64,
    /// Resident set size, MB (10^6 bytes; `VmRSS` of `/proc/PID/status`).
    pub rss_mb: f64,
    /// The anonymous part of it, MB (`RssAnon`: the heap, stacks, the KV pool): what
    /// the allocator keeps; `None` where the kernel does not report it.
    pub rss_anon_mb: Option<f64>,
    /// The file-backed part, MB (`RssFile`: the mapped model file and the binary).
    pub rss_file_mb: Option<f64>,
    /// Open file descriptors (`/proc/PID/fd` entries).
    pub fds: usize,
    /// Threads (`/proc/PID/task` entries).
    pub threads: usize,
    /// KV cache blocks owned by sequences (`stats.kv_blocks_used`).
    pub kv_blocks_used: u64,
    /// Requests running / waiting (`stats.running`, `stats.waiting`).
    pub running: u64,
    /// Requests waiting for admission.
    pub waiting: u64,
    /// Blocks held by the memory tier of the prefix cache (`prefix_cache.memory_blocks`).
    pub memory_blocks: u64,
    /// Blocks in the disk tier (`prefix_cache.disk_blocks`).
    pub disk_blocks: u64,
    /// Bytes of the files under the store's `blocks/` (file lengths).
    pub store_block_bytes: u64,
    /// Bytes of the files under the store's `index/` (sled).
    pub store_index_bytes: u64,
    /// MB the daemon holds from its allocator (`inferd_allocator_allocated_bytes`).
    pub allocated_mb: Option<f64>,
    /// MB its allocator keeps in memory (`inferd_allocator_resident_bytes`).
    pub allocator_resident_mb: Option<f64>,
}

/// What [`process`] reads of a process.
#[derive(Debug, Clone, Copy)]
pub struct ProcessFigures {
    /// Resident set size, kB (`VmRSS`).
    pub rss_kb: u64,
    /// Its anonymous part, kB (`RssAnon`, Linux 4.5 and later).
    pub rss_anon_kb: Option<u64>,
    /// Its file-backed part, kB (`RssFile`).
    pub rss_file_kb: Option<u64>,
    /// Open file descriptors.
    pub fds: usize,
    /// Threads.
    pub threads: usize,
}

/// The kB value of field `key` (e.g. `VmRSS:`) of a `/proc/PID/status` text.
fn status_kb(status: &str, key: &str) -> Option<u64> {
    status
        .lines()
        .find_map(|l| l.strip_prefix(key))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
}

/// Resident set size (whole, anonymous, file-backed), open file descriptors and threads
/// of process `pid` (proc(5), `/proc/PID/status`).
///
/// # Errors
/// When `/proc/PID` cannot be read (the process is gone, or not Linux).
pub fn process(pid: u32) -> Result<ProcessFigures> {
    let base = Path::new("/proc").join(pid.to_string());
    let status = std::fs::read_to_string(base.join("status"))
        .with_context(|| format!("reading /proc/{pid}/status"))?;
    let rss_kb =
        status_kb(&status, "VmRSS:").ok_or_else(|| anyhow!("no VmRSS in /proc/{pid}/status"))?;
    Ok(ProcessFigures {
        rss_kb,
        rss_anon_kb: status_kb(&status, "RssAnon:"),
        rss_file_kb: status_kb(&status, "RssFile:"),
        fds: std::fs::read_dir(base.join("fd"))?.count(),
        threads: std::fs::read_dir(base.join("task"))?.count(),
    })
}

/// Sum of the lengths of the regular files under `dir` (0 when it does not exist).
pub fn dir_bytes(dir: &Path) -> u64 {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return 0;
    };
    entries
        .flatten()
        .map(|e| match e.file_type() {
            Ok(t) if t.is_dir() => dir_bytes(&e.path()),
            Ok(t) if t.is_file() => e.metadata().map_or(0, |m| m.len()),
            _ => 0,
        })
        .sum()
}

/// One sample: the process figures of `pid`, the engine's from a `stats` frame, and the
/// store directory's sizes.
///
/// # Errors
/// When `/proc/PID` cannot be read.
pub fn sample(t_s: f64, pid: u32, stats: &Value, metrics: &str, store: &Path) -> Result<Sample> {
    let p = process(pid)?;
    let n = |v: &Value| v.as_u64().unwrap_or(0);
    let mb = |kb: u64| kb as f64 * 1024.0 / 1e6;
    Ok(Sample {
        t_s,
        rss_mb: mb(p.rss_kb),
        rss_anon_mb: p.rss_anon_kb.map(mb),
        rss_file_mb: p.rss_file_kb.map(mb),
        fds: p.fds,
        threads: p.threads,
        kv_blocks_used: n(&stats["kv_blocks_used"]),
        running: n(&stats["running"]),
        waiting: n(&stats["waiting"]),
        memory_blocks: n(&stats["prefix_cache"]["memory_blocks"]),
        disk_blocks: n(&stats["prefix_cache"]["disk_blocks"]),
        store_block_bytes: dir_bytes(&store.join("blocks")),
        store_index_bytes: dir_bytes(&store.join("index")),
        allocated_mb: metric(metrics, "inferd_allocator_allocated_bytes").map(|b| b / 1e6),
        allocator_resident_mb: metric(metrics, "inferd_allocator_resident_bytes").map(|b| b / 1e6),
    })
}

/// The value of the first sample of `family` in a Prometheus text exposition.
pub fn metric(text: &str, family: &str) -> Option<f64> {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .find(|l| {
            l.strip_prefix(family)
                .is_some_and(|r| r.starts_with(' ') || r.starts_with('{'))
        })
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
}

/// Least-squares slope of `y` over `x` (units of y per unit of x); 0 for fewer than two
/// points or no spread in `x`.
pub fn slope(points: &[(f64, f64)]) -> f64 {
    let n = points.len() as f64;
    if points.len() < 2 {
        return 0.0;
    }
    let mx = points.iter().map(|p| p.0).sum::<f64>() / n;
    let my = points.iter().map(|p| p.1).sum::<f64>() / n;
    let sxx: f64 = points.iter().map(|p| (p.0 - mx).powi(2)).sum();
    let sxy: f64 = points.iter().map(|p| (p.0 - mx) * (p.1 - my)).sum();
    if sxx == 0.0 {
        0.0
    } else {
        sxy / sxx
    }
}

/// The lowest point of each `bucket`-wide stretch of `x` (points sorted by x): the
/// floor of a series whose peaks follow the work in flight (a batch of long prompts'
/// activations), so a slope fitted to it follows what stays resident between them.
pub fn floor(points: &[(f64, f64)], bucket: f64) -> Vec<(f64, f64)> {
    let mut out: Vec<(f64, f64)> = Vec::new();
    let mut current: Option<(i64, (f64, f64))> = None;
    for &p in points {
        let b = (p.0 / bucket).floor() as i64;
        current = match current {
            Some((cb, low)) if cb == b => Some((cb, if p.1 < low.1 { p } else { low })),
            Some((_, low)) => {
                out.push(low);
                Some((b, p))
            }
            None => Some((b, p)),
        };
    }
    out.extend(current.map(|c| c.1));
    out
}

/// Standard error of the least-squares slope of `points` (same units as [`slope`]):
/// the residuals' standard deviation over the spread of `x`; `None` for fewer than three
/// points or no spread in `x`.
pub fn slope_standard_error(points: &[(f64, f64)]) -> Option<f64> {
    if points.len() < 3 {
        return None;
    }
    let n = points.len() as f64;
    let m = slope(points);
    let mx = points.iter().map(|p| p.0).sum::<f64>() / n;
    let my = points.iter().map(|p| p.1).sum::<f64>() / n;
    let b = my - m * mx;
    let sxx: f64 = points.iter().map(|p| (p.0 - mx).powi(2)).sum();
    let rss: f64 = points.iter().map(|p| (p.1 - (m * p.0 + b)).powi(2)).sum();
    (sxx > 0.0).then(|| (rss / (n - 2.0)).sqrt() / sxx.sqrt())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slope_of_a_line_and_of_noise() {
        let line: Vec<_> = (0..10)
            .map(|i| (f64::from(i), 3.0 * f64::from(i) + 1.0))
            .collect();
        assert!((slope(&line) - 3.0).abs() < 1e-12);
        let flat = [(0.0, 5.0), (1.0, 6.0), (2.0, 5.0), (3.0, 6.0)];
        assert!((slope(&flat) - 0.2).abs() < 1e-12);
        assert_eq!(slope(&[(1.0, 2.0)]), 0.0);
    }

    #[test]
    fn standard_error_of_a_slope() {
        let line: Vec<_> = (0..10)
            .map(|i| (f64::from(i), 2.0 * f64::from(i)))
            .collect();
        assert_eq!(slope_standard_error(&line), Some(0.0));
        // Residuals ±1 alternating around y = 0 over x = 0..4: sd = sqrt(4 / 2),
        // sxx = 10, so the error is sqrt(2) / sqrt(10).
        let zig = [(0.0, 1.0), (1.0, -1.0), (2.0, 1.0), (3.0, -1.0)];
        let m = slope(&zig);
        assert!((m - -0.4).abs() < 1e-12);
        let se = slope_standard_error(&zig).expect("se");
        let b = 0.6; // intercept of the fit
        let rss: f64 = zig.iter().map(|p| (p.1 - (m * p.0 + b)).powi(2)).sum();
        assert!(
            (se - (rss / 2.0).sqrt() / 5.0_f64.sqrt()).abs() < 1e-12,
            "{se}"
        );
        assert_eq!(slope_standard_error(&zig[..2]), None);
    }

    #[test]
    fn floor_keeps_the_lowest_point_of_each_bucket() {
        let pts = [
            (0.0, 5.0),
            (0.5, 3.0),
            (1.0, 9.0),
            (1.2, 8.0),
            (1.9, 8.5),
            (2.1, 1.0),
        ];
        assert_eq!(floor(&pts, 1.0), vec![(0.5, 3.0), (1.2, 8.0), (2.1, 1.0)]);
        assert!(floor(&[], 1.0).is_empty());
    }

    #[test]
    fn metric_reads_a_family_with_or_without_labels() {
        let text =
            "# HELP x\ninferd_a_bytes{allocator=\"jemalloc\"} 1234\ninferd_ab 7\ninferd_b 2.5\n";
        assert_eq!(metric(text, "inferd_a_bytes"), Some(1234.0));
        assert_eq!(metric(text, "inferd_b"), Some(2.5));
        assert_eq!(metric(text, "inferd_a"), None);
    }

    #[test]
    fn this_process_has_memory_fds_and_threads() {
        let p = process(std::process::id()).expect("own /proc");
        assert!(p.rss_kb > 100, "{p:?}");
        assert!(p.fds >= 3, "{p:?}");
        assert!(p.threads >= 1, "{p:?}");
        // The two parts add up to the whole (proc(5): VmRSS = RssAnon + RssFile + RssShmem).
        if let (Some(a), Some(f)) = (p.rss_anon_kb, p.rss_file_kb) {
            assert!(a > 0 && f > 0 && a + f <= p.rss_kb, "{p:?}");
        }
    }

    #[test]
    fn dir_bytes_sums_nested_files() {
        let d = tempfile::tempdir().expect("tempdir");
        std::fs::create_dir_all(d.path().join("a/b")).expect("mkdir");
        std::fs::write(d.path().join("x"), [0u8; 10]).expect("write");
        std::fs::write(d.path().join("a/b/y"), [0u8; 32]).expect("write");
        assert_eq!(dir_bytes(d.path()), 42);
        assert_eq!(dir_bytes(&d.path().join("missing")), 0);
    }
}
