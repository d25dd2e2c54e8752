//! What a rendered chat template implies for a sequence's output: whether and where
//! the model reasons, which tool-call format it writes, and the control tokens the
//! output parsers must see. Decided in `prepare/` (the template), read by the
//! detokenizer's channel splitting and by the sampling chain's reasoning gate.

/// How one sequence's output is split, decided when its prompt is rendered.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ChannelSpec {
    /// `Some`: the template can make the model reason; where the output starts.
    pub reasoning: Option<ReasoningStart>,
    /// `Some((format, parallel_tool_calls))`: parse tool calls.
    pub tools: Option<(ToolFormat, bool)>,
    /// Control tokens whose text the parsers must see (e.g. Mistral's `[TOOL_CALLS]`,
    /// `<|python_tag|>`): id and text. Other control tokens add no text.
    pub markers: Vec<(u32, String)>,
}

impl ChannelSpec {
    /// Whether any splitting happens (a plain request pays for nothing).
    pub fn is_plain(&self) -> bool {
        self.reasoning.is_none() && self.tools.is_none()
    }

    /// The text a control token `id` contributes to the parsers, if it is a marker.
    pub fn marker(&self, id: u32) -> Option<&str> {
        self.markers
            .iter()
            .find(|(t, _)| *t == id)
            .map(|(_, s)| s.as_str())
    }
}

/// Opens a reasoning block.
pub const THINK_OPEN: &str = "<think>";
/// Closes a reasoning block.
pub const THINK_CLOSE: &str = "</think>";

/// Where the output starts, from the rendered prompt's end.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReasoningStart {
    /// The output may open a reasoning block itself.
    Detect,
    /// The prompt ends inside an open `<think>` (the template opened it).
    Inside,
    /// The prompt ends right after a closed block (e.g. Qwen3 with
    /// `enable_thinking: false`): everything is content.
    Ended,
}

impl ReasoningStart {
    /// Reads the end of the rendered prompt `text`.
    pub fn of_prompt(text: &str) -> Self {
        let t = text.trim_end();
        if t.ends_with(THINK_OPEN) {
            Self::Inside
        } else if t.ends_with(THINK_CLOSE) {
            Self::Ended
        } else {
            Self::Detect
        }
    }
}

/// Opens a Hermes call block.
pub const HERMES_OPEN: &str = "<tool_call>";
/// Closes a Hermes call block.
pub const HERMES_CLOSE: &str = "</tool_call>";

/// How a template's model writes tool calls.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ToolFormat {
    /// `<tool_call>{…}</tool_call>` blocks.
    Hermes,
    /// A bare JSON object (or several, `;`-separated) as the whole answer.
    Llama3Json,
    /// `[TOOL_CALLS]` and a JSON array of calls.
    MistralV3,
}

impl ToolFormat {
    /// The format a chat template's source writes calls in, and whether the template
    /// renders `tools` itself; `(Hermes, false)` for a template without tool support
    /// (the daemon then describes the tools in a Hermes-style system message, as
    /// llama.cpp's generic fallback does).
    pub fn of_template(source: &str) -> (Self, bool) {
        let native = source.contains("tools");
        let format = if source.contains("[TOOL_CALLS]") {
            Self::MistralV3
        } else if source.contains("<tool_call>") {
            Self::Hermes
        } else if source.contains("<|python_tag|>") || source.contains("ipython") {
            Self::Llama3Json
        } else {
            Self::Hermes
        };
        (format, native)
    }

    /// The text that opens the calls (`None`: the answer itself starts with one).
    pub fn opener(self) -> Option<&'static str> {
        match self {
            Self::Hermes => Some("<tool_call>"),
            Self::MistralV3 => Some("[TOOL_CALLS]"),
            Self::Llama3Json => None,
        }
    }
}
