//! The daemon's wiring: bind the listener, load and start the engine
//! ([`crate::engine`]) while probes answer, serve until a signal, reload on SIGHUP,
//! drain and flush at shutdown.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use anyhow::Context as _;
use tokio::net::TcpListener;
use tokio::signal::unix::{signal, SignalKind};

use crate::adapters::AdapterRegistry;
use crate::config::{CliOverrides, ConfigError, Settings};
use crate::engine::{
    check_sampling, effective_sampling, load_chat_template, load_plugins, Started,
};
use crate::prefix_store::Flush;
use crate::sampling::wasm_plugin::PluginRegistry;
use crate::server::{serve, ConnectionLimits, State};

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

/// Binds the listener, loads everything while `/health` and `/ready` answer, serves
/// until SIGINT/SIGTERM (SIGHUP reloads the settings, see [`reload`]), then drains
/// (see [`State::drain`]) and flushes the prefix store.
///
/// # Errors
/// Model or tokenizer refused, bad device, listen address unavailable.
pub fn run(settings: Settings, source: SettingsSource) -> anyhow::Result<()> {
    let threads = set_compute_threads(settings.model.threads);
    tracing::info!(
        threads,
        engines = settings.engines.len().max(1),
        "compute threads"
    );
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
                let _ = loaded_tx.send(crate::engine::load_all(&for_loader));
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
        // kept from the start, the loader's freed temporaries stayed resident: the 1.5B
        // model's peak RSS 1,452 -> 1,940 MiB).
        crate::allocator::release_free_memory();
        if !crate::allocator::keep_freed_buffers() {
            tracing::debug!("the allocator keeps its own buffer policy");
        }
        let running = crate::engine::start(loaded, &settings);
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
        for arbiter in &running.engine_arbiters {
            arbiter.stop();
        }
        for store in &running.stores {
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
async fn reload(source: &SettingsSource, current: &mut Settings, state: &State, running: &Started) {
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
                ("[media]", current.media != new.media),
                ("[prefix_store]", current.prefix_store != new.prefix_store),
                ("[speculative]", current.speculative != new.speculative),
                ("[[engines]]", current.engines != new.engines),
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
            applied.engines = current.engines.clone();
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
    running: &Started,
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
    let registries = running.engine.adapter_registries();
    std::thread::Builder::new()
        .name("inferd-reload".into())
        .spawn(move || {
            let plugins = load_plugins(&for_loader, vocab);
            if plugins.is_ok() {
                for adapters in &registries {
                    sync_adapters(adapters, &for_loader.lora.adapters);
                }
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
