//! The WebAssembly plugin host: user logits processors and samplers as sandboxed
//! components over the WIT package in `wit/plugin.wit` (`inferd:plugin@0.1.1`). This
//! module is the only place wasmtime appears.
//!
//! - Load: [`PluginRegistry::load_dir`] compiles every `*.wasm` component in
//!   `plugins.dir` once with Cranelift (or loads it from the [`CompileCache`]), checks
//!   its imports (`inferd:plugin/*`, and the WASI 0.2 interfaces of `wasi`) and its
//!   world, links it into an `InstancePre`, and reads its `info`.
//! - Per request: [`PluginRegistry::instantiate`] (called by `SamplerChain::build` on
//!   the prepare stage's plugin pool, `prepare::plugins`) builds a [`PluginChain`]: one
//!   `Store` and instance per named plugin (so plugin globals are per-request state),
//!   `configure`d with the request's JSON config and seed. Dropping the chain drops the
//!   instances.
//! - Per step: [`PluginChain::process`] runs the processors in order and applies their
//!   edits ([`apply_edit`]); [`PluginChain::sample`] asks the sampler, if any.
//!
//! Files: `registry` (load, check, link, instantiate), `compile_cache`, `wasi` (the
//! deny-by-default WASI), `instance` (one store and its exports; trap messages),
//! `chain` (the per-step calls), `host` (the `host` imports),
//! `vocab`, `limits`, `ticker` (epoch deadlines), `edit` (applying a `logits-edit`),
//! `bindings` (the generated WIT bindings).
//!
//! Sandbox (the pattern of wasmtime's `examples/component` and Spin's host): no WASI
//! for components that do not import it, a WASI that grants nothing for those that do
//! (see `wasi`); epoch interruption with a per-call deadline (one epoch tick =
//! [`EPOCH_TICK`], advanced by one ticker thread per registry while any plugin call
//! runs); a
//! [`wasmtime::ResourceLimiter`] on linear memory, table elements, instances, tables
//! and memories. A trap, a missed deadline or a limit breach becomes an
//! [`ErrorKind::PluginTrap`] error that names the plugin and the cause, and fails only
//! the request that owns the instance.

mod bindings;
mod chain;
mod compile_cache;
mod cost;
mod edit;
mod host;
mod instance;
mod limits;
mod registry;
mod ticker;
mod vocab;
mod wasi;

use std::time::Duration;

/// Special token ids for [`PluginVocab::new`].
pub use bindings::SpecialTokenIds as PluginSpecialTokens;
pub use chain::{PluginChain, StepView};
pub use compile_cache::{CacheOutcome, CompileCache};
pub use cost::PluginCostSnapshot;
pub use edit::apply_edit;
pub use limits::{PluginLimits, PluginLimitsSnapshot};
pub use registry::{LoadError, PluginRegistry};
pub use vocab::PluginVocab;
pub use wasi::{ALLOWED_INTERFACES, CLOCK_STEP_NS, VIRTUAL_EPOCH_S};

/// The WIT package (and version) this host implements.
///
/// Components built against an earlier compatible version (0.1.0) load too: wasmtime
/// resolves their `host@0.1.0` import and `…@0.1.0` export by semver.
pub const INTERFACE: &str = "inferd:plugin@0.1.1";

/// One epoch tick: the granularity of call deadlines (a deadline of `d` is enforced
/// between `d` and `d + 2 ×` this after the call starts).
pub const EPOCH_TICK: Duration = Duration::from_millis(1);

/// Which world a plugin implements.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum PluginWorld {
    /// `logits-processor-plugin`: edits logits, reading them.
    LogitsProcessor,
    /// `context-processor-plugin` (0.1.1): edits logits from the step context alone; the
    /// host does not copy the row into it. Runs among the logits processors.
    ContextProcessor,
    /// `sampler-plugin`: chooses the token.
    Sampler,
}

/// A loaded plugin as the `plugins` message lists it.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct PluginDescription {
    /// The name requests use (from the plugin's `info`).
    pub name: String,
    /// `logits-processor`, `context-processor` or `sampler`.
    pub world: PluginWorld,
    /// The plugin's own version (from `info`).
    pub version: String,
    /// The plugin's one-line description (from `info`).
    pub description: String,
    /// The WIT package the plugin was built against, e.g. `inferd:plugin@0.1.1`.
    pub interface: String,
    /// The component's file name in `plugins.dir` (not the full path: every client
    /// sees it).
    pub file: String,
    /// The sandbox limits its instances run under (`[plugins]`, or its own
    /// `[plugins.limits.NAME]` table).
    pub limits: PluginLimitsSnapshot,
    /// What it has cost since start-up.
    pub cost: PluginCostSnapshot,
}

#[cfg(test)]
mod lang_tests;
#[cfg(test)]
mod tests;
#[cfg(test)]
mod wasi_tests;
