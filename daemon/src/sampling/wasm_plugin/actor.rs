//! `PluginSetupActor`: instantiates and configures a request's plugins on a
//! `SyncArbiter` pool of its own, between the tokenizer and the scheduler. Requests that
//! name no plugin never pass through it, so a slow or hostile `configure` (bounded by
//! `plugins.configure_deadline_ms`) delays only other plugin requests, never tokenizing.

use std::sync::{Arc, RwLock};

use actix::{Actor, Handler, Message, SyncContext};

use super::PluginRegistry;
use crate::request::{PluginSpec, StreamEvent};
use crate::scheduler::{Placer, Prepared};

/// Threads of the plugin set-up pool.
pub const SETUP_THREADS: usize = 2;

/// Instantiate and configure `specs` for `request`, then submit it to the scheduler; a
/// failure (`validation` for an unknown name or rejected config, `plugin_trap` for a trap
/// or timeout in `configure`) goes to the request's event channel instead.
#[derive(Debug, Message)]
#[rtype(result = "()")]
pub struct SetupPlugins {
    /// The tokenized request (its chain has no plugins until set up here).
    pub request: Prepared,
    /// The request's plugin list, in order.
    pub specs: Vec<PluginSpec>,
}

/// The plugin set-up stage. Start with `SyncArbiter::start(SETUP_THREADS, ..)`.
pub struct PluginSetupActor {
    plugins: Arc<RwLock<Arc<PluginRegistry>>>,
    scheduler: Arc<Placer>,
}

impl PluginSetupActor {
    /// A worker instantiating from the current registry in `plugins` (replaced as a
    /// whole when SIGHUP reloads `plugins.dir`) and submitting to `scheduler`.
    pub fn new(plugins: Arc<RwLock<Arc<PluginRegistry>>>, scheduler: Arc<Placer>) -> Self {
        Self { plugins, scheduler }
    }
}

impl Actor for PluginSetupActor {
    type Context = SyncContext<Self>;
}

impl Handler<SetupPlugins> for PluginSetupActor {
    type Result = ();

    fn handle(&mut self, msg: SetupPlugins, _ctx: &mut SyncContext<Self>) {
        let mut req = msg.request;
        if !req.cancel.is_cancelled() {
            // A poisoned lock only means a reload panicked: the registry is still whole.
            let registry = match self.plugins.read() {
                Ok(r) => r.clone(),
                Err(poisoned) => poisoned.into_inner().clone(),
            };
            // Every choice of an `n > 1` request gets instances of its own (a plugin's
            // state follows one sequence), seeded with the choice's seed.
            let set_up = (0..=req.forks.len()).try_for_each(|i| {
                let seed = req.sampling.choice_seed(i);
                let plugins = registry.instantiate(&msg.specs, seed, &req.client_id)?;
                match i.checked_sub(1) {
                    None => req.chain.set_plugins(plugins),
                    Some(f) => {
                        if let Some(chain) = req.forks.get_mut(f) {
                            chain.set_plugins(plugins);
                        }
                    }
                }
                Ok::<(), crate::error::InferError>(())
            });
            match set_up {
                Ok(()) => {}
                // Cancelled while configuring: the scheduler ends it as cancelled.
                Err(_) if req.cancel.is_cancelled() => {}
                Err(e) => {
                    tracing::warn!(id = %req.client_id, error = %e.message, "plugin set-up failed");
                    let _ = req.events.send(StreamEvent::Error(e));
                    return;
                }
            }
        }
        // A request cancelled while it waited here is ended by the scheduler.
        self.scheduler.submit(req);
    }
}
