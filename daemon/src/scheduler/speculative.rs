//! Speculative decoding's scheduling side: where drafts come from (n-gram prompt
//! lookup), how many a sequence gets each step (an adaptive controller), and the
//! counters for `stats`, `/metrics` and `usage`.
//!
//! A decoding sequence with drafts `d₁ … d_m` runs its pending token plus the drafts as
//! one item of the step's forward pass, asking for every row's logits. Row `i` gives the
//! distribution of the token after `d_i`; the engine loop samples the rows in order
//! through the request's own sampling chain and keeps going while the sampled token
//! equals the next draft (see [`crate::sampling::speculative`] for why this is Leviathan
//! et al.'s rule for these drafts). Rows after the first mismatch are discarded, the KV
//! positions they wrote are past the sequence's end and its blocks beyond it are
//! released ([`crate::scheduler::BlockManager::truncate`]).
//!
//! With a draft model, its K/V live in a second pool under the same block ids, and a
//! sequence tracks how far they are computed ([`SpecState::draft_computed`]), starting
//! from position 0 for every sequence: blocks shared through the prefix cache or a fork
//! hold the target's K/V, but their draft K/V may come from nobody (a sequence that
//! never drafted) or be stale, so they are never trusted. Writing the draft K/V of a
//! shared block again is harmless: the same tokens at the same positions give the same
//! bits.

use crate::config::{SpecMethod, SpeculativeConfig};
use crate::model_runner::SpecCosts;
use crate::request::stats::ratio;

/// The scheduler's speculation settings (from `[speculative]`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Speculation {
    /// Most drafts per sequence per step.
    pub k: usize,
    /// `Some(cost)`: drafts come from the model runner's draft model, each draft token
    /// costing `cost` of a target decode step (besides its verification row); `None`:
    /// n-gram prompt lookup.
    pub draft_cost: Option<f64>,
    /// Cost of one extra row of a decode step, as a fraction of a one-row step
    /// (measured at start-up, [`crate::model_runner::SpecCosts`]).
    pub row_cost: f64,
    /// Whether `row_cost` follows the engine's steps ([`RowCost`]); false when
    /// `speculative.row_cost` sets it.
    pub follow_row_cost: bool,
    /// Shortest suffix the lookup matches, tokens.
    pub ngram_min: usize,
    /// Longest suffix the lookup matches, tokens (tried first).
    pub ngram_max: usize,
    /// Drafts are proposed only while at most this many sequences decode.
    pub max_running: usize,
}

impl Speculation {
    /// The settings of `[speculative]` with the measured `costs`, or `None` when it is
    /// off.
    pub fn from_config(c: &SpeculativeConfig, costs: SpecCosts) -> Option<Self> {
        (c.method != SpecMethod::Off && c.max_running > 0).then_some(Self {
            k: c.k,
            draft_cost: costs.draft_cost.filter(|_| c.method == SpecMethod::Draft),
            row_cost: costs.row_cost,
            follow_row_cost: c.row_cost == 0.0,
            ngram_min: c.ngram_min,
            ngram_max: c.ngram_max,
            max_running: c.max_running,
        })
    }
}

/// Prompt lookup (n-gram) proposal over `len` tokens of history (`token(i)`: prompt
/// then output): for `n` from `max` down to `min`, the most recent earlier occurrence of
/// the last `n` tokens proposes up to `k` tokens that followed it. The first `n` with a
/// match wins (the longest suffix). Empty when nothing matches, the history is shorter
/// than `min + 1` tokens, or `k` is 0.
///
/// The method of Saxena's prompt lookup decoding (2023) and vLLM's `ngram` proposer;
/// the most recent occurrence is taken (the text being quoted or edited is usually the
/// nearest).
pub fn ngram_propose(
    len: usize,
    token: impl Fn(usize) -> u32,
    min: usize,
    max: usize,
    k: usize,
) -> Vec<u32> {
    if k == 0 || min == 0 {
        return Vec::new();
    }
    for n in (min..=max).rev() {
        // The suffix is `len − n .. len`; an earlier occurrence starts at `i < len − n`.
        let Some(suffix_start) = len.checked_sub(n) else {
            continue;
        };
        let matches_at = |i: usize| (0..n).all(|j| token(i + j) == token(suffix_start + j));
        if let Some(i) = (0..suffix_start).rev().find(|&i| matches_at(i)) {
            let from = i + n;
            let to = (from + k).min(len);
            return (from..to).map(&token).collect();
        }
    }
    Vec::new()
}

/// Acceptance estimate a sequence starts with: a draft from a matched n-gram is a
/// coin toss; a draft model is chosen because it agrees with the target.
const PRIOR_ACCEPTANCE: f64 = 0.5;
const PRIOR_ACCEPTANCE_DRAFT_MODEL: f64 = 0.9;
/// Weight of each new observation in the acceptance estimate (an exponential moving
/// average over about the last 10 drafts).
const ACCEPTANCE_EMA: f64 = 0.1;

/// Steps a draft-model sequence goes without drafts before it drafts one token again to
/// re-measure its acceptance (the draft model cannot be shadowed for free).
const PROBE_INTERVAL: u32 = 16;

/// One sequence's speculation state: the adaptive draft length and its counters.
#[derive(Debug, Clone, PartialEq)]
pub struct SpecState {
    /// Estimated probability that a draft is accepted given the ones before it were.
    acceptance: f64,
    /// What `acceptance` started from.
    prior: f64,
    /// The first draft of a proposal not run this step, compared with the sampled
    /// token to keep learning `acceptance` while speculation is off.
    shadow: Option<u32>,
    /// Drafts verified so far.
    pub drafted: usize,
    /// Of those, drafts accepted.
    pub accepted: usize,
    /// Steps that verified at least one draft.
    pub verifications: usize,
    /// Positions whose K/V the draft model holds (draft method).
    pub draft_computed: usize,
    /// Consecutive steps without drafts (draft method: for the probe).
    idle: u32,
}

impl Default for SpecState {
    fn default() -> Self {
        Self {
            acceptance: PRIOR_ACCEPTANCE,
            prior: PRIOR_ACCEPTANCE,
            shadow: None,
            drafted: 0,
            accepted: 0,
            verifications: 0,
            draft_computed: 0,
            idle: 0,
        }
    }
}

impl SpecState {
    /// The state a sequence starts with under `spec` (its prior acceptance estimate).
    pub fn new(spec: &Speculation) -> Self {
        let prior = if spec.draft_cost.is_some() {
            PRIOR_ACCEPTANCE_DRAFT_MODEL
        } else {
            PRIOR_ACCEPTANCE
        };
        Self {
            acceptance: prior,
            prior,
            ..Self::default()
        }
    }

    /// The state of a choice forked from this sequence: its prior, no counts.
    pub fn fork(&self) -> Self {
        Self {
            acceptance: self.prior,
            prior: self.prior,
            ..Self::default()
        }
    }

    /// How many of `available` drafts to run: the `m` maximising the expected tokens per
    /// unit of step cost, `(1 + α + … + α^m) / (1 + m · row_cost)` for acceptance
    /// estimate `α` (each draft is accepted only when all before it were). 0 turns
    /// speculation off for this step; the first draft is then shadowed (compared with
    /// the sampled token) so the estimate can recover.
    /// `row_cost` is an extra row's cost as a fraction of a one-row step.
    pub fn draft_len(&mut self, available: usize, row_cost: f64) -> usize {
        self.draft_len_at(available, row_cost)
    }

    /// [`Self::draft_len`] for the draft method, each draft costing `draft_cost` of a
    /// decode step on top of its row (`cost` = both); after [`PROBE_INTERVAL`] steps
    /// without drafts it drafts one token, so the estimate follows a change in
    /// acceptance (unless `cost ≥ 1`, where no draft can pay).
    pub fn model_draft_len(&mut self, available: usize, cost: f64) -> usize {
        // At a cost of a whole step per draft, not even certain drafts pay: no probes
        // (each would also make the draft model catch up on the tokens it skipped).
        if cost >= 1.0 {
            return 0;
        }
        let m = self.draft_len_at(available, cost);
        if m > 0 || available == 0 {
            self.idle = 0;
            return m;
        }
        self.idle += 1;
        if self.idle >= PROBE_INTERVAL {
            self.idle = 0;
            return 1;
        }
        0
    }

    fn draft_len_at(&self, available: usize, cost: f64) -> usize {
        let a = self.acceptance;
        let (mut best, mut best_m) = (1.0, 0);
        let (mut gain, mut p) = (1.0, 1.0);
        for m in 1..=available {
            p *= a;
            gain += p;
            let v = gain / (1.0 + m as f64 * cost);
            if v > best {
                (best, best_m) = (v, m);
            }
        }
        best_m
    }

    /// Records that the first draft `d` was not run this step: [`Self::observe_sampled`]
    /// compares it with the token sampled.
    pub fn shadow(&mut self, d: u32) {
        self.shadow = Some(d);
    }

    /// The token sampled in a step without drafts: a shadowed draft counts as accepted
    /// or rejected in the estimate (not in the counters).
    pub fn observe_sampled(&mut self, token: u32) {
        if let Some(d) = self.shadow.take() {
            self.update(d == token);
        }
    }

    /// A verification of `drafted` drafts accepted the first `accepted` of them.
    pub fn observe_verification(&mut self, drafted: usize, accepted: usize) {
        self.shadow = None;
        if drafted == 0 {
            return;
        }
        self.drafted += drafted;
        self.accepted += accepted;
        self.verifications += 1;
        for _ in 0..accepted {
            self.update(true);
        }
        if accepted < drafted {
            self.update(false);
        }
    }

    /// `accepted / drafted` (0 before any draft).
    pub fn acceptance_rate(&self) -> f64 {
        ratio(self.accepted, self.drafted)
    }

    /// Tokens per verification step: `(accepted + verifications) / verifications`.
    pub fn tokens_per_verification(&self) -> f64 {
        ratio(self.accepted + self.verifications, self.verifications)
    }

    fn update(&mut self, accepted: bool) {
        let x = if accepted { 1.0 } else { 0.0 };
        self.acceptance += ACCEPTANCE_EMA * (x - self.acceptance);
    }
}

/// Weight of each step in [`RowCost`]'s moving averages.
const ROW_COST_EMA: f64 = 0.05;

/// The cost of an extra verification row, followed online from the engine's own steps
/// that ran one decoding sequence alone: the moving average of one-row step times `t₁`,
/// and of `(t_r / t₁ − 1) / (r − 1)` over steps of `r > 1` rows. It starts from the
/// start-up measurement and so follows what the probe cannot see (a deep context's
/// attention per row, other load on the machine).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RowCost {
    /// Moving average of one-row step times, seconds (`None` before the first).
    one_row: Option<f64>,
    /// The current estimate, a fraction of a one-row step.
    pub cost: f64,
}

impl RowCost {
    /// Starts at `cost`.
    pub fn new(cost: f64) -> Self {
        Self {
            one_row: None,
            cost,
        }
    }

    /// A step of `rows` rows of one decoding sequence took `secs`.
    pub fn observe(&mut self, rows: usize, secs: f64) {
        if rows == 0 || !secs.is_finite() || secs <= 0.0 {
            return;
        }
        if rows == 1 {
            let t = self.one_row.get_or_insert(secs);
            *t += ROW_COST_EMA * (secs - *t);
            return;
        }
        if let Some(t1) = self.one_row {
            let c = ((secs / t1 - 1.0) / (rows - 1) as f64).clamp(0.0, 4.0);
            self.cost += ROW_COST_EMA * (c - self.cost);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn propose(h: &[u32], min: usize, max: usize, k: usize) -> Vec<u32> {
        ngram_propose(h.len(), |i| h[i], min, max, k)
    }

    #[test]
    fn the_longest_suffix_proposes_what_followed_it() {
        // "7 8 9" occurred earlier, followed by 1 2 3; the 1-gram "9" also occurs later
        // (followed by 5), but the longer match wins.
        let h = [7, 8, 9, 1, 2, 3, 9, 5, 7, 8, 9];
        assert_eq!(propose(&h, 1, 3, 2), vec![1, 2]);
        assert_eq!(propose(&h, 1, 3, 10), vec![1, 2, 3, 9, 5, 7, 8, 9]);
        // Only 1-grams allowed: the most recent earlier "9" (index 6) is followed by 5.
        assert_eq!(propose(&h, 1, 1, 3), vec![5, 7, 8]);
    }

    #[test]
    fn the_most_recent_occurrence_wins_among_equal_lengths() {
        let h = [1, 2, 10, 1, 2, 20, 1, 2];
        assert_eq!(propose(&h, 2, 2, 1), vec![20]);
    }

    #[test]
    fn bounds_are_respected() {
        let h = [4, 5, 6, 4, 5];
        // The 2-gram "4 5" matches; with min 3 nothing does.
        assert_eq!(propose(&h, 2, 3, 4), vec![6, 4, 5]);
        assert!(propose(&h, 3, 4, 4).is_empty());
        assert!(propose(&h, 1, 2, 0).is_empty(), "k = 0");
        // A proposal stops at the end of the history.
        assert_eq!(propose(&[3, 3], 1, 1, 5), vec![3]);
    }

    #[test]
    fn empty_and_short_histories_propose_nothing() {
        assert!(propose(&[], 1, 4, 4).is_empty());
        assert!(propose(&[9], 1, 4, 4).is_empty());
        assert!(propose(&[1, 2, 3, 4], 1, 4, 4).is_empty(), "no repeat");
    }

    #[test]
    fn draft_length_follows_acceptance() {
        let mut s = SpecState::default();
        // α = 0.5: (1 + .5) / 1.15 = 1.30 beats m = 0 (1.0); m = 2: 1.75 / 1.3 = 1.35;
        // m = 3: 1.875 / 1.45 = 1.29.
        assert_eq!(s.draft_len(8, 0.15), 2);
        assert_eq!(s.draft_len(1, 0.15), 1);
        assert_eq!(s.draft_len(0, 0.15), 0);
        for _ in 0..40 {
            s.observe_verification(8, 8);
        }
        assert_eq!(s.draft_len(8, 0.15), 8, "near-certain drafts: all of them");
        for _ in 0..40 {
            s.observe_verification(1, 0);
        }
        assert_eq!(s.draft_len(8, 0.15), 0, "rejected drafts: speculation off");
        assert_eq!(s.drafted, 360);
        assert_eq!(s.accepted, 320);
        assert_eq!(s.verifications, 80);
        // Shadowed drafts that would have been accepted bring it back.
        for _ in 0..30 {
            s.shadow(5);
            s.observe_sampled(5);
        }
        assert!(s.draft_len(8, 0.15) >= 4);
        assert_eq!(s.drafted, 360, "shadows are not counted as drafts");
    }

    #[test]
    fn draft_model_length_counts_the_draft_cost_and_probes() {
        let mut s = SpecState::default();
        // α = 0.5 and a draft costing 0.65 of a step (its row and its draft step): none pays.
        assert_eq!(s.model_draft_len(8, 0.65), 0);
        for _ in 0..PROBE_INTERVAL - 2 {
            assert_eq!(s.model_draft_len(8, 0.65), 0);
        }
        assert_eq!(s.model_draft_len(8, 0.65), 1, "the probe");
        assert_eq!(s.model_draft_len(8, 0.65), 0);
        for _ in 0..40 {
            s.observe_verification(8, 8);
        }
        // Near-certain drafts at 0.45 each: (1 + m) / (1 + 0.45 m) grows with m.
        assert_eq!(s.model_draft_len(8, 0.45), 8);
        // A draft costing a whole step never pays, not even probed.
        for _ in 0..2 * PROBE_INTERVAL {
            assert_eq!(s.model_draft_len(8, 1.1), 0);
        }
    }

    #[test]
    fn the_row_cost_follows_the_steps() {
        let mut r = RowCost::new(0.2);
        r.observe(3, 0.008);
        assert_eq!(r.cost, 0.2, "no one-row time yet");
        for _ in 0..200 {
            r.observe(1, 0.004);
            // 5 rows take 2.6 one-row steps: 0.4 per extra row.
            r.observe(5, 0.0104);
        }
        assert!((r.cost - 0.4).abs() < 1e-3, "{}", r.cost);
        r.observe(2, f64::NAN);
        assert!((r.cost - 0.4).abs() < 1e-3);
    }

    #[test]
    fn stats_ratios() {
        let mut st = crate::request::SpecStats::default();
        assert_eq!(st.with_ratios().acceptance_rate, 0.0);
        st.add(4, 3);
        st.add(4, 1);
        st.add(0, 0);
        let r = st.with_ratios();
        assert_eq!(
            (r.draft_tokens, r.accepted_tokens, r.verification_steps),
            (8, 4, 2)
        );
        assert_eq!(r.acceptance_rate, 0.5);
        assert_eq!(r.tokens_per_verification, 3.0);
    }
}
