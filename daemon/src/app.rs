//! Start-up: load the model and tokenizer, start the actors, serve until shutdown.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use actix::{Actor, Arbiter, SyncArbiter};
use anyhow::Context as _;
use tokio::net::TcpListener;

use crate::config::Settings;
use crate::model::{load_gguf, KvBlockPool, LoadOptions, KV_ELEMENT_BYTES};
use crate::model_runner::{select_device, ModelRunner, ModelRunnerActor};
use crate::scheduler::{BlockManager, Scheduler, SchedulerActor, SchedulerLimits};
use crate::server::{serve, Engine};
use crate::tokenizer::{TextTokenizer, TokenizerActor};

/// Sets the CPU thread count of the model math: our kernels' thread team
/// ([`crate::model::team`]) and rayon's global pool (candle's CPU ops), which reads
/// `RAYON_NUM_THREADS` when first used; this must run before any model code. `0` = one
/// thread per available core.
pub fn set_compute_threads(threads: usize) -> usize {
    let n = if threads == 0 {
        std::thread::available_parallelism().map_or(1, |n| n.get())
    } else {
        threads
    };
    // Edition 2021: set_var is safe; nothing else reads the environment concurrently
    // this early in start-up.
    std::env::set_var("RAYON_NUM_THREADS", n.to_string());
    crate::model::team::set_threads(n)
}

/// Loads everything and serves until SIGINT/SIGTERM.
///
/// # Errors
/// Model or tokenizer refused, bad device, listen address unavailable.
pub fn run(settings: Settings) -> anyhow::Result<()> {
    let threads = set_compute_threads(settings.model.threads);
    let device = select_device(&settings.model.device).map_err(anyhow::Error::msg)?;
    tracing::info!(path = %settings.model.path.display(), ?device, threads, "loading model");
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
    let runner = Arc::new(Mutex::new(Some(ModelRunner::new(loaded.model, pool))));
    let system = actix::System::new();
    let result = system.block_on(async move {
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
        let scheduler = SchedulerActor::start_in_arbiter(&engine_arbiter.handle(), move |_| {
            SchedulerActor::new(
                Scheduler::new(limits, BlockManager::new(num_blocks, block_size)),
                runner_addr,
                tok_for_sched,
            )
        });
        let tok = tokenizer.clone();
        let sched_for_tok = scheduler.clone();
        let sched_for_util = scheduler.clone();
        let tokenizer_addr = SyncArbiter::start(settings.tokenizer.threads, move || {
            TokenizerActor::new(tok.clone(), sched_for_tok.clone())
        });
        let tok_util = tokenizer.clone();
        let utility_tokenizer = SyncArbiter::start(1, move || {
            TokenizerActor::new(tok_util.clone(), sched_for_util.clone())
        });
        let listener = TcpListener::bind(addr)
            .await
            .with_context(|| format!("cannot listen on {addr} (server.listen)"))?;
        let local = listener.local_addr()?;
        tracing::info!(addr = %local, "listening on ws://{local}/v1/ws");
        // A machine-readable line on stdout for scripts and tests.
        println!("inferd: listening on ws://{local}/v1/ws");
        let engine = Engine {
            tokenizer: tokenizer_addr,
            utility_tokenizer,
            scheduler,
            defaults: settings.sampling.clone(),
            vocab_size: tokenizer.vocab_size(),
            max_message_bytes: settings.server.max_message_bytes,
        };
        serve(listener, engine, crate::shutdown::signal()).await;
        tracing::info!("shutting down");
        engine_arbiter.stop();
        anyhow::Ok(())
    });
    result
}
