//! The `n` choices of one OpenAI response and the echoed prompt (`echo`): which choice
//! an event belongs to, each choice's text and log-probabilities so far, and the usage
//! of the whole response (the prompt counted once, the completion tokens of every
//! choice summed, as OpenAI counts them).

use serde_json::{json, Value};

use crate::request::TokenLogprobs;
use crate::request::{FinishReason, StreamEvent, ToolCallDelta, Usage};

/// The choice an event is about and the event itself: a [`StreamEvent::Choice`]
/// unwrapped, any other event as choice 0.
pub(super) fn split_choice(event: StreamEvent) -> (usize, StreamEvent) {
    match event {
        StreamEvent::Choice { index, event } => (index, *event),
        e => (0, e),
    }
}

/// Sets the index of a chunk's one choice (chunks are built for choice 0).
pub(super) fn with_index(mut chunk: Value, index: usize) -> Value {
    if index > 0 {
        if let Some(c) = chunk
            .get_mut("choices")
            .and_then(|c| c.get_mut(0))
            .and_then(Value::as_object_mut)
        {
            c.insert("index".into(), json!(index));
        }
    }
    chunk
}

/// The usage of a response: the first choice's prompt and cached tokens, the
/// completion tokens of every choice ended so far.
#[derive(Debug, Default, Clone, Copy)]
pub(super) struct UsageSum(Option<Usage>);

impl UsageSum {
    /// Adds one choice's `done` usage.
    pub(super) fn add(&mut self, u: &Usage) {
        match &mut self.0 {
            Some(t) => t.add_completion(u),
            None => self.0 = Some(*u),
        }
    }

    /// The total (zeros before any choice ended).
    pub(super) fn total(&self) -> Usage {
        self.0.unwrap_or_default()
    }
}

/// One choice of a whole (non-streamed) response.
#[derive(Debug, Default)]
pub(super) struct ChoiceText {
    /// Its text (the echoed prompt first, with `echo`).
    pub(super) text: String,
    /// Its log-probability entries (the prompt's first, with `echo`).
    pub(super) entries: Vec<TokenLogprobs>,
    /// Its reasoning text.
    pub(super) reasoning: String,
    /// Its tool-call pieces, in order.
    pub(super) calls: Vec<ToolCallDelta>,
    /// How it ended, once it did.
    pub(super) finish: Option<FinishReason>,
}

/// What one event did to a whole response.
pub(super) enum Collected {
    /// Nothing to answer yet.
    Pending,
    /// Every choice ended: answer with [`Collector::choices`] and this usage.
    Complete(Usage),
    /// The request failed.
    Failed(crate::error::InferError),
}

/// The choices of a non-streamed response, collected from the request's events.
pub(super) struct Collector {
    choices: Vec<ChoiceText>,
    left: usize,
    usage: UsageSum,
}

impl Collector {
    /// A response of `n` choices.
    pub(super) fn new(n: usize) -> Self {
        Self {
            choices: (0..n.max(1)).map(|_| ChoiceText::default()).collect(),
            left: n.max(1),
            usage: UsageSum::default(),
        }
    }

    /// Takes one event.
    pub(super) fn push(&mut self, event: StreamEvent) -> Collected {
        let (index, event) = split_choice(event);
        match event {
            StreamEvent::Started { .. } | StreamEvent::Choice { .. } => Collected::Pending,
            // The prompt starts every choice's text (OpenAI's `echo`).
            StreamEvent::Echo { text, logprobs, .. } => {
                for c in &mut self.choices {
                    c.text.push_str(&text);
                    c.entries.extend(logprobs.iter().cloned());
                }
                Collected::Pending
            }
            StreamEvent::Delta {
                text,
                logprobs,
                reasoning,
                tool_calls,
                ..
            } => {
                if let Some(c) = self.choices.get_mut(index) {
                    c.text.push_str(&text);
                    c.entries.extend(logprobs);
                    c.reasoning.push_str(&reasoning);
                    c.calls.extend(tool_calls);
                }
                Collected::Pending
            }
            StreamEvent::Done {
                finish_reason,
                usage,
                ..
            } => {
                if let Some(c) = self.choices.get_mut(index) {
                    if c.finish.replace(finish_reason).is_none() {
                        self.left = self.left.saturating_sub(1);
                        self.usage.add(&usage);
                    }
                }
                if self.left == 0 {
                    Collected::Complete(self.usage.total())
                } else {
                    Collected::Pending
                }
            }
            StreamEvent::Error(e) => Collected::Failed(e),
        }
    }

    /// The choices, in index order.
    pub(super) fn choices(&self) -> &[ChoiceText] {
        &self.choices
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::request::Timings;

    fn done(index: usize, completion_tokens: usize) -> StreamEvent {
        StreamEvent::Choice {
            index,
            event: Box::new(StreamEvent::Done {
                finish_reason: FinishReason::Length,
                usage: Usage {
                    prompt_tokens: 7,
                    completion_tokens,
                    cached_tokens: 0,
                    ..Usage::default()
                },
                timings: Timings {
                    ttft_ms: 1.0,
                    decode_tokens_per_s: 0.0,
                },
            }),
        }
    }

    fn delta(index: usize, text: &str) -> StreamEvent {
        StreamEvent::Choice {
            index,
            event: Box::new(StreamEvent::Delta {
                text: text.into(),
                token_ids: vec![1],
                logprobs: Vec::new(),
                reasoning: String::new(),
                tool_calls: Vec::new(),
            }),
        }
    }

    /// Interleaved choices collect apart; the prompt is counted once, completions
    /// summed; the echo starts every choice.
    #[test]
    fn choices_collect_apart_and_usage_sums() {
        let mut c = Collector::new(2);
        let echo = StreamEvent::Echo {
            text: "P".into(),
            token_ids: vec![1],
            logprobs: Vec::new(),
        };
        for e in [echo, delta(1, "b"), delta(0, "a"), delta(1, "c")] {
            assert!(matches!(c.push(e), Collected::Pending));
        }
        assert!(matches!(c.push(done(1, 2)), Collected::Pending));
        let Collected::Complete(u) = c.push(done(0, 1)) else {
            panic!("complete")
        };
        assert_eq!((u.prompt_tokens, u.completion_tokens), (7, 3));
        let texts: Vec<&str> = c.choices().iter().map(|c| c.text.as_str()).collect();
        assert_eq!(texts, ["Pa", "Pbc"]);
    }

    #[test]
    fn a_chunk_gets_its_choice_index() {
        let chunk = json!({"choices": [{"index": 0, "text": "x"}]});
        assert_eq!(with_index(chunk, 2)["choices"][0]["index"], 2);
    }
}
