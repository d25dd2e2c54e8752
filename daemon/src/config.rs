//! Daemon configuration, layered with the `config` crate:
//! built-in defaults < config file (TOML) < environment (`INFERD__SECTION__KEY`) < CLI flags.
//!
//! Every key is documented in `configs/inferd.toml`. Unknown keys and invalid values
//! stop start-up with a message naming the key.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::de::{self, Deserializer, Visitor};
use serde::{Deserialize, Serialize};

use crate::api::SamplingDefaults;
use crate::model::{Kernels, Quantize};

mod engines;
mod kv_events;
mod lora;
mod media;
mod server;
mod speculative;
pub use engines::{EngineConfig, MAX_ENGINES};
pub use kv_events::{EventEncoding, KvEventsConfig};
pub use lora::LoraConfig;
pub use media::MediaConfig;
pub use server::ServerConfig;
pub use speculative::{SpecMethod, SpeculativeConfig, MAX_NGRAM, MAX_SPEC_K};

/// `[model]`: which model to load and how.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ModelConfig {
    /// A GGUF file or a Hugging Face checkpoint directory. Relative paths resolve
    /// against the current directory; a leading `~/` (or a bare `~`) is replaced by
    /// `$HOME`.
    pub path: PathBuf,
    /// `"auto"`, `"cpu"` or `"cuda:N"`.
    pub device: String,
    /// CPU threads for the model math; 0 = one per available core.
    #[serde(deserialize_with = "whole_number")]
    pub threads: usize,
    /// Which kernels run the weight matrices (see [`Kernels`]).
    pub kernels: Kernels,
    /// Re-quantization of the weights at load (see [`Quantize`]).
    pub quantize: Quantize,
    /// Context window in tokens; 0 = the model's own (`llama.context_length`). A larger
    /// value than the model's is rejected.
    #[serde(deserialize_with = "whole_number")]
    pub context_length: usize,
    /// A Jinja chat template file used instead of the model's (vLLM's
    /// `--chat-template`, llama.cpp's `--chat-template-file`); empty = the model's own.
    /// Re-read on SIGHUP.
    pub chat_template: PathBuf,
    /// A vision projector GGUF (llama.cpp's `--mmproj` file, `general.architecture =
    /// clip`) that gives a GGUF model its vision tower; empty = none. A Hugging Face
    /// directory carries its tower itself. Same path rules as `path`.
    pub mmproj: PathBuf,
    /// Whether the model's `generation_config.json` sampling values (temperature,
    /// top-k, top-p, min-p; `do_sample: false` = greedy) replace the `[sampling]`
    /// defaults for requests that omit them (vLLM's `--generation-config auto`).
    pub generation_config: GenerationConfig,
}

/// `model.generation_config`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum GenerationConfig {
    /// The model's values, where it has them, over `[sampling]`.
    Auto,
    /// `[sampling]` only.
    Ignore,
}

impl Default for ModelConfig {
    fn default() -> Self {
        Self {
            path: PathBuf::from("models/SmolLM2-135M-Instruct.Q4_1.gguf"),
            device: "auto".into(),
            threads: 0,
            kernels: Kernels::Native,
            quantize: Quantize::None,
            context_length: 0,
            chat_template: PathBuf::new(),
            mmproj: PathBuf::new(),
            generation_config: GenerationConfig::Auto,
        }
    }
}

/// Deserializes an integer setting strictly: a whole, non-negative number (or a string
/// of digits, as environment variables arrive), never a fraction rounded silently.
fn whole_number<'de, D, T>(d: D) -> Result<T, D::Error>
where
    D: Deserializer<'de>,
    T: TryFrom<u64>,
{
    struct Whole;
    impl Visitor<'_> for Whole {
        type Value = u64;
        fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("a whole non-negative number")
        }
        fn visit_u64<E: de::Error>(self, v: u64) -> Result<u64, E> {
            Ok(v)
        }
        fn visit_i64<E: de::Error>(self, v: i64) -> Result<u64, E> {
            u64::try_from(v).map_err(|_| E::invalid_value(de::Unexpected::Signed(v), &self))
        }
        fn visit_f64<E: de::Error>(self, v: f64) -> Result<u64, E> {
            Err(E::invalid_type(de::Unexpected::Float(v), &self))
        }
        fn visit_str<E: de::Error>(self, v: &str) -> Result<u64, E> {
            v.trim()
                .parse()
                .map_err(|_| E::invalid_value(de::Unexpected::Str(v), &self))
        }
    }
    let v = d.deserialize_any(Whole)?;
    T::try_from(v).map_err(|_| de::Error::custom(format!("{v} is too large")))
}

/// [`whole_number`] for a setting that may be left out (`None`).
fn whole_number_opt<'de, D, T>(d: D) -> Result<Option<T>, D::Error>
where
    D: Deserializer<'de>,
    T: TryFrom<u64>,
{
    whole_number(d).map(Some)
}

/// Marks a deserialization message that [`Settings::load`] turns into
/// `<key> must be ...`, the form of the range checks in [`Settings::validate`].
const KEYED: &str = "must be ";

/// Deserializes a boolean setting strictly: a TOML boolean, or the string `true` or
/// `false` in any case (as environment variables arrive), never `1`, `"yes"` or `"on"`
/// (which the `config` crate would otherwise coerce).
fn strict_bool<'de, D: Deserializer<'de>>(d: D) -> Result<bool, D::Error> {
    struct Strict;
    impl Strict {
        fn reject<E: de::Error>(got: std::fmt::Arguments<'_>) -> E {
            E::custom(format!("{KEYED}true or false (got {got})"))
        }
    }
    impl<'v> Visitor<'v> for Strict {
        type Value = bool;
        fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("true or false")
        }
        fn visit_bool<E: de::Error>(self, v: bool) -> Result<bool, E> {
            Ok(v)
        }
        fn visit_i64<E: de::Error>(self, v: i64) -> Result<bool, E> {
            Err(Self::reject(format_args!("integer {v}")))
        }
        fn visit_u64<E: de::Error>(self, v: u64) -> Result<bool, E> {
            Err(Self::reject(format_args!("integer {v}")))
        }
        fn visit_i128<E: de::Error>(self, v: i128) -> Result<bool, E> {
            Err(Self::reject(format_args!("integer {v}")))
        }
        fn visit_u128<E: de::Error>(self, v: u128) -> Result<bool, E> {
            Err(Self::reject(format_args!("integer {v}")))
        }
        fn visit_f64<E: de::Error>(self, v: f64) -> Result<bool, E> {
            Err(Self::reject(format_args!("floating point {v}")))
        }
        fn visit_str<E: de::Error>(self, v: &str) -> Result<bool, E> {
            match v.to_ascii_lowercase().as_str() {
                "true" => Ok(true),
                "false" => Ok(false),
                _ => Err(Self::reject(format_args!("string {v:?}"))),
            }
        }
        fn visit_unit<E: de::Error>(self) -> Result<bool, E> {
            Err(Self::reject(format_args!("nothing")))
        }
        fn visit_seq<A: de::SeqAccess<'v>>(self, _: A) -> Result<bool, A::Error> {
            Err(Self::reject(format_args!("an array")))
        }
        fn visit_map<A: de::MapAccess<'v>>(self, _: A) -> Result<bool, A::Error> {
            Err(Self::reject(format_args!("a table")))
        }
    }
    d.deserialize_any(Strict)
}

/// Turns a `config` error into a message; one raised with [`KEYED`] by a field's
/// deserializer comes out as `<key> must be ... (got ...)`.
fn describe(e: config::ConfigError) -> String {
    if let config::ConfigError::At {
        error,
        origin,
        key: Some(key),
    } = &e
    {
        if let config::ConfigError::Message(m) = error.as_ref() {
            if m.starts_with(KEYED) {
                return match origin {
                    Some(o) => format!("{key} {m} in {o}"),
                    None => format!("{key} {m}"),
                };
            }
        }
    }
    e.to_string()
}

/// `message` with the environment variable that set the key it is about, when one of
/// `vars` did (`INFERD__SCHEDULER__FOO` for `scheduler.foo`): the `config` crate names
/// only the key, and a key that no file holds leaves the user guessing where it came from.
fn with_variable(message: String, vars: &[String]) -> String {
    let from_env = vars.iter().find(|var| {
        let Some(rest) = var.strip_prefix("INFERD__") else {
            return false;
        };
        let path: Vec<String> = rest.split("__").map(str::to_lowercase).collect();
        let dotted = path.join(".");
        match path.split_last() {
            Some((leaf, parent)) if !parent.is_empty() => {
                message.contains(&dotted)
                    || (message.contains(&format!("`{leaf}`"))
                        && message.contains(&format!("`{}`", parent.join("."))))
            }
            _ => message.contains(&format!("`{dotted}`")),
        }
    });
    match from_env {
        Some(var) => format!("{message} (set by the environment variable {var})"),
        None => message,
    }
}

/// Replaces a leading `~/` (or a bare `~`) of a path setting by `home`.
///
/// # Errors
/// The path starts with `~` and `home` is `None` (`$HOME` unset or empty).
fn expand_home(key: &str, p: &mut PathBuf, home: Option<&Path>) -> Result<(), ConfigError> {
    let rest = if p.as_os_str() == "~" {
        Path::new("")
    } else if let Ok(rest) = p.strip_prefix("~") {
        rest
    } else {
        return Ok(());
    };
    let Some(home) = home else {
        return Err(ConfigError(format!(
            "{key} starts with ~ but HOME is not set (got \"{}\")",
            p.display()
        )));
    };
    *p = if rest.as_os_str().is_empty() {
        home.to_path_buf()
    } else {
        home.join(rest)
    };
    Ok(())
}

/// `[scheduler]`: continuous batching, KV cache budget and admission bounds.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct SchedulerConfig {
    /// Sequences generating at once; more wait in the queue.
    #[serde(deserialize_with = "whole_number")]
    pub max_running: usize,
    /// Queued sequences; a request beyond this gets an `overloaded` error at once.
    #[serde(deserialize_with = "whole_number")]
    pub max_waiting: usize,
    /// Tokens per engine step (one forward pass), over all sequences: one decode token
    /// per running sequence plus prefill chunks. Longer prompts are prefilled in chunks
    /// so running streams keep flowing; smaller values lower the worst inter-token
    /// latency, larger ones the time to first token of long prompts. Must be ≥
    /// `max_running`.
    #[serde(deserialize_with = "whole_number")]
    pub max_batch_tokens: usize,
    /// Context depth (tokens) at which a chunk is halved: a chunk starting at position
    /// `p` gets `budget × E / (E + p)` tokens, keeping each step's compute (and so the
    /// pause of running streams) about constant deep into long prompts.
    #[serde(deserialize_with = "whole_number")]
    pub attention_cost_tokens: usize,
    /// KV cache budget in bytes: the block pool holds `kv_cache_bytes / (block_size ×
    /// bytes per token)` blocks, bytes per token being `2 × layers × kv_heads ×
    /// head_dim × 2` (f16 K and V).
    #[serde(deserialize_with = "whole_number")]
    pub kv_cache_bytes: u64,
    /// Tokens per KV block.
    #[serde(deserialize_with = "whole_number")]
    pub block_size: usize,
    /// Automatic prefix caching in the KV pool (the memory tier): full blocks keep
    /// their hash after use and a prompt starting with the same tokens reuses them.
    /// The disk tier (`[prefix_store]`) needs it. Strictly `true` or `false`.
    #[serde(deserialize_with = "strict_bool")]
    pub prefix_caching: bool,
}

impl Default for SchedulerConfig {
    fn default() -> Self {
        Self {
            max_running: 16,
            max_waiting: 256,
            max_batch_tokens: 512,
            attention_cost_tokens: 1024,
            kv_cache_bytes: 256 << 20,
            block_size: 16,
            prefix_caching: true,
        }
    }
}

/// `[tokenizer]`: the tokenizer actor pool.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct TokenizerConfig {
    /// Threads rendering templates and tokenizing prompts.
    #[serde(deserialize_with = "whole_number")]
    pub threads: usize,
}

impl Default for TokenizerConfig {
    fn default() -> Self {
        Self { threads: 2 }
    }
}

/// `[plugins]`: WebAssembly logits-processor and sampler plugins.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct PluginsConfig {
    /// Directory whose `*.wasm` components are loaded at start-up (relative paths are
    /// relative to the working directory; a leading `~/` or a bare `~` is replaced by
    /// `$HOME`). Missing: no plugins (a warning is logged).
    pub dir: PathBuf,
    /// Directory of compiled plugin components, reused across restarts and reloads
    /// (native code: as trusted as `dir`). Default: `prefix_store.path`'s default state
    /// directory + `/plugin-cache`; `""` compiles at every load. A leading `~/` (or a
    /// bare `~`) is replaced by `$HOME`.
    pub compile_cache: PathBuf,
    /// Wall-clock deadline of one `process`/`sample` call, milliseconds.
    #[serde(deserialize_with = "whole_number")]
    pub call_deadline_ms: u64,
    /// Wall-clock deadline of `info` (at load) and `configure` (per request), milliseconds.
    #[serde(deserialize_with = "whole_number")]
    pub configure_deadline_ms: u64,
    /// Largest linear memory of one plugin instance, bytes.
    #[serde(deserialize_with = "whole_number")]
    pub memory_bytes: u64,
    /// `log` lines kept per request and plugin; the rest are dropped and counted.
    #[serde(deserialize_with = "whole_number")]
    pub log_lines_per_request: u32,
    /// Most core instances, tables and memories one plugin instance may create (an
    /// interpreter built by componentize-py needs about 40).
    #[serde(deserialize_with = "whole_number")]
    pub instances: u32,
    /// `[plugins.limits.NAME]`: the limits of the plugin named NAME (its `info` name);
    /// each field left out takes the value above.
    pub limits: BTreeMap<String, PluginLimitOverrides>,
}

/// One `[plugins.limits.NAME]` table: any of the `[plugins]` limits, for one plugin.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct PluginLimitOverrides {
    /// `call_deadline_ms` for this plugin.
    #[serde(deserialize_with = "whole_number_opt")]
    pub call_deadline_ms: Option<u64>,
    /// `configure_deadline_ms` for this plugin.
    #[serde(deserialize_with = "whole_number_opt")]
    pub configure_deadline_ms: Option<u64>,
    /// `memory_bytes` for this plugin.
    #[serde(deserialize_with = "whole_number_opt")]
    pub memory_bytes: Option<u64>,
    /// `log_lines_per_request` for this plugin.
    #[serde(deserialize_with = "whole_number_opt")]
    pub log_lines_per_request: Option<u32>,
    /// `instances` for this plugin.
    #[serde(deserialize_with = "whole_number_opt")]
    pub instances: Option<u32>,
}

impl Default for PluginsConfig {
    fn default() -> Self {
        let d = crate::sampling::wasm_plugin::PluginLimits::default();
        Self {
            dir: PathBuf::from("target/plugins"),
            compile_cache: default_state_dir().join("plugin-cache"),
            call_deadline_ms: d.call_deadline.as_millis() as u64,
            configure_deadline_ms: d.configure_deadline.as_millis() as u64,
            memory_bytes: d.memory_bytes as u64,
            log_lines_per_request: d.log_lines_per_request,
            instances: d.instances as u32,
            limits: BTreeMap::new(),
        }
    }
}

impl PluginsConfig {
    /// The compile cache `compile_cache` names (none when it is empty).
    pub fn compile_cache(&self) -> crate::sampling::wasm_plugin::CompileCache {
        let dir = &self.compile_cache;
        crate::sampling::wasm_plugin::CompileCache::new(
            (!dir.as_os_str().is_empty()).then(|| dir.clone()),
        )
    }

    /// The sandbox limits these settings describe.
    pub fn limits(&self) -> crate::sampling::wasm_plugin::PluginLimits {
        crate::sampling::wasm_plugin::PluginLimits {
            call_deadline: std::time::Duration::from_millis(self.call_deadline_ms),
            configure_deadline: std::time::Duration::from_millis(self.configure_deadline_ms),
            memory_bytes: usize::try_from(self.memory_bytes).unwrap_or(usize::MAX),
            log_lines_per_request: self.log_lines_per_request,
            instances: self.instances as usize,
            ..Default::default()
        }
    }

    /// The limits of each plugin with a `[plugins.limits.NAME]` table, by name.
    pub fn overrides(&self) -> BTreeMap<String, crate::sampling::wasm_plugin::PluginLimits> {
        self.limits
            .iter()
            .map(|(name, o)| (name.clone(), self.with(o).limits()))
            .collect()
    }

    /// These settings with `o`'s fields in place of the global ones.
    fn with(&self, o: &PluginLimitOverrides) -> PluginsConfig {
        PluginsConfig {
            dir: self.dir.clone(),
            compile_cache: self.compile_cache.clone(),
            call_deadline_ms: o.call_deadline_ms.unwrap_or(self.call_deadline_ms),
            configure_deadline_ms: o
                .configure_deadline_ms
                .unwrap_or(self.configure_deadline_ms),
            memory_bytes: o.memory_bytes.unwrap_or(self.memory_bytes),
            log_lines_per_request: o
                .log_lines_per_request
                .unwrap_or(self.log_lines_per_request),
            instances: o.instances.unwrap_or(self.instances),
            limits: BTreeMap::new(),
        }
    }

    /// Checks every limit, `prefix` naming the table (`plugins` or
    /// `plugins.limits.NAME`).
    fn check_limits(&self, prefix: &str) -> Result<(), String> {
        if !(1..=10_000).contains(&self.call_deadline_ms) {
            return Err(format!(
                "{prefix}.call_deadline_ms must be in [1, 10000] (got {})",
                self.call_deadline_ms
            ));
        }
        if !(1..=60_000).contains(&self.configure_deadline_ms) {
            return Err(format!(
                "{prefix}.configure_deadline_ms must be in [1, 60000] (got {})",
                self.configure_deadline_ms
            ));
        }
        if !((4 << 20)..=(4u64 << 30)).contains(&self.memory_bytes) {
            return Err(format!(
                "{prefix}.memory_bytes must be in [4194304, 4294967296] (got {})",
                self.memory_bytes
            ));
        }
        if self.log_lines_per_request > 1_000_000 {
            return Err(format!(
                "{prefix}.log_lines_per_request must be in [0, 1000000] (got {})",
                self.log_lines_per_request
            ));
        }
        if !(1..=1000).contains(&self.instances) {
            return Err(format!(
                "{prefix}.instances must be in [1, 1000] (got {})",
                self.instances
            ));
        }
        Ok(())
    }
}

/// `[prefix_store]`: the disk tier of the prefix cache (sled).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct PrefixStoreConfig {
    /// Whether full KV blocks are also kept on disk, across restarts. Strictly `true` or
    /// `false`.
    #[serde(deserialize_with = "strict_bool")]
    pub enabled: bool,
    /// Directory of the sled database. Default: `$STATE_DIRECTORY/prefix-store` (set by
    /// systemd's `StateDirectory=`), else `$XDG_STATE_HOME/inferd/prefix-store`, else
    /// `~/.local/state/inferd/prefix-store`. A leading `~/` (or a bare `~`) is replaced
    /// by `$HOME`.
    pub path: PathBuf,
    /// Budget of stored entries, bytes; least recently used blocks are evicted beyond it.
    #[serde(deserialize_with = "whole_number")]
    pub max_bytes: u64,
    /// Bytes of computed blocks waiting to be written; blocks offered beyond it are
    /// not stored (the step never waits for the disk).
    #[serde(deserialize_with = "whole_number")]
    pub max_queued_bytes: u64,
}

/// The default state directory of the daemon (see [`PrefixStoreConfig::path`]).
pub fn default_state_dir() -> PathBuf {
    let env = |k: &str| {
        std::env::var_os(k)
            .filter(|v| !v.is_empty())
            .map(PathBuf::from)
    };
    if let Some(d) = env("STATE_DIRECTORY") {
        // systemd may pass several, separated by ':'; the first is ours.
        let first = d
            .to_string_lossy()
            .split(':')
            .next()
            .unwrap_or("")
            .to_string();
        return PathBuf::from(first);
    }
    if let Some(d) = env("XDG_STATE_HOME") {
        return d.join("inferd");
    }
    if let Some(h) = env("HOME") {
        return h.join(".local/state/inferd");
    }
    PathBuf::from("inferd-state")
}

impl Default for PrefixStoreConfig {
    fn default() -> Self {
        Self {
            enabled: true,
            path: default_state_dir().join("prefix-store"),
            max_bytes: 4 << 30,
            max_queued_bytes: 256 << 20,
        }
    }
}

/// `[log]`: logging.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct LogConfig {
    /// A `tracing` filter: `error`, `warn`, `info`, `debug`, `trace`, or directives
    /// such as `inferd=debug`. `RUST_LOG` overrides it when set.
    pub level: String,
}

impl Default for LogConfig {
    fn default() -> Self {
        Self {
            level: "info".into(),
        }
    }
}

/// The whole configuration.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Settings {
    /// Listener.
    pub server: ServerConfig,
    /// Model.
    pub model: ModelConfig,
    /// Scheduler bounds.
    pub scheduler: SchedulerConfig,
    /// Defaults for absent sampling fields of a request.
    pub sampling: SamplingDefaults,
    /// Tokenizer pool.
    pub tokenizer: TokenizerConfig,
    /// Wasm plugins.
    pub plugins: PluginsConfig,
    /// Disk tier of the prefix cache.
    pub prefix_store: PrefixStoreConfig,
    /// Logging.
    pub log: LogConfig,
    /// Speculative decoding.
    pub speculative: SpeculativeConfig,
    /// LoRA adapters.
    pub lora: LoraConfig,
    /// KV-cache events for routers.
    pub kv_events: KvEventsConfig,
    /// Images in chat messages: bounds and local directories.
    pub media: MediaConfig,
    /// Several engines of the model in one process (`[[engines]]`); empty: one.
    pub engines: Vec<EngineConfig>,
}

/// Whether `s` names a device the way `model.device` does: `"auto"`, `"cpu"` or
/// `"cuda:N"` (the ordinal is checked when the device opens).
pub(crate) fn is_device(s: &str) -> bool {
    s == "auto" || s == "cpu" || s.starts_with("cuda:")
}

/// Command-line overrides (the highest layer).
#[derive(Debug, Clone, Default)]
pub struct CliOverrides {
    /// `--model PATH`.
    pub model: Option<PathBuf>,
    /// `--listen ADDR`.
    pub listen: Option<String>,
    /// `--mmproj FILE`.
    pub mmproj: Option<PathBuf>,
    /// `--lora-modules NAME=PATH` (repeatable): added to `lora.adapters`.
    pub lora_modules: Vec<(String, PathBuf)>,
}

/// A configuration error: names the key (or file) and the problem.
#[derive(Debug, thiserror::Error)]
#[error("configuration error: {0}")]
pub struct ConfigError(pub String);

impl Settings {
    /// Builds the layered configuration.
    ///
    /// # Errors
    /// Unreadable or malformed file, unknown key, wrong type or out-of-range value.
    pub fn load(file: Option<&Path>, cli: &CliOverrides) -> Result<Self, ConfigError> {
        Self::load_with_env(file, cli, None)
    }

    /// [`Settings::load`] with the environment layer read from `env` (variable name to
    /// value) instead of the process environment when given.
    fn load_with_env(
        file: Option<&Path>,
        cli: &CliOverrides,
        env: Option<config::Map<String, String>>,
    ) -> Result<Self, ConfigError> {
        let defaults = config::Config::try_from(&Settings::default())
            .map_err(|e| ConfigError(format!("built-in defaults: {e}")))?;
        // The variables' names, for messages about the keys they set.
        let vars: Vec<String> = match &env {
            Some(m) => m.keys().cloned().collect(),
            None => std::env::vars().map(|(k, _)| k).collect(),
        };
        let mut builder = config::Config::builder().add_source(defaults);
        if let Some(path) = file {
            if !path.is_file() {
                return Err(ConfigError(format!(
                    "config file {} not found or not a regular file",
                    path.display()
                )));
            }
            builder = builder.add_source(config::File::from(path).format(config::FileFormat::Toml));
        }
        builder = builder.add_source(
            config::Environment::with_prefix("INFERD")
                .separator("__")
                .try_parsing(true)
                // INFERD__MEDIA__LOCAL_DIRS=/srv/a,/srv/b
                .list_separator(",")
                .with_list_parse_key("media.local_dirs")
                .source(env),
        );
        if let Some(m) = &cli.model {
            builder = builder
                .set_override("model.path", m.display().to_string())
                .map_err(|e| ConfigError(e.to_string()))?;
        }
        if let Some(m) = &cli.mmproj {
            builder = builder
                .set_override("model.mmproj", m.display().to_string())
                .map_err(|e| ConfigError(e.to_string()))?;
        }
        if let Some(l) = &cli.listen {
            builder = builder
                .set_override("server.listen", l.clone())
                .map_err(|e| ConfigError(e.to_string()))?;
        }
        let cfg = builder
            .build()
            .map_err(|e| ConfigError(with_variable(e.to_string(), &vars)))?;
        let mut settings: Settings = cfg
            .try_deserialize()
            .map_err(|e| ConfigError(with_variable(describe(e), &vars)))?;
        let mut named = std::collections::HashSet::new();
        for (name, path) in &cli.lora_modules {
            if !named.insert(name) {
                return Err(ConfigError(format!(
                    "--lora-modules: the name {} is given twice; each adapter needs its own",
                    crate::model::source::quote(name)
                )));
            }
            // A flag overrides the file's adapter of the same name, as flags do.
            settings.lora.adapters.insert(name.clone(), path.clone());
        }
        let home = std::env::var_os("HOME")
            .filter(|h| !h.is_empty())
            .map(PathBuf::from);
        settings.expand_home(home.as_deref())?;
        settings.validate()?;
        Ok(settings)
    }

    /// Replaces a leading `~/` (or a bare `~`) of every path setting by `home`.
    ///
    /// # Errors
    /// A path starts with `~` and `home` is `None`.
    pub fn expand_home(&mut self, home: Option<&Path>) -> Result<(), ConfigError> {
        expand_home("model.path", &mut self.model.path, home)?;
        if !self.model.chat_template.as_os_str().is_empty() {
            expand_home("model.chat_template", &mut self.model.chat_template, home)?;
        }
        if !self.model.mmproj.as_os_str().is_empty() {
            expand_home("model.mmproj", &mut self.model.mmproj, home)?;
        }
        expand_home("plugins.dir", &mut self.plugins.dir, home)?;
        if !self.plugins.compile_cache.as_os_str().is_empty() {
            expand_home(
                "plugins.compile_cache",
                &mut self.plugins.compile_cache,
                home,
            )?;
        }
        for (name, path) in &mut self.lora.adapters {
            expand_home(&format!("lora.adapters.{name}"), path, home)?;
        }
        for (i, dir) in self.media.local_dirs.iter_mut().enumerate() {
            expand_home(&format!("media.local_dirs[{i}]"), dir, home)?;
        }
        expand_home("prefix_store.path", &mut self.prefix_store.path, home)
    }

    /// Checks value ranges; each message names the key, the bound and the value.
    ///
    /// # Errors
    /// The first invalid value found.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let bad = |m: String| Err(ConfigError(m));
        self.server.validate().map_err(ConfigError)?;
        if self.model.path.as_os_str().is_empty() {
            return bad("model.path must not be empty".into());
        }
        if !is_device(&self.model.device) {
            return bad(format!(
                "model.device must be \"auto\", \"cpu\" or \"cuda:N\" (got \"{}\")",
                self.model.device
            ));
        }
        if self.model.threads > 1024 {
            return bad(format!(
                "model.threads must be in [0, 1024] (got {})",
                self.model.threads
            ));
        }
        if !(1..=65536).contains(&self.scheduler.max_running) {
            return bad(format!(
                "scheduler.max_running must be in [1, 65536] (got {})",
                self.scheduler.max_running
            ));
        }
        if self.scheduler.max_waiting == 0 {
            return bad("scheduler.max_waiting must be >= 1 (got 0)".into());
        }
        if !(1..=65536).contains(&self.scheduler.max_batch_tokens) {
            return bad(format!(
                "scheduler.max_batch_tokens must be in [1, 65536] (got {})",
                self.scheduler.max_batch_tokens
            ));
        }
        if self.scheduler.max_batch_tokens < self.scheduler.max_running {
            return bad(format!(
                "scheduler.max_batch_tokens must be >= scheduler.max_running = {} (got {})",
                self.scheduler.max_running, self.scheduler.max_batch_tokens
            ));
        }
        if !(1..=1024).contains(&self.scheduler.block_size) {
            return bad(format!(
                "scheduler.block_size must be in [1, 1024] tokens (got {})",
                self.scheduler.block_size
            ));
        }
        if !((1 << 20)..=(1u64 << 40)).contains(&self.scheduler.kv_cache_bytes) {
            return bad(format!(
                "scheduler.kv_cache_bytes must be in [1048576, 1099511627776] (got {})",
                self.scheduler.kv_cache_bytes
            ));
        }
        if self.scheduler.attention_cost_tokens == 0 {
            return bad("scheduler.attention_cost_tokens must be >= 1 (got 0)".into());
        }
        if self.tokenizer.threads == 0 || self.tokenizer.threads > 64 {
            return bad(format!(
                "tokenizer.threads must be in [1, 64] (got {})",
                self.tokenizer.threads
            ));
        }
        let p = &self.plugins;
        p.check_limits("plugins").map_err(ConfigError)?;
        for (name, o) in &p.limits {
            let valid = (1..=64).contains(&name.len())
                && name.bytes().all(|b| {
                    b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_' || b == b'-'
                });
            if !valid {
                return bad(format!(
                    "plugins.limits.{name}: a plugin name is 1 to 64 characters from a-z, 0-9, \
                     '_' and '-'"
                ));
            }
            p.with(o)
                .check_limits(&format!("plugins.limits.{name}"))
                .map_err(ConfigError)?;
        }
        let ps = &self.prefix_store;
        if ps.enabled && ps.path.as_os_str().is_empty() {
            return bad("prefix_store.path must not be empty".into());
        }
        if !((1 << 20)..=(1u64 << 50)).contains(&ps.max_bytes) {
            return bad(format!(
                "prefix_store.max_bytes must be in [1048576, 1125899906842624] (got {})",
                ps.max_bytes
            ));
        }
        if !((1 << 20)..=(1u64 << 40)).contains(&ps.max_queued_bytes) {
            return bad(format!(
                "prefix_store.max_queued_bytes must be in [1048576, 1099511627776] (got {})",
                ps.max_queued_bytes
            ));
        }
        self.speculative.validate()?;
        self.lora.validate()?;
        self.media.validate()?;
        self.kv_events.validate()?;
        self.validate_engines()?;
        let s = &self.sampling;
        if !(0.0..=100.0).contains(&s.temperature) {
            return bad(format!(
                "sampling.temperature must be in [0, 100] (got {})",
                s.temperature
            ));
        }
        if !(s.top_p > 0.0 && s.top_p <= 1.0) {
            return bad(format!(
                "sampling.top_p must be in (0, 1] (got {})",
                s.top_p
            ));
        }
        if !(0.0..=1.0).contains(&s.min_p) {
            return bad(format!(
                "sampling.min_p must be in [0, 1] (got {})",
                s.min_p
            ));
        }
        if s.max_tokens == 0 {
            return bad("sampling.max_tokens must be >= 1 (got 0)".into());
        }
        if self.log.level.trim().is_empty() {
            return bad("log.level must not be empty".into());
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(name: &str, text: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("inferd-config-unit-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        let p = dir.join(name);
        std::fs::write(&p, text).expect("write");
        p
    }

    #[test]
    fn shipped_config_equals_the_built_in_defaults() {
        let p = crate::test_support::workspace_root().join("configs/inferd.toml");
        let s = Settings::load(Some(&p), &CliOverrides::default()).expect("load");
        assert_eq!(s, Settings::default());
    }

    #[test]
    fn file_then_cli_layers_override_defaults() {
        let p = write(
            "layers.toml",
            "[server]\nlisten = \"127.0.0.1:9000\"\n[scheduler]\nmax_running = 3\n",
        );
        let s = Settings::load(Some(&p), &CliOverrides::default()).expect("load");
        assert_eq!(s.server.listen, "127.0.0.1:9000");
        assert_eq!(s.scheduler.max_running, 3);
        assert_eq!(s.scheduler.max_waiting, 256);
        let cli = CliOverrides {
            model: Some(PathBuf::from("/m.gguf")),
            listen: Some("127.0.0.1:1".into()),
            mmproj: Some(PathBuf::from("/mmproj.gguf")),
            lora_modules: vec![("sql".into(), PathBuf::from("/a/sql-lora"))],
        };
        let s = Settings::load(Some(&p), &cli).expect("load");
        assert_eq!(s.server.listen, "127.0.0.1:1");
        assert_eq!(s.model.path, PathBuf::from("/m.gguf"));
        assert_eq!(s.model.mmproj, PathBuf::from("/mmproj.gguf"));
        assert_eq!(
            s.lora.adapters.get("sql"),
            Some(&PathBuf::from("/a/sql-lora"))
        );
        let bad = CliOverrides {
            lora_modules: vec![("a b".into(), PathBuf::from("/x"))],
            ..CliOverrides::default()
        };
        let e = Settings::load(Some(&p), &bad).expect_err("name");
        assert!(e.0.contains("lora.adapters: lora_name must be"), "{e}");
        let twice = CliOverrides {
            lora_modules: vec![
                ("sql".into(), PathBuf::from("/a")),
                ("sql".into(), PathBuf::from("/b")),
            ],
            ..CliOverrides::default()
        };
        let e = Settings::load(Some(&p), &twice).expect_err("twice");
        assert_eq!(
            e.0,
            "--lora-modules: the name \"sql\" is given twice; each adapter needs its own"
        );
    }

    #[test]
    fn a_plugin_gets_limits_of_its_own() {
        let p = write(
            "plugin-limits.toml",
            "[plugins]\ncall_deadline_ms = 20\n[plugins.limits.py_ban]\ncall_deadline_ms = 50\n\
             memory_bytes = 268435456\ninstances = 64\n",
        );
        let s = Settings::load(Some(&p), &CliOverrides::default()).expect("load");
        let own = &s.plugins.overrides()["py_ban"];
        assert_eq!(own.call_deadline, std::time::Duration::from_millis(50));
        assert_eq!((own.memory_bytes, own.instances), (256 << 20, 64));
        // Fields left out take the [plugins] values.
        assert_eq!(
            own.configure_deadline,
            s.plugins.limits().configure_deadline
        );
        assert_eq!(
            s.plugins.limits().call_deadline,
            std::time::Duration::from_millis(20)
        );
        for (text, want) in [
            (
                "[plugins.limits.py_ban]\ncall_deadline_ms = 0\n",
                "plugins.limits.py_ban.call_deadline_ms must be in [1, 10000] (got 0)",
            ),
            (
                "[plugins.limits.py_ban]\ninstances = 5000\n",
                "plugins.limits.py_ban.instances must be in [1, 1000] (got 5000)",
            ),
            (
                "[plugins]\ninstances = 0\n",
                "plugins.instances must be in [1, 1000] (got 0)",
            ),
            (
                "[plugins.limits.Py]\ninstances = 5\n",
                "plugins.limits.Py: a plugin name is 1 to 64 characters",
            ),
            (
                "[plugins.limits.py_ban]\nmemory = 5\n",
                "unknown field `memory`",
            ),
        ] {
            let p = write("plugin-limits-bad.toml", text);
            let e = Settings::load(Some(&p), &CliOverrides::default()).expect_err(text);
            assert!(e.to_string().contains(want), "{text}: {e}");
        }
    }

    #[test]
    fn integer_settings_refuse_fractions_and_zero_queues() {
        for (text, key, want) in [
            (
                "[scheduler]\nblock_size = 16.7\n",
                "block_size",
                "floating point `16.7`",
            ),
            (
                "[scheduler]\nkv_cache_bytes = 1.5e9\n",
                "kv_cache_bytes",
                "floating point",
            ),
            (
                "[scheduler]\nmax_running = -3\n",
                "max_running",
                "integer `-3`",
            ),
            (
                "[scheduler]\nmax_waiting = 0\n",
                "max_waiting",
                "must be >= 1 (got 0)",
            ),
            (
                "[scheduler]\nmax_running = 100000\n",
                "max_running",
                "[1, 65536] (got 100000)",
            ),
            (
                "[prefix_store]\nmax_bytes = 100\n",
                "prefix_store.max_bytes",
                "[1048576, 1125899906842624] (got 100)",
            ),
            (
                "[prefix_store]\nmax_queued_bytes = 0\n",
                "prefix_store.max_queued_bytes",
                "[1048576, 1099511627776] (got 0)",
            ),
            (
                "[prefix_store]\npath = \"\"\n",
                "prefix_store.path",
                "must not be empty",
            ),
        ] {
            let p = write("whole.toml", text);
            let e = Settings::load(Some(&p), &CliOverrides::default()).expect_err(text);
            let msg = e.to_string();
            assert!(msg.contains(key) && msg.contains(want), "{text}: {msg}");
        }
        // Digits in a string (as environment variables arrive) are a number.
        let p = write("digits.toml", "[scheduler]\nblock_size = \"32\"\n");
        let s = Settings::load(Some(&p), &CliOverrides::default()).expect("digits");
        assert_eq!(s.scheduler.block_size, 32);
    }

    #[test]
    fn boolean_settings_are_strictly_true_or_false() {
        for (text, want) in [
            (
                "[prefix_store]\nenabled = 1\n",
                "prefix_store.enabled must be true or false (got integer 1)",
            ),
            (
                "[prefix_store]\nenabled = \"yes\"\n",
                "prefix_store.enabled must be true or false (got string \"yes\")",
            ),
            (
                "[scheduler]\nprefix_caching = 0\n",
                "scheduler.prefix_caching must be true or false (got integer 0)",
            ),
            (
                "[scheduler]\nprefix_caching = \"on\"\n",
                "scheduler.prefix_caching must be true or false (got string \"on\")",
            ),
            (
                "[scheduler]\nprefix_caching = 1.0\n",
                "scheduler.prefix_caching must be true or false (got floating point 1)",
            ),
        ] {
            let p = write("bool.toml", text);
            let e = Settings::load(Some(&p), &CliOverrides::default()).expect_err(text);
            assert!(e.to_string().contains(want), "{text}: {e}");
        }
        // TOML booleans, and the strings "true"/"false" in any case.
        let p = write(
            "bool-ok.toml",
            "[prefix_store]\nenabled = false\n[scheduler]\nprefix_caching = \"False\"\n",
        );
        let s = Settings::load(Some(&p), &CliOverrides::default()).expect("booleans");
        assert!(!s.prefix_store.enabled && !s.scheduler.prefix_caching);
        // Environment variables arrive as strings.
        let env = |k: &str, v: &str| Some([(k.to_string(), v.to_string())].into_iter().collect());
        for v in ["false", "FALSE"] {
            let s = Settings::load_with_env(
                None,
                &CliOverrides::default(),
                env("INFERD__PREFIX_STORE__ENABLED", v),
            )
            .expect(v);
            assert!(!s.prefix_store.enabled, "{v}");
        }
        let s = Settings::load_with_env(
            None,
            &CliOverrides::default(),
            env("INFERD__SCHEDULER__PREFIX_CACHING", "true"),
        )
        .expect("true");
        assert!(s.scheduler.prefix_caching);
        // A key or value from the environment names its variable.
        let e = Settings::load_with_env(
            None,
            &CliOverrides::default(),
            env("INFERD__SCHEDULER__FOO", "1"),
        )
        .expect_err("unknown key");
        assert!(e.to_string().contains("unknown field `foo`"), "{e}");
        assert!(
            e.to_string()
                .ends_with(" (set by the environment variable INFERD__SCHEDULER__FOO)"),
            "{e}"
        );
        for (v, got) in [
            ("1", "integer 1"),
            ("yes", "string \"yes\""),
            ("off", "string \"off\""),
        ] {
            let e = Settings::load_with_env(
                None,
                &CliOverrides::default(),
                env("INFERD__PREFIX_STORE__ENABLED", v),
            )
            .expect_err(v);
            let want = format!("prefix_store.enabled must be true or false (got {got})");
            assert!(e.to_string().contains(&want), "{v}: {e}");
        }
    }

    #[test]
    fn media_local_dirs_from_the_environment_and_with_a_tilde() {
        let env = Some(
            [(
                "INFERD__MEDIA__LOCAL_DIRS".to_string(),
                "/srv/a,/srv/b".to_string(),
            )]
            .into_iter()
            .collect(),
        );
        let s = Settings::load_with_env(None, &CliOverrides::default(), env).expect("list");
        assert_eq!(
            s.media.local_dirs,
            [PathBuf::from("/srv/a"), PathBuf::from("/srv/b")]
        );
        let mut s = Settings::default();
        s.media.local_dirs = vec!["~/imgs".into()];
        s.expand_home(Some(Path::new("/home/someone")))
            .expect("home");
        assert_eq!(s.media.local_dirs, [PathBuf::from("/home/someone/imgs")]);
        assert!(s.validate().is_ok());
    }

    #[test]
    fn leading_tilde_of_paths_is_the_home_directory() {
        let home = Path::new("/home/someone");
        let mut s = Settings::default();
        s.model.path = PathBuf::from("~/models/m.gguf");
        s.plugins.dir = PathBuf::from("~");
        s.prefix_store.path = PathBuf::from("~other/store");
        s.expand_home(Some(home)).expect("expand");
        assert_eq!(s.model.path, PathBuf::from("/home/someone/models/m.gguf"));
        assert_eq!(s.plugins.dir, PathBuf::from("/home/someone"));
        // Only `~` and `~/`: `~user` and paths not starting with `~` stay as they are.
        assert_eq!(s.prefix_store.path, PathBuf::from("~other/store"));
        let mut s = Settings::default();
        s.prefix_store.path = PathBuf::from("/a/~/b");
        s.expand_home(Some(home)).expect("no tilde");
        assert_eq!(s.prefix_store.path, PathBuf::from("/a/~/b"));
        s.prefix_store.path = PathBuf::from("~/store");
        let e = s.expand_home(None).expect_err("no HOME");
        assert!(e.to_string().contains("prefix_store.path"), "{e}");

        // Through the layers, with the process's HOME.
        let p = write(
            "tilde.toml",
            "[model]\npath = \"~/x\"\n[plugins]\ndir = \"~/p\"\n[prefix_store]\npath = \"~/s\"\n",
        );
        match std::env::var_os("HOME").filter(|h| !h.is_empty()) {
            Some(h) => {
                let h = PathBuf::from(h);
                let s = Settings::load(Some(&p), &CliOverrides::default()).expect("load");
                assert_eq!(s.model.path, h.join("x"));
                assert_eq!(s.plugins.dir, h.join("p"));
                assert_eq!(s.prefix_store.path, h.join("s"));
                let cli = CliOverrides {
                    model: Some(PathBuf::from("~/m.gguf")),
                    listen: None,
                    mmproj: None,
                    lora_modules: Vec::new(),
                };
                let s = Settings::load(Some(&p), &cli).expect("load");
                assert_eq!(s.model.path, h.join("m.gguf"));
            }
            None => {
                let e = Settings::load(Some(&p), &CliOverrides::default()).expect_err("no HOME");
                assert!(e.to_string().contains("model.path"), "{e}");
            }
        }
    }

    #[test]
    fn unknown_keys_and_bad_values_name_the_key() {
        let p = write("unknown.toml", "[model]\npaht = \"x\"\n");
        let e = Settings::load(Some(&p), &CliOverrides::default()).expect_err("unknown key");
        assert!(e.to_string().contains("paht"), "{e}");
        let p = write("section.toml", "[modle]\npath = \"x\"\n");
        let e = Settings::load(Some(&p), &CliOverrides::default()).expect_err("unknown section");
        assert!(e.to_string().contains("modle"), "{e}");
        let p = write("type.toml", "[scheduler]\nmax_running = \"many\"\n");
        let e = Settings::load(Some(&p), &CliOverrides::default()).expect_err("bad type");
        assert!(e.to_string().contains("max_running"), "{e}");
        let p = write("range.toml", "[sampling]\nmin_p = 1.5\n");
        let e = Settings::load(Some(&p), &CliOverrides::default()).expect_err("range");
        assert!(
            e.to_string()
                .contains("sampling.min_p must be in [0, 1] (got 1.5)"),
            "{e}"
        );
        let p = write("policy.toml", "[model]\nkernels = \"fast\"\n");
        let e = Settings::load(Some(&p), &CliOverrides::default()).expect_err("enum");
        assert!(e.to_string().contains("fast"), "{e}");
        let e = Settings::load(Some(Path::new("/no/such.toml")), &CliOverrides::default())
            .expect_err("missing");
        assert!(e.to_string().contains("/no/such.toml"), "{e}");
    }
}
