//! The sandbox's limits: [`PluginLimits`] from the `[plugins]` configuration, and the
//! per-store [`Limiter`] that enforces memory, table and instance bounds.

use std::sync::Arc;
use std::time::Duration;

use wasmtime::ResourceLimiter;

/// Sandbox limits and deadlines, from the `[plugins]` configuration.
#[derive(Debug, Clone, PartialEq)]
pub struct PluginLimits {
    /// Wall-clock deadline of one `process` or `sample` call.
    pub call_deadline: Duration,
    /// Wall-clock deadline of `info` (at load) and `configure` (per request), which may
    /// build lookup tables over the whole vocabulary.
    pub configure_deadline: Duration,
    /// Largest linear memory of one instance, bytes.
    pub memory_bytes: usize,
    /// Largest table of one instance, elements.
    pub table_elements: usize,
    /// Most core instances, tables and memories one component instance may create.
    pub instances: usize,
    /// `log` lines kept per request-plugin instance; the rest are dropped and counted.
    pub log_lines_per_request: u32,
}

impl Default for PluginLimits {
    fn default() -> Self {
        Self {
            call_deadline: Duration::from_millis(10),
            configure_deadline: Duration::from_millis(1000),
            memory_bytes: 64 << 20,
            table_elements: 10_000,
            instances: 16,
            log_lines_per_request: 20,
        }
    }
}

/// Memory/table limits of one store, recording the first breach so a trap can be
/// reported as "broke its memory limit" rather than a bare trap.
pub(super) struct Limiter {
    pub(super) memory_bytes: usize,
    /// The setting `memory_bytes` came from, for the breach message
    /// (`plugins.memory_bytes` or `plugins.limits.NAME.memory_bytes`).
    pub(super) memory_setting: Arc<str>,
    /// Largest linear memory this store grew to, bytes.
    pub(super) memory_peak: usize,
    pub(super) table_elements: usize,
    pub(super) instances: usize,
    pub(super) breach: Option<String>,
}

impl ResourceLimiter for Limiter {
    fn memory_growing(
        &mut self,
        current: usize,
        desired: usize,
        _maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        if desired > self.memory_bytes {
            let msg = format!(
                "broke its memory limit: tried to grow linear memory from {current} to \
                 {desired} bytes; {} = {}",
                self.memory_setting, self.memory_bytes
            );
            self.breach.get_or_insert(msg.clone());
            return Err(wasmtime::Error::msg(msg));
        }
        self.memory_peak = self.memory_peak.max(desired);
        Ok(true)
    }

    fn table_growing(
        &mut self,
        current: usize,
        desired: usize,
        _maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        if desired > self.table_elements {
            let msg = format!(
                "broke its table limit: tried to grow a table from {current} to {desired} \
                 elements; limit {}",
                self.table_elements
            );
            self.breach.get_or_insert(msg.clone());
            return Err(wasmtime::Error::msg(msg));
        }
        Ok(true)
    }

    fn instances(&self) -> usize {
        self.instances
    }

    fn tables(&self) -> usize {
        self.instances
    }

    fn memories(&self) -> usize {
        self.instances
    }
}

impl PluginLimits {
    /// Limits at least as loose as each of `all` in every respect: the load-time probe
    /// of a plugin runs under them, as its name (which picks its own limits) is known
    /// only once its `info` has answered.
    pub fn loosest<'a>(all: impl IntoIterator<Item = &'a PluginLimits>) -> Option<PluginLimits> {
        all.into_iter().cloned().reduce(|a, b| PluginLimits {
            call_deadline: a.call_deadline.max(b.call_deadline),
            configure_deadline: a.configure_deadline.max(b.configure_deadline),
            memory_bytes: a.memory_bytes.max(b.memory_bytes),
            table_elements: a.table_elements.max(b.table_elements),
            instances: a.instances.max(b.instances),
            log_lines_per_request: a.log_lines_per_request.max(b.log_lines_per_request),
        })
    }

    /// The figures the `plugins` message reports.
    pub fn snapshot(&self) -> PluginLimitsSnapshot {
        PluginLimitsSnapshot {
            call_deadline_ms: self.call_deadline.as_secs_f64() * 1e3,
            configure_deadline_ms: self.configure_deadline.as_secs_f64() * 1e3,
            memory_bytes: self.memory_bytes as u64,
            instances: self.instances as u64,
        }
    }
}

/// A plugin's limits as the `plugins` message lists them (`limits`).
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize)]
pub struct PluginLimitsSnapshot {
    /// Deadline of one `process` / `sample` call, milliseconds.
    pub call_deadline_ms: f64,
    /// Deadline of `info` and `configure`, milliseconds.
    pub configure_deadline_ms: f64,
    /// Largest linear memory of one instance, bytes.
    pub memory_bytes: u64,
    /// Most core instances, tables and memories of one instance.
    pub instances: u64,
}
