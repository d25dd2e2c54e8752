//! [`ReasoningGate`]: holds a structured-output constraint back while the model
//! reasons, so the grammar applies to the answer only (issue 17; vLLM's structured
//! output with a reasoning parser does the same: the grammar starts after the end of
//! reasoning).
//!
//! States: `Detect` (the output may still open `<think>`: the constraint's mask applies,
//! and the tokens that spell `<think>` stay allowed beside it; a token the grammar
//! allows goes to the grammar, one only `<think>` explains starts the reasoning, after
//! which only tokens that continue `<think>` are allowed), `Inside` (no mask; the
//! sequence's output splitter reopens the gate at `</think>`), `Open` (the constraint
//! follows every token). While the reasoning holds the constraint back, the
//! end-of-generation tokens are banned: ending there would leave the constraint (a
//! forced tool call, a JSON answer) unmet.

use crate::request::channels::{ReasoningStart, THINK_OPEN};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// `matched` bytes of `<think>` taken so far.
    Detect {
        matched: usize,
    },
    Inside,
    Open,
}

/// Decides, token by token, whether the constraint sees the output.
#[derive(Debug, Clone)]
pub struct ReasoningGate {
    state: State,
    /// Tokens whose bytes are a non-empty piece of `<think>`: id and bytes.
    pieces: Vec<(u32, Vec<u8>)>,
    /// `<think>` openers the last mask banned (allowed again by the gate): taking one
    /// starts the reasoning.
    restored: Vec<u32>,
    /// End-of-generation ids, banned while the reasoning holds the constraint back.
    eog: Vec<u32>,
    /// Per accepted token: the state before it and whether the constraint took it.
    history: Vec<(State, bool)>,
}

impl ReasoningGate {
    /// A gate for output starting as `start` (`Ended`: open at once). `pieces` are the
    /// vocabulary's tokens whose bytes occur in `<think>` ([`Self::think_pieces`]).
    pub fn new(start: ReasoningStart, pieces: Vec<(u32, Vec<u8>)>, eog: Vec<u32>) -> Self {
        let state = match start {
            ReasoningStart::Detect => State::Detect { matched: 0 },
            ReasoningStart::Inside => State::Inside,
            ReasoningStart::Ended => State::Open,
        };
        Self {
            state,
            pieces,
            restored: Vec::new(),
            eog,
            history: Vec::new(),
        }
    }

    /// The tokens of a vocabulary (`bytes(id)` for `id < vocab`) whose bytes are a
    /// non-empty substring of `<think>`.
    pub fn think_pieces<'a>(vocab: u32, bytes: impl Fn(u32) -> &'a [u8]) -> Vec<(u32, Vec<u8>)> {
        let marker = THINK_OPEN.as_bytes();
        (0..vocab)
            .filter_map(|id| {
                let b = bytes(id);
                let inside = !b.is_empty()
                    && b.len() <= marker.len()
                    && marker.windows(b.len()).any(|w| w == b);
                inside.then(|| (id, b.to_vec()))
            })
            .collect()
    }

    /// The reasoning ended (or the output showed it has none): the constraint follows
    /// from the next token.
    pub fn open(&mut self) {
        if self.state == State::Inside {
            self.state = State::Open;
        }
    }

    /// Whether the next [`Self::apply`] runs the constraint's mask.
    pub fn masks(&self) -> bool {
        matches!(self.state, State::Open | State::Detect { matched: 0 })
    }

    /// Pieces that continue `<think>` after `matched` bytes.
    fn continuations(&self, matched: usize) -> impl Iterator<Item = &(u32, Vec<u8>)> {
        let rest = &THINK_OPEN.as_bytes()[matched..];
        self.pieces.iter().filter(move |(_, b)| rest.starts_with(b))
    }

    /// Runs `mask` (the constraint's) over `logits` as the state asks: always when
    /// open, with the `<think>` openers kept when detecting; not while inside; a
    /// started `<think>` allows only its continuations.
    ///
    /// # Errors
    /// The mask's error.
    pub fn apply<E>(
        &mut self,
        logits: &mut [f32],
        mask: impl FnOnce(&mut [f32]) -> Result<(), E>,
    ) -> Result<(), E> {
        self.restored.clear();
        match self.state {
            State::Open => mask(logits),
            State::Inside => {
                self.ban_eog(logits);
                Ok(())
            }
            State::Detect { matched: 0 } => {
                let saved: Vec<(u32, f32)> = self
                    .continuations(0)
                    .filter_map(|(id, _)| logits.get(*id as usize).map(|l| (*id, *l)))
                    .collect();
                mask(logits)?;
                for &(id, l) in &saved {
                    if let Some(x) = logits.get_mut(id as usize) {
                        if *x == f32::NEG_INFINITY && l != f32::NEG_INFINITY {
                            *x = l;
                            self.restored.push(id);
                        }
                    }
                }
                Ok(())
            }
            State::Detect { matched } => {
                let keep: Vec<(u32, f32)> = self
                    .continuations(matched)
                    .filter_map(|(id, _)| logits.get(*id as usize).map(|l| (*id, *l)))
                    .collect();
                logits.fill(f32::NEG_INFINITY);
                for (id, l) in keep {
                    logits[id as usize] = l;
                }
                Ok(())
            }
        }
    }

    fn ban_eog(&self, logits: &mut [f32]) {
        for &t in &self.eog {
            if let Some(x) = logits.get_mut(t as usize) {
                *x = f32::NEG_INFINITY;
            }
        }
    }

    /// `token` was accepted; returns whether the constraint must take it.
    pub fn accept(&mut self, token: u32) -> bool {
        let before = self.state;
        let feed = match self.state {
            State::Open => true,
            State::Inside => false,
            State::Detect { matched } => {
                // At the start a token the grammar allowed is the grammar's; only one
                // the gate let through beside it opens the reasoning.
                let opens = matched > 0 || self.restored.contains(&token);
                let piece = self
                    .continuations(matched)
                    .find(|(id, _)| *id == token)
                    .map(|(_, b)| b.len())
                    .filter(|_| opens);
                match piece {
                    Some(n) if matched + n == THINK_OPEN.len() => {
                        self.state = State::Inside;
                        false
                    }
                    Some(n) => {
                        self.state = State::Detect {
                            matched: matched + n,
                        };
                        false
                    }
                    None => {
                        self.state = State::Open;
                        true
                    }
                }
            }
        };
        self.history.push((before, feed));
        feed
    }

    /// Takes back the last `n` tokens; returns how many of them the constraint took.
    pub fn rollback(&mut self, n: usize) -> usize {
        let mut fed = 0;
        for _ in 0..n {
            let Some((state, f)) = self.history.pop() else {
                break;
            };
            self.state = state;
            fed += usize::from(f);
        }
        fed
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Vocabulary: 0 "<", 1 "think", 2 ">", 3 "<think>", 4 "{", 5 "x".
    fn gate(start: ReasoningStart) -> ReasoningGate {
        let vocab: [&[u8]; 7] = [b"<", b"think", b">", b"<think>", b"{", b"x", b"<|end|>"];
        ReasoningGate::new(
            start,
            ReasoningGate::think_pieces(7, |i| vocab[i as usize]),
            vec![6],
        )
    }

    /// A mask that allows only `{`.
    fn brace(l: &mut [f32]) -> Result<(), ()> {
        for (i, x) in l.iter_mut().enumerate() {
            if i != 4 {
                *x = f32::NEG_INFINITY;
            }
        }
        Ok(())
    }

    fn allowed(l: &[f32]) -> Vec<usize> {
        (0..l.len()).filter(|&i| l[i].is_finite()).collect()
    }

    #[test]
    fn detect_allows_the_grammar_and_think_openers() {
        let mut g = gate(ReasoningStart::Detect);
        let mut l = vec![0.5; 7];
        g.apply(&mut l, brace).unwrap_or(());
        assert_eq!(allowed(&l), [0, 3, 4]);
        assert!(!g.accept(0), "'<' starts <think>: not the constraint's");
        let mut l = vec![0.5; 7];
        g.apply(&mut l, brace).unwrap_or(());
        assert_eq!(allowed(&l), [1], "only the continuation of <think>");
        assert!(!g.accept(1));
        assert!(!g.accept(2));
        let mut l = vec![0.5; 7];
        g.apply(&mut l, brace).unwrap_or(());
        assert_eq!(
            allowed(&l),
            [0, 1, 2, 3, 4, 5],
            "inside: no mask, no end of turn"
        );
        assert!(!g.accept(5));
        g.open();
        assert!(
            g.accept(4),
            "after </think> the constraint takes every token"
        );
        assert_eq!(g.rollback(5), 1);
        let mut l = vec![0.5; 7];
        g.apply(&mut l, brace).unwrap_or(());
        assert_eq!(allowed(&l), [0, 3, 4], "rolled back to the start");
    }

    /// A mask that allows only `<` (a grammar such as `<tool_call>…`).
    fn angle(l: &mut [f32]) -> Result<(), ()> {
        for (i, x) in l.iter_mut().enumerate() {
            if i != 0 {
                *x = f32::NEG_INFINITY;
            }
        }
        Ok(())
    }

    #[test]
    fn a_token_the_grammar_allows_is_the_grammars() {
        let mut g = gate(ReasoningStart::Detect);
        let mut l = vec![0.5; 7];
        g.apply(&mut l, angle).unwrap_or(());
        assert_eq!(allowed(&l), [0, 3]);
        assert!(
            g.accept(0),
            "'<' continues the grammar: the constraint takes it"
        );
        let mut l = vec![0.5; 7];
        g.apply(&mut l, angle).unwrap_or(());
        assert_eq!(allowed(&l), [0], "open: the grammar's mask alone");
        let mut g = gate(ReasoningStart::Detect);
        let mut l = vec![0.5; 7];
        g.apply(&mut l, angle).unwrap_or(());
        assert!(!g.accept(3), "<think> only the gate allowed: reasoning");
    }

    #[test]
    fn a_grammar_token_first_opens_the_gate() {
        let mut g = gate(ReasoningStart::Detect);
        assert!(g.accept(4));
        let mut l = vec![0.5; 7];
        g.apply(&mut l, brace).unwrap_or(());
        assert_eq!(allowed(&l), [4]);
    }

    #[test]
    fn prompt_opened_reasoning_waits_for_the_splitter() {
        let mut g = gate(ReasoningStart::Inside);
        assert!(!g.accept(4));
        g.open();
        assert!(g.accept(4));
        let mut g = gate(ReasoningStart::Ended);
        assert!(g.accept(0));
    }
}
