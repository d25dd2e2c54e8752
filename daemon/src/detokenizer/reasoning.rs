//! [`ReasoningSplitter`]: separates a model's reasoning (`<think>…</think>`, as Qwen3,
//! DeepSeek-R1 and SmolLM3 emit it) from its answer in the released output text.
//!
//! Rules (vLLM's `deepseek_r1` / `qwen3` reasoning parsers, llama.cpp's
//! `--reasoning-format deepseek`): the output is reasoning when it opens with `<think>`
//! (leading whitespace allowed) or when the prompt already left the model inside an
//! open `<think>`; the reasoning runs to the first `</think>`, both markers are dropped,
//! whitespace right after `</think>` is dropped, and the rest is content. Output that
//! ends inside the reasoning is all reasoning. The markers are ASCII, so splitting at
//! them keeps every piece whole UTF-8.

pub use crate::request::channels::{ReasoningStart, THINK_CLOSE, THINK_OPEN};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// At the start: holding leading whitespace and a prefix of `<think>`.
    Detect,
    /// Inside the reasoning.
    Inside,
    /// Just after `</think>`: dropping whitespace.
    Closing,
    /// Content.
    Content,
}

/// Text split into the two channels by one push.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Split {
    /// Reasoning text.
    pub reasoning: String,
    /// Answer text.
    pub content: String,
}

/// Splits streamed text into reasoning and content (one per sequence).
///
/// Guarantee: the concatenated `reasoning` of every push and `finish` is the text
/// between the markers, and the concatenated `content` is the rest without the markers
/// and the whitespace after `</think>`.
#[derive(Debug, Clone)]
pub struct ReasoningSplitter {
    state: State,
    /// Text held back: leading whitespace and a `<think>` prefix (Detect), or a
    /// `</think>` prefix (Inside).
    held: String,
}

impl ReasoningSplitter {
    /// A splitter for output that starts as `start` says.
    pub fn new(start: ReasoningStart) -> Self {
        let state = match start {
            ReasoningStart::Detect => State::Detect,
            ReasoningStart::Inside => State::Inside,
            ReasoningStart::Ended => State::Content,
        };
        Self {
            state,
            held: String::new(),
        }
    }

    /// Whether the reasoning is over (or never started): content follows.
    pub fn ended(&self) -> bool {
        matches!(self.state, State::Closing | State::Content)
    }

    /// Whether the output is inside a reasoning block now.
    pub fn inside(&self) -> bool {
        self.state == State::Inside
    }

    /// Splits `text` (the next released piece) into `out`.
    pub fn push(&mut self, text: &str, out: &mut Split) {
        let mut rest: &str = text;
        let mut owned: String;
        loop {
            match self.state {
                State::Detect => {
                    self.held.push_str(rest);
                    let t = self.held.trim_start();
                    if let Some(after) = t.strip_prefix(THINK_OPEN) {
                        owned = after.to_string();
                        self.held.clear();
                        self.state = State::Inside;
                        rest = &owned;
                        continue;
                    }
                    if !THINK_OPEN.starts_with(t) {
                        out.content.push_str(&self.held);
                        self.held.clear();
                        self.state = State::Content;
                    }
                    return;
                }
                State::Inside => {
                    self.held.push_str(rest);
                    if let Some(at) = self.held.find(THINK_CLOSE) {
                        out.reasoning.push_str(&self.held[..at]);
                        owned = self.held[at + THINK_CLOSE.len()..].to_string();
                        self.held.clear();
                        self.state = State::Closing;
                        rest = &owned;
                        continue;
                    }
                    let keep = partial_suffix(&self.held, THINK_CLOSE);
                    let cut = self.held.len() - keep;
                    out.reasoning.push_str(&self.held[..cut]);
                    self.held.drain(..cut);
                    return;
                }
                State::Closing => {
                    let t = rest.trim_start();
                    if !t.is_empty() {
                        self.state = State::Content;
                        out.content.push_str(t);
                    }
                    return;
                }
                State::Content => {
                    out.content.push_str(rest);
                    return;
                }
            }
        }
    }

    /// The output ended: releases what is held (a `<think>` prefix is content, a
    /// `</think>` prefix is reasoning).
    pub fn finish(&mut self, out: &mut Split) {
        let held = std::mem::take(&mut self.held);
        match self.state {
            State::Detect => out.content.push_str(&held),
            State::Inside => out.reasoning.push_str(&held),
            State::Closing | State::Content => {}
        }
    }
}

/// Length of the longest suffix of `text` that is a proper prefix of `marker`.
pub(crate) fn partial_suffix(text: &str, marker: &str) -> usize {
    let max = marker.len().saturating_sub(1).min(text.len());
    (1..=max)
        .rev()
        .find(|&n| {
            text.is_char_boundary(text.len() - n) && marker.starts_with(&text[text.len() - n..])
        })
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(start: ReasoningStart, pieces: &[&str]) -> (Split, Vec<Split>) {
        let mut s = ReasoningSplitter::new(start);
        let mut all = Split::default();
        let mut each = Vec::new();
        for p in pieces {
            let mut out = Split::default();
            s.push(p, &mut out);
            all.reasoning.push_str(&out.reasoning);
            all.content.push_str(&out.content);
            each.push(out);
        }
        let mut out = Split::default();
        s.finish(&mut out);
        all.reasoning.push_str(&out.reasoning);
        all.content.push_str(&out.content);
        (all, each)
    }

    #[test]
    fn markers_split_at_every_boundary() {
        let text = "\n<think>\nLet me see: 2+2.\n</think>\n\nIt is 4.";
        for cut in 0..=text.len() {
            for cut2 in cut..=text.len() {
                let (all, _) = run(
                    ReasoningStart::Detect,
                    &[&text[..cut], &text[cut..cut2], &text[cut2..]],
                );
                assert_eq!(all.reasoning, "\nLet me see: 2+2.\n", "cuts {cut} {cut2}");
                assert_eq!(all.content, "It is 4.", "cuts {cut} {cut2}");
            }
        }
    }

    #[test]
    fn reasoning_streams_without_holding_more_than_a_marker_prefix() {
        let (_, each) = run(
            ReasoningStart::Detect,
            &["<think>", "abc", "de</th", "ink>x"],
        );
        assert_eq!(each[1].reasoning, "abc");
        assert_eq!(each[2].reasoning, "de");
        assert_eq!(each[3].reasoning, "");
        assert_eq!(each[3].content, "x");
    }

    #[test]
    fn output_without_think_is_all_content() {
        let (all, each) = run(ReasoningStart::Detect, &[" <th", "e end"]);
        assert_eq!(each[0].content, "", "a <think> prefix is held");
        assert_eq!(all.content, " <the end");
        assert_eq!(all.reasoning, "");
        let (all, _) = run(ReasoningStart::Detect, &["Hi <think>x</think>"]);
        assert_eq!(
            all.content, "Hi <think>x</think>",
            "only a leading block counts"
        );
    }

    #[test]
    fn prompt_opened_and_closed_blocks() {
        assert_eq!(
            ReasoningStart::of_prompt("a<think>\n"),
            ReasoningStart::Inside
        );
        assert_eq!(
            ReasoningStart::of_prompt("<think>\n\n</think>\n\n"),
            ReasoningStart::Ended
        );
        assert_eq!(
            ReasoningStart::of_prompt("assistant\n"),
            ReasoningStart::Detect
        );
        let (all, _) = run(ReasoningStart::Inside, &["thought</think>answer"]);
        assert_eq!(
            (all.reasoning.as_str(), all.content.as_str()),
            ("thought", "answer")
        );
        let (all, _) = run(ReasoningStart::Ended, &["<think>x</think>y"]);
        assert_eq!(all.content, "<think>x</think>y");
    }

    #[test]
    fn unfinished_reasoning_is_all_reasoning() {
        let (all, _) = run(ReasoningStart::Detect, &["<think>still going</thi"]);
        assert_eq!(all.reasoning, "still going</thi");
        assert_eq!(all.content, "");
    }

    #[test]
    fn multibyte_text_next_to_markers() {
        let (all, _) = run(ReasoningStart::Detect, &["<think>é😀</think>ü"]);
        assert_eq!((all.reasoning.as_str(), all.content.as_str()), ("é😀", "ü"));
    }
}
