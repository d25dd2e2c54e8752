//! Start-up: load the model and tokenizer, start the actors, serve until shutdown.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use actix::{Actor, Arbiter, SyncArbiter};
use anyhow::Context as _;
use tokio::net::TcpListener;

use crate::config::Settings;
use crate::model::{load_gguf, KvBlockPool, LoadOptions, KV_ELEMENT_BYTES};
use crate::model_runner::{select_device, ModelRunner, ModelRunnerActor};
use crate::prefix_store::{
    DiskCounters, DiskStore, FingerprintParts, Flush, ModelFingerprint, PersistSink,
    PrefixReadActor, PrefixStoreActor,
};
use crate::sampling::wasm_plugin::actor::{PluginSetupActor, SETUP_THREADS};
use crate::sampling::wasm_plugin::{PluginRegistry, PluginVocab};
use crate::scheduler::PrefixCaching;
use crate::scheduler::{BlockManager, Scheduler, SchedulerActor, SchedulerLimits};
use crate::server::{serve, Engine};
use crate::tokenizer::{TextTokenizer, TokenizerActor};

/// Sets the CPU thread count of the model math: our kernels' thread team
/// ([`crate::model::team`]) and rayon's global pool (candle's CPU ops), which reads
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
    crate::model::team::set_threads(n)
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
    let weights = std::fs::metadata(model_path).map_or(0, |m| m.len());
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

/// Loads everything and serves until SIGINT/SIGTERM.
///
/// # Errors
/// Model or tokenizer refused, bad device, listen address unavailable.
pub fn run(settings: Settings) -> anyhow::Result<()> {
    let threads = set_compute_threads(settings.model.threads);
    let device = select_device(&settings.model.device).map_err(anyhow::Error::msg)?;
    tracing::info!(path = %settings.model.path.display(), ?device, threads, "loading model");
    crate::service::status(&format!("loading model {}", settings.model.path.display()));
    let t0 = std::time::Instant::now();
    let loaded = load_gguf(
        &settings.model.path,
        &LoadOptions {
            device,
            q4_1: settings.model.q4_1,
        },
    )
    .with_context(|| {
        format!(
            "loading model {} (model.path)",
            settings.model.path.display()
        )
    })?;
    let tokenizer = Arc::new(
        TextTokenizer::from_gguf(&loaded.metadata)
            .with_context(|| format!("tokenizer of {}", settings.model.path.display()))?,
    );
    let cfg = loaded.model.config().clone();
    if tokenizer.vocab_size() > cfg.vocab_size {
        anyhow::bail!(
            "tokenizer has {} tokens but the model's embedding has only {} rows",
            tokenizer.vocab_size(),
            cfg.vocab_size
        );
    }
    settings
        .sampling
        .check(tokenizer.vocab_size())
        .map_err(|e| anyhow::anyhow!("configuration error: sampling: {}", e.message))?;
    let context_length = match settings.model.context_length {
        0 => cfg.context_length,
        n if n > cfg.context_length => anyhow::bail!(
            "configuration error: model.context_length must be <= the model's {} tokens (got {n})",
            cfg.context_length
        ),
        n => n,
    };
    tracing::info!(
        architecture = %loaded.architecture,
        layers = cfg.n_layer,
        vocab = cfg.vocab_size,
        context_length,
        kv_bytes_per_token = cfg.kv_bytes_per_token(KV_ELEMENT_BYTES),
        load_ms = t0.elapsed().as_millis() as u64,
        "model loaded"
    );
    let addr: SocketAddr = settings
        .server
        .listen
        .parse()
        .with_context(|| format!("server.listen = \"{}\"", settings.server.listen))?;

    let cfg = loaded.model.config().clone();
    let bytes_per_token = cfg.kv_bytes_per_token(KV_ELEMENT_BYTES);
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
            "2 x {} layers x {} kv_heads x {} head_dim x {KV_ELEMENT_BYTES} bytes",
            cfg.n_layer, cfg.n_kv_head, cfg.head_dim
        ),
        kv_cache_bytes = settings.scheduler.kv_cache_bytes,
        block_size,
        num_blocks,
        tokens = num_blocks * block_size,
        "KV cache budget"
    );
    let pool = KvBlockPool::new(&cfg, block_size, num_blocks, loaded.model.device())
        .map_err(|e| anyhow::anyhow!("KV cache: {}", crate::model::candle_error_message(&e)))?;
    crate::service::status("opening the prefix store");
    let prefix = open_prefix_store(&settings, &cfg, &pool, loaded.model.device())?;
    let mut model_runner = ModelRunner::new(loaded.model, pool);
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
    let runner_persist = disk_store.as_ref().map(|(_, c)| c.clone());
    crate::service::status("loading plugins");
    let plugins = Arc::new(load_plugins(&settings, &tokenizer)?);
    let system = actix::System::new();
    let result = system.block_on(async move {
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
        let scheduler = SchedulerActor::start_in_arbiter(&engine_arbiter.handle(), move |_| {
            let mut policy = Scheduler::new(limits, BlockManager::new(num_blocks, block_size));
            if let Some(p) = prefix_caching {
                policy = policy.with_prefix_caching(p);
            }
            let actor = SchedulerActor::new(policy, runner_addr, tok_for_sched);
            match store_for_sched {
                Some(store) => actor.with_store(store),
                None => actor,
            }
        });
        let tok = tokenizer.clone();
        let sched_for_tok = scheduler.clone();
        let sched_for_util = scheduler.clone();
        let (plugins_for_setup, sched_for_setup) = (plugins.clone(), scheduler.clone());
        let plugin_setup = SyncArbiter::start(SETUP_THREADS, move || {
            PluginSetupActor::new(plugins_for_setup.clone(), sched_for_setup.clone())
        });
        let setup_for_tok = plugin_setup.clone();
        let tokenizer_addr = SyncArbiter::start(settings.tokenizer.threads, move || {
            TokenizerActor::new(tok.clone(), sched_for_tok.clone(), setup_for_tok.clone())
        });
        let tok_util = tokenizer.clone();
        let utility_tokenizer = SyncArbiter::start(1, move || {
            TokenizerActor::new(
                tok_util.clone(),
                sched_for_util.clone(),
                plugin_setup.clone(),
            )
        });
        let listener = TcpListener::bind(addr)
            .await
            .with_context(|| format!("cannot listen on {addr} (server.listen)"))?;
        let local = listener.local_addr()?;
        tracing::info!(addr = %local, "listening on ws://{local}/v1/ws");
        // A machine-readable line on stdout for scripts and tests.
        println!("inferd: listening on ws://{local}/v1/ws");
        crate::service::ready(&format!("serving on {local}"));
        let engine = Engine {
            tokenizer: tokenizer_addr,
            utility_tokenizer,
            scheduler,
            defaults: settings.sampling.clone(),
            vocab_size: tokenizer.vocab_size(),
            max_message_bytes: settings.server.max_message_bytes,
            plugins,
        };
        serve(listener, engine, crate::shutdown::signal()).await;
        tracing::info!("shutting down");
        crate::service::stopping();
        engine_arbiter.stop();
        if let Some(store) = store_addr {
            // Queued writes are handled first (the mailbox is FIFO), then sled flushes.
            if let Err(e) = store.send(Flush).await {
                tracing::error!(error = %e, "prefix store: flush at shutdown failed");
            }
        }
        anyhow::Ok(())
    });
    result
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
    cfg: &crate::model::LlamaConfig,
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
        architecture: format!(
            "llama layers={} embd={} heads={} kv_heads={} head_dim={} rope_dim={} \
             rope_theta={} rms_eps={} vocab={}",
            cfg.n_layer,
            cfg.n_embd,
            cfg.n_head,
            cfg.n_kv_head,
            cfg.head_dim,
            cfg.rope_dim,
            cfg.rope_theta,
            cfg.rms_eps,
            cfg.vocab_size
        ),
        kv_dtype: "f16",
        block_size: pool.block_size(),
        device: if device.is_cpu() { "cpu" } else { "cuda" },
        weights_policy: format!("{:?}", settings.model.q4_1),
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
fn load_plugins(settings: &Settings, tokenizer: &TextTokenizer) -> anyhow::Result<PluginRegistry> {
    let started = std::time::Instant::now();
    let vocab = Arc::new(PluginVocab::from_tokenizer(tokenizer));
    let (registry, errors) =
        PluginRegistry::load_dir(&settings.plugins.dir, vocab, settings.plugins.limits())?;
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
