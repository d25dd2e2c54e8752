//! One plugin instance owned by one request: its store, its exports, and the mapping of
//! a failed call to a `plugin_trap` error.

use std::sync::Arc;
use std::time::Duration;

use wasmtime::{Store, Trap};

use super::bindings::{ContextProcessorPlugin, LogitsProcessorPlugin, PluginInfo, SamplerPlugin};
use super::cost::PluginCost;
use super::host::HostState;
use super::ticker::{ticks, ActiveCall, TickerShared};
use crate::error::{ErrorKind, InferError};

pub(super) enum Exports {
    Processor(LogitsProcessorPlugin),
    Context(ContextProcessorPlugin),
    Sampler(SamplerPlugin),
}

/// One plugin instance owned by one request.
pub(super) struct PluginInstance {
    pub(super) label: Arc<str>,
    /// Position in the request's `plugins` list (`usize::MAX` for the load-time probe).
    pub(super) index: usize,
    pub(super) store: Store<HostState>,
    pub(super) exports: Option<Exports>,
    pub(super) ticker: Arc<TickerShared>,
    /// Deadline of one `process` / `sample` call (this plugin's limits).
    pub(super) call_deadline: Duration,
    /// The plugin's running cost, shared with the registry.
    pub(super) cost: Arc<PluginCost>,
    /// Whether the component imports WASI (its calls then run off any Tokio runtime).
    pub(super) wasi: bool,
}

impl Drop for PluginInstance {
    fn drop(&mut self) {
        self.cost.memory(self.store.data().limiter.memory_peak);
        let dropped = self.store.data().log.lock().map_or(0, |log| log.dropped);
        if dropped > 0 {
            tracing::warn!(plugin = %self.label, dropped, "plugin log lines dropped (rate limit)");
        }
    }
}

impl PluginInstance {
    pub(super) fn where_(&self) -> String {
        if self.index == usize::MAX {
            format!("plugin {}", self.label)
        } else {
            format!("plugin {} (plugins[{}])", self.label, self.index)
        }
    }

    /// Maps a failed call to a `plugin_trap` error naming the plugin and the cause.
    pub(super) fn trap_error(
        &mut self,
        call: &str,
        err: wasmtime::Error,
        deadline: Duration,
    ) -> InferError {
        let who = self.where_();
        let cause = if let Some(b) = self.store.data_mut().limiter.breach.take() {
            b
        } else if let Some(trap) = err.downcast_ref::<Trap>() {
            match trap {
                Trap::Interrupt => format!(
                    "exceeded its deadline of {} ms",
                    deadline.as_secs_f64() * 1e3
                ),
                Trap::UnreachableCodeReached => {
                    "trapped: unreachable instruction (a panic or abort in the plugin)".into()
                }
                other => format!("trapped: {other}"),
            }
        } else {
            format!("failed: {err:#}")
        };
        InferError::new(ErrorKind::PluginTrap, format!("{who} {cause} in {call}"))
    }

    pub(super) fn info(&mut self, deadline: Duration) -> Result<PluginInfo, InferError> {
        self.store.set_epoch_deadline(ticks(deadline));
        let _call = ActiveCall::start(&self.ticker);
        let res = match &self.exports {
            Some(Exports::Processor(p)) => p
                .inferd_plugin_logits_processor()
                .call_info(&mut self.store),
            Some(Exports::Context(c)) => c
                .inferd_plugin_context_processor()
                .call_info(&mut self.store),
            Some(Exports::Sampler(s)) => s.inferd_plugin_sampler().call_info(&mut self.store),
            None => return Err(InferError::internal("plugin instance without exports")),
        };
        res.map_err(|e| self.trap_error("info", e, deadline))
    }

    pub(super) fn configure(
        &mut self,
        config: &str,
        seed: u64,
        deadline: Duration,
        name: &str,
    ) -> Result<(), InferError> {
        self.store.set_epoch_deadline(ticks(deadline));
        let call = ActiveCall::start(&self.ticker);
        let res = match &self.exports {
            Some(Exports::Processor(p)) => {
                p.inferd_plugin_logits_processor()
                    .call_configure(&mut self.store, config, seed)
            }
            Some(Exports::Context(c)) => {
                c.inferd_plugin_context_processor()
                    .call_configure(&mut self.store, config, seed)
            }
            Some(Exports::Sampler(s)) => {
                s.inferd_plugin_sampler()
                    .call_configure(&mut self.store, config, seed)
            }
            None => return Err(InferError::internal("plugin instance without exports")),
        };
        drop(call);
        match res {
            Ok(Ok(())) => Ok(()),
            Ok(Err(msg)) => Err(InferError::validation(format!(
                "plugins[{}].config: plugin {name:?} rejected it: {msg}",
                self.index
            ))),
            Err(e) => Err(self.trap_error("configure", e, deadline)),
        }
    }
}
