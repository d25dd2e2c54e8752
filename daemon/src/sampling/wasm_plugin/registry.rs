//! [`PluginRegistry`]: loads, checks and links every plugin component once, and
//! instantiates a request's plugins into a [`PluginChain`].

use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use wasmtime::component::{HasSelf, Linker};
use wasmtime::{Config, Engine, Store};

use super::bindings::{
    self, ContextProcessorPluginPre, LogitsProcessorPluginPre, SamplerPluginPre, StepContext,
};
use super::chain::PluginChain;
use super::compile_cache::{CacheOutcome, CompileCache};
use super::cost::PluginCost;
use super::host::{HostState, PluginLog};
use super::instance::{Exports, PluginInstance};
use super::limits::{Limiter, PluginLimits};
use super::ticker::{ticks, ActiveCall, EpochTicker};
use super::vocab::PluginVocab;
use super::{PluginDescription, PluginWorld, INTERFACE};
use crate::error::InferError;
use crate::request::PluginSpec;

pub(super) enum Pre {
    Processor(LogitsProcessorPluginPre<HostState>),
    Context(ContextProcessorPluginPre<HostState>),
    Sampler(SamplerPluginPre<HostState>),
}

struct LoadedPlugin {
    desc: PluginDescription,
    pre: Pre,
    /// Whether the component imports WASI (then linked with the deny-by-default sandbox).
    wasi: bool,
    /// The limits its instances run under.
    limits: PluginLimits,
    /// The setting its memory limit came from (for the breach message).
    memory_setting: Arc<str>,
    cost: Arc<PluginCost>,
}

/// A plugin file that could not be loaded, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LoadError {
    /// The file.
    pub path: PathBuf,
    /// What was wrong (compile error, forbidden import, unknown world, bad `info`).
    pub reason: String,
}

impl fmt::Display for LoadError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.path.display(), self.reason)
    }
}

/// Every loaded plugin, compiled once; hands out per-request [`PluginChain`]s.
pub struct PluginRegistry {
    engine: Engine,
    plugins: BTreeMap<String, LoadedPlugin>,
    vocab: Arc<PluginVocab>,
    limits: PluginLimits,
    /// `[plugins.limits.NAME]`: limits of the plugin named NAME instead of `limits`.
    overrides: BTreeMap<String, PluginLimits>,
    /// Compiled components kept on disk (`plugins.compile_cache`).
    cache: CompileCache,
    ticker: EpochTicker,
}

impl fmt::Debug for PluginRegistry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PluginRegistry")
            .field("plugins", &self.plugins.keys().collect::<Vec<_>>())
            .field("limits", &self.limits)
            .finish_non_exhaustive()
    }
}

fn valid_name(name: &str) -> bool {
    (1..=64).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_' || b == b'-')
}

impl PluginRegistry {
    /// A registry without plugins (every request naming one gets a `validation` error).
    ///
    /// # Errors
    /// When the Wasm engine cannot be configured or the epoch thread cannot start.
    pub fn empty(vocab: Arc<PluginVocab>, limits: PluginLimits) -> anyhow::Result<Self> {
        let mut cfg = Config::new();
        cfg.wasm_component_model(true)
            .epoch_interruption(true)
            .cranelift_opt_level(wasmtime::OptLevel::Speed);
        let engine = Engine::new(&cfg)?;
        let ticker = EpochTicker::start(&engine)?;
        Ok(Self {
            engine,
            plugins: BTreeMap::new(),
            vocab,
            limits,
            overrides: BTreeMap::new(),
            cache: CompileCache::default(),
            ticker,
        })
    }

    /// Gives the plugins named in `overrides` their own limits instead of the registry's
    /// (for plugins loaded after this call).
    #[must_use]
    pub fn with_overrides(mut self, overrides: BTreeMap<String, PluginLimits>) -> Self {
        self.overrides = overrides;
        self
    }

    /// Keeps compiled components in `cache` (for plugins loaded after this call).
    #[must_use]
    pub fn with_compile_cache(mut self, cache: CompileCache) -> Self {
        self.cache = cache;
        self
    }

    /// Loads every `*.wasm` file in `dir` (sorted by file name). A missing directory
    /// loads nothing (logged as a warning). Files that fail to load are skipped and
    /// returned with the reason; the caller logs them.
    ///
    /// # Errors
    /// When the engine cannot start or `dir` exists but cannot be read.
    pub fn load_dir(
        dir: &Path,
        vocab: Arc<PluginVocab>,
        limits: PluginLimits,
    ) -> anyhow::Result<(Self, Vec<LoadError>)> {
        Self::empty(vocab, limits)?.load_all(dir)
    }

    /// [`PluginRegistry::load_dir`] on this registry (e.g. one with
    /// [`PluginRegistry::with_overrides`]).
    ///
    /// # Errors
    /// When `dir` exists but cannot be read.
    pub fn load_all(self, dir: &Path) -> anyhow::Result<(Self, Vec<LoadError>)> {
        let mut reg = self;
        if !dir.exists() {
            tracing::warn!(dir = %dir.display(), "plugins.dir does not exist; no plugins loaded");
            return Ok((reg, Vec::new()));
        }
        let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
            .map_err(|e| anyhow::anyhow!("plugins.dir {}: {e}", dir.display()))?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.extension().is_some_and(|x| x == "wasm") && p.is_file())
            .collect();
        files.sort();
        let mut errors = Vec::new();
        for path in files {
            if let Err(reason) = reg.load_file(&path) {
                errors.push(LoadError { path, reason });
            }
        }
        Ok((reg, errors))
    }

    /// Compiles and links one component file and adds it under its `info` name.
    ///
    /// # Errors
    /// A message naming what is wrong: not a component, an import other than
    /// `inferd:plugin/*`, neither world exported, an `info` that traps or gives an
    /// invalid or duplicate name.
    pub fn load_file(&mut self, path: &Path) -> Result<PluginDescription, String> {
        let started = Instant::now();
        let (component, outcome) = self.cache.load(&self.engine, path)?;
        let compile_ms = started.elapsed().as_secs_f64() * 1e3;
        let ty = component.component_type();
        let mut wasi = false;
        for (name, _) in ty.imports(&self.engine) {
            wasi |= super::wasi::check_import(name)?;
        }
        let exports: Vec<String> = ty
            .exports(&self.engine)
            .map(|(n, _)| n.to_string())
            .collect();
        let world = if exports
            .iter()
            .any(|n| n.starts_with("inferd:plugin/logits-processor@"))
        {
            PluginWorld::LogitsProcessor
        } else if exports
            .iter()
            .any(|n| n.starts_with("inferd:plugin/context-processor@"))
        {
            PluginWorld::ContextProcessor
        } else if exports
            .iter()
            .any(|n| n.starts_with("inferd:plugin/sampler@"))
        {
            PluginWorld::Sampler
        } else {
            return Err(format!(
                "exports none of inferd:plugin/logits-processor, context-processor and sampler \
                 (exports: {})",
                exports.join(", ")
            ));
        };
        let interface = exports
            .iter()
            .find_map(|n| n.split_once('@').map(|(_, v)| format!("inferd:plugin@{v}")))
            .unwrap_or_else(|| INTERFACE.to_string());
        let mut linker = Linker::<HostState>::new(&self.engine);
        bindings::processor::inferd::plugin::types::add_to_linker::<_, HasSelf<_>>(
            &mut linker,
            |s| s,
        )
        .and_then(|()| {
            bindings::processor::inferd::plugin::host::add_to_linker::<_, HasSelf<_>>(
                &mut linker,
                |s| s,
            )
        })
        .and_then(|()| {
            if wasi {
                super::wasi::link(&mut linker)
            } else {
                Ok(())
            }
        })
        .map_err(|e| format!("linking the host interface failed: {e:#}"))?;
        let instance_pre = linker
            .instantiate_pre(&component)
            .map_err(|e| format!("does not match the host's imports: {e:#}"))?;
        let pre = match world {
            PluginWorld::LogitsProcessor => Pre::Processor(
                LogitsProcessorPluginPre::new(instance_pre)
                    .map_err(|e| format!("does not match {INTERFACE} logits-processor: {e:#}"))?,
            ),
            PluginWorld::ContextProcessor => Pre::Context(
                ContextProcessorPluginPre::new(instance_pre)
                    .map_err(|e| format!("does not match {INTERFACE} context-processor: {e:#}"))?,
            ),
            PluginWorld::Sampler => Pre::Sampler(
                SamplerPluginPre::new(instance_pre)
                    .map_err(|e| format!("does not match {INTERFACE} sampler: {e:#}"))?,
            ),
        };
        // The file name only: the `plugins` reply goes to every client.
        let file = path.file_name().map_or_else(
            || path.display().to_string(),
            |n| n.to_string_lossy().into_owned(),
        );
        // The name, which may pick other limits, is known only after `info`: the probe
        // runs under the loosest of them all.
        let probe_limits =
            PluginLimits::loosest(std::iter::once(&self.limits).chain(self.overrides.values()))
                .unwrap_or_else(|| self.limits.clone());
        let probe_setting: Arc<str> = if probe_limits.memory_bytes == self.limits.memory_bytes {
            Arc::from("plugins.memory_bytes")
        } else {
            Arc::from("the largest plugins.limits.*.memory_bytes")
        };
        let cost = Arc::new(PluginCost::default());
        let info = super::wasi::off_runtime(|| {
            let mut inst = self.new_instance(
                &pre,
                wasi,
                Arc::from(file.as_str()),
                (usize::MAX, 0),
                &probe_limits,
                &probe_setting,
                &cost,
            )?;
            inst.info(probe_limits.configure_deadline)
        })
        .map_err(|e| e.message)?;
        if !valid_name(&info.name) {
            return Err(format!(
                "info.name must be 1 to 64 characters from a-z, 0-9, '_' and '-', got {:?}",
                info.name
            ));
        }
        if let Some(other) = self.plugins.get(&info.name) {
            return Err(format!(
                "plugin name {:?} is already taken by {}",
                info.name, other.desc.file
            ));
        }
        let limits = self
            .overrides
            .get(&info.name)
            .unwrap_or(&self.limits)
            .clone();
        let memory_setting: Arc<str> = if limits.memory_bytes == self.limits.memory_bytes {
            Arc::from("plugins.memory_bytes")
        } else {
            Arc::from(format!("plugins.limits.{}.memory_bytes", info.name))
        };
        let desc = PluginDescription {
            name: info.name.clone(),
            world,
            version: info.version,
            description: info.description,
            interface,
            file,
            limits: limits.snapshot(),
            cost: cost.snapshot(),
        };
        tracing::info!(
            plugin = %desc.name,
            world = ?desc.world,
            version = %desc.version,
            file = %desc.file,
            wasi,
            compiled = outcome == CacheOutcome::Compiled,
            load_ms = format!("{compile_ms:.0}"),
            "plugin loaded"
        );
        self.plugins.insert(
            info.name,
            LoadedPlugin {
                desc: desc.clone(),
                pre,
                wasi,
                limits,
                memory_setting,
                cost,
            },
        );
        Ok(desc)
    }

    /// The loaded plugins, by name, with their cost so far.
    pub fn list(&self) -> Vec<PluginDescription> {
        self.plugins
            .values()
            .map(|p| PluginDescription {
                cost: p.cost.snapshot(),
                ..p.desc.clone()
            })
            .collect()
    }

    /// The sandbox limits of plugins without their own `[plugins.limits.NAME]`.
    pub fn limits(&self) -> &PluginLimits {
        &self.limits
    }

    /// Vocabulary size plugins see (the logits row length they must handle).
    pub fn vocab_size(&self) -> usize {
        self.vocab.len()
    }

    /// A new instance of `pre` in a store of its own. `(index, seed)`: its place in the
    /// request's list (`usize::MAX` for the load-time probe) and the request's seed, which
    /// seeds its WASI random sources (mixed with `index`).
    #[allow(clippy::too_many_arguments)]
    fn new_instance(
        &self,
        pre: &Pre,
        wasi: bool,
        label: Arc<str>,
        (index, seed): (usize, u64),
        limits: &PluginLimits,
        memory_setting: &Arc<str>,
        cost: &Arc<PluginCost>,
    ) -> Result<PluginInstance, InferError> {
        let log = Arc::new(Mutex::new(PluginLog {
            label: label.clone(),
            left: limits.log_lines_per_request,
            dropped: 0,
        }));
        let wasi_seed = seed ^ (index as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        let state = HostState {
            vocab: self.vocab.clone(),
            limiter: Limiter {
                memory_bytes: limits.memory_bytes,
                memory_setting: memory_setting.clone(),
                memory_peak: 0,
                table_elements: limits.table_elements,
                instances: limits.instances,
                breach: None,
            },
            wasi: super::wasi::sandbox_ctx(wasi_seed, &log),
            log,
        };
        let mut store = Store::new(&self.engine, state);
        store.limiter(|s| &mut s.limiter);
        store.epoch_deadline_trap();
        store.set_epoch_deadline(ticks(limits.configure_deadline));
        let call = ActiveCall::start(&self.ticker.shared);
        let started = Instant::now();
        let exports = match pre {
            Pre::Processor(p) => p.instantiate(&mut store).map(Exports::Processor),
            Pre::Context(p) => p.instantiate(&mut store).map(Exports::Context),
            Pre::Sampler(p) => p.instantiate(&mut store).map(Exports::Sampler),
        };
        cost.instantiated(started.elapsed());
        drop(call);
        let mut inst = PluginInstance {
            label,
            index,
            store,
            exports: None,
            ticker: self.ticker.shared.clone(),
            call_deadline: limits.call_deadline,
            cost: cost.clone(),
            wasi,
        };
        match exports {
            Ok(e) => {
                inst.exports = Some(e);
                Ok(inst)
            }
            Err(e) => Err(inst.trap_error("instantiation", e, limits.configure_deadline)),
        }
    }

    /// Builds the request's plugin chain: instantiates each named plugin in its own store
    /// and calls its `configure` with the entry's JSON config and `seed`. `request` is the
    /// client's id (for log lines). `Ok(None)` when `specs` is empty.
    ///
    /// # Errors
    /// - `validation`: an unknown name (`plugins[i].name`), a sampler that is not the
    ///   last entry, or a `configure` that returned `err` (the plugin's message).
    /// - `plugin_trap`: instantiation or `configure` trapped, missed the configure
    ///   deadline or broke a limit.
    pub fn instantiate(
        &self,
        specs: &[PluginSpec],
        seed: u64,
        request: &str,
    ) -> Result<Option<PluginChain>, InferError> {
        if specs.is_empty() {
            return Ok(None);
        }
        let mut chain = PluginChain {
            processors: Vec::new(),
            sampler: None,
            step_ctx: StepContext {
                sequence_id: 0,
                position: 0,
                prompt_tokens: 0,
                generated: Vec::new(),
            },
        };
        for (i, spec) in specs.iter().enumerate() {
            let Some(plugin) = self.plugins.get(&spec.name) else {
                let loaded: Vec<&str> = self.plugins.keys().map(String::as_str).collect();
                let shown: String = spec.name.chars().take(64).collect();
                return Err(InferError::validation(format!(
                    "plugins[{i}].name: no plugin named {shown:?}{} is loaded (loaded: {})",
                    if shown.len() < spec.name.len() {
                        " (cut)"
                    } else {
                        ""
                    },
                    if loaded.is_empty() {
                        "none".to_string()
                    } else {
                        loaded.join(", ")
                    }
                )));
            };
            if plugin.desc.world == PluginWorld::Sampler && i + 1 != specs.len() {
                return Err(InferError::validation(format!(
                    "plugins[{i}]: {:?} is a sampler and must be the last entry (at most one \
                     sampler per request), but {} more follow",
                    spec.name,
                    specs.len() - i - 1
                )));
            }
            let label: Arc<str> = Arc::from(format!("{} (request {request})", spec.name));
            let setup = || {
                let mut inst = self.new_instance(
                    &plugin.pre,
                    plugin.wasi,
                    label,
                    (i, seed),
                    &plugin.limits,
                    &plugin.memory_setting,
                    &plugin.cost,
                )?;
                inst.configure(
                    &spec.config,
                    seed,
                    plugin.limits.configure_deadline,
                    &spec.name,
                )?;
                Ok::<_, InferError>(inst)
            };
            let inst = if plugin.wasi {
                super::wasi::off_runtime(setup)?
            } else {
                setup()?
            };
            match plugin.desc.world {
                PluginWorld::LogitsProcessor | PluginWorld::ContextProcessor => {
                    chain.processors.push(inst)
                }
                PluginWorld::Sampler => chain.sampler = Some(inst),
            }
        }
        Ok(Some(chain))
    }
}
