//! `SchedulerActor`: the engine loop. A thin shell over [`Scheduler`]: each step it
//! sweeps cancellations, asks the policy for a batch, runs it on the model runner,
//! then hands the output to the post-step ([`super::post_step`]: sampling,
//! verification, detokenizing and streaming).
//! Exactly one step is in flight at a time; the next starts as soon as one finishes.

use std::sync::Arc;
use std::time::{Duration, Instant};

use actix::{
    Actor, ActorFutureExt, Addr, AsyncContext, Context, Handler, Message, MessageResult, WrapFuture,
};

use crate::adapters::AdapterLease;
use crate::error::{ErrorKind, InferError};
use crate::model_runner::ModelRunnerActor;
use crate::prefix_store::hash::extend_hashes_with;
use crate::prefix_store::{root_hash_with, LookupRun, PrefixReadActor};
use crate::request::{SeqId, StreamEvent};

use crate::request::Vocab;

use super::policy::Scheduler;
use super::post_step::PostStep;
use super::sequence::{Prepared, Sequence};
use crate::request::DiskHit;
use crate::request::EngineStats;

/// A LoRA adapter's weights finished loading (or failed to): waiting requests for it
/// may be admitted now (or are failed at the next step).
#[derive(Debug, Message)]
#[rtype(result = "()")]
pub struct AdapterLoaded;

/// Queue a prepared request (sent by `prepare/` only).
#[derive(Debug, Message)]
#[rtype(result = "()")]
pub struct Submit(pub Prepared);

/// Control message: a client cancelled `SeqId` or disconnected. The request's
/// [`crate::request::CancelFlag`] is already set; this only makes the engine act on
/// it now rather than at its next step.
#[derive(Debug, Message)]
#[rtype(result = "()")]
pub struct Cancel(pub SeqId);

/// Ask for the engine counters (the `stats` message).
#[derive(Debug, Message)]
#[rtype(result = "EngineStats")]
pub struct GetStats;

/// Most bytes of disk-tier K/V that queued requests (and lookups in flight) may hold.
const MAX_DISK_HIT_BYTES_WAITING: usize = 512 << 20;

/// Engine counters are logged at most this often while the engine is busy.
const STATS_LOG_INTERVAL: Duration = Duration::from_secs(10);

/// The engine loop actor; run it on its own `Arbiter` so sampling and detokenization
/// stay off the connections' executor.
pub struct SchedulerActor {
    scheduler: Scheduler,
    runner: Addr<ModelRunnerActor>,
    vocab: Arc<dyn Vocab>,
    store: Option<Addr<PrefixReadActor>>,
    /// Where the memory tier's KV-cache events go (`[kv_events]`).
    kv_events: Option<crate::kv_events::KvEventSink>,
    /// What the placer of several engines reads (`[[engines]]`).
    load: Option<std::sync::Arc<super::EngineLoad>>,
    /// Bytes the disk lookups in flight may return (blocks asked × block bytes).
    lookup_bytes_in_flight: usize,
    step_in_flight: bool,
    /// When the running step was sent to the model runner.
    step_since: Option<Instant>,
    last_stats_log: Instant,
}

impl SchedulerActor {
    /// Builds the actor around a policy, the runner and the vocabulary (for token bytes
    /// and end-of-generation ids).
    pub fn new(
        scheduler: Scheduler,
        runner: Addr<ModelRunnerActor>,
        vocab: Arc<dyn Vocab>,
    ) -> Self {
        Self {
            scheduler,
            runner,
            vocab,
            store: None,
            kv_events: None,
            load: None,
            lookup_bytes_in_flight: 0,
            step_in_flight: false,
            step_since: None,
            last_stats_log: Instant::now(),
        }
    }

    /// Reads prompt prefixes from the prefix store's disk tier before queueing.
    pub fn with_store(mut self, store: Addr<PrefixReadActor>) -> Self {
        self.store = Some(store);
        self
    }

    /// Publishes the policy's KV-cache events (its scheduler must record them:
    /// [`Scheduler::with_kv_events`]).
    pub fn with_kv_events(mut self, sink: crate::kv_events::KvEventSink) -> Self {
        self.kv_events = Some(sink);
        self
    }

    /// Reports to the placer of several engines (its scheduler must record KV-cache
    /// events: [`Scheduler::with_kv_events`]).
    pub fn with_load(mut self, load: std::sync::Arc<super::EngineLoad>) -> Self {
        self.load = Some(load);
        self
    }

    /// Hands the events the policy recorded since the last call to the publisher and
    /// the placer, and tells the placer the blocks held.
    fn publish_kv_events(&mut self) {
        if self.kv_events.is_none() && self.load.is_none() {
            return;
        }
        let events = self.scheduler.take_kv_events();
        if let Some(load) = &self.load {
            load.apply(&events);
            load.set_active(self.scheduler.load_blocks());
        }
        if let Some(sink) = &self.kv_events {
            sink.publish(&events);
        }
    }

    /// The disk lookup for `req`'s prompt: the full blocks after those the memory tier
    /// holds, up to `⌊(prompt − 1) / block_size⌋`; `None` when there is nothing to ask
    /// (no disk tier, caching off for the request, or memory holds them all).
    fn disk_lookup(&self, req: &Prepared) -> Option<(LookupRun, usize)> {
        self.store.as_ref()?;
        let prefix = self.scheduler.prefix_caching()?;
        // A prompt being scored (`echo` with `logprobs`) reads nothing from the cache.
        let scoring = req.sampling.echo && req.sampling.logprobs.is_some();
        if !req.cache.enabled || req.prompt.is_empty() || scoring {
            return None;
        }
        let bs = self.scheduler.blocks().block_size();
        let cap = (req.prompt.len() - 1) / bs;
        let tokens: Vec<Vec<u32>> = req.prompt[..cap * bs]
            .chunks(bs)
            .map(<[u32]>::to_vec)
            .collect();
        let mut hashes = Vec::with_capacity(cap);
        extend_hashes_with(
            &mut hashes,
            &root_hash_with(
                &prefix.fingerprint,
                &req.cache.salt,
                req.adapter.as_ref().map(AdapterLease::key).as_ref(),
            ),
            &prefix.fingerprint,
            &req.prompt,
            &req.images,
            bs,
            cap,
        );
        let m = self
            .scheduler
            .blocks()
            .match_prefix(&hashes, |i| tokens[i].clone())
            .len();
        if m >= cap {
            return None;
        }
        // Ask only for blocks the store's index lists; nothing listed, no round trip.
        let n = prefix
            .disk
            .as_ref()
            .map_or(0, |d| d.stored_run(&hashes[m..]));
        if n == 0 {
            return None;
        }
        // Queued requests hold their disk blocks until admission: past this bound a
        // request gets no disk lookup (it will find the blocks in memory once an earlier
        // request has loaded them, or prefill them), so a burst of requests with one long
        // prefix cannot hold a copy each.
        let held = self.scheduler.disk_hit_bytes_waiting() + self.lookup_bytes_in_flight;
        if held + n * self.block_bytes_estimate() > MAX_DISK_HIT_BYTES_WAITING {
            return None;
        }
        Some((
            LookupRun {
                hashes: hashes[m..m + n].to_vec(),
                tokens: tokens[m..m + n].to_vec(),
            },
            m,
        ))
    }

    /// Bytes of one block's K/V in the store (`scheduler.block_bytes` of the pool); a
    /// bound for accounting only.
    fn block_bytes_estimate(&self) -> usize {
        self.scheduler.prefix_caching().map_or(0, |p| p.block_bytes)
    }

    /// Queues `req` and runs a step.
    fn submit(&mut self, req: Prepared, ctx: &mut Context<Self>) {
        if req.cancel.is_cancelled() {
            self.post().end_cancelled(Sequence::new(req, 0));
            return;
        }
        if let Err(rejected) = self.scheduler.submit(req) {
            let (req, error) = *rejected;
            tracing::warn!(id = %req.client_id, error = %error.message, "request rejected");
            let _ = req.events.send(StreamEvent::Error(error));
            return;
        }
        if let Some(load) = &self.load {
            load.set_active(self.scheduler.load_blocks());
        }
        self.step(ctx);
    }

    fn log_stats(&mut self) {
        self.last_stats_log = Instant::now();
        let st = self.scheduler.stats();
        tracing::info!(
            running = st.running,
            waiting = st.waiting,
            preempted = st.preempted,
            preemptions_total = st.preemptions_total,
            kv_blocks_used = st.kv_blocks_used,
            kv_blocks_total = st.kv_blocks_total,
            tokens_generated = st.tokens_generated,
            steps = st.steps,
            spec_acceptance_rate = format_args!("{:.2}", st.speculative.acceptance_rate),
            spec_tokens_per_verification =
                format_args!("{:.2}", st.speculative.tokens_per_verification),
            "engine stats"
        );
    }

    /// The post-step over this loop's policy and vocabulary.
    fn post(&mut self) -> PostStep<'_> {
        PostStep {
            scheduler: &mut self.scheduler,
            vocab: self.vocab.as_ref(),
            load: self.load.as_deref(),
        }
    }

    /// Starts the next step unless one is running or there is nothing to do.
    fn step(&mut self, ctx: &mut Context<Self>) {
        if self.step_in_flight {
            return;
        }
        self.publish_kv_events();
        self.post().sweep_cancelled();
        if self.scheduler.is_idle() {
            return;
        }
        if self.last_stats_log.elapsed() >= STATS_LOG_INTERVAL {
            self.log_stats();
        }
        let (batch, admitted) = self.scheduler.schedule();
        self.publish_kv_events();
        self.after_adapter_gates(ctx);
        for id in admitted {
            if let Some(seq) = self.scheduler.running_mut(id) {
                seq.send_started();
            }
        }
        if batch.is_empty() {
            return;
        }
        self.step_in_flight = true;
        self.step_since = Some(Instant::now());
        // One decoding sequence alone (lookup drafts or none): its time measures what an
        // extra verification row costs.
        let solo_rows = match batch.items.as_slice() {
            [i] if i.draft.is_none() && i.start_pos >= i.prompt_len => Some(i.tokens.len()),
            _ => None,
        };
        let sampling: Vec<SeqId> = batch
            .items
            .iter()
            .filter(|i| i.logit_rows > 0)
            .map(|i| i.seq)
            .collect();
        let fut = self
            .runner
            .send(batch)
            .into_actor(self)
            .map(move |res, act, ctx| {
                act.step_in_flight = false;
                if let (Some(rows), Some(t)) = (solo_rows, act.step_since.take()) {
                    act.scheduler.observe_step(rows, t.elapsed().as_secs_f64());
                }
                act.step_since = None;
                match res {
                    Ok(out) => act.post().on_step(out),
                    Err(e) => act.post().fail_all(InferError::internal(format!(
                        "model runner unavailable: {e}"
                    ))),
                }
                act.step(ctx);
            });
        ctx.spawn(fut);
        // The runner computes on its own thread: prepare what sampling needs that does
        // not depend on the logits (structured-output masks) meanwhile.
        for id in sampling {
            if let Some(seq) = self.scheduler.running_mut(id) {
                seq.prepare_sample();
            }
        }
    }

    /// Fails the requests whose adapter is gone, and starts the adapter loads the
    /// step asked for, each on a thread of its own (file reading and checks), which
    /// wakes the scheduler when done.
    fn after_adapter_gates(&mut self, ctx: &mut Context<Self>) {
        for (seq, why) in self.scheduler.take_gone() {
            self.post()
                .fail(seq, InferError::new(ErrorKind::ModelNotFound, why));
        }
        let Some((registry, loads)) = self.scheduler.take_adapter_loads() else {
            return;
        };
        for (name, path) in loads {
            let (registry, me) = (registry.clone(), ctx.address());
            let spawned = std::thread::Builder::new()
                .name("inferd-lora-load".into())
                .spawn(move || {
                    let t0 = Instant::now();
                    match registry.load_resident(&name, &path) {
                        Ok(()) => tracing::info!(
                            adapter = %name,
                            load_ms = t0.elapsed().as_millis() as u64,
                            "LoRA adapter resident"
                        ),
                        Err(e) => tracing::error!(error = %e, "LoRA adapter failed to load"),
                    }
                    me.do_send(AdapterLoaded);
                });
            if let Err(e) = spawned {
                tracing::error!(error = %e, "cannot start a LoRA loading thread");
            }
        }
    }
}

impl Actor for SchedulerActor {
    type Context = Context<Self>;

    /// Under a systemd watchdog, pings it every half timeout from this loop while the
    /// engine makes progress: no step is running, or the running one began less than
    /// a whole timeout ago. A hung model runner (or a hung loop) stops the pings, and
    /// systemd restarts the service. With several engines, a ping needs every loop's
    /// progress within the timeout ([`crate::service::watchdog_alive`]).
    fn started(&mut self, ctx: &mut Context<Self>) {
        if let Some(every) = crate::service::watchdog_interval() {
            tracing::info!(
                interval_ms = every.as_millis() as u64,
                "systemd watchdog: pinging from the engine loop"
            );
            let slot = crate::service::watchdog_register();
            ctx.run_interval(every, move |act, _| {
                match act.step_since.map(|t| t.elapsed()) {
                    Some(running) if running >= 2 * every => tracing::error!(
                        step_running_s = running.as_secs_f64(),
                        "engine step is not finishing: watchdog pings withheld"
                    ),
                    _ => crate::service::watchdog_alive(slot, 2 * every),
                }
            });
        }
    }
}

impl Handler<Submit> for SchedulerActor {
    type Result = ();

    fn handle(&mut self, msg: Submit, ctx: &mut Context<Self>) {
        let req = msg.0;
        if let Some(load) = &self.load {
            load.taken(
                req.prompt
                    .len()
                    .div_ceil(self.scheduler.block_size().max(1)),
            );
        }
        if req.cancel.is_cancelled() {
            self.post().end_cancelled(Sequence::new(req, 0));
            return;
        }
        let (Some(store), Some((lookup, first_block))) =
            (self.store.clone(), self.disk_lookup(&req))
        else {
            self.submit(req, ctx);
            return;
        };
        // The disk read runs on the store's reader thread; the request is queued when
        // it returns (with whatever run of blocks was intact).
        let reserved = lookup.hashes.len() * self.block_bytes_estimate();
        self.lookup_bytes_in_flight += reserved;
        let fut = store
            .send(lookup)
            .into_actor(self)
            .map(move |res, act, ctx| {
                act.lookup_bytes_in_flight = act.lookup_bytes_in_flight.saturating_sub(reserved);
                let mut req = req;
                match res {
                    Ok(blocks) if !blocks.is_empty() => {
                        req.disk_hit = Some(DiskHit {
                            first_block,
                            blocks,
                        });
                    }
                    Ok(_) => {}
                    Err(e) => tracing::warn!(error = %e, "prefix store unavailable"),
                }
                act.submit(req, ctx);
            });
        ctx.spawn(fut);
    }
}

impl Handler<Cancel> for SchedulerActor {
    type Result = ();

    fn handle(&mut self, _msg: Cancel, ctx: &mut Context<Self>) {
        self.post().sweep_cancelled();
        self.step(ctx);
    }
}

impl Handler<GetStats> for SchedulerActor {
    type Result = MessageResult<GetStats>;

    fn handle(&mut self, _msg: GetStats, _ctx: &mut Context<Self>) -> Self::Result {
        let mut st = self.scheduler.stats();
        if let Some(sink) = &self.kv_events {
            st.kv_events = crate::request::KvEventStats {
                published: sink.sent(),
                dropped: sink.dropped(),
            };
        }
        tracing::debug!(?st, "engine stats requested");
        MessageResult(st)
    }
}

impl Handler<AdapterLoaded> for SchedulerActor {
    type Result = ();

    fn handle(&mut self, _msg: AdapterLoaded, ctx: &mut Context<Self>) {
        self.step(ctx);
    }
}
