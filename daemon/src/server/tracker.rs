//! Every generate request in flight, over all connections and both protocols: what a
//! graceful shutdown waits for (and cancels when `server.shutdown_grace_s` runs out),
//! and where per-request metrics are recorded from the request's events.
//!
//! Lives on the actix system thread with the sessions (hence `Rc`, not `Arc`).

use std::cell::RefCell;
use std::collections::HashMap;
use std::rc::Rc;
use std::time::Instant;

use tokio::sync::Notify;

use crate::engine::Canceller;
use crate::error::ErrorKind;
use crate::metrics::metrics;
use crate::request::{CancelFlag, SeqId, StreamEvent, Usage};

#[derive(Default)]
struct Inner {
    active: RefCell<HashMap<SeqId, CancelFlag>>,
    changed: Notify,
}

/// The set of requests in flight (cheap to clone: one shared set).
#[derive(Clone, Default)]
pub struct Tracker(Rc<Inner>);

impl Tracker {
    /// Registers request `seq`; the returned guard removes it when dropped, and cancels it
    /// then unless its final event (`done` or `error`) was observed.
    pub fn track(&self, seq: SeqId, cancel: CancelFlag, scheduler: Canceller) -> Tracked {
        self.0.active.borrow_mut().insert(seq, cancel.clone());
        Tracked {
            tracker: self.clone(),
            seq,
            cancel,
            scheduler,
            accepted: Instant::now(),
            last_token: None,
            ended: false,
            choices_left: 1,
            choice_usage: None,
        }
    }

    /// Requests in flight.
    pub fn len(&self) -> usize {
        self.0.active.borrow().len()
    }

    /// Whether no request is in flight.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Resolves once no request is in flight.
    pub async fn wait_empty(&self) {
        loop {
            let changed = self.0.changed.notified();
            if self.is_empty() {
                return;
            }
            changed.await;
        }
    }

    /// Cancels every request in flight (each ends with `finish_reason: "cancelled"`, or
    /// an `error` of type `cancelled` when it had not started).
    pub fn cancel_all(&self, scheduler: &Canceller) {
        for (seq, cancel) in self.0.active.borrow().iter() {
            cancel.cancel();
            scheduler.cancel(*seq);
        }
    }
}

/// One request in flight; see [`Tracker::track`].
pub struct Tracked {
    tracker: Tracker,
    seq: SeqId,
    cancel: CancelFlag,
    scheduler: Canceller,
    accepted: Instant,
    last_token: Option<Instant>,
    ended: bool,
    /// Choices whose `done` has not been seen (`n`, then counting down).
    choices_left: usize,
    /// Usage summed over the choices ended so far: prompt once, completions added.
    choice_usage: Option<Usage>,
}

impl Tracked {
    /// The engine's id of this request.
    pub fn seq(&self) -> SeqId {
        self.seq
    }

    /// The request's cancel flag.
    pub fn cancel_flag(&self) -> CancelFlag {
        self.cancel.clone()
    }

    /// Sets the request's number of choices (`n`): it ends with the last choice's
    /// `done`.
    pub fn with_choices(mut self, n: usize) -> Self {
        self.choices_left = n.max(1);
        self
    }

    /// Records `event` in the metrics; returns whether it is the request's final event.
    pub fn observe(&mut self, event: &StreamEvent) -> bool {
        let m = metrics();
        match event {
            StreamEvent::Started { .. } | StreamEvent::Echo { .. } => false,
            StreamEvent::Choice { index, event } => match &**event {
                // One choice's tokens count as the request's stream for the latencies.
                StreamEvent::Delta { .. } if *index == 0 => self.observe(event),
                StreamEvent::Done {
                    finish_reason,
                    usage,
                    timings,
                } => {
                    let total = self.choice_usage.get_or_insert(Usage {
                        completion_tokens: 0,
                        draft_tokens: 0,
                        accepted_draft_tokens: 0,
                        ..*usage
                    });
                    total.add_completion(usage);
                    self.choices_left = self.choices_left.saturating_sub(1);
                    if self.choices_left > 0 {
                        return false;
                    }
                    let usage = *total;
                    self.observe(&StreamEvent::Done {
                        finish_reason: *finish_reason,
                        usage,
                        timings: *timings,
                    })
                }
                _ => false,
            },
            StreamEvent::Delta { token_ids, .. } => {
                let now = Instant::now();
                if let (Some(last), n @ 1..) = (self.last_token, token_ids.len()) {
                    // Tokens released together (held back for a stop sequence or UTF-8)
                    // share the interval.
                    let each = now.duration_since(last).as_secs_f64() / n as f64;
                    for _ in 0..n {
                        m.itl.observe(each);
                    }
                }
                if !token_ids.is_empty() {
                    self.last_token = Some(now);
                }
                false
            }
            StreamEvent::Done {
                finish_reason,
                usage,
                timings,
            } => {
                let reason = serde_json::to_value(finish_reason)
                    .ok()
                    .and_then(|v| v.as_str().map(str::to_owned))
                    .unwrap_or_default();
                m.requests.with_label_values(&[reason.as_str()]).inc();
                m.prompt_tokens.inc_by(usage.prompt_tokens as u64);
                m.generation_tokens.inc_by(usage.completion_tokens as u64);
                if usage.completion_tokens > 0 {
                    m.ttft.observe(timings.ttft_ms / 1000.0);
                }
                self.end();
                true
            }
            StreamEvent::Error(e) => {
                m.requests.with_label_values(&["error"]).inc();
                m.request_errors.with_label_values(&[e.kind.as_str()]).inc();
                if e.kind == ErrorKind::PluginTrap {
                    m.plugin_traps.inc();
                }
                self.end();
                true
            }
        }
    }

    fn end(&mut self) {
        self.ended = true;
        metrics().e2e.observe(self.accepted.elapsed().as_secs_f64());
    }
}

impl Drop for Tracked {
    fn drop(&mut self) {
        if !self.ended {
            // The client went away (or the connection broke) before the end: stop the
            // engine's work on it.
            self.cancel.cancel();
            self.scheduler.cancel(self.seq);
            metrics().requests.with_label_values(&["cancelled"]).inc();
        }
        self.tracker.0.active.borrow_mut().remove(&self.seq);
        self.tracker.0.changed.notify_waiters();
    }
}
