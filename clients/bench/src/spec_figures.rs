//! Result types of the speculative scenario, filled the same way for inferd and
//! llama-server: one [`Run`] per single-stream request, one [`Round`] per run of the
//! concurrent streams, and per workload a [`Workload`] comparing speculation on with off
//! (decode speed, acceptance, tokens per verification, greedy identity).
//!
//! Decode tok/s of a request is (tokens − tokens of the first arrival) / (last arrival −
//! first arrival), as in the serving scenario. Of the repetitions of a prompt the fastest
//! counts (per arm); a workload's tok/s is the sum of those runs' tokens after the first
//! over the sum of their spans, and of the concurrent rounds the fastest aggregate counts.

use std::collections::BTreeMap;

use serde::Serialize;
use serde_json::Value;

use crate::client::Trace;
use crate::figures::{level_from, Level};

/// Draft counters of one request or of several. `None`: the engine did not report it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct Drafts {
    /// Draft tokens proposed and verified.
    pub draft_tokens: Option<u64>,
    /// Of those, drafts accepted.
    pub accepted_tokens: Option<u64>,
    /// Steps that verified at least one draft.
    pub verification_steps: Option<u64>,
}

impl Drafts {
    /// No drafts, all counters known.
    pub const ZERO: Drafts = Drafts {
        draft_tokens: Some(0),
        accepted_tokens: Some(0),
        verification_steps: Some(0),
    };

    /// Both counted together; a counter is unknown when either side's is.
    pub fn add(self, other: Drafts) -> Drafts {
        let sum = |a: Option<u64>, b: Option<u64>| Some(a? + b?);
        Drafts {
            draft_tokens: sum(self.draft_tokens, other.draft_tokens),
            accepted_tokens: sum(self.accepted_tokens, other.accepted_tokens),
            verification_steps: sum(self.verification_steps, other.verification_steps),
        }
    }

    /// The sum over `items`.
    pub fn total<'a>(items: impl IntoIterator<Item = &'a Drafts>) -> Drafts {
        items.into_iter().fold(Drafts::ZERO, |acc, d| acc.add(*d))
    }

    /// `accepted / drafts`; `None` without drafts.
    pub fn acceptance_rate(&self) -> Option<f64> {
        let d = self.draft_tokens.filter(|&d| d > 0)?;
        Some(self.accepted_tokens? as f64 / d as f64)
    }

    /// Tokens a verification step produced: `(accepted + steps) / steps`; `None` without
    /// verification steps.
    pub fn tokens_per_verification(&self) -> Option<f64> {
        let s = self.verification_steps.filter(|&s| s > 0)?;
        Some((self.accepted_tokens? + s) as f64 / s as f64)
    }
}

/// One request.
#[derive(Debug, Clone, Serialize)]
pub struct Run {
    /// Prompt name (concurrent streams: `s<index>:<prompt>`).
    pub prompt: String,
    /// Speculation on (inferd: `"speculative": true`; llama.cpp: the n-gram server).
    pub speculative: bool,
    /// Repetition (concurrent streams: the round).
    pub rep: usize,
    pub prompt_tokens: u64,
    /// Generated tokens received.
    pub tokens: u64,
    /// Tokens after the first arrival.
    pub tokens_after_first: u64,
    /// First to last arrival, seconds.
    pub span_s: f64,
    /// `tokens_after_first / span_s`.
    pub tok_per_s: f64,
    pub ttft_ms: f64,
    pub finish_reason: String,
    #[serde(flatten)]
    pub drafts: Drafts,
    /// The generated token ids (compared between the arms).
    #[serde(skip)]
    pub token_ids: Vec<u32>,
    /// The generated text.
    #[serde(skip)]
    pub text: String,
    /// Engine-specific details (inferd: usage and the stats delta; llama-server: its
    /// timings and log figures).
    pub extra: Value,
}

impl Run {
    /// A run from its trace.
    pub fn new(
        prompt: &str,
        speculative: bool,
        rep: usize,
        trace: &Trace,
        drafts: Drafts,
        extra: Value,
    ) -> Run {
        let (tokens_after_first, span_s) = trace.timing.decode_span();
        Run {
            prompt: prompt.to_owned(),
            speculative,
            rep,
            prompt_tokens: trace.prompt_tokens,
            tokens: trace.timing.tokens(),
            tokens_after_first,
            span_s,
            tok_per_s: if span_s > 0.0 {
                tokens_after_first as f64 / span_s
            } else {
                0.0
            },
            ttft_ms: trace.timing.ttft_s().unwrap_or(0.0) * 1e3,
            finish_reason: trace.finish_reason.clone(),
            drafts,
            token_ids: trace.token_ids.clone(),
            text: trace.text.clone(),
            extra,
        }
    }
}

/// One run of the concurrent streams, all sent together.
#[derive(Debug, Clone, Serialize)]
pub struct Round {
    pub round: usize,
    pub speculative: bool,
    /// Aggregate figures (`aggregate_tok_per_s` = all tokens / first send → last end).
    pub level: Level,
    /// Over all streams.
    #[serde(flatten)]
    pub drafts: Drafts,
    pub runs: Vec<Run>,
    pub extra: Value,
}

impl Round {
    /// A round from its streams' traces and runs (in the same order).
    pub fn new(
        round: usize,
        speculative: bool,
        max_tokens: u64,
        traces: &[Trace],
        runs: Vec<Run>,
        drafts: Drafts,
        extra: Value,
    ) -> Round {
        let first = traces.iter().map(|t| t.sent).min();
        let streams: Vec<_> = traces
            .iter()
            .map(|t| {
                let start = first.map_or(0.0, |f| t.sent.duration_since(f).as_secs_f64());
                (start, t.timing.clone())
            })
            .collect();
        Round {
            round,
            speculative,
            level: level_from(traces.len(), max_tokens, &streams),
            drafts,
            runs,
            extra,
        }
    }
}

/// Runs whose token ids differ from the reference run of their prompt (its first run
/// with speculation off).
#[derive(Debug, Clone, Serialize)]
pub struct Mismatch {
    pub prompt: String,
    pub rep: usize,
    pub speculative: bool,
    /// First index where the ids differ (the shorter length when one is a prefix of the
    /// other).
    pub at: usize,
    pub reference_len: usize,
    pub len: usize,
    /// Up to 8 ids from `at` of the reference and of this run.
    pub reference_ids: Vec<u32>,
    pub ids: Vec<u32>,
}

/// Every run of `runs` whose ids differ from its prompt's reference (the first run with
/// speculation off, else the first run).
pub fn mismatches<'a>(runs: impl IntoIterator<Item = &'a Run>) -> Vec<Mismatch> {
    let mut by_prompt: BTreeMap<&str, Vec<&Run>> = BTreeMap::new();
    for r in runs {
        by_prompt.entry(&r.prompt).or_default().push(r);
    }
    let mut out = Vec::new();
    for (prompt, runs) in by_prompt {
        let Some(reference) = runs.iter().find(|r| !r.speculative).or(runs.first()) else {
            continue;
        };
        for r in &runs {
            let (a, b) = (&reference.token_ids, &r.token_ids);
            if a == b {
                continue;
            }
            let at = a.iter().zip(b).take_while(|(x, y)| x == y).count();
            let window = |v: &[u32]| v.iter().skip(at).take(8).copied().collect();
            out.push(Mismatch {
                prompt: prompt.to_owned(),
                rep: r.rep,
                speculative: r.speculative,
                at,
                reference_len: a.len(),
                len: b.len(),
                reference_ids: window(a),
                ids: window(b),
            });
        }
    }
    out
}

/// One arm (speculation on or off) of a workload.
#[derive(Debug, Clone, Serialize)]
pub struct Arm {
    /// Decode tok/s (single stream) or aggregate tok/s (concurrent); `None`: no run.
    pub tok_per_s: Option<f64>,
    /// tok/s of every run (concurrent: of every round).
    pub all_tok_per_s: Vec<f64>,
    /// Generated tokens of the runs that count.
    pub tokens: u64,
    /// Over every run of the arm.
    #[serde(flatten)]
    pub drafts: Drafts,
    pub acceptance_rate: Option<f64>,
    pub tokens_per_verification: Option<f64>,
}

impl Arm {
    fn new(tok_per_s: Option<f64>, all: Vec<f64>, tokens: u64, drafts: Drafts) -> Arm {
        Arm {
            tok_per_s,
            all_tok_per_s: all,
            tokens,
            drafts,
            acceptance_rate: drafts.acceptance_rate(),
            tokens_per_verification: drafts.tokens_per_verification(),
        }
    }

    /// Single stream: the fastest run of each prompt counts; tok/s = Σ tokens after the
    /// first / Σ spans of those runs.
    fn single(runs: &[&Run]) -> Arm {
        let mut best: BTreeMap<&str, &Run> = BTreeMap::new();
        for r in runs {
            let b = best.entry(&r.prompt).or_insert(r);
            if r.tok_per_s > b.tok_per_s {
                *b = r;
            }
        }
        let after: u64 = best.values().map(|r| r.tokens_after_first).sum();
        let span: f64 = best.values().map(|r| r.span_s).sum();
        Arm::new(
            (span > 0.0).then(|| after as f64 / span),
            runs.iter().map(|r| r.tok_per_s).collect(),
            best.values().map(|r| r.tokens).sum(),
            Drafts::total(runs.iter().map(|r| &r.drafts)),
        )
    }

    /// Concurrent: the fastest round counts.
    fn concurrent(rounds: &[&Round]) -> Arm {
        let best = rounds.iter().max_by(|a, b| {
            a.level
                .aggregate_tok_per_s
                .total_cmp(&b.level.aggregate_tok_per_s)
        });
        Arm::new(
            best.map(|r| r.level.aggregate_tok_per_s),
            rounds.iter().map(|r| r.level.aggregate_tok_per_s).collect(),
            best.map_or(0, |r| r.level.tokens),
            Drafts::total(rounds.iter().map(|r| &r.drafts)),
        )
    }
}

/// `a / b` when both are known and `b > 0`.
pub fn ratio(a: Option<f64>, b: Option<f64>) -> Option<f64> {
    match (a, b) {
        (Some(a), Some(b)) if b > 0.0 => Some(a / b),
        _ => None,
    }
}

/// One prompt of a single-stream workload.
#[derive(Debug, Clone, Serialize)]
pub struct PromptRow {
    pub prompt: String,
    pub off: Arm,
    pub on: Arm,
    /// on / off.
    pub ratio: Option<f64>,
    pub identical: bool,
    /// The text of the first run with speculation off.
    pub text: String,
}

/// A workload: speculation on against off.
#[derive(Debug, Clone, Serialize)]
pub struct Workload {
    /// `extractive`, `open-ended` or `16 streams`.
    pub name: String,
    pub off: Arm,
    pub on: Arm,
    /// on / off.
    pub ratio: Option<f64>,
    /// Whether every run's token ids equal its prompt's reference (see [`mismatches`]).
    pub identical: bool,
    pub mismatches: Vec<Mismatch>,
    /// Single-stream workloads: per prompt.
    pub prompts: Vec<PromptRow>,
}

/// The order of the two arms (speculation on, off) in repetition or round `i`:
/// alternating, so the machine's drift hits both equally.
pub fn arm_order(i: usize) -> [bool; 2] {
    if i.is_multiple_of(2) {
        [true, false]
    } else {
        [false, true]
    }
}

impl Workload {
    /// A workload from its two arms and the runs' mismatches.
    fn new(
        name: &str,
        off: Arm,
        on: Arm,
        mismatches: Vec<Mismatch>,
        prompts: Vec<PromptRow>,
    ) -> Self {
        Self {
            name: name.to_owned(),
            ratio: ratio(on.tok_per_s, off.tok_per_s),
            off,
            on,
            identical: mismatches.is_empty(),
            mismatches,
            prompts,
        }
    }
}

/// The single-stream workload `name` over the runs of the prompts `names`.
pub fn single_stream(name: &str, names: &[&str], runs: &[Run]) -> Workload {
    let mine: Vec<&Run> = runs
        .iter()
        .filter(|r| names.contains(&r.prompt.as_str()))
        .collect();
    let arm = |on: bool| -> Vec<&Run> {
        mine.iter()
            .copied()
            .filter(|r| r.speculative == on)
            .collect()
    };
    let (off, on) = (Arm::single(&arm(false)), Arm::single(&arm(true)));
    let mismatches = mismatches(mine.iter().copied());
    let prompts = names
        .iter()
        .map(|&p| {
            let of = |on: bool| -> Vec<&Run> {
                mine.iter()
                    .copied()
                    .filter(|r| r.prompt == p && r.speculative == on)
                    .collect()
            };
            let (off_runs, on_runs) = (of(false), of(true));
            let (off, on) = (Arm::single(&off_runs), Arm::single(&on_runs));
            PromptRow {
                prompt: p.to_owned(),
                ratio: ratio(on.tok_per_s, off.tok_per_s),
                off,
                on,
                identical: !mismatches.iter().any(|m| m.prompt == p),
                text: off_runs.first().map(|r| r.text.clone()).unwrap_or_default(),
            }
        })
        .collect();
    Workload::new(name, off, on, mismatches, prompts)
}

/// The concurrent workload `name` over `rounds`.
pub fn concurrent(name: &str, rounds: &[Round]) -> Workload {
    let arm = |on: bool| -> Vec<&Round> { rounds.iter().filter(|r| r.speculative == on).collect() };
    let (off, on) = (Arm::concurrent(&arm(false)), Arm::concurrent(&arm(true)));
    let mismatches = mismatches(rounds.iter().flat_map(|r| &r.runs));
    Workload::new(name, off, on, mismatches, Vec::new())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(prompt: &str, on: bool, rep: usize, tok_per_s: f64, ids: &[u32]) -> Run {
        Run {
            prompt: prompt.into(),
            speculative: on,
            rep,
            prompt_tokens: 10,
            tokens: 11,
            tokens_after_first: 10,
            span_s: 10.0 / tok_per_s,
            tok_per_s,
            ttft_ms: 1.0,
            finish_reason: "length".into(),
            drafts: if on {
                Drafts {
                    draft_tokens: Some(8),
                    accepted_tokens: Some(6),
                    verification_steps: Some(2),
                }
            } else {
                Drafts::ZERO
            },
            token_ids: ids.to_vec(),
            text: String::new(),
            extra: Value::Null,
        }
    }

    #[test]
    fn drafts_ratios_and_unknowns() {
        let d = Drafts {
            draft_tokens: Some(10),
            accepted_tokens: Some(6),
            verification_steps: Some(3),
        };
        assert_eq!(d.acceptance_rate(), Some(0.6));
        assert_eq!(d.tokens_per_verification(), Some(3.0));
        assert_eq!(Drafts::ZERO.acceptance_rate(), None);
        let unknown = Drafts {
            verification_steps: None,
            ..d
        };
        assert_eq!(d.add(unknown).verification_steps, None);
        assert_eq!(d.add(unknown).draft_tokens, Some(20));
    }

    #[test]
    fn best_run_per_prompt_and_ratio() {
        let runs = vec![
            run("a", false, 0, 50.0, &[1, 2, 3]),
            run("a", true, 0, 90.0, &[1, 2, 3]),
            run("a", false, 1, 40.0, &[1, 2, 3]),
            run("a", true, 1, 100.0, &[1, 2, 3]),
            run("b", false, 0, 50.0, &[4]),
            run("b", true, 0, 50.0, &[4]),
        ];
        let w = single_stream("w", &["a", "b"], &runs);
        // off: (10 + 10) / (0.2 + 0.2) = 50; on: (10 + 10) / (0.1 + 0.2) = 66.7.
        assert!((w.off.tok_per_s.unwrap() - 50.0).abs() < 1e-9);
        assert!((w.on.tok_per_s.unwrap() - 200.0 / 3.0).abs() < 1e-9);
        assert!(w.identical);
        assert_eq!(w.on.drafts.draft_tokens, Some(24));
        // 3 runs x (6 accepted over 2 steps): (18 + 6) / 6.
        assert_eq!(w.on.tokens_per_verification, Some(4.0));
        assert_eq!(w.prompts.len(), 2);
        assert!((w.prompts[0].ratio.unwrap() - 2.0).abs() < 1e-9);
    }

    #[test]
    fn mismatch_names_the_first_difference() {
        let runs = vec![
            run("a", false, 0, 50.0, &[1, 2, 3, 4]),
            run("a", true, 0, 50.0, &[1, 2, 9, 4]),
            run("a", true, 1, 50.0, &[1, 2, 3]),
        ];
        let m = mismatches(&runs);
        assert_eq!(m.len(), 2);
        assert_eq!((m[0].at, m[0].ids.clone()), (2, vec![9, 4]));
        assert_eq!((m[1].at, m[1].len, m[1].reference_len), (3, 3, 4));
        let w = single_stream("w", &["a"], &runs);
        assert!(!w.identical);
        assert!(!w.prompts[0].identical);
    }
}
