//! The engines: one model served by one engine, or by several (`[[engines]]`: each its
//! own device, compute team, runner, KV pool, scheduler loop and prefix-store
//! directory), behind the cheap-clone [`Engine`] handle that `server/` holds (it never
//! sees an actor address). One prepare stage (its pools and the plugin pool) serves every
//! engine and hands each request to the placer ([`crate::prepare::Placer`]).
//! [`load_all`] builds the parts on a loading thread, [`start`] starts the actors
//! inside the actix system and returns the handle.
//!
//! - [`checks`]: the settings checked against the machine and the model.
//! - [`build`]: loading (model, tokenizer, draft, KV pool, adapters, prefix store, plugins).
//! - [`start`](mod@start): the actors and the handle.
//! - [`stats`]: the engines' counters added up.

mod build;
mod checks;
mod draft;
mod start;
mod stats;

use std::sync::{Arc, RwLock};
use std::time::Instant;

use actix::Addr;

use crate::adapters::AdapterLease;
use crate::api::SamplingDefaults;
use crate::error::{ErrorKind, InferError};
use crate::prepare::{Decode, Encode, Placer, Prepare, PrepareActor};
use crate::request::EngineStats;
use crate::request::{CancelFlag, EventSender, GenerateRequest, SeqId};
use crate::sampling::wasm_plugin::PluginRegistry;
use crate::scheduler::{Cancel, GetStats};

pub(crate) use build::load_plugins;
pub use build::{load, load_all, Loaded};
pub(crate) use checks::{check_sampling, effective_sampling, load_chat_template};
pub use start::{start, Started};

/// The loaded plugins, replaced as a whole when SIGHUP reloads `plugins.dir`; a request
/// keeps the registry it was set up with.
pub type SharedPlugins = Arc<RwLock<Arc<PluginRegistry>>>;

/// The handle to one engine that the edge holds: cheap to clone (reference-counted
/// addresses and values), so every connection keeps its own. The actors behind it stay
/// private: requests go in through [`Engine::submit`], control through
/// [`Engine::cancel`], and the utility calls through [`Engine::stats`],
/// [`Engine::tokenize`] and [`Engine::detokenize`].
#[derive(Clone)]
pub struct Engine {
    /// The prepare pool (first stage of the pipeline), for generate requests.
    prepare: Addr<PrepareActor>,
    /// A separate one-thread prepare pool for `tokenize`/`detokenize` messages, so
    /// that a flood of them never delays generate requests.
    utility: Addr<PrepareActor>,
    /// The engines' scheduler loops, behind the placer.
    placer: Arc<Placer>,
    /// Defaults for absent sampling fields (reloaded on SIGHUP).
    pub defaults: SamplingDefaults,
    /// Vocabulary size, for validating token ids.
    pub vocab_size: usize,
    /// Largest accepted WebSocket message or HTTP request body, bytes (reloaded on SIGHUP).
    pub max_message_bytes: usize,
    /// The loaded Wasm plugins (for the `plugins` message).
    pub plugins: SharedPlugins,
    /// The model's name in the OpenAI API (`/v1/models`, `model` fields): the GGUF file
    /// name without `.gguf`.
    pub model_id: String,
    /// When the model was loaded, Unix seconds (`/v1/models` `created`).
    pub created: u64,
    /// The LoRA adapters served over the base model: the first engine's registry
    /// (every engine holds the same names; [`Engine::adapter_registries`] are all).
    pub adapters: std::sync::Arc<crate::adapters::AdapterRegistry>,
}

impl Engine {
    /// Hands a validated request to the engine: it is prepared (template, ids,
    /// sampler chain) and queued; its events (`Started`, `Delta`s, then `Done` or
    /// `Error`) arrive on `events`. `adapter` is the lease [`Engine::lease_adapter`]
    /// gave.
    pub fn submit(
        &self,
        seq: SeqId,
        request: GenerateRequest,
        adapter: Option<AdapterLease>,
        events: EventSender,
        cancel: CancelFlag,
    ) {
        self.prepare.do_send(Prepare {
            seq,
            request,
            adapter,
            events,
            cancel,
            received_at: Instant::now(),
        });
    }

    /// Makes the engine act on a cancelled request now rather than at its next step
    /// (the request's [`CancelFlag`] is set by the caller).
    pub fn cancel(&self, seq: SeqId) {
        self.canceller().cancel(seq);
    }

    /// A handle that can only cancel, for what outlives a request's connection.
    pub fn canceller(&self) -> Canceller {
        Canceller(self.placer.clone())
    }

    /// The counters of all engines together (running, waiting, KV blocks,
    /// speculation), with each engine's share in `engines`.
    ///
    /// # Errors
    /// `internal` when an engine loop is gone.
    pub async fn stats(&self) -> Result<EngineStats, InferError> {
        let each = self.stats_each().await?;
        let placed: Vec<u64> = self
            .placer
            .replicas()
            .iter()
            .map(|r| r.load.placed())
            .collect();
        Ok(stats::merged(&each, &placed))
    }

    /// Each engine's own counters, in `[[engines]]` order.
    ///
    /// # Errors
    /// `internal` when an engine loop is gone.
    pub async fn stats_each(&self) -> Result<Vec<EngineStats>, InferError> {
        let mut each = Vec::with_capacity(self.placer.replicas().len());
        for r in self.placer.replicas() {
            each.push(
                r.scheduler
                    .send(GetStats)
                    .await
                    .map_err(|e| InferError::internal(format!("engine unavailable: {e}")))?,
            );
        }
        Ok(each)
    }

    /// The adapter registry of every engine (loads and unloads go to all).
    pub fn adapter_registries(&self) -> Vec<Arc<crate::adapters::AdapterRegistry>> {
        self.placer
            .replicas()
            .iter()
            .map(|r| r.adapters.clone())
            .collect()
    }

    /// Token ids of `text` (`special`: special-token text maps to control ids), on the
    /// utility prepare pool so that a flood of these never delays generation.
    ///
    /// # Errors
    /// The tokenizer's own (bad input), or `internal` when the pool is gone.
    pub async fn tokenize(&self, text: String, special: bool) -> Result<Vec<u32>, InferError> {
        self.utility
            .send(Encode { text, special })
            .await
            .map_err(tokenizer_unavailable)?
    }

    /// The text of `token_ids` (each already checked to be `< vocab_size`); control
    /// tokens are skipped.
    ///
    /// # Errors
    /// `internal` when the utility prepare pool is gone.
    pub async fn detokenize(&self, token_ids: Vec<u32>) -> Result<String, InferError> {
        self.utility
            .send(Decode { token_ids })
            .await
            .map_err(tokenizer_unavailable)
    }

    /// The lease on the adapter `request` names (`None` for the base model, also when
    /// the WebSocket's `adapter` gives the base model's name).
    ///
    /// # Errors
    /// `model_not_found`, naming the adapter and what this daemon serves.
    pub fn lease_adapter(
        &self,
        request: &GenerateRequest,
    ) -> Result<Option<crate::adapters::AdapterLease>, InferError> {
        let Some(choice) = &request.adapter else {
            return Ok(None);
        };
        // The base model's name means no adapter, on both edges.
        if choice.name == self.model_id {
            return Ok(None);
        }
        match self.adapters.lease(&choice.name, choice.scale) {
            Some(lease) => Ok(Some(lease)),
            None => {
                let names: Vec<String> = self
                    .adapters
                    .list()
                    .into_iter()
                    .map(|a| format!("{:?}", a.name))
                    .collect();
                let adapters = if names.is_empty() {
                    "no LoRA adapters".to_string()
                } else {
                    format!("the LoRA adapters {}", names.join(", "))
                };
                Err(InferError::new(
                    ErrorKind::ModelNotFound,
                    format!(
                        "{}: no model or LoRA adapter is named {}; this daemon serves {:?} and {adapters}",
                        choice.field,
                        crate::model::source::quote(&choice.name),
                        self.model_id
                    ),
                ))
            }
        }
    }
}

fn tokenizer_unavailable(e: actix::MailboxError) -> InferError {
    InferError::internal(format!("tokenizer unavailable: {e}"))
}

/// Cancels requests; held by the request tracker so that a request whose connection
/// is gone still reaches its engine (every engine is told: a loop that does not hold
/// the request ignores it).
#[derive(Clone)]
pub struct Canceller(Arc<Placer>);

impl Canceller {
    /// As [`Engine::cancel`].
    pub fn cancel(&self, seq: SeqId) {
        for r in self.0.replicas() {
            r.scheduler.do_send(Cancel(seq));
        }
    }
}
