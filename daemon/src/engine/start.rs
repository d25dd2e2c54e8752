//! Starting the engines' actors (inside the actix system) on what
//! [`super::build::load_all`] built. Each engine gets its own prefix-store writer and
//! reader, model runner (on its own compute team when there are several) and
//! scheduler loop on an arbiter of its own; one prepare stage (the prepare pools and the
//! plugin setup pool) serves them all and hands each prepared request to the
//! [`Placer`]. The result is the [`Engine`] handle the server holds.

use std::sync::{Arc, Mutex, RwLock};

use actix::{Actor, Addr, Arbiter, SyncArbiter};

use super::build::Loaded;
use super::checks::effective_sampling;
use super::{Engine, SharedPlugins};
use crate::config::Settings;
use crate::model_runner::ModelRunnerActor;
use crate::prefix_store::{PersistSink, PrefixReadActor, PrefixStoreActor};
use crate::prepare::actor::PrepareShared;
use crate::prepare::media::MediaStep;
use crate::prepare::plugins::{PluginSetupActor, SETUP_THREADS};
use crate::prepare::{Placer, PrepareActor, Replica};
use crate::sampling::wasm_plugin::PluginVocab;
use crate::scheduler::{
    BlockManager, EngineLoad, Scheduler, SchedulerActor, SchedulerLimits, Speculation,
};
use crate::tokenizer::TextTokenizer;

/// Started engines: the handle, and what shutdown and reload need besides.
pub struct Started {
    pub(crate) engine: Engine,
    /// One per engine: its scheduler loop's arbiter.
    pub(crate) engine_arbiters: Vec<Arbiter>,
    /// One per engine with a disk tier: its writer.
    pub(crate) stores: Vec<Addr<PrefixStoreActor>>,
    pub(crate) vocab: Arc<PluginVocab>,
    /// The tokenizer, for chat-template overrides and generation defaults on reload.
    pub(crate) tokenizer: Arc<TextTokenizer>,
}

/// One engine's started loop, before the shared prepare stage.
struct Core {
    replica: Replica,
    arbiter: Arbiter,
    store: Option<Addr<PrefixStoreActor>>,
}

/// Starts the actors (inside the actix system) on what [`super::load_all`] built (at
/// least one engine; the first one's tokenizer and plugins serve the prepare stage).
///
/// # Panics
/// If `engines` is empty (a caller bug: `load_all` gives at least one).
pub fn start(engines: Vec<Loaded>, settings: &Settings) -> Started {
    let several = engines.len() > 1;
    let mut engines = engines.into_iter();
    let mut first = engines.next().expect("at least one engine");
    let tokenizer = first.tokenizer.clone();
    let vocab = first.vocab.clone();
    let model_id = first.model_id.clone();
    let adapters = first.adapters.clone();
    let first_vision = first.vision.take();
    let plugins = first
        .plugins
        .take()
        .expect("the first engine loads the plugins (load_all)");
    let cores: Vec<Core> = std::iter::once(first)
        .chain(engines)
        .map(|l| start_core(l, settings, &tokenizer, several))
        .collect();
    let mut replicas = Vec::with_capacity(cores.len());
    let (mut engine_arbiters, mut stores) = (Vec::new(), Vec::new());
    for c in cores {
        replicas.push(c.replica);
        engine_arbiters.push(c.arbiter);
        stores.extend(c.store);
    }
    let placer = Arc::new(Placer::new(replicas));
    let plugins: SharedPlugins = Arc::new(RwLock::new(Arc::new(plugins)));
    let grammars = Arc::new(crate::sampling::constraint::LazyCompiler::default());
    let plugin_setup = {
        let (plugins, placer, grammars) = (plugins.clone(), placer.clone(), grammars.clone());
        let vocab: Arc<dyn crate::request::Vocab> = tokenizer.clone();
        SyncArbiter::start(SETUP_THREADS, move || {
            PluginSetupActor::new(
                plugins.clone(),
                vocab.clone(),
                grammars.clone(),
                placer.clone(),
            )
        })
    };
    let shared = Arc::new(PrepareShared {
        tokenizer: tokenizer.clone(),
        model_id: model_id.clone(),
        grammars,
        media: MediaStep::new(&settings.media),
        vision: first_vision,
    });
    let new_pool = |threads: usize, images: Option<Addr<PrepareActor>>| {
        let (shared, placer, setup) = (shared.clone(), placer.clone(), plugin_setup.clone());
        SyncArbiter::start(threads, move || {
            let a = PrepareActor::new(shared.clone(), placer.clone(), setup.clone());
            match &images {
                Some(p) => a.with_image_pool(p.clone()),
                None => a,
            }
        })
    };
    // A vision-language model's image requests are decoded on a pool of their own
    // (one thread: one decoded image in memory at a time), never on the text pool.
    let image_pool = shared.vision.is_some().then(|| new_pool(1, None));
    let pool = |threads: usize| new_pool(threads, image_pool.clone());
    let prepare = pool(settings.tokenizer.threads);
    let utility = pool(1);
    let created = crate::server::unix_now();
    Started {
        engine: Engine {
            prepare,
            utility,
            placer,
            defaults: effective_sampling(settings, &tokenizer),
            vocab_size: tokenizer.vocab_size(),
            max_message_bytes: settings.server.max_message_bytes,
            plugins,
            model_id,
            created,
            adapters,
        },
        engine_arbiters,
        stores,
        vocab,
        tokenizer,
    }
}

/// Starts one engine's prefix store, model runner and scheduler loop; with `several`
/// the loop reports its load and memory-tier blocks to the placer ([`EngineLoad`]),
/// which a single engine never reads (its step does none of that work).
fn start_core(
    loaded: Loaded,
    settings: &Settings,
    tokenizer: &Arc<TextTokenizer>,
    several: bool,
) -> Core {
    let Loaded {
        mut model_runner,
        disk_store,
        prefix_caching,
        context_length,
        num_blocks,
        block_size,
        spec_costs,
        adapters,
        kv_events,
        team,
        ..
    } = loaded;
    let on_cpu = model_runner.model().device().is_cpu();
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
        if let Some(team) = &team {
            team.use_on_this_thread();
        }
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
    let arbiter = Arbiter::new();
    let store_for_sched = match (store_reader, &store_addr) {
        (Some(reader), Some(writer)) => {
            let writer = writer.clone();
            Some(SyncArbiter::start(1, move || {
                PrefixReadActor::new(reader.clone(), writer.clone())
            }))
        }
        _ => None,
    };
    let load = Arc::new(EngineLoad::default());
    let medium = kv_events.as_ref().map(|(_, m)| *m).or_else(|| {
        several.then_some(if on_cpu {
            crate::kv_events::Medium::Cpu
        } else {
            crate::kv_events::Medium::Gpu
        })
    });
    let prefix = prefix_caching.as_ref().map(|p| (p.fingerprint, block_size));
    let (tok_for_sched, adapters_for_sched, load_for_sched) =
        (tokenizer.clone(), adapters.clone(), load.clone());
    let scheduler = SchedulerActor::start_in_arbiter(&arbiter.handle(), move |_| {
        let mut policy = Scheduler::new(limits, BlockManager::new(num_blocks, block_size))
            .with_adapters(adapters_for_sched);
        if let Some(p) = prefix_caching {
            policy = policy.with_prefix_caching(p);
        }
        if let Some(spec) = speculation {
            policy = policy.with_speculation(spec);
        }
        if let Some(medium) = medium {
            policy = policy.with_kv_events(medium);
        }
        let mut actor = SchedulerActor::new(policy, runner_addr, tok_for_sched);
        if let Some((sink, _)) = kv_events {
            actor = actor.with_kv_events(sink);
        }
        if several {
            actor = actor.with_load(load_for_sched);
        }
        match store_for_sched {
            Some(store) => actor.with_store(store),
            None => actor,
        }
    });
    Core {
        replica: Replica {
            scheduler,
            load,
            adapters,
            prefix,
            block_size,
        },
        arbiter,
        store: store_addr,
    }
}
