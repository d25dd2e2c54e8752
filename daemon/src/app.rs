//! Start-up: load the model and tokenizer, start the actors, serve until shutdown.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, RwLock};

use actix::{Actor, Arbiter, SyncArbiter};
use anyhow::Context as _;
use tokio::net::TcpListener;
use tokio::signal::unix::{signal, SignalKind};

use crate::adapters::AdapterRegistry;
use crate::config::{CliOverrides, ConfigError, Settings, SpecMethod};
use crate::model::lora::LoraBase;
use crate::model::{KvBlockPool, LoadOptions, MatrixPolicy, ModelFormat};
use crate::model_runner::{select_device, ModelRunner, ModelRunnerActor, SpecCosts};
use crate::prefix_store::{
    DiskCounters, DiskStore, FingerprintParts, Flush, ModelFingerprint, PersistSink,
    PrefixReadActor, PrefixStoreActor,
};
use crate::sampling::wasm_plugin::actor::{PluginSetupActor, SETUP_THREADS};
use crate::sampling::wasm_plugin::{PluginRegistry, PluginVocab};
use crate::scheduler::PrefixCaching;
use crate::scheduler::{BlockManager, Scheduler, SchedulerActor, SchedulerLimits, Speculation};
use crate::server::{serve, ConnectionLimits, Engine, SharedPlugins, State};
use crate::tokenizer::{TextTokenizer, TokenizerActor};

mod draft;

/// An extra verification row's cost when it cannot be measured (a pool too small for
/// the probe): what the default model's rows cost on a 2-core CPU.
const DEFAULT_ROW_COST: f64 = 0.6;

/// Sets the CPU thread count of the model math: our kernels' thread team
/// ([`inferd_kernels::team`]) and rayon's global pool (candle's CPU ops), which reads
/// `RAYON_NUM_THREADS` when first used; this must run before any model code. `0` = one
/// thread per available core.
pub fn set_compute_threads(threads: usize) -> usize {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let n = if threads == 0 { cores } else { threads };
    if n > cores {
        tracing::warn!(
            threads = n,
            cores,
            "model.threads exceeds the available cores: the compute threads busy-wait \
             between kernels and will slow each other down; use 0 (one per core) or fewer"
        );
    }
    // Edition 2021: set_var is safe; nothing else reads the environment concurrently
    // this early in start-up.
    std::env::set_var("RAYON_NUM_THREADS", n.to_string());
    inferd_kernels::team::set_threads(n)
}

/// The CPU KV pool lives in RAM beside the weights: refuse a `scheduler.kv_cache_bytes`
/// larger than the machine's memory (`MemTotal` of `/proc/meminfo`) minus the model
/// file, rather than let the pool exhaust memory under load. Where `/proc/meminfo` is
/// unavailable the check is skipped.
///
/// # Errors
/// The budget exceeds the bound (the message names the setting, both figures in bytes).
fn check_kv_fits_in_ram(kv_cache_bytes: u64, model_path: &std::path::Path) -> anyhow::Result<()> {
    let Some(mem_total) = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|s| mem_total_bytes(&s))
    else {
        return Ok(());
    };
    let weights = if model_path.is_dir() {
        std::fs::read_dir(model_path).map_or(0, |d| {
            d.filter_map(|e| e.ok()?.metadata().ok())
                .map(|m| m.len())
                .sum()
        })
    } else {
        std::fs::metadata(model_path).map_or(0, |m| m.len())
    };
    let bound = mem_total.saturating_sub(weights);
    if kv_cache_bytes > bound {
        anyhow::bail!(
            "scheduler.kv_cache_bytes = {kv_cache_bytes} exceeds the memory left for the KV \
             cache on this machine: {bound} bytes (MemTotal {mem_total} bytes minus the \
             {weights}-byte model file); lower it"
        );
    }
    Ok(())
}

/// `MemTotal` in bytes from the text of `/proc/meminfo` (`MemTotal:  123 kB`).
fn mem_total_bytes(meminfo: &str) -> Option<u64> {
    let line = meminfo.lines().find(|l| l.starts_with("MemTotal:"))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    kb.checked_mul(1024)
}

/// Where the settings came from, so SIGHUP can read them again (same file, same
/// environment, same command-line flags).
#[derive(Debug, Clone, Default)]
pub struct SettingsSource {
    /// `--config FILE`.
    pub file: Option<PathBuf>,
    /// The command-line flags.
    pub cli: CliOverrides,
}

impl SettingsSource {
    /// Reads the layered settings.
    ///
    /// # Errors
    /// As [`Settings::load`].
    pub fn load(&self) -> Result<Settings, ConfigError> {
        Settings::load(self.file.as_deref(), &self.cli)
    }
}

/// Everything built on the loading thread, before the actors start.
struct Loaded {
    model_runner: ModelRunner,
    tokenizer: Arc<TextTokenizer>,
    vocab: Arc<PluginVocab>,
    plugins: PluginRegistry,
    disk_store: Option<DiskTier>,
    prefix_caching: Option<PrefixCaching>,
    context_length: usize,
    num_blocks: usize,
    block_size: usize,
    model_id: String,
    /// What speculative verification costs here (measured at start-up).
    spec_costs: SpecCosts,
    /// The LoRA adapters (`[lora]`, `--lora-modules`), checked against the model.
    adapters: Arc<AdapterRegistry>,
}

/// Loads the model, tokenizer, KV pool, prefix store and plugins (seconds of file
/// reading and compute; runs on a thread of its own while the listener answers probes).
fn load(settings: &Settings, device: candle_core::Device) -> anyhow::Result<Loaded> {
    tracing::info!(path = %settings.model.path.display(), ?device, "loading model");
    crate::service::status(&format!("loading model {}", settings.model.path.display()));
    let t0 = std::time::Instant::now();
    let loaded = crate::model::load(
        &settings.model.path,
        &LoadOptions {
            device,
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
    let tokenizer = match loaded.format {
        ModelFormat::Gguf => TextTokenizer::from_gguf(&loaded.metadata),
        ModelFormat::HfDir => TextTokenizer::from_hf_dir(&loaded.path),
    };
    let tokenizer = Arc::new(
        tokenizer.with_context(|| format!("tokenizer of {}", settings.model.path.display()))?,
    );
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
    crate::service::status("loading plugins");
    let vocab = Arc::new(PluginVocab::from_tokenizer(&tokenizer));
    let plugins = load_plugins(settings, vocab.clone())?;
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
    })
}

/// The running pipeline, as far as shutdown and reload need it.
struct Running {
    engine: Engine,
    engine_arbiter: Arbiter,
    store: Option<actix::Addr<PrefixStoreActor>>,
    vocab: Arc<PluginVocab>,
    /// The tokenizer, for chat-template overrides and generation defaults on reload.
    tokenizer: Arc<TextTokenizer>,
}

/// Reads and compiles `model.chat_template` (`None` when empty).
///
/// # Errors
/// The file is unreadable, over 1 MiB, not UTF-8, or does not compile; the message names
/// the key and the file.
fn load_chat_template(
    path: &std::path::Path,
    tokenizer: &TextTokenizer,
) -> anyhow::Result<Option<crate::tokenizer::ChatTemplate>> {
    if path.as_os_str().is_empty() {
        return Ok(None);
    }
    let what = || format!("model.chat_template = {}", path.display());
    let bytes = crate::model::source::read_bounded(path, 1 << 20).with_context(what)?;
    let source = String::from_utf8(bytes)
        .map_err(|_| anyhow::anyhow!("{}: the file is not UTF-8", what()))?;
    if source.trim().is_empty() {
        anyhow::bail!("{}: the file is empty", what());
    }
    let t = tokenizer.compile_template(&source).with_context(what)?;
    tracing::info!(file = %path.display(), "chat template: the operator's file, not the model's");
    Ok(Some(t))
}

/// Checks `[sampling]`, then the defaults with the model's `generation_config.json`
/// values over them, each error naming where the bad value came from.
///
/// # Errors
/// A default out of its bound.
fn check_sampling(settings: &Settings, tokenizer: &TextTokenizer) -> anyhow::Result<()> {
    let vocab = tokenizer.vocab_size();
    settings
        .sampling
        .check(vocab)
        .map_err(|e| anyhow::anyhow!("configuration error: sampling: {}", e.message))?;
    effective_sampling(settings, tokenizer)
        .check(vocab)
        .map_err(|e| {
            anyhow::anyhow!(
                "the model's generation_config.json: {} (model.generation_config = \"ignore\" \
             uses [sampling] alone)",
                e.message
            )
        })
}

/// `[sampling]` with the model's `generation_config.json` values over it when
/// `model.generation_config = "auto"` (`do_sample: false` means greedy, temperature 0).
fn effective_sampling(
    settings: &Settings,
    tokenizer: &TextTokenizer,
) -> crate::api::SamplingDefaults {
    let mut d = settings.sampling.clone();
    if settings.model.generation_config == crate::config::GenerationConfig::Ignore {
        return d;
    }
    let g = tokenizer.generation_defaults();
    if let Some(t) = g.temperature {
        d.temperature = t;
    }
    if let Some(k) = g.top_k {
        d.top_k = k;
    }
    if let Some(p) = g.top_p {
        d.top_p = p;
    }
    if let Some(p) = g.min_p {
        d.min_p = p;
    }
    if g.do_sample == Some(false) {
        d.temperature = 0.0;
    }
    d
}

/// Starts the actors (inside the actix system) on what [`load`] built.
fn start_actors(loaded: Loaded, settings: &Settings) -> Running {
    let Loaded {
        mut model_runner,
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
    } = loaded;
    let runner_persist = disk_store.as_ref().map(|(_, c)| c.clone());
    let store_reader = disk_store.as_ref().map(|(store, _)| store.reader());
    let store_addr = disk_store.map(|(store, counters)| {
        let slot = Arc::new(Mutex::new(Some(store)));
        let counters2 = counters.clone();
        SyncArbiter::start(1, move || {
            let taken = slot.lock().ok().and_then(|mut g| g.take());
            PrefixStoreActor::new(
                taken.expect("prefix store factory called more than once"),
                counters2.clone(),
            )
        })
    });
    if let (Some(addr), Some(counters)) = (&store_addr, runner_persist) {
        model_runner = model_runner.with_persist(PersistSink {
            recipient: addr.clone().recipient(),
            counters,
            max_queued_bytes: settings.prefix_store.max_queued_bytes,
        });
    }
    let runner = Arc::new(Mutex::new(Some(model_runner)));
    let runner_addr = SyncArbiter::start(1, move || {
        let taken = runner.lock().ok().and_then(|mut g| g.take());
        // SyncArbiter calls the factory once per thread and we start exactly one.
        ModelRunnerActor::new(taken.expect("model runner factory called more than once"))
    });
    let limits = SchedulerLimits {
        max_running: settings.scheduler.max_running,
        max_waiting: settings.scheduler.max_waiting,
        context_length,
        max_batch_tokens: settings.scheduler.max_batch_tokens,
        attention_cost_tokens: settings.scheduler.attention_cost_tokens,
    };
    let speculation = Speculation::from_config(&settings.speculative, spec_costs);
    let engine_arbiter = Arbiter::new();
    let tok_for_sched = tokenizer.clone();
    let store_for_sched = match (store_reader, &store_addr) {
        (Some(reader), Some(writer)) => {
            let writer = writer.clone();
            Some(SyncArbiter::start(1, move || {
                PrefixReadActor::new(reader.clone(), writer.clone())
            }))
        }
        _ => None,
    };
    let adapters_for_sched = adapters.clone();
    let scheduler = SchedulerActor::start_in_arbiter(&engine_arbiter.handle(), move |_| {
        let mut policy = Scheduler::new(limits, BlockManager::new(num_blocks, block_size))
            .with_adapters(adapters_for_sched);
        if let Some(p) = prefix_caching {
            policy = policy.with_prefix_caching(p);
        }
        if let Some(spec) = speculation {
            policy = policy.with_speculation(spec);
        }
        let actor = SchedulerActor::new(policy, runner_addr, tok_for_sched);
        match store_for_sched {
            Some(store) => actor.with_store(store),
            None => actor,
        }
    });
    let plugins: SharedPlugins = Arc::new(RwLock::new(Arc::new(plugins)));
    let tok = tokenizer.clone();
    let sched_for_tok = scheduler.clone();
    let sched_for_util = scheduler.clone();
    let (plugins_for_setup, sched_for_setup) = (plugins.clone(), scheduler.clone());
    let plugin_setup = SyncArbiter::start(SETUP_THREADS, move || {
        PluginSetupActor::new(plugins_for_setup.clone(), sched_for_setup.clone())
    });
    let setup_for_tok = plugin_setup.clone();
    let grammars = Arc::new(crate::sampling::constraint::LazyCompiler::default());
    let grammars_for_util = grammars.clone();
    let tokenizer_addr = SyncArbiter::start(settings.tokenizer.threads, move || {
        TokenizerActor::new(
            tok.clone(),
            sched_for_tok.clone(),
            setup_for_tok.clone(),
            grammars.clone(),
        )
    });
    let tok_util = tokenizer.clone();
    let utility_tokenizer = SyncArbiter::start(1, move || {
        TokenizerActor::new(
            tok_util.clone(),
            sched_for_util.clone(),
            plugin_setup.clone(),
            grammars_for_util.clone(),
        )
    });
    let created = crate::server::unix_now();
    Running {
        engine: Engine {
            tokenizer: tokenizer_addr,
            utility_tokenizer,
            scheduler,
            defaults: effective_sampling(settings, &tokenizer),
            vocab_size: tokenizer.vocab_size(),
            max_message_bytes: settings.server.max_message_bytes,
            plugins,
            model_id,
            created,
            adapters,
        },
        engine_arbiter,
        store: store_addr,
        vocab,
        tokenizer: tokenizer.clone(),
    }
}

/// Binds the listener, loads everything while `/health` and `/ready` answer, serves
/// until SIGINT/SIGTERM (SIGHUP reloads the settings, see [`reload`]), then drains
/// (see [`State::drain`]) and flushes the prefix store.
///
/// # Errors
/// Model or tokenizer refused, bad device, listen address unavailable.
pub fn run(settings: Settings, source: SettingsSource) -> anyhow::Result<()> {
    let threads = set_compute_threads(settings.model.threads);
    let device = select_device(&settings.model.device).map_err(anyhow::Error::msg)?;
    tracing::info!(threads, "compute threads");
    let addr: SocketAddr = settings
        .server
        .listen
        .parse()
        .with_context(|| format!("server.listen = \"{}\"", settings.server.listen))?;
    let nofile = crate::server::ensure_nofile(settings.server.max_connections)?;
    tracing::info!(
        soft = nofile.soft,
        hard = nofile.hard,
        raised_from = nofile.raised_from,
        max_connections = settings.server.max_connections,
        "open-file limit (RLIMIT_NOFILE)"
    );
    let system = actix::System::new();
    system.block_on(async move {
        let listener = TcpListener::bind(addr)
            .await
            .with_context(|| format!("cannot listen on {addr} (server.listen)"))?;
        let local = listener.local_addr()?;
        tracing::info!(addr = %local, "listening (GET /ready answers 503 until the model and the plugins are loaded)");
        // Machine-readable, like the "listening on" line once the model is loaded.
        println!("inferd: bound to {local}, loading");
        // Signals are ours from here on: SIGTERM during loading exits cleanly.
        let mut term = signal(SignalKind::terminate()).context("SIGTERM handler")?;
        let mut int = signal(SignalKind::interrupt()).context("SIGINT handler")?;
        let mut hup = signal(SignalKind::hangup()).context("SIGHUP handler")?;
        let state = State::new(settings.server.api_key.clone());
        state.set_connection_limits(ConnectionLimits::from_config(&settings.server));
        let (stop_accepting, stopped) = tokio::sync::oneshot::channel::<()>();
        let server = actix_rt::spawn(serve(listener, state.clone(), async move {
            let _ = stopped.await;
        }));

        let (loaded_tx, loaded_rx) = tokio::sync::oneshot::channel();
        let for_loader = settings.clone();
        std::thread::Builder::new()
            .name("inferd-load".into())
            .spawn(move || {
                let _ = loaded_tx.send(load(&for_loader, device));
            })
            .context("starting the loading thread")?;
        tokio::pin!(loaded_rx);
        let loaded = loop {
            tokio::select! {
                r = &mut loaded_rx => break r.context("the loading thread died")??,
                _ = term.recv() => { tracing::info!("SIGTERM while loading: exiting"); return Ok(()); }
                _ = int.recv() => { tracing::info!("SIGINT while loading: exiting"); return Ok(()); }
                _ = hup.recv() => tracing::warn!("SIGHUP while loading: ignored (reload once ready)"),
            }
        };
        // Loading's temporaries (tensor bytes read, then repacked) are freed now: hand
        // them back, then keep the forward passes' buffers (allocator::keep_freed_buffers;
        // set before loading, it kept the loader's freed pages resident: Gemma 3 270M's
        // peak RSS 575 -> 731 MiB).
        crate::allocator::release_free_memory();
        if !crate::allocator::keep_freed_buffers() {
            tracing::debug!("the allocator keeps its own buffer policy");
        }
        let running = start_actors(loaded, &settings);
        state.set_engine(running.engine.clone());
        tracing::info!(addr = %local, "serving on http://{local} (WebSocket ws://{local}/v1/ws)");
        // A machine-readable line on stdout for scripts and tests: the daemon serves.
        println!("inferd: listening on ws://{local}/v1/ws");
        let serving = format!("serving on {local}");
        crate::service::ready(&serving);

        let mut current = settings;
        loop {
            tokio::select! {
                _ = term.recv() => break,
                _ = int.recv() => break,
                _ = hup.recv() => {
                    crate::service::reloading();
                    reload(&source, &mut current, &state, &running).await;
                    crate::service::ready(&serving);
                }
            }
        }
        tracing::info!("shutting down");
        crate::service::stopping();
        let _ = stop_accepting.send(());
        let grace = std::time::Duration::from_secs(current.server.shutdown_grace_s);
        let hurry = async move {
            tokio::select! {
                _ = term.recv() => {}
                _ = int.recv() => {}
            }
        };
        state.drain(grace, hurry).await;
        let _ = server.await;
        running.engine_arbiter.stop();
        if let Some(store) = running.store {
            // Queued writes are handled first (the mailbox is FIFO), then sled flushes.
            if let Err(e) = store.send(Flush).await {
                tracing::error!(error = %e, "prefix store: flush at shutdown failed");
            }
        }
        tracing::info!("stopped");
        anyhow::Ok(())
    })
}

/// SIGHUP: reads the settings again and applies what can change while running
/// (`server.api_key`, `server.max_message_bytes`, `server.shutdown_grace_s`,
/// `server.max_connections`, `server.header_timeout_ms`,
/// `[sampling]`, `[plugins]` with the plugin directory compiled again, `log.level`).
/// Streams in flight are untouched (a request keeps the plugins it was set up with).
/// Changes to other settings are logged as needing a restart and not applied. An
/// invalid file, value or plugin directory rejects the whole reload: the running
/// configuration stays.
async fn reload(source: &SettingsSource, current: &mut Settings, state: &State, running: &Running) {
    tracing::info!("SIGHUP: reloading the configuration");
    match try_reload(source, current, running).await {
        Ok((new, plugins, template)) => {
            let restart: Vec<&str> = [
                ("server.listen", current.server.listen != new.server.listen),
                ("[model]", {
                    // model.chat_template is applied without a restart.
                    let mut m = new.model.clone();
                    m.chat_template = current.model.chat_template.clone();
                    current.model != m
                }),
                ("[scheduler]", current.scheduler != new.scheduler),
                ("[tokenizer]", current.tokenizer != new.tokenizer),
                ("[prefix_store]", current.prefix_store != new.prefix_store),
                ("[speculative]", current.speculative != new.speculative),
                (
                    "lora.max_loras, lora.max_rank",
                    (current.lora.max_loras, current.lora.max_rank)
                        != (new.lora.max_loras, new.lora.max_rank),
                ),
            ]
            .into_iter()
            .filter_map(|(name, changed)| changed.then_some(name))
            .collect();
            if !restart.is_empty() {
                tracing::warn!(
                    settings = %restart.join(", "),
                    "reload: these settings changed but take effect only after a restart"
                );
            }
            let loaded = plugins.list().len();
            if let Ok(mut p) = running.engine.plugins.write() {
                *p = Arc::new(plugins);
            }
            running.tokenizer.set_template_override(template);
            let mut for_defaults = new.clone();
            for_defaults.model.generation_config = current.model.generation_config;
            state.reconfigure(
                new.server.api_key.clone(),
                effective_sampling(&for_defaults, &running.tokenizer),
                new.server.max_message_bytes,
            );
            state.set_connection_limits(ConnectionLimits::from_config(&new.server));
            if let Ok(false) = crate::telemetry::set_level(&new.log.level) {
                tracing::info!("reload: RUST_LOG is set and governs the log level");
            }
            let mut applied = new;
            applied.server.listen = current.server.listen.clone();
            applied.model = crate::config::ModelConfig {
                chat_template: applied.model.chat_template.clone(),
                ..current.model.clone()
            };
            applied.scheduler = current.scheduler.clone();
            applied.tokenizer = current.tokenizer.clone();
            applied.prefix_store = current.prefix_store.clone();
            *current = applied;
            tracing::info!(plugins = loaded, "reload: configuration applied");
        }
        Err(e) => tracing::error!(
            error = %format!("{e:#}"),
            "reload rejected; the running configuration stays"
        ),
    }
}

/// The checked new settings, the freshly compiled plugin directory and chat template.
async fn try_reload(
    source: &SettingsSource,
    current: &Settings,
    running: &Running,
) -> anyhow::Result<(
    Settings,
    PluginRegistry,
    Option<crate::tokenizer::ChatTemplate>,
)> {
    let new = source.load()?;
    crate::server::ensure_nofile(new.server.max_connections)?;
    let template = load_chat_template(&new.model.chat_template, &running.tokenizer)?;
    let mut for_defaults = new.clone();
    for_defaults.model.generation_config = current.model.generation_config;
    check_sampling(&for_defaults, &running.tokenizer)?;
    crate::telemetry::check_level(&new.log.level)
        .map_err(|e| anyhow::anyhow!("configuration error: {e}"))?;
    if new.server.listen != current.server.listen {
        // The running listener's address is what matters for the API-key rule.
        let mut check = new.clone();
        check.server.listen = current.server.listen.clone();
        check.validate()?;
    }
    let (tx, rx) = tokio::sync::oneshot::channel();
    let (for_loader, vocab) = (new.clone(), running.vocab.clone());
    let adapters = running.engine.adapters.clone();
    std::thread::Builder::new()
        .name("inferd-reload".into())
        .spawn(move || {
            let plugins = load_plugins(&for_loader, vocab);
            if plugins.is_ok() {
                sync_adapters(&adapters, &for_loader.lora.adapters);
            }
            let _ = tx.send(plugins);
        })
        .context("starting the plugin loading thread")?;
    let plugins = rx.await.context("the plugin loading thread died")??;
    Ok((new, plugins, template))
}

/// SIGHUP's `[lora] adapters`: adapters no longer listed are unloaded (one still in
/// use stays, with a warning), new or moved ones loaded; a failure is logged and the
/// rest still apply. Adapters loaded through `POST /v1/load_lora_adapter` are left
/// alone unless the config names them.
fn sync_adapters(
    registry: &AdapterRegistry,
    wanted: &std::collections::BTreeMap<String, std::path::PathBuf>,
) {
    let configured = registry.configured();
    for name in configured.iter().filter(|n| !wanted.contains_key(*n)) {
        match registry.unregister(name) {
            Ok(()) => tracing::info!(adapter = %name, "reload: LoRA adapter unloaded"),
            Err(e) => tracing::warn!(adapter = %name, error = %e, "reload: LoRA adapter kept"),
        }
    }
    for (name, path) in wanted {
        match registry.info(name) {
            Some(i) if &i.path == path => continue,
            Some(_) => {
                if let Err(e) = registry.unregister(name) {
                    tracing::warn!(adapter = %name, error = %e, "reload: LoRA adapter kept at its old path");
                    continue;
                }
            }
            None => {}
        }
        match registry.register_configured(name, path) {
            Ok(i) => tracing::info!(adapter = %name, rank = i.rank, "reload: LoRA adapter loaded"),
            Err(e) => tracing::error!(error = %e, "reload: LoRA adapter not loaded"),
        }
    }
}

/// The disk tier with its counters, when `prefix_store.enabled`.
type DiskTier = (DiskStore, Arc<DiskCounters>);

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
    let fingerprint = ModelFingerprint::compute(&settings.model.path, &parts)
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
fn load_plugins(settings: &Settings, vocab: Arc<PluginVocab>) -> anyhow::Result<PluginRegistry> {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mem_total_parses_proc_meminfo() {
        let text = "MemTotal:       24576000 kB\nMemFree:        1000 kB\n";
        assert_eq!(mem_total_bytes(text), Some(24_576_000 * 1024));
        assert_eq!(mem_total_bytes("MemFree: 1 kB\n"), None);
        assert_eq!(mem_total_bytes("MemTotal: lots kB\n"), None);
    }

    #[test]
    fn kv_budget_beyond_ram_is_refused_with_the_setting_named() {
        let err = check_kv_fits_in_ram(1 << 40, std::path::Path::new("/nonexistent"));
        let total = std::fs::read_to_string("/proc/meminfo")
            .ok()
            .and_then(|s| mem_total_bytes(&s));
        if total.is_some_and(|t| t < 1 << 40) {
            let msg = format!("{:#}", err.expect_err("1 TiB exceeds this machine's RAM"));
            assert!(
                msg.contains("scheduler.kv_cache_bytes = 1099511627776"),
                "{msg}"
            );
            assert!(msg.contains("MemTotal"), "{msg}");
        }
        assert!(check_kv_fits_in_ram(1 << 20, std::path::Path::new("/nonexistent")).is_ok());
    }
}
