//! [`PluginChain`]: the plugins of one request, run at every step.

use std::fmt;
use std::time::Instant;

use super::apply_edit;
use super::bindings::{LogitsEdit, StepContext};
use super::instance::{Exports, PluginInstance};
use super::ticker::{ticks, ActiveCall};
use super::wasi::off_runtime;
use crate::error::{ErrorKind, InferError};

/// Where a sequence stands, for [`PluginChain::process`] and [`PluginChain::sample`].
#[derive(Debug, Clone, Copy)]
pub struct StepView<'a> {
    /// Engine id of the sequence.
    pub sequence_id: u64,
    /// Prompt length, tokens.
    pub prompt_tokens: usize,
    /// Tokens generated so far.
    pub generated: &'a [u32],
}

/// The plugins of one request, each in its own store; dropped with the request.
pub struct PluginChain {
    pub(super) processors: Vec<PluginInstance>,
    pub(super) sampler: Option<PluginInstance>,
    /// Reused across steps (its `generated` list is refilled, not reallocated).
    pub(super) step_ctx: StepContext,
}

impl fmt::Debug for PluginChain {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PluginChain")
            .field(
                "processors",
                &self
                    .processors
                    .iter()
                    .map(|p| &*p.label)
                    .collect::<Vec<_>>(),
            )
            .field("sampler", &self.sampler.as_ref().map(|p| &*p.label))
            .finish_non_exhaustive()
    }
}

impl PluginChain {
    /// Whether the chain ends in a sampler plugin (which then chooses every token).
    pub fn has_sampler(&self) -> bool {
        self.sampler.is_some()
    }

    fn fill_ctx(&mut self, step: &StepView<'_>) {
        let ctx = &mut self.step_ctx;
        ctx.sequence_id = step.sequence_id;
        ctx.prompt_tokens = step.prompt_tokens as u32;
        ctx.position = (step.prompt_tokens + step.generated.len()) as u32;
        ctx.generated.clear();
        ctx.generated.extend_from_slice(step.generated);
    }

    /// Runs every logits processor (and context processor) in request order on `logits`
    /// (`(vocab_size,)` f32), applying each edit before the next processor sees the row.
    ///
    /// # Errors
    /// `plugin_trap` naming the plugin: a trap, a missed `plugins.call_deadline_ms`, a
    /// limit breach, an `err` result, or an invalid edit (see [`apply_edit`]).
    pub fn process(&mut self, step: &StepView<'_>, logits: &mut [f32]) -> Result<(), InferError> {
        if self.processors.is_empty() {
            return Ok(());
        }
        self.fill_ctx(step);
        for inst in &mut self.processors {
            let deadline = inst.call_deadline;
            inst.store.set_epoch_deadline(ticks(deadline));
            let call = ActiveCall::start(&inst.ticker);
            let started = Instant::now();
            let (store, ctx, row) = (&mut inst.store, &self.step_ctx, &*logits);
            // A context processor gets no row: nothing is copied into the guest.
            let run = || match &inst.exports {
                Some(Exports::Processor(p)) => p
                    .inferd_plugin_logits_processor()
                    .call_process(store, ctx, row),
                Some(Exports::Context(c)) => {
                    c.inferd_plugin_context_processor().call_process(store, ctx)
                }
                _ => Err(wasmtime::Error::msg("processor instance without exports")),
            };
            let res = if inst.wasi { off_runtime(run) } else { run() };
            inst.cost.called(started.elapsed());
            drop(call);
            let edit: LogitsEdit = match res {
                Ok(Ok(edit)) => edit,
                Ok(Err(msg)) => {
                    return Err(InferError::new(
                        ErrorKind::PluginTrap,
                        format!("{} returned an error in process: {msg}", inst.where_()),
                    ))
                }
                Err(e) => return Err(inst.trap_error("process", e, deadline)),
            };
            apply_edit(&edit, logits).map_err(|msg| {
                InferError::new(
                    ErrorKind::PluginTrap,
                    format!("{} returned an invalid edit: {msg}", inst.where_()),
                )
            })?;
        }
        Ok(())
    }

    /// Asks the sampler plugin for the next token. `random` is uniform in `[0, 1)`, drawn
    /// by the caller from the request's seeded generator.
    ///
    /// # Errors
    /// `internal` when the chain has no sampler; `plugin_trap` naming the plugin for a
    /// trap, missed deadline, limit breach, `err` result, or a token id that is out of
    /// range or whose logit is −∞ or NaN.
    pub fn sample(
        &mut self,
        step: &StepView<'_>,
        logits: &[f32],
        random: f64,
    ) -> Result<u32, InferError> {
        if self.sampler.is_none() {
            return Err(InferError::internal(
                "PluginChain::sample without a sampler",
            ));
        }
        self.fill_ctx(step);
        let Some(inst) = self.sampler.as_mut() else {
            return Err(InferError::internal(
                "PluginChain::sample without a sampler",
            ));
        };
        let deadline = inst.call_deadline;
        inst.store.set_epoch_deadline(ticks(deadline));
        let Some(Exports::Sampler(s)) = &inst.exports else {
            return Err(InferError::internal("sampler instance without exports"));
        };
        let call = ActiveCall::start(&inst.ticker);
        let started = Instant::now();
        let (store, ctx) = (&mut inst.store, &self.step_ctx);
        let run = || {
            s.inferd_plugin_sampler()
                .call_sample(store, ctx, logits, random)
        };
        let res = if inst.wasi { off_runtime(run) } else { run() };
        inst.cost.called(started.elapsed());
        drop(call);
        let token = match res {
            Ok(Ok(t)) => t,
            Ok(Err(msg)) => {
                return Err(InferError::new(
                    ErrorKind::PluginTrap,
                    format!("{} returned an error in sample: {msg}", inst.where_()),
                ))
            }
            Err(e) => return Err(inst.trap_error("sample", e, deadline)),
        };
        match logits.get(token as usize) {
            Some(l) if !l.is_nan() && *l != f32::NEG_INFINITY => Ok(token),
            Some(l) => Err(InferError::new(
                ErrorKind::PluginTrap,
                format!(
                    "{} sampled token {token}, whose logit is {l} (removed)",
                    inst.where_()
                ),
            )),
            None => Err(InferError::new(
                ErrorKind::PluginTrap,
                format!(
                    "{} sampled token id {token}, out of range (vocabulary size {})",
                    inst.where_(),
                    logits.len()
                ),
            )),
        }
    }
}
