//! Request preparation: the one stage between the edges and the scheduler.
//!
//! A validated request goes, on the prepare pool ([`PrepareActor`], a `SyncArbiter`):
//! template → prompt ids ([`prompt`]) → the request's sampling chains
//! (`SamplerChain::build`: grammar, reasoning gate) → the [`Placer`], which picks the
//! engine and sends `Submit`. A request that names plugins takes one detour, through
//! the plugin pool ([`plugins::PluginSetupActor`]), where its chains are built with
//! their plugin instances: a slow or hostile `configure` (bounded by
//! `plugins.configure_deadline_ms`) then delays only other plugin requests, never
//! tokenizing. Any failure goes to the request's event channel as an `error` before
//! anything is queued.
//!
//! Nothing else sends `Submit`; the tokenizer is pure and the sampling stage never
//! talks to the scheduler.

pub mod actor;
pub mod media;
pub mod placement;
pub mod plugins;
pub mod preprocess;
pub mod prompt;
pub mod vision;

#[cfg(test)]
mod media_tests;
#[cfg(test)]
mod vision_tests;

pub use actor::{Decode, Encode, Prepare, PrepareActor};
pub use placement::{Placer, Replica};
