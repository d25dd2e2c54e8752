//! What each plugin costs, measured as it runs: instantiation time, per-call time of
//! `process` / `sample`, and the largest linear memory an instance reached. Shared by
//! the registry (which reports it in the `plugins` message) and every instance.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// Running totals of one plugin, updated lock-free by every request's instance.
#[derive(Debug, Default)]
pub(super) struct PluginCost {
    instantiations: AtomicU64,
    instantiate_ns: AtomicU64,
    calls: AtomicU64,
    call_ns: AtomicU64,
    memory_peak: AtomicU64,
}

impl PluginCost {
    /// One instantiation (the load-time probe included) that took `took`.
    pub(super) fn instantiated(&self, took: Duration) {
        self.instantiations.fetch_add(1, Ordering::Relaxed);
        self.instantiate_ns
            .fetch_add(nanos(took), Ordering::Relaxed);
    }

    /// One `process` or `sample` call that took `took`.
    pub(super) fn called(&self, took: Duration) {
        self.calls.fetch_add(1, Ordering::Relaxed);
        self.call_ns.fetch_add(nanos(took), Ordering::Relaxed);
    }

    /// An instance's linear memory reached `bytes`.
    pub(super) fn memory(&self, bytes: usize) {
        self.memory_peak.fetch_max(bytes as u64, Ordering::Relaxed);
    }

    /// The figures the `plugins` message reports.
    pub(super) fn snapshot(&self) -> PluginCostSnapshot {
        let mean = |total: &AtomicU64, n: u64, unit_ns: f64| {
            if n == 0 {
                0.0
            } else {
                total.load(Ordering::Relaxed) as f64 / n as f64 / unit_ns
            }
        };
        let instantiations = self.instantiations.load(Ordering::Relaxed);
        let calls = self.calls.load(Ordering::Relaxed);
        PluginCostSnapshot {
            instantiations,
            instantiate_ms_mean: mean(&self.instantiate_ns, instantiations, 1e6),
            calls,
            call_us_mean: mean(&self.call_ns, calls, 1e3),
            memory_bytes_peak: self.memory_peak.load(Ordering::Relaxed),
        }
    }
}

fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

/// A plugin's measured cost since start-up (the `cost` object of the `plugins` message).
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize)]
pub struct PluginCostSnapshot {
    /// Instances created: one at load, then one per request that names the plugin.
    pub instantiations: u64,
    /// Mean time to instantiate one, from its pre-linked `InstancePre`, milliseconds.
    pub instantiate_ms_mean: f64,
    /// `process` / `sample` calls (one per decode step of each request using it).
    pub calls: u64,
    /// Mean wall-clock time of one call, microseconds (the logits row copied in and
    /// the edit copied out included).
    pub call_us_mean: f64,
    /// Largest linear memory any instance grew to, bytes.
    pub memory_bytes_peak: u64,
}
