//! `SchedulerActor`: the engine loop. A thin shell over [`Scheduler`]: each step it
//! sweeps cancellations, asks the policy for a batch, runs it on the model runner,
//! then samples and detokenizes each sequence's new token and streams the events.
//! Exactly one step is in flight at a time; the next starts as soon as one finishes.

use std::sync::Arc;
use std::time::{Duration, Instant};

use actix::{
    Actor, ActorFutureExt, Addr, AsyncContext, Context, Handler, Message, MessageResult, WrapFuture,
};

use crate::adapters::AdapterLease;
use crate::error::{ErrorKind, InferError};
use crate::model_runner::{ModelRunnerActor, StepOutput};
use crate::prefix_store::hash::extend_hashes;
use crate::prefix_store::{root_hash_with, LookupRun, PrefixReadActor};
use crate::request::{FinishReason, SeqId, StreamEvent};
use crate::sampling::speculative;

use crate::tokenizer::TextTokenizer;

use super::policy::{EngineStats, Scheduler};
use super::sequence::{DiskHit, Sequence, TokenOutcome, TokenizedRequest};

/// A LoRA adapter's weights finished loading (or failed to): waiting requests for it
/// may be admitted now (or are failed at the next step).
#[derive(Debug, Message)]
#[rtype(result = "()")]
pub struct AdapterLoaded;

/// Queue a tokenized request (from the tokenizer stage).
#[derive(Debug, Message)]
#[rtype(result = "()")]
pub struct Submit(pub TokenizedRequest);

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
    tokenizer: Arc<TextTokenizer>,
    store: Option<Addr<PrefixReadActor>>,
    /// Bytes the disk lookups in flight may return (blocks asked × block bytes).
    lookup_bytes_in_flight: usize,
    step_in_flight: bool,
    /// When the running step was sent to the model runner.
    step_since: Option<Instant>,
    last_stats_log: Instant,
}

impl SchedulerActor {
    /// Builds the actor around a policy, the runner and the tokenizer (for token bytes
    /// and end-of-generation ids).
    pub fn new(
        scheduler: Scheduler,
        runner: Addr<ModelRunnerActor>,
        tokenizer: Arc<TextTokenizer>,
    ) -> Self {
        Self {
            scheduler,
            runner,
            tokenizer,
            store: None,
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

    /// The disk lookup for `req`'s prompt: the full blocks after those the memory tier
    /// holds, up to `⌊(prompt − 1) / block_size⌋`; `None` when there is nothing to ask
    /// (no disk tier, caching off for the request, or memory holds them all).
    fn disk_lookup(&self, req: &TokenizedRequest) -> Option<(LookupRun, usize)> {
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
        extend_hashes(
            &mut hashes,
            &root_hash_with(
                &prefix.fingerprint,
                &req.cache.salt,
                req.adapter.as_ref().map(AdapterLease::key).as_ref(),
            ),
            &prefix.fingerprint,
            &req.prompt,
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
    fn submit(&mut self, req: TokenizedRequest, ctx: &mut Context<Self>) {
        if req.cancel.is_cancelled() {
            self.end_cancelled(Sequence::new(req, 0));
            return;
        }
        if let Err(rejected) = self.scheduler.submit(req) {
            let (req, error) = *rejected;
            tracing::warn!(id = %req.client_id, error = %error.message, "request rejected");
            let _ = req.events.send(StreamEvent::Error(error));
            return;
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

    fn finish(&self, mut seq: Sequence, reason: FinishReason) {
        // The adapter is free for unloading once the client sees the end.
        seq.adapter = None;
        let t = seq.finish(reason);
        tracing::info!(
            id = %seq.client_id,
            seq = %seq.id,
            prompt_tokens = seq.prompt.len(),
            completion_tokens = seq.generated.len(),
            ttft_ms = format_args!("{:.1}", t.ttft_ms),
            decode_tok_s = format_args!("{:.1}", t.decode_tokens_per_s),
            draft_tokens = seq.spec.as_ref().map_or(0, |s| s.drafted),
            accepted_draft_tokens = seq.spec.as_ref().map_or(0, |s| s.accepted),
            acceptance_rate = format_args!("{:.2}", seq.spec.as_ref().map_or(0.0, |s| s.acceptance_rate())),
            tokens_per_verification = format_args!("{:.2}", seq.spec.as_ref().map_or(0.0, |s| s.tokens_per_verification())),
            finish_reason = ?reason,
            "request finished"
        );
    }

    fn fail(&self, mut seq: Sequence, error: InferError) {
        seq.adapter = None;
        tracing::warn!(id = %seq.client_id, seq = %seq.id, error = %error.message, "request failed");
        seq.send(StreamEvent::Error(error));
        if seq.choices > 1 {
            // The error ends the request: its other choices stop too.
            seq.cancel.cancel();
        }
    }

    /// Ends cancelled sequences: a started one with `done` / `cancelled`, one still
    /// queued (no `started` sent yet) with an `error` of type `cancelled`.
    fn sweep_cancelled(&mut self) {
        for seq in self.scheduler.take_cancelled() {
            self.end_cancelled(seq);
        }
    }

    fn end_cancelled(&self, mut seq: Sequence) {
        seq.adapter = None;
        if seq.started {
            self.finish(seq, FinishReason::Cancelled);
        } else {
            tracing::info!(id = %seq.client_id, seq = %seq.id, "request cancelled before it started");
            seq.send(StreamEvent::Error(InferError::new(
                ErrorKind::Cancelled,
                "the request was cancelled before it started",
            )));
        }
    }

    /// Starts the next step unless one is running or there is nothing to do.
    fn step(&mut self, ctx: &mut Context<Self>) {
        if self.step_in_flight {
            return;
        }
        self.sweep_cancelled();
        if self.scheduler.is_idle() {
            return;
        }
        if self.last_stats_log.elapsed() >= STATS_LOG_INTERVAL {
            self.log_stats();
        }
        let (batch, admitted) = self.scheduler.schedule();
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
                    Ok(out) => act.on_step(out),
                    Err(e) => act.fail_all(InferError::internal(format!(
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
            self.fail(seq, InferError::new(ErrorKind::ModelNotFound, why));
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

    /// Scores, samples, detokenizes and streams the results of one step.
    fn on_step(&mut self, out: StepOutput) {
        for item in out.items {
            if self.scheduler.running_mut(item.seq).is_none() {
                continue;
            }
            let mut rows = match item.logits {
                Ok(rows) => rows,
                Err(e) => {
                    if let Some(s) = self.scheduler.remove_running(item.seq) {
                        self.fail(s, e);
                    }
                    continue;
                }
            };
            if let Some(seq) = self.scheduler.running_mut(item.seq) {
                // The rows are the chunk's last ones: the prompt scores of `echo`.
                let first = (seq.computed + seq.in_flight).saturating_sub(rows.len());
                if let Some(echo) = seq.echo.as_mut() {
                    echo.absorb(first, &rows, &seq.prompt);
                }
            }
            self.scheduler.commit_step(item.seq);
            let Some(seq) = self.scheduler.running_mut(item.seq) else {
                continue;
            };
            if seq.cancel.is_cancelled() || seq.pending_len() > 0 {
                continue; // swept before the next step / more prompt chunks to go
            }
            // Drafts of the lookup (the sequence's) or of the draft model (the item's).
            if !seq.drafts.is_empty() || seq.model_drafts > 0 {
                let drafts = match std::mem::take(&mut seq.drafts) {
                    d if d.is_empty() => item.drafts,
                    d => d,
                };
                self.verify(item.seq, &drafts, rows);
                continue;
            }
            let Some(logits) = rows.pop() else {
                self.fail_missing_logits(item.seq);
                continue;
            };
            // The prompt is computed: its echo goes first, then the other choices fork
            // and sample from the same row.
            if let Some(echo) = seq.echo.take() {
                let tok = &self.tokenizer;
                let event = echo.event(&seq.prompt, |t| tok.token_bytes(t), |t| tok.token_piece(t));
                seq.send(event);
            }
            let mut choices = vec![item.seq];
            if seq.has_forks() {
                choices.extend(self.scheduler.fork_choices(item.seq));
            }
            let last = choices.len() - 1;
            let mut logits = Some(logits);
            for (k, id) in choices.into_iter().enumerate() {
                let row = if k == last {
                    logits.take()
                } else {
                    logits.clone()
                };
                if let Some(mut row) = row {
                    if let Some(Ok(TokenOutcome::Finished(reason))) = self.sample_next(id, &mut row)
                    {
                        self.end(id, reason);
                    }
                }
            }
        }
    }

    /// Speculative verification of sequence `id`'s `drafts`: `rows[i]` are the logits
    /// after its pending token and the first `i` drafts. Rows are sampled in order
    /// through the request's chain, as plain decode steps would sample them, while the
    /// sampled token equals the next draft; the first token that differs (or the one
    /// after the last draft) ends the run. Every sampled token is streamed and checked
    /// for stop sequences, end of generation and the budget one by one, so a run ends
    /// exactly where decoding without drafts would. See [`crate::sampling::speculative`].
    fn verify(&mut self, id: SeqId, drafts: &[u32], mut rows: Vec<Vec<f32>>) {
        if rows.len() != drafts.len() + 1 {
            self.fail_missing_logits(id);
            return;
        }
        let verdict =
            speculative::verify(drafts, &mut rows, |row| match self.sample_next(id, row) {
                Some(Ok(outcome)) => {
                    let token = self
                        .scheduler
                        .running_mut(id)
                        .and_then(|s| s.generated.last().copied());
                    let end = match outcome {
                        TokenOutcome::Continue => None,
                        TokenOutcome::Finished(reason) => Some(reason),
                    };
                    token.map(|t| (t, end)).ok_or(())
                }
                Some(Err(())) | None => Err(()),
            });
        self.scheduler
            .commit_drafts(id, drafts.len(), verdict.accepted);
        match verdict.outcome {
            Ok(Some(reason)) => self.end(id, reason),
            Ok(None) => {}
            // A failed sequence was removed with its error; one still running here lost
            // its token, which cannot happen: end it rather than stall it.
            Err(()) => {
                if let Some(s) = self.scheduler.remove_running(id) {
                    self.fail(
                        s,
                        InferError::internal("speculative verification lost a token"),
                    );
                }
            }
        }
    }

    fn fail_missing_logits(&mut self, id: SeqId) {
        if let Some(s) = self.scheduler.remove_running(id) {
            self.fail(
                s,
                InferError::internal(
                    "the model runner returned no logits for a sequence that needs them",
                ),
            );
        }
    }

    /// Ends the running sequence `id` with `reason`.
    fn end(&mut self, id: SeqId, reason: FinishReason) {
        if let Some(s) = self.scheduler.remove_running(id) {
            self.finish(s, reason);
        }
    }

    /// Samples sequence `id`'s next token from its logits row and streams it. Returns
    /// whether generation goes on, `Err(())` when the sequence failed (it is removed and
    /// its error sent), `None` when it is not running. A budget of 0 (`echo` scoring
    /// only) finishes at once without sampling.
    fn sample_next(&mut self, id: SeqId, logits: &mut [f32]) -> Option<Result<TokenOutcome, ()>> {
        let seq = self.scheduler.running_mut(id)?;
        if seq.max_new_tokens == 0 {
            return Some(Ok(TokenOutcome::Finished(FinishReason::Length)));
        }
        let mut sampled = match seq.sample(logits) {
            Ok(t) => t,
            Err(e) => {
                if let Some(s) = self.scheduler.remove_running(id) {
                    self.fail(s, e);
                }
                return Some(Err(()));
            }
        };
        let token = sampled.token;
        if let Some(lp) = sampled.logprobs.as_mut() {
            for t in std::iter::once(&mut lp.chosen).chain(lp.top.iter_mut()) {
                t.bytes = self.tokenizer.token_piece(t.token).to_vec();
            }
        }
        let is_eog = self.tokenizer.eog_token_ids().contains(&token);
        let outcome = match seq.accept_token(sampled, self.tokenizer.token_bytes(token), is_eog) {
            Ok(o) => o,
            Err(e) => {
                if let Some(s) = self.scheduler.remove_running(id) {
                    self.fail(s, e);
                }
                return Some(Err(()));
            }
        };
        self.scheduler.note_generated();
        Some(Ok(outcome))
    }

    fn fail_all(&mut self, error: InferError) {
        while let Some(seq) = self.scheduler.pop_any() {
            self.fail(seq, error.clone());
        }
    }
}

impl Actor for SchedulerActor {
    type Context = Context<Self>;

    /// Under a systemd watchdog, pings it every half timeout from this loop while the
    /// engine makes progress: no step is running, or the running one began less than
    /// a whole timeout ago. A hung model runner (or a hung loop) stops the pings, and
    /// systemd restarts the service.
    fn started(&mut self, ctx: &mut Context<Self>) {
        if let Some(every) = crate::service::watchdog_interval() {
            tracing::info!(
                interval_ms = every.as_millis() as u64,
                "systemd watchdog: pinging from the engine loop"
            );
            ctx.run_interval(every, move |act, _| {
                match act.step_since.map(|t| t.elapsed()) {
                    Some(running) if running >= 2 * every => tracing::error!(
                        step_running_s = running.as_secs_f64(),
                        "engine step is not finishing: watchdog pings withheld"
                    ),
                    _ => crate::service::watchdog_ping(),
                }
            });
        }
    }
}

impl Handler<Submit> for SchedulerActor {
    type Result = ();

    fn handle(&mut self, msg: Submit, ctx: &mut Context<Self>) {
        let req = msg.0;
        if req.cancel.is_cancelled() {
            self.end_cancelled(Sequence::new(req, 0));
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
        self.sweep_cancelled();
        self.step(ctx);
    }
}

impl Handler<GetStats> for SchedulerActor {
    type Result = MessageResult<GetStats>;

    fn handle(&mut self, _msg: GetStats, _ctx: &mut Context<Self>) -> Self::Result {
        let st = self.scheduler.stats();
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
