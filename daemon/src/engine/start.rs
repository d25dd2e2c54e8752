//! Starting one engine's actors (inside the actix system) on what
//! [`super::build::load`] built: the prefix store's writer and reader, the model
//! runner, the scheduler loop on an arbiter of its own, the plugin setup pool and the
//! tokenizer pools; the result is the [`Engine`] handle the server holds.

use std::sync::{Arc, Mutex, RwLock};

use actix::{Actor, Arbiter, SyncArbiter};

use super::build::Loaded;
use super::checks::effective_sampling;
use super::{Engine, SharedPlugins};
use crate::config::Settings;
use crate::model_runner::ModelRunnerActor;
use crate::prefix_store::{PersistSink, PrefixReadActor, PrefixStoreActor};
use crate::sampling::wasm_plugin::actor::{PluginSetupActor, SETUP_THREADS};
use crate::sampling::wasm_plugin::PluginVocab;
use crate::scheduler::{BlockManager, Scheduler, SchedulerActor, SchedulerLimits, Speculation};
use crate::tokenizer::{TextTokenizer, TokenizerActor};

/// A started engine: its handle, and what shutdown and reload need besides.
pub struct Started {
    pub(crate) engine: Engine,
    pub(crate) engine_arbiter: Arbiter,
    pub(crate) store: Option<actix::Addr<PrefixStoreActor>>,
    pub(crate) vocab: Arc<PluginVocab>,
    /// The tokenizer, for chat-template overrides and generation defaults on reload.
    pub(crate) tokenizer: Arc<TextTokenizer>,
}

/// Starts the actors (inside the actix system) on what [`super::load`] built.
pub fn start(loaded: Loaded, settings: &Settings) -> Started {
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
        kv_events,
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
        if let Some((_, medium)) = &kv_events {
            policy = policy.with_kv_events(*medium);
        }
        let mut actor = SchedulerActor::new(policy, runner_addr, tok_for_sched);
        if let Some((sink, _)) = kv_events {
            actor = actor.with_kv_events(sink);
        }
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
    Started {
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
