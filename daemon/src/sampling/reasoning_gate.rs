//! [`ReasoningGate`]: holds a structured-output constraint back while the model
//! reasons, so the grammar applies to the answer only (issue 17; vLLM's structured
//! output with a reasoning parser does the same: the grammar starts after the end of
//! reasoning).
//!
//! States: `Detect` (the output may still open `<think>`: the constraint's mask applies,
//! and the tokens that spell `<think>` stay allowed beside it; once one is taken, only
//! tokens that continue it are), `Inside` (no mask; the sequence's output splitter
//! reopens the gate at `</think>`), `Open` (the constraint follows every token).

use crate::detokenizer::reasoning::{ReasoningStart, THINK_OPEN};

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
    /// Logits of the pieces, kept across the constraint's mask.
    saved: Vec<(u32, f32)>,
    /// Per accepted token: the state before it and whether the constraint took it.
    history: Vec<(State, bool)>,
}

impl ReasoningGate {
    /// A gate for output starting as `start` (`Ended`: open at once). `pieces` are the
    /// vocabulary's tokens whose bytes occur in `<think>` ([`Self::think_pieces`]).
    pub fn new(start: ReasoningStart, pieces: Vec<(u32, Vec<u8>)>) -> Self {
        let state = match start {
            ReasoningStart::Detect => State::Detect { matched: 0 },
            ReasoningStart::Inside => State::Inside,
            ReasoningStart::Ended => State::Open,
        };
        Self {
            state,
            pieces,
            saved: Vec::new(),
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
        match self.state {
            State::Open => mask(logits),
            State::Inside => Ok(()),
            State::Detect { matched: 0 } => {
                let saved: Vec<(u32, f32)> = self
                    .continuations(0)
                    .filter_map(|(id, _)| logits.get(*id as usize).map(|l| (*id, *l)))
                    .collect();
                mask(logits)?;
                for &(id, l) in &saved {
                    if let Some(x) = logits.get_mut(id as usize) {
                        *x = l;
                    }
                }
                self.saved = saved;
                Ok(())
            }
            State::Detect { matched } => {
                self.saved.clear();
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

    /// `token` was accepted; returns whether the constraint must take it.
    pub fn accept(&mut self, token: u32) -> bool {
        let before = self.state;
        let feed = match self.state {
            State::Open => true,
            State::Inside => false,
            State::Detect { matched } => {
                let piece = self
                    .continuations(matched)
                    .find(|(id, _)| *id == token)
                    .map(|(_, b)| b.len());
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
        let vocab: [&[u8]; 6] = [b"<", b"think", b">", b"<think>", b"{", b"x"];
        ReasoningGate::new(start, ReasoningGate::think_pieces(6, |i| vocab[i as usize]))
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
        let mut l = vec![0.5; 6];
        g.apply(&mut l, brace).unwrap_or(());
        assert_eq!(allowed(&l), [0, 3, 4]);
        assert!(!g.accept(0), "'<' starts <think>: not the constraint's");
        let mut l = vec![0.5; 6];
        g.apply(&mut l, brace).unwrap_or(());
        assert_eq!(allowed(&l), [1], "only the continuation of <think>");
        assert!(!g.accept(1));
        assert!(!g.accept(2));
        let mut l = vec![0.5; 6];
        g.apply(&mut l, brace).unwrap_or(());
        assert_eq!(allowed(&l), [0, 1, 2, 3, 4, 5], "inside: no mask");
        assert!(!g.accept(5));
        g.open();
        assert!(
            g.accept(4),
            "after </think> the constraint takes every token"
        );
        assert_eq!(g.rollback(5), 1);
        let mut l = vec![0.5; 6];
        g.apply(&mut l, brace).unwrap_or(());
        assert_eq!(allowed(&l), [0, 3, 4], "rolled back to the start");
    }

    #[test]
    fn a_grammar_token_first_opens_the_gate() {
        let mut g = gate(ReasoningStart::Detect);
        assert!(g.accept(4));
        let mut l = vec![0.5; 6];
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
