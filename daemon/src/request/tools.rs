//! Tool-calling types after validation: the request's `tools` and `tool_choice`, the
//! calls an assistant message of the history made, and the call fragments streamed back.
//!
//! Shapes follow OpenAI's chat API (<https://platform.openai.com/docs/api-reference/chat>):
//! a tool is `{"type": "function", "function": {"name", "description", "parameters"}}`,
//! a call is `{"id", "type": "function", "function": {"name", "arguments"}}` with
//! `arguments` a JSON text.

use serde_json::Value;

/// One function the model may call (`tools[i].function`).
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct FunctionTool {
    /// `name`: 1–64 characters from `a-z A-Z 0-9 _ -` (OpenAI's rule).
    pub name: String,
    /// `description`, when given.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    /// `parameters`: a JSON schema of the arguments object (`{"type": "object",
    /// "properties": {}}` when omitted, as OpenAI documents).
    pub parameters: Value,
}

/// `tool_choice`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ToolChoice {
    /// `"none"`: the tools are not shown to the model and its output is not parsed for
    /// calls.
    None,
    /// `"auto"` (the default when `tools` is given): the model decides; calls found in
    /// the output are returned as `tool_calls`.
    Auto,
    /// `"required"`: the output is constrained to one or more calls of the given tools.
    Required,
    /// `{"type": "function", "function": {"name": …}}`: the output is constrained to a
    /// call of this tool.
    Function(String),
}

/// A request's tool options.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolOptions {
    /// The functions, names unique.
    pub tools: Vec<FunctionTool>,
    /// What the model may or must do with them.
    pub choice: ToolChoice,
    /// `parallel_tool_calls` (default true): more than one call per turn.
    pub parallel: bool,
}

impl ToolOptions {
    /// Whether tools are shown to the model and its output parsed for calls.
    pub fn active(&self) -> bool {
        self.choice != ToolChoice::None && !self.tools.is_empty()
    }

    /// The tools a constrained call may use: all for `required`, the named one for a
    /// function choice, none (no constraint) for `auto` and `none`.
    pub fn forced(&self) -> Option<Vec<&FunctionTool>> {
        match &self.choice {
            ToolChoice::Required => Some(self.tools.iter().collect()),
            ToolChoice::Function(name) => {
                Some(self.tools.iter().filter(|t| &t.name == name).collect())
            }
            ToolChoice::None | ToolChoice::Auto => None,
        }
    }
}

/// A call an assistant message made (`messages[i].tool_calls[j]`), or one parsed from
/// the output.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct ToolCall {
    /// `id`, echoed by the `tool` message that answers it (`tool_call_id`).
    pub id: String,
    /// The function's name.
    pub name: String,
    /// The arguments as JSON text.
    pub arguments: String,
}

/// One streamed piece of a tool call (OpenAI's `delta.tool_calls[k]`): the first piece
/// of a call carries its `id` and `name`, the following ones parts of `arguments`; the
/// concatenation of a call's `arguments` pieces is its whole arguments text.
#[derive(Debug, Clone, PartialEq, Eq, Default, serde::Serialize)]
pub struct ToolCallDelta {
    /// Position of the call in this turn's `tool_calls`, from 0.
    pub index: usize,
    /// The call's id (first piece only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    /// The function's name (first piece only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// A piece of the arguments text (may be empty).
    pub arguments: String,
}

/// Folds streamed pieces into whole calls, in index order (what a non-streamed
/// response returns, so both are equal by construction).
pub fn fold_tool_calls(deltas: &[ToolCallDelta]) -> Vec<ToolCall> {
    let mut calls: Vec<ToolCall> = Vec::new();
    for d in deltas {
        while calls.len() <= d.index {
            calls.push(ToolCall {
                id: String::new(),
                name: String::new(),
                arguments: String::new(),
            });
        }
        let c = &mut calls[d.index];
        if let Some(id) = &d.id {
            c.id.clone_from(id);
        }
        if let Some(name) = &d.name {
            c.name.clone_from(name);
        }
        c.arguments.push_str(&d.arguments);
    }
    calls
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pieces_fold_into_calls() {
        let d = |index, id: Option<&str>, name: Option<&str>, a: &str| ToolCallDelta {
            index,
            id: id.map(Into::into),
            name: name.map(Into::into),
            arguments: a.into(),
        };
        let calls = fold_tool_calls(&[
            d(0, Some("call_a"), Some("f"), ""),
            d(0, None, None, "{\"x\": "),
            d(0, None, None, "1}"),
            d(1, Some("call_b"), Some("g"), "{}"),
        ]);
        assert_eq!(
            calls,
            vec![
                ToolCall {
                    id: "call_a".into(),
                    name: "f".into(),
                    arguments: "{\"x\": 1}".into()
                },
                ToolCall {
                    id: "call_b".into(),
                    name: "g".into(),
                    arguments: "{}".into()
                },
            ]
        );
    }

    #[test]
    fn forced_tools_follow_the_choice() {
        let tool = |n: &str| FunctionTool {
            name: n.into(),
            description: None,
            parameters: serde_json::json!({}),
        };
        let mut o = ToolOptions {
            tools: vec![tool("a"), tool("b")],
            choice: ToolChoice::Auto,
            parallel: true,
        };
        assert!(o.forced().is_none() && o.active());
        o.choice = ToolChoice::Function("b".into());
        let names: Vec<_> = o.forced().into_iter().flatten().map(|t| &t.name).collect();
        assert_eq!(names, ["b"]);
        o.choice = ToolChoice::Required;
        assert_eq!(o.forced().map(|v| v.len()), Some(2));
        o.choice = ToolChoice::None;
        assert!(!o.active());
    }
}
