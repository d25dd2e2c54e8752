//! [`PromptEcho`]: a request's prompt echoed back (`echo`), with the log-probability of
//! each prompt token given the ones before it when `logprobs` is set (teacher forcing:
//! a client scores a given continuation). The scores come from the prefill's logits
//! rows, one per prompt position, through the same `ln softmax` of the raw logits as
//! generated tokens ([`crate::sampling::logprobs::step_logprobs`]).

use crate::request::StreamEvent;
use crate::sampling::logprobs::step_logprobs;
use crate::sampling::{TokenLogprobs, TopLogprob};

/// The echo state of one sequence, from admission until its echo is sent.
#[derive(Debug, Clone, PartialEq)]
pub struct PromptEcho {
    /// `Some(k)`: score the prompt, with `k` alternatives per token.
    top: Option<usize>,
    /// `scores[i]`: prompt token `i + 1` given tokens `0..=i` (from the logits row of
    /// position `i`), collected in position order.
    scores: Vec<TokenLogprobs>,
}

impl PromptEcho {
    /// The echo of a request with `logprobs` (`None`: the text and ids only).
    pub fn new(logprobs: Option<usize>) -> Self {
        Self {
            top: logprobs,
            scores: Vec::new(),
        }
    }

    /// Whether positions of the prompt still need their logits rows: the prompt is
    /// scored and not every row was seen. Such a sequence must compute those positions
    /// itself (no prefix-cache hit may skip them).
    pub fn needs_rows(&self, prompt_len: usize) -> bool {
        self.top.is_some() && self.scores.len() + 1 < prompt_len
    }

    /// Logits rows a step running positions `start..end` must return for the scores:
    /// the rows from the first unscored position on, when it lies before the prompt's
    /// last position (whose row is the next token's, not a prompt token's); 0 when
    /// none is needed. The rows asked are the chunk's last ones, as the runner returns.
    pub fn rows_wanted(&self, start: usize, end: usize, prompt_len: usize) -> usize {
        if self.top.is_none() {
            return 0;
        }
        let first = start.max(self.scores.len());
        if first < end.min(prompt_len.saturating_sub(1)) {
            end - first
        } else {
            0
        }
    }

    /// Takes the scores of the prompt tokens after the positions of `rows` (`rows[j]` is
    /// the logits row of position `first_pos + j`); rows already seen (a recompute
    /// after preemption) and rows past the prompt are skipped.
    pub fn absorb(&mut self, first_pos: usize, rows: &[Vec<f32>], prompt: &[u32]) {
        let Some(top) = self.top else {
            return;
        };
        for (j, row) in rows.iter().enumerate() {
            let pos = first_pos + j;
            if pos != self.scores.len() {
                continue;
            }
            let Some(&token) = prompt.get(pos + 1) else {
                break;
            };
            self.scores.push(
                step_logprobs(row, token, top).unwrap_or_else(|| TokenLogprobs {
                    chosen: TopLogprob {
                        token,
                        logprob: f32::NEG_INFINITY,
                        bytes: Vec::new(),
                    },
                    top: Vec::new(),
                }),
            );
        }
    }

    /// The [`StreamEvent::Echo`] of `prompt`: its text (`text_bytes` of each token,
    /// invalid UTF-8 replaced), ids, and with `logprobs` one entry per token (the
    /// first without a log-probability: NaN), each token's `piece` as its bytes.
    pub fn event<'a>(
        self,
        prompt: &[u32],
        text_bytes: impl Fn(u32) -> &'a [u8],
        piece: impl Fn(u32) -> &'a [u8],
    ) -> StreamEvent {
        let bytes: Vec<u8> = prompt
            .iter()
            .flat_map(|&t| text_bytes(t))
            .copied()
            .collect();
        let logprobs = match (self.top, prompt.first()) {
            (Some(_), Some(&first)) => {
                let head = TokenLogprobs {
                    chosen: TopLogprob {
                        token: first,
                        logprob: f32::NAN,
                        bytes: Vec::new(),
                    },
                    top: Vec::new(),
                };
                let mut all: Vec<TokenLogprobs> =
                    std::iter::once(head).chain(self.scores).collect();
                for e in &mut all {
                    for t in std::iter::once(&mut e.chosen).chain(e.top.iter_mut()) {
                        t.bytes = piece(t.token).to_vec();
                    }
                }
                all
            }
            _ => Vec::new(),
        };
        StreamEvent::Echo {
            text: String::from_utf8_lossy(&bytes).into_owned(),
            token_ids: prompt.to_vec(),
            logprobs,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(hot: usize) -> Vec<f32> {
        (0..4).map(|i| if i == hot { 2.0 } else { 0.0 }).collect()
    }

    /// Rows are asked from the first unscored position, chunk by chunk, and a
    /// recompute after preemption asks again only for what was not seen.
    #[test]
    fn rows_follow_the_chunks_of_the_prompt() {
        let prompt = [0u32, 1, 2, 3, 0];
        let mut e = PromptEcho::new(Some(1));
        assert!(e.needs_rows(5));
        // Chunk 0..2: rows of positions 0 and 1.
        assert_eq!(e.rows_wanted(0, 2, 5), 2);
        e.absorb(0, &[row(1), row(2)], &prompt);
        // Preempted: recompute from 0; positions 0, 1 are scored, 2.. still needed.
        assert_eq!(e.rows_wanted(0, 3, 5), 1);
        e.absorb(2, &[row(3)], &prompt);
        // Last chunk 3..5: position 3 scores token 4; position 4 is the sampling row.
        assert_eq!(e.rows_wanted(3, 5, 5), 2);
        e.absorb(3, &[row(0), row(1)], &prompt);
        assert!(!e.needs_rows(5));
        assert_eq!(e.rows_wanted(5, 6, 5), 0);
        let StreamEvent::Echo {
            text,
            token_ids,
            logprobs,
        } = e.event(&prompt, |_| b"x", |_| b"p")
        else {
            panic!("echo")
        };
        assert_eq!((text.as_str(), token_ids), ("xxxxx", prompt.to_vec()));
        assert_eq!(logprobs.len(), 5);
        assert!(logprobs[0].chosen.logprob.is_nan() && logprobs[0].top.is_empty());
        // Each token was the hot one of its row: ln(e² / (e² + 3)).
        let want = (2f64 - (2f64.exp() + 3.0).ln()) as f32;
        for (i, lp) in logprobs.iter().enumerate().skip(1) {
            assert_eq!(lp.chosen.token, prompt[i]);
            assert!((lp.chosen.logprob - want).abs() < 1e-6, "{lp:?}");
            assert_eq!(lp.top[0].token, prompt[i]);
            assert_eq!(lp.chosen.bytes, b"p");
        }
    }

    #[test]
    fn an_echo_without_logprobs_wants_no_rows() {
        let e = PromptEcho::new(None);
        assert!(!e.needs_rows(9));
        assert_eq!(e.rows_wanted(0, 9, 9), 0);
        let StreamEvent::Echo { logprobs, .. } = e.event(&[5, 6], |_| b"", |_| b"") else {
            panic!("echo")
        };
        assert!(logprobs.is_empty());
    }
}
