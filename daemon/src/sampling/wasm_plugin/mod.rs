//! The WebAssembly plugin host: user logits processors and samplers as sandboxed
//! components over the WIT package in `wit/plugin.wit` (`inferd:plugin@0.1.0`). This
//! module is the only place wasmtime appears.
//!
//! - Load: [`PluginRegistry::load_dir`] compiles every `*.wasm` component in
//!   `plugins.dir` once with Cranelift, checks its imports (only `inferd:plugin/*`; no
//!   WASI) and its world, links it into an `InstancePre`, and reads its `info`.
//! - Per request: [`PluginRegistry::instantiate`] (called by [`actor::PluginSetupActor`],
//!   a pool between the tokenizer and the scheduler) builds a [`PluginChain`]: one
//!   `Store` and instance per named plugin (so plugin globals are per-request state),
//!   `configure`d with the request's JSON config and seed. Dropping the chain drops the
//!   instances.
//! - Per step: [`PluginChain::process`] runs the processors in order and applies their
//!   edits ([`apply_edit`]); [`PluginChain::sample`] asks the sampler, if any.
//!
//! Sandbox (the pattern of wasmtime's `examples/component` and Spin's host): no WASI
//! at all; epoch interruption with a per-call deadline (one epoch tick =
//! [`EPOCH_TICK`], advanced by one ticker thread per registry while any plugin call
//! runs); a
//! [`wasmtime::ResourceLimiter`] on linear memory, table elements, instances, tables
//! and memories. A trap, a missed deadline or a limit breach becomes an
//! [`ErrorKind::PluginTrap`] error that names the plugin and the cause, and fails only
//! the request that owns the instance.

pub mod actor;
mod bindings;
mod edit;

use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};
use std::thread;
use std::time::Duration;

use wasmtime::component::{Component, HasSelf, Linker};
use wasmtime::{Config, Engine, ResourceLimiter, Store, Trap};

use crate::error::{ErrorKind, InferError};
use crate::request::PluginSpec;
use crate::tokenizer::TextTokenizer;

use bindings::{
    LogLevel, LogitsEdit, LogitsProcessorPlugin, LogitsProcessorPluginPre, PluginInfo,
    SamplerPlugin, SamplerPluginPre, SpecialTokenIds, StepContext, VocabBlob,
};
pub use edit::apply_edit;

/// The WIT package (and version) this host implements.
pub const INTERFACE: &str = "inferd:plugin@0.1.0";

/// One epoch tick: the granularity of call deadlines (a deadline of `d` is enforced
/// between `d` and `d + 2 ×` this after the call starts).
pub const EPOCH_TICK: Duration = Duration::from_millis(1);

/// Most `log` bytes kept per line; longer messages are cut at a character boundary.
const LOG_LINE_MAX_BYTES: usize = 1024;

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

/// Which world a plugin implements.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum PluginWorld {
    /// `logits-processor-plugin`: edits logits.
    LogitsProcessor,
    /// `sampler-plugin`: chooses the token.
    Sampler,
}

/// A loaded plugin as the `plugins` message lists it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct PluginDescription {
    /// The name requests use (from the plugin's `info`).
    pub name: String,
    /// `logits-processor` or `sampler`.
    pub world: PluginWorld,
    /// The plugin's own version (from `info`).
    pub version: String,
    /// The plugin's one-line description (from `info`).
    pub description: String,
    /// The WIT package the plugin was built against, e.g. `inferd:plugin@0.1.0`.
    pub interface: String,
    /// The component's file name in `plugins.dir` (not the full path: every client
    /// sees it).
    pub file: String,
}

/// The vocabulary as plugins see it through the `host` interface.
#[derive(Debug, Clone)]
pub struct PluginVocab {
    /// Concatenated bytes of every token in id order.
    bytes: Vec<u8>,
    /// `vocab_size + 1` offsets into `bytes`.
    offsets: Vec<u32>,
    special: SpecialTokenIds,
}

impl PluginVocab {
    /// The vocabulary of `tok`: each token's llama.cpp piece (`token_to_piece` with
    /// `special = true`: control tokens give their text), and its special ids.
    pub fn from_tokenizer(tok: &TextTokenizer) -> Self {
        let n = tok.vocab_size() as u32;
        let pieces = (0..n).map(|id| tok.token_piece(id).to_vec());
        let control = (0..n).filter(|&id| tok.is_control(id)).collect();
        Self::new(
            pieces,
            SpecialTokenIds {
                bos: tok.bos_token_id(),
                eos: tok.eos_token_id(),
                end_of_generation: tok.eog_token_ids().to_vec(),
                control,
            },
        )
    }

    /// A vocabulary from explicit token bytes (id order) and special ids (benchmarks and
    /// tests use synthetic ones).
    ///
    /// # Panics
    /// When the total byte length exceeds `u32::MAX`.
    pub fn new(tokens: impl IntoIterator<Item = Vec<u8>>, special: SpecialTokenIds) -> Self {
        let mut bytes = Vec::new();
        let mut offsets = vec![0u32];
        for t in tokens {
            bytes.extend_from_slice(&t);
            offsets.push(u32::try_from(bytes.len()).expect("vocabulary bytes fit in u32"));
        }
        Self {
            bytes,
            offsets,
            special,
        }
    }

    /// Number of tokens.
    pub fn len(&self) -> usize {
        self.offsets.len() - 1
    }

    /// Whether the vocabulary is empty.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn token(&self, id: u32) -> Option<&[u8]> {
        let i = id as usize;
        let (a, b) = (*self.offsets.get(i)?, *self.offsets.get(i + 1)?);
        Some(&self.bytes[a as usize..b as usize])
    }
}

/// Special token ids for [`PluginVocab::new`].
pub use bindings::SpecialTokenIds as PluginSpecialTokens;

/// Memory/table limits of one store, recording the first breach so a trap can be
/// reported as "broke its memory limit" rather than a bare trap.
struct Limiter {
    memory_bytes: usize,
    table_elements: usize,
    instances: usize,
    breach: Option<String>,
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
                 {desired} bytes; plugins.memory_bytes = {}",
                self.memory_bytes
            );
            self.breach.get_or_insert(msg.clone());
            return Err(wasmtime::Error::msg(msg));
        }
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

/// The data of one plugin store: what the `host` imports need.
struct HostState {
    vocab: Arc<PluginVocab>,
    limiter: Limiter,
    /// `plugin-name request-id`, for log lines.
    label: Arc<str>,
    logs_left: u32,
    logs_dropped: u32,
}

impl bindings::TypesHost for HostState {}

impl bindings::Host for HostState {
    fn vocab_size(&mut self) -> u32 {
        self.vocab.len() as u32
    }

    fn token_bytes(&mut self, token: u32) -> Option<Vec<u8>> {
        self.vocab.token(token).map(<[u8]>::to_vec)
    }

    fn vocab_bytes(&mut self) -> VocabBlob {
        VocabBlob {
            bytes: self.vocab.bytes.clone(),
            offsets: self.vocab.offsets.clone(),
        }
    }

    fn special_tokens(&mut self) -> SpecialTokenIds {
        self.vocab.special.clone()
    }

    fn log(&mut self, level: LogLevel, message: String) {
        if self.logs_left == 0 {
            self.logs_dropped += 1;
            return;
        }
        self.logs_left -= 1;
        let mut end = message.len().min(LOG_LINE_MAX_BYTES);
        while !message.is_char_boundary(end) {
            end -= 1;
        }
        let msg = &message[..end];
        let plugin = &*self.label;
        match level {
            LogLevel::Debug => tracing::debug!(plugin, "{msg}"),
            LogLevel::Info => tracing::info!(plugin, "{msg}"),
            LogLevel::Warn => tracing::warn!(plugin, "{msg}"),
            LogLevel::Error => tracing::error!(plugin, "{msg}"),
        }
    }
}

enum Pre {
    Processor(LogitsProcessorPluginPre<HostState>),
    Sampler(SamplerPluginPre<HostState>),
}

struct LoadedPlugin {
    desc: PluginDescription,
    pre: Pre,
}

/// State shared by the epoch ticker thread and the plugin calls.
#[derive(Debug, Default)]
struct TickerShared {
    stop: AtomicBool,
    /// Plugin calls running now; the ticker sleeps while there are none.
    active: AtomicUsize,
    thread: OnceLock<thread::Thread>,
}

/// Marks one plugin call as running (the ticker advances the epoch while any is).
struct ActiveCall(Arc<TickerShared>);

impl ActiveCall {
    fn start(shared: &Arc<TickerShared>) -> Self {
        if shared.active.fetch_add(1, Ordering::AcqRel) == 0 {
            if let Some(t) = shared.thread.get() {
                t.unpark();
            }
        }
        Self(shared.clone())
    }
}

impl Drop for ActiveCall {
    fn drop(&mut self) {
        self.0.active.fetch_sub(1, Ordering::AcqRel);
    }
}

/// Advances the engine's epoch every [`EPOCH_TICK`] while a plugin call runs, and
/// sleeps otherwise (an idle daemon gets no 1 kHz wake-ups); stops when dropped.
struct EpochTicker {
    shared: Arc<TickerShared>,
}

impl EpochTicker {
    fn start(engine: &Engine) -> std::io::Result<Self> {
        let shared = Arc::new(TickerShared::default());
        let (s, weak) = (shared.clone(), engine.weak());
        let handle = thread::Builder::new()
            .name("plugin-epoch".into())
            .spawn(move || {
                while !s.stop.load(Ordering::Acquire) {
                    if s.active.load(Ordering::Acquire) == 0 {
                        // Woken by the next call (`unpark`); the timeout only bounds
                        // how long a stop request waits.
                        thread::park_timeout(Duration::from_millis(100));
                        continue;
                    }
                    thread::sleep(EPOCH_TICK);
                    match weak.upgrade() {
                        Some(engine) => engine.increment_epoch(),
                        None => break,
                    }
                }
            })?;
        let _ = shared.thread.set(handle.thread().clone());
        Ok(Self { shared })
    }
}

impl Drop for EpochTicker {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::Release);
        if let Some(t) = self.shared.thread.get() {
            t.unpark();
        }
    }
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

fn ticks(d: Duration) -> u64 {
    // +1: the current tick may be about to end, so a deadline of d lasts at least d.
    d.as_nanos().div_ceil(EPOCH_TICK.as_nanos()) as u64 + 1
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
            ticker,
        })
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
        let mut reg = Self::empty(vocab, limits)?;
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
        let component =
            Component::from_file(&self.engine, path).map_err(|e| format!("not loadable: {e:#}"))?;
        let ty = component.component_type();
        for (name, _) in ty.imports(&self.engine) {
            if !name.starts_with("inferd:plugin/") {
                return Err(format!(
                    "imports `{name}`, which the sandbox does not provide (plugins may import \
                     only inferd:plugin/host and inferd:plugin/types; no WASI)"
                ));
            }
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
            .any(|n| n.starts_with("inferd:plugin/sampler@"))
        {
            PluginWorld::Sampler
        } else {
            return Err(format!(
                "exports neither inferd:plugin/logits-processor nor inferd:plugin/sampler \
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
        .map_err(|e| format!("linking the host interface failed: {e:#}"))?;
        let instance_pre = linker
            .instantiate_pre(&component)
            .map_err(|e| format!("does not match the host's imports: {e:#}"))?;
        let pre = match world {
            PluginWorld::LogitsProcessor => Pre::Processor(
                LogitsProcessorPluginPre::new(instance_pre)
                    .map_err(|e| format!("does not match {INTERFACE} logits-processor: {e:#}"))?,
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
        let mut inst = self
            .new_instance(&pre, Arc::from(file.as_str()), usize::MAX)
            .map_err(|e| e.message)?;
        let info = inst
            .info(self.limits.configure_deadline)
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
        let desc = PluginDescription {
            name: info.name.clone(),
            world,
            version: info.version,
            description: info.description,
            interface,
            file,
        };
        tracing::info!(
            plugin = %desc.name,
            world = ?desc.world,
            version = %desc.version,
            file = %desc.file,
            "plugin loaded"
        );
        self.plugins.insert(
            info.name,
            LoadedPlugin {
                desc: desc.clone(),
                pre,
            },
        );
        Ok(desc)
    }

    /// The loaded plugins, by name.
    pub fn list(&self) -> Vec<PluginDescription> {
        self.plugins.values().map(|p| p.desc.clone()).collect()
    }

    /// The sandbox limits in force.
    pub fn limits(&self) -> &PluginLimits {
        &self.limits
    }

    /// Vocabulary size plugins see (the logits row length they must handle).
    pub fn vocab_size(&self) -> usize {
        self.vocab.len()
    }

    fn new_instance(
        &self,
        pre: &Pre,
        label: Arc<str>,
        index: usize,
    ) -> Result<PluginInstance, InferError> {
        let state = HostState {
            vocab: self.vocab.clone(),
            limiter: Limiter {
                memory_bytes: self.limits.memory_bytes,
                table_elements: self.limits.table_elements,
                instances: self.limits.instances,
                breach: None,
            },
            label: label.clone(),
            logs_left: self.limits.log_lines_per_request,
            logs_dropped: 0,
        };
        let mut store = Store::new(&self.engine, state);
        store.limiter(|s| &mut s.limiter);
        store.epoch_deadline_trap();
        store.set_epoch_deadline(ticks(self.limits.configure_deadline));
        let call = ActiveCall::start(&self.ticker.shared);
        let exports = match pre {
            Pre::Processor(p) => p.instantiate(&mut store).map(Exports::Processor),
            Pre::Sampler(p) => p.instantiate(&mut store).map(Exports::Sampler),
        };
        drop(call);
        let mut inst = PluginInstance {
            label,
            index,
            store,
            exports: None,
            ticker: self.ticker.shared.clone(),
        };
        match exports {
            Ok(e) => {
                inst.exports = Some(e);
                Ok(inst)
            }
            Err(e) => Err(inst.trap_error("instantiation", e, self.limits.configure_deadline)),
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
            call_deadline: self.limits.call_deadline,
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
            let mut inst = self.new_instance(&plugin.pre, label, i)?;
            inst.configure(
                &spec.config,
                seed,
                self.limits.configure_deadline,
                &spec.name,
            )?;
            match plugin.desc.world {
                PluginWorld::LogitsProcessor => chain.processors.push(inst),
                PluginWorld::Sampler => chain.sampler = Some(inst),
            }
        }
        Ok(Some(chain))
    }
}

enum Exports {
    Processor(LogitsProcessorPlugin),
    Sampler(SamplerPlugin),
}

/// One plugin instance owned by one request.
struct PluginInstance {
    label: Arc<str>,
    /// Position in the request's `plugins` list (`usize::MAX` for the load-time probe).
    index: usize,
    store: Store<HostState>,
    exports: Option<Exports>,
    ticker: Arc<TickerShared>,
}

impl Drop for PluginInstance {
    fn drop(&mut self) {
        let dropped = self.store.data().logs_dropped;
        if dropped > 0 {
            tracing::warn!(plugin = %self.label, dropped, "plugin log lines dropped (rate limit)");
        }
    }
}

impl PluginInstance {
    fn where_(&self) -> String {
        if self.index == usize::MAX {
            format!("plugin {}", self.label)
        } else {
            format!("plugin {} (plugins[{}])", self.label, self.index)
        }
    }

    /// Maps a failed call to a `plugin_trap` error naming the plugin and the cause.
    fn trap_error(&mut self, call: &str, err: wasmtime::Error, deadline: Duration) -> InferError {
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

    fn info(&mut self, deadline: Duration) -> Result<PluginInfo, InferError> {
        self.store.set_epoch_deadline(ticks(deadline));
        let _call = ActiveCall::start(&self.ticker);
        let res = match &self.exports {
            Some(Exports::Processor(p)) => p
                .inferd_plugin_logits_processor()
                .call_info(&mut self.store),
            Some(Exports::Sampler(s)) => s.inferd_plugin_sampler().call_info(&mut self.store),
            None => return Err(InferError::internal("plugin instance without exports")),
        };
        res.map_err(|e| self.trap_error("info", e, deadline))
    }

    fn configure(
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
    processors: Vec<PluginInstance>,
    sampler: Option<PluginInstance>,
    call_deadline: Duration,
    /// Reused across steps (its `generated` list is refilled, not reallocated).
    step_ctx: StepContext,
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

    /// Runs every logits processor in request order on `logits` (`(vocab_size,)` f32),
    /// applying each edit before the next processor sees the row.
    ///
    /// # Errors
    /// `plugin_trap` naming the plugin: a trap, a missed `plugins.call_deadline_ms`, a
    /// limit breach, an `err` result, or an invalid edit (see [`apply_edit`]).
    pub fn process(&mut self, step: &StepView<'_>, logits: &mut [f32]) -> Result<(), InferError> {
        if self.processors.is_empty() {
            return Ok(());
        }
        self.fill_ctx(step);
        let deadline = self.call_deadline;
        for inst in &mut self.processors {
            inst.store.set_epoch_deadline(ticks(deadline));
            let Some(Exports::Processor(p)) = &inst.exports else {
                return Err(InferError::internal("processor instance without exports"));
            };
            let call = ActiveCall::start(&inst.ticker);
            let res = p.inferd_plugin_logits_processor().call_process(
                &mut inst.store,
                &self.step_ctx,
                logits,
            );
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
        let deadline = self.call_deadline;
        let Some(inst) = self.sampler.as_mut() else {
            return Err(InferError::internal(
                "PluginChain::sample without a sampler",
            ));
        };
        inst.store.set_epoch_deadline(ticks(deadline));
        let Some(Exports::Sampler(s)) = &inst.exports else {
            return Err(InferError::internal("sampler instance without exports"));
        };
        let call = ActiveCall::start(&inst.ticker);
        let res =
            s.inferd_plugin_sampler()
                .call_sample(&mut inst.store, &self.step_ctx, logits, random);
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

#[cfg(test)]
mod tests;
