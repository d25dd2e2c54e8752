//! [`Channels`]: after the [`super::OutputStream`] (whole characters, stop sequences
//! cut), the released text is split into reasoning ([`super::reasoning`]) and answer,
//! and the answer into content and tool calls ([`super::tool_calls`]).

use super::reasoning::{ReasoningSplitter, Split};
use super::tool_calls::{ToolCallParser, ToolSplit};
pub use crate::request::channels::ChannelSpec;
use crate::request::ToolCallDelta;

/// What one push released, per channel.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ChannelOut {
    /// Answer text.
    pub content: String,
    /// Reasoning text.
    pub reasoning: String,
    /// Tool-call pieces.
    pub tool_calls: Vec<ToolCallDelta>,
}

/// One sequence's channel splitting.
#[derive(Debug, Clone)]
pub struct Channels {
    reasoning: Option<ReasoningSplitter>,
    tools: Option<ToolCallParser>,
}

impl Channels {
    /// The splitters `spec` asks for; `seq` (the engine id) makes call ids unique.
    pub fn new(spec: &ChannelSpec, seq: u64) -> Self {
        Self {
            reasoning: spec.reasoning.map(ReasoningSplitter::new),
            tools: spec
                .tools
                .map(|(format, parallel)| ToolCallParser::new(format, parallel, seq)),
        }
    }

    /// Whether the reasoning is over (or there is none): a constraint may apply.
    pub fn reasoning_ended(&self) -> bool {
        self.reasoning.as_ref().is_none_or(ReasoningSplitter::ended)
    }

    /// Whether tool calls were found.
    pub fn has_tool_calls(&self) -> bool {
        self.tools.as_ref().is_some_and(ToolCallParser::has_calls)
    }

    /// Splits the next released text (moved through untouched when there is nothing
    /// to split: a plain request's text is not copied).
    pub fn push(&mut self, text: String) -> ChannelOut {
        let mut split = Split::default();
        match self.reasoning.as_mut() {
            Some(r) => r.push(&text, &mut split),
            None => split.content = text,
        }
        self.answer(split)
    }

    /// The output ended: releases everything held.
    pub fn finish(&mut self, text: String) -> ChannelOut {
        let mut split = Split::default();
        match self.reasoning.as_mut() {
            Some(r) => {
                r.push(&text, &mut split);
                r.finish(&mut split);
            }
            None => split.content = text,
        }
        let mut out = self.answer(split);
        if let Some(t) = self.tools.as_mut() {
            let mut rest = ToolSplit::default();
            t.finish(&mut rest);
            out.content.push_str(&rest.content);
            out.tool_calls.extend(rest.calls);
        }
        out
    }

    fn answer(&mut self, split: Split) -> ChannelOut {
        let Some(t) = self.tools.as_mut() else {
            return ChannelOut {
                content: split.content,
                reasoning: split.reasoning,
                tool_calls: Vec::new(),
            };
        };
        let mut out = ToolSplit::default();
        if !split.content.is_empty() {
            t.push(&split.content, &mut out);
        }
        ChannelOut {
            content: out.content,
            reasoning: split.reasoning,
            tool_calls: out.calls,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::request::{ReasoningStart, ToolFormat};

    #[test]
    fn reasoning_then_a_call() {
        let spec = ChannelSpec {
            reasoning: Some(ReasoningStart::Detect),
            tools: Some((ToolFormat::Hermes, true)),
            markers: Vec::new(),
        };
        let mut c = Channels::new(&spec, 1);
        let text = "<think>Need the weather.</think>\n\n<tool_call>\n{\"name\": \"w\", \"arguments\": {\"c\": 1}}\n</tool_call>";
        let mut all = ChannelOut::default();
        for ch in text.chars() {
            let out = c.push(ch.to_string());
            all.content.push_str(&out.content);
            all.reasoning.push_str(&out.reasoning);
            all.tool_calls.extend(out.tool_calls);
            if all.reasoning.len() < "Need the weather.".len() {
                assert!(!c.reasoning_ended());
            }
        }
        let out = c.finish(String::new());
        all.tool_calls.extend(out.tool_calls);
        assert!(c.reasoning_ended() && c.has_tool_calls());
        assert_eq!(all.reasoning, "Need the weather.");
        assert_eq!(all.content, "");
        let calls = crate::request::tools::fold_tool_calls(&all.tool_calls);
        assert_eq!(calls.len(), 1);
        assert_eq!(calls[0].arguments, "{\"c\": 1}");
    }

    #[test]
    fn plain_spec_passes_text_through() {
        let spec = ChannelSpec::default();
        assert!(spec.is_plain());
        let mut c = Channels::new(&spec, 1);
        assert_eq!(c.push("<think>x".into()).content, "<think>x");
        assert_eq!(c.finish("y".into()).content, "y");
        assert!(c.reasoning_ended());
    }
}
