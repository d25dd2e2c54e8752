//! The constraint of `tool_choice: "required"` or a named function: a Lark grammar
//! (llguidance's dialect) that admits only calls of the allowed tools in the template's
//! tool-call format, each call's arguments valid against the tool's `parameters`
//! schema (embedded with llguidance's `%json`), with the JSON layout of
//! `response_format` so generation ends.

use serde_json::{json, Value};

use super::constraint::{check_keywords, json_layout};
use crate::error::InferError;
use crate::request::FunctionTool;
use crate::request::ToolFormat;

/// The Lark grammar for calls of `tools` (`tools[k]` is the request's tool with index
/// `indices[k]`, for error messages) in `format`; `parallel`: one or more calls, else
/// exactly one. `marker_id`: the token id of `[TOOL_CALLS]` when it is a control token.
///
/// # Errors
/// `validation` naming `tools[i].function.parameters` and a schema keyword llguidance
/// cannot enforce.
pub fn tool_call_grammar(
    format: ToolFormat,
    tools: &[(usize, &FunctionTool)],
    parallel: bool,
    marker_id: Option<u32>,
) -> Result<String, InferError> {
    let key = match format {
        ToolFormat::Llama3Json => "parameters",
        ToolFormat::Hermes | ToolFormat::MistralV3 => "arguments",
    };
    let mut rules = String::new();
    let mut alternatives = Vec::new();
    for (k, (i, tool)) in tools.iter().enumerate() {
        check_keywords(&tool.parameters, "#")
            .map_err(|e| InferError::validation(format!("tools[{i}].function.parameters: {e}")))?;
        let mut schema = json!({
            "type": "object",
            "properties": {
                "name": {"const": tool.name},
                key: tool.parameters,
            },
            "required": ["name", key],
            "additionalProperties": false,
        });
        schema["x-guidance"] = json_layout();
        rules.push_str(&format!("call{k}: %json {}\n", Value::to_string(&schema)));
        alternatives.push(format!("call{k}"));
    }
    let call = alternatives.join(" | ");
    let (open, sep, close) = match format {
        ToolFormat::Hermes => (
            "\"<tool_call>\\n\" ",
            "\"\\n</tool_call>\\n<tool_call>\\n\"",
            " \"\\n</tool_call>\"",
        ),
        ToolFormat::Llama3Json => ("", "\"; \"", ""),
        ToolFormat::MistralV3 => ("", "\", \"", " \"]\""),
    };
    let open = match (format, marker_id) {
        (ToolFormat::MistralV3, Some(id)) => format!("<[{id}]> \"[\" "),
        (ToolFormat::MistralV3, None) => "\"[TOOL_CALLS][\" ".to_string(),
        _ => open.to_string(),
    };
    let body = if parallel {
        format!("one ({sep} one)*")
    } else {
        "one".to_string()
    };
    Ok(format!("start: {open}{body}{close}\none: {call}\n{rules}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tool(name: &str, parameters: Value) -> FunctionTool {
        FunctionTool {
            name: name.into(),
            description: None,
            parameters,
        }
    }

    #[test]
    fn hermes_grammar_has_one_rule_per_tool() {
        let a = tool("a", json!({"type": "object"}));
        let b = tool(
            "b",
            json!({"type": "object", "properties": {"x": {"type": "integer"}}}),
        );
        let g = tool_call_grammar(ToolFormat::Hermes, &[(0, &a), (1, &b)], true, None)
            .unwrap_or_default();
        assert!(g.starts_with(
            "start: \"<tool_call>\\n\" one (\"\\n</tool_call>\\n<tool_call>\\n\" one)* \"\\n</tool_call>\"\none: call0 | call1\n"
        ));
        assert!(g.contains("\"name\":{\"const\":\"b\"}"));
    }

    #[test]
    fn unsupported_keywords_name_the_tool() {
        let bad = tool("a", json!({"type": "object", "maxPropertiez": 3}));
        let e =
            tool_call_grammar(ToolFormat::Hermes, &[(3, &bad)], false, None).expect_err("refused");
        assert!(
            e.message.starts_with("tools[3].function.parameters: "),
            "{}",
            e.message
        );
    }

    /// Feeds `text` byte by byte (a byte-level vocabulary, id = byte, 256 = end of
    /// turn) through the compiled grammar: whether every byte was allowed and the turn
    /// may end after it.
    fn accepts(lark: String, text: &str) -> bool {
        use crate::sampling::constraint::GrammarCompiler;
        use crate::sampling::{LogitsProcessor, StepContext};
        let mut words: Vec<Vec<u8>> = (0..=255u8).map(|b| vec![b]).collect();
        words.push(b"\xFF<|end|>".to_vec());
        let Ok(comp) = GrammarCompiler::new(&words, 256) else {
            return false;
        };
        let Ok(mut c) = comp.compile_tool_calls(lark, &[256]) else {
            return false;
        };
        let ctx = StepContext {
            sequence_id: 1,
            prompt: &[],
            generated: &[],
        };
        for b in text.bytes().map(u32::from).chain([256]) {
            let mut logits = vec![0.0f32; 257];
            if c.apply(&ctx, &mut logits).is_err() || logits[b as usize] != 0.0 {
                return false;
            }
            if c.accept(b).is_err() {
                return false;
            }
        }
        true
    }

    #[test]
    fn grammars_admit_exactly_the_calls_of_each_format() {
        let w = tool(
            "get_weather",
            json!({"type": "object", "properties": {"city": {"type": "string"}},
                   "required": ["city"], "additionalProperties": false}),
        );
        let t = tool("get_time", json!({"type": "object", "properties": {}}));
        let both = [(0, &w), (1, &t)];
        let g = |f, parallel| tool_call_grammar(f, &both, parallel, None).unwrap_or_default();
        let hermes = "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>";
        assert!(accepts(g(ToolFormat::Hermes, false), hermes));
        let two = format!(
            "{hermes}\n<tool_call>\n{{\"name\": \"get_time\", \"arguments\": {{}}}}\n</tool_call>"
        );
        assert!(accepts(g(ToolFormat::Hermes, true), &two));
        assert!(
            !accepts(g(ToolFormat::Hermes, false), &two),
            "one call only"
        );
        assert!(!accepts(
            g(ToolFormat::Hermes, false),
            "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"town\": \"Paris\"}}\n</tool_call>"
        ), "arguments follow the schema");
        assert!(!accepts(g(ToolFormat::Hermes, false), "Sure! <tool_call>"));
        assert!(accepts(
            g(ToolFormat::Llama3Json, true),
            "{\"name\": \"get_time\", \"parameters\": {}}; {\"name\": \"get_weather\", \"parameters\": {\"city\": \"x\"}}"
        ));
        assert!(accepts(
            g(ToolFormat::MistralV3, true),
            "[TOOL_CALLS][{\"name\": \"get_time\", \"arguments\": {}}, {\"name\": \"get_time\", \"arguments\": {}}]"
        ));
    }

    #[test]
    fn mistral_uses_the_control_token() {
        let a = tool("a", json!({}));
        let g = tool_call_grammar(ToolFormat::MistralV3, &[(0, &a)], false, Some(5))
            .unwrap_or_default();
        assert!(g.starts_with("start: <[5]> \"[\" one \"]\""), "{g}");
    }
}
