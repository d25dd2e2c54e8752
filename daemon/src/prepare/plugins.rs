//! [`PluginSetupActor`]: the plugin pool of the prepare stage. Builds the chains of a
//! request that names plugins, instantiating and configuring its plugins, then submits
//! it. Requests that name no plugin never pass through it, so a slow or hostile
//! `configure` (bounded by `plugins.configure_deadline_ms`) delays only other plugin
//! requests, never tokenizing.

use std::sync::{Arc, RwLock};

use actix::{Actor, Handler, Message, SyncContext};

use super::actor::Prepare;
use super::placement::Placer;
use super::prompt::Prompt;
use crate::request::{StreamEvent, Vocab};
use crate::sampling::build::{ChainParts, PluginRequest};
use crate::sampling::constraint::LazyCompiler;
use crate::sampling::wasm_plugin::PluginRegistry;
use crate::sampling::SamplerChain;

/// Threads of the plugin set-up pool.
pub const SETUP_THREADS: usize = 2;

/// Build the chains of a tokenized request with its plugins, then submit it; a
/// failure (`validation` for an unknown name or rejected config, `plugin_trap` for a
/// trap or timeout in `configure`) goes to the request's event channel instead.
#[derive(Debug, Message)]
#[rtype(result = "()")]
pub struct SetupPlugins {
    /// The request (its `plugins` are not empty).
    pub prepare: Prepare,
    /// Its rendered prompt.
    pub prompt: Prompt,
}

/// The plugin set-up pool. Start with `SyncArbiter::start(SETUP_THREADS, ..)`.
pub struct PluginSetupActor {
    plugins: Arc<RwLock<Arc<PluginRegistry>>>,
    vocab: Arc<dyn Vocab>,
    grammars: Arc<LazyCompiler>,
    placer: Arc<Placer>,
}

impl PluginSetupActor {
    /// A worker instantiating from the current registry in `plugins` (replaced as a
    /// whole when SIGHUP reloads `plugins.dir`) and submitting through `placer`.
    pub fn new(
        plugins: Arc<RwLock<Arc<PluginRegistry>>>,
        vocab: Arc<dyn Vocab>,
        grammars: Arc<LazyCompiler>,
        placer: Arc<Placer>,
    ) -> Self {
        Self {
            plugins,
            vocab,
            grammars,
            placer,
        }
    }
}

impl Actor for PluginSetupActor {
    type Context = SyncContext<Self>;
}

impl Handler<SetupPlugins> for PluginSetupActor {
    type Result = ();

    fn handle(&mut self, msg: SetupPlugins, _ctx: &mut SyncContext<Self>) {
        let SetupPlugins { prepare, prompt } = msg;
        // A poisoned lock only means a reload panicked: the registry is still whole.
        let registry = match self.plugins.read() {
            Ok(r) => r.clone(),
            Err(poisoned) => poisoned.into_inner().clone(),
        };
        let request = &prepare.request;
        let build = |with_plugins: bool| {
            let parts = ChainParts {
                vocab: self.vocab.as_ref(),
                grammars: &self.grammars,
                tools: request.tools.as_ref(),
                tool_format: prompt.tool_format,
                channels: &prompt.channels,
                plugins: with_plugins.then(|| PluginRequest {
                    registry: &registry,
                    specs: &request.plugins,
                    client_id: &request.client_id,
                }),
            };
            SamplerChain::build(&request.sampling, &parts)
        };
        // A request cancelled while it waited here is ended by the scheduler, without
        // configuring its plugins.
        let cancelled = || prepare.cancel.is_cancelled();
        let chains = match build(!cancelled()) {
            Ok(chains) => chains,
            // Cancelled while configuring: the scheduler ends it as cancelled.
            Err(_) if cancelled() => match build(false) {
                Ok(chains) => chains,
                Err(e) => return fail(&prepare, e),
            },
            Err(e) => {
                tracing::warn!(id = %request.client_id, error = %e.message, "plugin set-up failed");
                return fail(&prepare, e);
            }
        };
        self.placer.submit(prepare.into_prepared(prompt, chains));
    }
}

fn fail(prepare: &Prepare, e: crate::error::InferError) {
    let _ = prepare.events.send(StreamEvent::Error(e));
}
