//! The post-step: what happens to one engine step's output before the next step is
//! scheduled, as plain code over the [`Scheduler`] and the vocabulary (no actor, no
//! messages; unit-tested in `post_step_tests`). For each sequence in the step: the
//! prompt echo's scores, the commit of its computed tokens, then either the draft
//! verification or one sampled token per choice (the `n` choices fork from the prompt's
//! last row), each detokenized and streamed; finished and failed sequences end here
//! with their last event. The shape follows nano-vllm's `postprocess`.

use crate::error::{ErrorKind, InferError};
use crate::model_runner::StepOutput;
use crate::request::Vocab;
use crate::request::{FinishReason, SeqId, StreamEvent};
use crate::sampling::speculative;

use super::policy::Scheduler;
use super::sequence::{Sequence, TokenOutcome};

/// The post-step over one engine's policy and vocabulary (borrowed for one call).
pub struct PostStep<'a> {
    /// The policy whose sequences the step computed.
    pub scheduler: &'a mut Scheduler,
    /// For token bytes, pieces and end-of-generation ids.
    pub vocab: &'a dyn Vocab,
    /// What the loop reports to the placer of several engines (`None`: one engine).
    /// A finishing sequence's blocks leave the reported load before its client sees
    /// the end, so a follow-up request is never placed against a load already gone.
    pub load: Option<&'a super::EngineLoad>,
}

impl PostStep<'_> {
    /// Ends `seq` with `reason`: its `done` event, and the request's log line.
    pub fn finish(&self, mut seq: Sequence, reason: FinishReason) {
        // The adapter is free for unloading once the client sees the end.
        seq.adapter = None;
        if let Some(load) = self.load {
            load.set_active(self.scheduler.load_blocks());
        }
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

    /// Ends `seq` with `error` (the other choices of its request stop too).
    pub fn fail(&self, mut seq: Sequence, error: InferError) {
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
    pub fn sweep_cancelled(&mut self) {
        for seq in self.scheduler.take_cancelled() {
            self.end_cancelled(seq);
        }
    }

    /// Ends the cancelled `seq` (see [`PostStep::sweep_cancelled`]).
    pub fn end_cancelled(&self, mut seq: Sequence) {
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

    /// Scores, samples, detokenizes and streams the results of one step.
    pub fn on_step(&mut self, out: StepOutput) {
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
                let tok = self.vocab;
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
                t.bytes = self.vocab.token_piece(t.token).to_vec();
            }
        }
        let is_eog = self.vocab.is_eog(token);
        let outcome = match seq.accept_token(sampled, self.vocab.token_bytes(token), is_eog) {
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

    /// Fails every sequence, queued or running, with `error` (the runner is gone).
    pub fn fail_all(&mut self, error: InferError) {
        while let Some(seq) = self.scheduler.pop_any() {
            self.fail(seq, error.clone());
        }
    }
}
