//! Loading one engine's parts on the loading thread: the model and its tokenizer, the
//! draft model, the KV pool sized from `scheduler.kv_cache_bytes`, the LoRA adapters,
//! the prefix store's disk tier and the Wasm plugins.

use std::sync::Arc;

use anyhow::Context as _;

use super::checks::{check_kv_fits_in_ram, check_sampling, load_chat_template};
use super::draft;
use crate::adapters::AdapterRegistry;
use crate::config::{Settings, SpecMethod};
use crate::kv_events::{KvEventSink, Medium};
use crate::model::lora::LoraBase;
use crate::model::{KvBlockPool, LoadOptions, MatrixPolicy, ModelFormat};
use crate::model_runner::{ModelRunner, SpecCosts};
use crate::prefix_store::{DiskCounters, DiskStore, FingerprintParts, ModelFingerprint};
use crate::sampling::wasm_plugin::{PluginRegistry, PluginVocab};
use crate::scheduler::PrefixCaching;
use crate::tokenizer::TextTokenizer;
use inferd_kernels::team::TeamRef;

/// An extra verification row's cost when it cannot be measured (a pool too small for
/// the probe): what the default model's rows cost on a 2-core CPU.
const DEFAULT_ROW_COST: f64 = 0.6;

/// Everything built on the loading thread, before the actors start.
pub struct Loaded {
    pub(super) model_runner: ModelRunner,
    pub(super) tokenizer: Arc<TextTokenizer>,
    pub(super) vocab: Arc<PluginVocab>,
    /// The plugins (`None` for every engine but the first).
    pub(super) plugins: Option<PluginRegistry>,
    pub(super) disk_store: Option<DiskTier>,
    pub(super) prefix_caching: Option<PrefixCaching>,
    pub(super) context_length: usize,
    pub(super) num_blocks: usize,
    pub(super) block_size: usize,
    pub(super) model_id: String,
    /// What speculative verification costs here (measured at start-up).
    pub(super) spec_costs: SpecCosts,
    /// The LoRA adapters (`[lora]`, `--lora-modules`), checked against the model.
    pub(super) adapters: Arc<AdapterRegistry>,
    /// The KV-cache event publisher and the medium of the KV pool (`[kv_events]`).
    pub(super) kv_events: Option<(KvEventSink, Medium)>,
    /// The compute team of this engine's kernels (`[[engines]]`; `None`: the
    /// process-wide team).
    pub(super) team: Option<TeamRef>,
    /// The prompt side of a vision-language model (`None`: text only).
    pub(super) vision: Option<crate::prepare::vision::VisionPrompt>,
}

/// Loads every engine (`[[engines]]`, or the one `[model]` describes), one after the
/// other, each on the team of threads it will run on; only the first compiles the
/// plugins (the prepare stage is shared).
///
/// # Errors
/// As [`load`], the engine named (`engines[N]`) when there are several.
pub fn load_all(settings: &Settings) -> anyhow::Result<Vec<Loaded>> {
    let all = settings.engine_settings();
    let several = all.len() > 1;
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let threads: usize = all.iter().map(|s| s.model.threads.max(1)).sum();
    if several && threads > cores {
        tracing::warn!(
            threads,
            cores,
            "the engines' compute threads exceed the available cores: they busy-wait \
             between kernels and will slow each other down; lower engines[N].threads"
        );
    }
    let mut loaded = Vec::with_capacity(all.len());
    for (i, s) in all.iter().enumerate() {
        let device = crate::model_runner::select_device(&s.model.device).map_err(|e| {
            if several {
                anyhow::anyhow!(
                    "engines[{i}].device: {}",
                    e.replacen("model.device", "", 1)
                        .trim_start_matches([':', ' ', '='])
                )
            } else {
                anyhow::Error::msg(e)
            }
        })?;
        let team = several.then(|| {
            let team = TeamRef::new(s.model.threads);
            team.use_on_this_thread();
            tracing::info!(engine = i, threads = team.threads(), device = ?device, "engine");
            team
        });
        let mut l = load(s, device, i == 0);
        if several {
            l = l.with_context(|| format!("engines[{i}]"));
        }
        let mut l = l?;
        l.team = team;
        loaded.push(l);
    }
    Ok(loaded)
}

/// Loads the model, tokenizer, KV pool, prefix store and, with `plugins`, the plugins
/// (seconds of file reading and compute; runs on a thread of its own while the
/// listener answers probes).
pub fn load(
    settings: &Settings,
    device: candle_core::Device,
    plugins: bool,
) -> anyhow::Result<Loaded> {
    tracing::info!(path = %settings.model.path.display(), ?device, "loading model");
    crate::service::status(&format!("loading model {}", settings.model.path.display()));
    let t0 = std::time::Instant::now();
    let mut loaded = crate::model::load(
        &settings.model.path,
        &LoadOptions {
            device: device.clone(),
            matrices: MatrixPolicy {
                kernels: settings.model.kernels,
                quantize: settings.model.quantize,
            },
        },
    )
    .with_context(|| {
        format!(
            "loading model {} (model.path)",
            settings.model.path.display()
        )
    })?;
    if !settings.model.mmproj.as_os_str().is_empty() {
        crate::model::attach_mmproj(&mut loaded, &settings.model.mmproj, &device).with_context(
            || {
                format!(
                    "loading vision projector {} (model.mmproj)",
                    settings.model.mmproj.display()
                )
            },
        )?;
    }
    let tokenizer = match loaded.format {
        ModelFormat::Gguf => TextTokenizer::from_gguf(&loaded.metadata),
        ModelFormat::HfDir => TextTokenizer::from_hf_dir(&loaded.path),
    };
    let mut tokenizer =
        tokenizer.with_context(|| format!("tokenizer of {}", settings.model.path.display()))?;
    let vision = match loaded.vision.take() {
        Some(v) => {
            let prompt = match &v.preprocessor {
                Some(pp) => crate::prepare::vision::VisionPrompt::from_mmproj(
                    &v.config,
                    pp,
                    &tokenizer,
                    v.tower.tokens_per_frame(),
                ),
                None => crate::prepare::vision::VisionPrompt::from_hf(
                    &loaded.path,
                    &v.config,
                    &tokenizer,
                    v.tower.tokens_per_frame(),
                ),
            }
            .map_err(|e| anyhow::anyhow!("{}: {e}", settings.model.path.display()))?;
            // A vision-language template reads each message's content as parts.
            tokenizer.set_content_parts(prompt.content_parts());
            tracing::info!(
                tokens_per_image = v.tower.tokens_per_frame(),
                "vision tower loaded"
            );
            Some((v.tower, prompt))
        }
        None => None,
    };
    let tokenizer = Arc::new(tokenizer);
    if let Some(t) = load_chat_template(&settings.model.chat_template, &tokenizer)? {
        tokenizer.set_template_override(Some(t));
    }
    let cfg = loaded.model.spec().clone();
    let kv = loaded.model.kv_layout();
    if tokenizer.vocab_size() > cfg.vocab_size {
        anyhow::bail!(
            "tokenizer has {} tokens but the model's embedding has only {} rows",
            tokenizer.vocab_size(),
            cfg.vocab_size
        );
    }
    check_sampling(settings, &tokenizer)?;
    let context_length = match settings.model.context_length {
        0 => cfg.context_length,
        n if n > cfg.context_length => anyhow::bail!(
            "configuration error: model.context_length must be <= the model's {} tokens (got {n})",
            cfg.context_length
        ),
        n => n,
    };
    tracing::info!(
        architecture = cfg.architecture.name(),
        format = ?loaded.format,
        layers = cfg.n_layer,
        vocab = cfg.vocab_size,
        context_length,
        kv_bytes_per_token = kv.bytes_per_token(),
        load_ms = t0.elapsed().as_millis() as u64,
        "model loaded"
    );
    let draft = draft::load_draft(settings, loaded.model.device(), &tokenizer)?;
    // The draft model's K/V sit in a pool of their own under the same block ids: one
    // block holds both, and the budget pays for both.
    let draft_kv = draft.as_ref().map(|d| d.model.kv_layout());
    let bytes_per_token =
        kv.bytes_per_token() + draft_kv.as_ref().map_or(0, |k| k.bytes_per_token());
    let block_size = settings.scheduler.block_size;
    let num_blocks =
        (settings.scheduler.kv_cache_bytes / (bytes_per_token * block_size) as u64) as usize;
    if num_blocks == 0 {
        anyhow::bail!(
            "scheduler.kv_cache_bytes = {} holds no block of scheduler.block_size = \
             {block_size} tokens ({bytes_per_token} bytes per token, {} bytes per block); \
             raise kv_cache_bytes or lower block_size",
            settings.scheduler.kv_cache_bytes,
            bytes_per_token * block_size
        );
    }
    if loaded.model.device().is_cpu() {
        check_kv_fits_in_ram(settings.scheduler.kv_cache_bytes, &settings.model.path)?;
    }
    tracing::info!(
        kv_bytes_per_token = bytes_per_token,
        formula = format_args!(
            "2 x {} layers x {} kv_heads x {} head_dim x {} bytes ({})",
            kv.n_layer,
            kv.n_kv_head,
            kv.head_dim,
            kv.dtype.bytes(),
            kv.dtype.name()
        ),
        kv_cache_bytes = settings.scheduler.kv_cache_bytes,
        block_size,
        num_blocks,
        tokens = num_blocks * block_size,
        "KV cache budget"
    );
    let model_id = settings
        .model
        .path
        .file_name()
        .map(|n| n.to_string_lossy().trim_end_matches(".gguf").to_owned())
        .unwrap_or_else(|| "model".into());
    let adapters = Arc::new(
        AdapterRegistry::new(
            LoraBase::of(&loaded.model),
            settings.lora.max_loras,
            settings.lora.max_rank,
        )
        .with_base_name(&model_id),
    );
    for (name, path) in &settings.lora.adapters {
        crate::service::status(&format!("loading LoRA adapter {name}"));
        let info = adapters
            .register_configured(name, path)
            .map_err(|e| anyhow::anyhow!("lora.adapters.{name}: {e}"))?;
        tracing::info!(
            adapter = %name,
            path = %path.display(),
            rank = info.rank,
            resident = info.resident,
            "LoRA adapter loaded"
        );
    }
    let pool = KvBlockPool::new(&kv, block_size, num_blocks, loaded.model.device())
        .map_err(|e| anyhow::anyhow!("KV cache: {}", crate::model::candle_error_message(&e)))?;
    crate::service::status("opening the prefix store");
    let prefix = open_prefix_store(settings, &cfg, &pool, loaded.model.device())?;
    let mut model_runner = ModelRunner::new(loaded.model, pool);
    let vision_prompt = match vision {
        Some((tower, prompt)) => {
            model_runner = model_runner.with_vision(tower);
            Some(prompt)
        }
        None => None,
    };
    let mut spec_costs = SpecCosts {
        row_cost: DEFAULT_ROW_COST,
        draft_cost: None,
    };
    if let (Some(d), Some(dkv)) = (draft, draft_kv) {
        let pool =
            KvBlockPool::new(&dkv, block_size, num_blocks, d.model.device()).map_err(|e| {
                anyhow::anyhow!("draft KV cache: {}", crate::model::candle_error_message(&e))
            })?;
        spec_costs.draft_cost = Some(d.cost);
        model_runner = model_runner.with_draft(d.model, pool);
    }
    if settings.speculative.method != SpecMethod::Off {
        crate::service::status("measuring speculative decoding costs");
        match model_runner.measure_spec_costs() {
            Ok(Some(c)) => {
                spec_costs = SpecCosts {
                    draft_cost: c.draft_cost.or(spec_costs.draft_cost),
                    ..c
                }
            }
            Ok(None) => {}
            Err(e) => anyhow::bail!(
                "measuring speculative decoding costs: {}",
                crate::model::candle_error_message(&e)
            ),
        }
        let sp = &settings.speculative;
        if sp.row_cost > 0.0 {
            spec_costs.row_cost = sp.row_cost;
        }
        if sp.draft_cost > 0.0 && spec_costs.draft_cost.is_some() {
            spec_costs.draft_cost = Some(sp.draft_cost);
        }
        if let Some(d) = spec_costs.draft_cost {
            if d + spec_costs.row_cost >= 1.0 {
                tracing::warn!(
                    draft_cost = format_args!("{d:.3}"),
                    row_cost = format_args!("{:.3}", spec_costs.row_cost),
                    "speculative decoding: a draft step plus its verification row cost a whole \
                     decode step here, so the draft model will not draft (a smaller draft \
                     model, or speculative.method = \"ngram\")"
                );
            }
        }
        tracing::info!(
            row_cost = format_args!("{:.3}", spec_costs.row_cost),
            draft_cost = format_args!("{:.3}", spec_costs.draft_cost.unwrap_or(0.0)),
            "speculative decoding: costs of a verification row and a draft step, against a decode step"
        );
    }
    let mut disk_store = None;
    let mut prefix_caching = None;
    if let Some((fingerprint, disk)) = prefix {
        let counters = disk.as_ref().map(|(_, c)| c.clone());
        prefix_caching = Some(PrefixCaching {
            fingerprint,
            disk: counters,
            block_bytes: model_runner.pool().block_bytes(),
        });
        disk_store = disk;
    }
    let kv_events = start_kv_events(settings, &mut disk_store, model_runner.model().device())?;
    let vocab = Arc::new(PluginVocab::from_vocab(tokenizer.as_ref()));
    let plugins = if plugins {
        crate::service::status("loading plugins");
        Some(load_plugins(settings, vocab.clone())?)
    } else {
        None
    };
    Ok(Loaded {
        model_runner,
        tokenizer,
        vocab,
        plugins,
        disk_store,
        prefix_caching,
        context_length,
        num_blocks,
        block_size,
        model_id,
        spec_costs,
        adapters,
        kv_events,
        team: None,
        vision: vision_prompt,
    })
}

/// Starts the KV-cache event publisher when `kv_events.enabled` (its first message is
/// `AllBlocksCleared`), then has the disk tier announce the blocks it holds.
///
/// # Errors
/// A socket cannot be bound.
fn start_kv_events(
    settings: &Settings,
    disk: &mut Option<DiskTier>,
    device: &candle_core::Device,
) -> anyhow::Result<Option<(KvEventSink, Medium)>> {
    if !settings.kv_events.enabled {
        return Ok(None);
    }
    if !settings.scheduler.prefix_caching {
        tracing::warn!(
            "kv_events.enabled with scheduler.prefix_caching = false: no block is ever \
             cached, so only AllBlocksCleared is published"
        );
    }
    let (sink, bound) = KvEventSink::start(&settings.kv_events)?;
    let replay = bound.replay_endpoint.as_deref().unwrap_or("off");
    tracing::info!(endpoint = %bound.endpoint, replay, topic = %settings.kv_events.topic, "KV-cache events");
    // Machine-readable, like the "listening on" line.
    println!("inferd: kv events on {} replay {replay}", bound.endpoint);
    if let Some((store, _)) = disk.as_mut() {
        store.with_kv_events(sink.clone(), settings.scheduler.block_size);
    }
    let medium = if device.is_cpu() {
        Medium::Cpu
    } else {
        Medium::Gpu
    };
    Ok(Some((sink, medium)))
}

/// The disk tier with its counters, when `prefix_store.enabled`.
pub(super) type DiskTier = (DiskStore, Arc<DiskCounters>);

/// The model fingerprint and, when enabled, the opened disk tier; `None` when prefix
/// caching is off (`scheduler.prefix_caching = false`).
///
/// # Errors
/// The weights file cannot be read for its fingerprint, or `prefix_store.path` is not
/// this daemon's to use ([`crate::prefix_store::StoreError::is_config_error`]: another
/// daemon's lock, a foreign directory). Other failures to open the store are logged and
/// the daemon runs with the memory tier only.
fn open_prefix_store(
    settings: &Settings,
    spec: &crate::model::ModelSpec,
    pool: &KvBlockPool,
    device: &candle_core::Device,
) -> anyhow::Result<Option<(ModelFingerprint, Option<DiskTier>)>> {
    if !settings.scheduler.prefix_caching {
        tracing::info!("prefix cache: off (scheduler.prefix_caching = false)");
        return Ok(None);
    }
    let started = std::time::Instant::now();
    let parts = FingerprintParts {
        format_version: crate::prefix_store::entry::FORMAT_VERSION,
        architecture: spec.fingerprint_text(),
        kv_dtype: pool.dtype().name(),
        block_size: pool.block_size(),
        device: if device.is_cpu() { "cpu" } else { "cuda" },
        weights_policy: format!("{:?} {:?}", settings.model.kernels, settings.model.quantize),
    };
    let mmproj = Some(settings.model.mmproj.as_path()).filter(|m| !m.as_os_str().is_empty());
    let fingerprint = ModelFingerprint::compute(&settings.model.path, mmproj, &parts)
        .with_context(|| format!("fingerprint of {}", settings.model.path.display()))?;
    if !settings.prefix_store.enabled {
        tracing::info!("prefix cache: memory tier only (prefix_store.enabled = false)");
        return Ok(Some((fingerprint, None)));
    }
    let path = &settings.prefix_store.path;
    let counters = Arc::new(DiskCounters::default());
    let store = match DiskStore::open(
        path,
        fingerprint,
        pool.block_bytes(),
        settings.prefix_store.max_bytes,
        counters.clone(),
    ) {
        Ok(store) => store,
        Err(e) if e.is_config_error() => return Err(e.into()),
        Err(e) => {
            // The file system failed (permissions, a full disk): serve without the
            // disk tier rather than not at all.
            tracing::error!(
                error = %e,
                "prefix cache: the disk tier cannot be opened; running with the memory \
                 tier only"
            );
            return Ok(Some((fingerprint, None)));
        }
    };
    tracing::info!(
        fingerprint = ?fingerprint,
        block_bytes = pool.block_bytes(),
        open_ms = started.elapsed().as_millis() as u64,
        "prefix cache: memory and disk tiers"
    );
    Ok(Some((fingerprint, Some((store, counters)))))
}

/// Compiles the plugins in `plugins.dir` (see [`PluginRegistry::load_dir`]); a file
/// that fails to load is logged as an error and skipped.
///
/// # Errors
/// When the Wasm engine cannot start or the directory exists but cannot be read.
pub(crate) fn load_plugins(
    settings: &Settings,
    vocab: Arc<PluginVocab>,
) -> anyhow::Result<PluginRegistry> {
    let started = std::time::Instant::now();
    let (registry, errors) = PluginRegistry::empty(vocab, settings.plugins.limits())?
        .with_overrides(settings.plugins.overrides())
        .with_compile_cache(settings.plugins.compile_cache())
        .load_all(&settings.plugins.dir)?;
    for e in &errors {
        tracing::error!(file = %e.path.display(), reason = %e.reason, "plugin not loaded");
    }
    tracing::info!(
        dir = %settings.plugins.dir.display(),
        loaded = registry.list().len(),
        failed = errors.len(),
        load_ms = started.elapsed().as_millis() as u64,
        "plugins"
    );
    Ok(registry)
}
