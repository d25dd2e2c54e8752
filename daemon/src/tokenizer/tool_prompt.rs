//! Tools in the prompt: the `tools` value a template gets, and for a template without
//! tool support the fallback — the tools described in a Hermes-style system message
//! (the wording of Qwen2.5's template, NousResearch's Hermes format), earlier calls
//! written as `<tool_call>` blocks and tool results as `<tool_response>` user turns, as
//! llama.cpp's generic tool-call handler does for templates it does not know.

use serde_json::{json, Value};

use crate::request::{ChatMessage, FunctionTool};

/// `tools` as templates expect it: `[{"type": "function", "function": {"name",
/// "description", "parameters"}}]`.
pub fn tools_value(tools: &[FunctionTool]) -> Value {
    Value::Array(
        tools
            .iter()
            .map(|t| json!({"type": "function", "function": t}))
            .collect(),
    )
}

/// The system-message text describing `tools` in the Hermes format.
pub fn hermes_system_text(tools: &[FunctionTool]) -> String {
    let mut s = String::from(
        "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n\
         You are provided with function signatures within <tools></tools> XML tags:\n<tools>",
    );
    if let Value::Array(items) = tools_value(tools) {
        for t in items {
            s.push('\n');
            s.push_str(&t.to_string());
        }
    }
    s.push_str(
        "\n</tools>\n\nFor each function call, return a json object with function name and \
         arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n\
         {\"name\": <function-name>, \"arguments\": <args-json-object>}\n</tool_call>",
    );
    s
}

/// The messages a template without tool support renders: the tools described in the
/// first system message (one is added when there is none), assistant calls as
/// `<tool_call>` blocks in the content, and each run of `tool` messages as one `user`
/// message of `<tool_response>` blocks. `tools` is empty when the request's tools are
/// not shown (`tool_choice: "none"`), which still rewrites the history.
pub fn fallback_messages(messages: &[ChatMessage], tools: &[FunctionTool]) -> Vec<ChatMessage> {
    let mut out: Vec<ChatMessage> = Vec::with_capacity(messages.len() + 1);
    if !tools.is_empty() {
        let text = hermes_system_text(tools);
        match messages.first() {
            Some(m) if m.role == "system" => {}
            _ => out.push(ChatMessage::new("system", text.clone())),
        }
        if let Some(m) = messages.first().filter(|m| m.role == "system") {
            out.push(ChatMessage::new(
                "system",
                format!("{}\n\n{text}", m.content),
            ));
        }
    }
    let skip = usize::from(!out.is_empty() && messages.first().is_some_and(|m| m.role == "system"));
    for m in &messages[skip..] {
        if m.role == "tool" {
            let block = format!("<tool_response>\n{}\n</tool_response>", m.content);
            match out.last_mut() {
                Some(prev) if prev.role == "user" && prev.content.ends_with("</tool_response>") => {
                    prev.content.push('\n');
                    prev.content.push_str(&block);
                }
                _ => out.push(ChatMessage::new("user", block)),
            }
            continue;
        }
        let mut content = m.content.clone();
        for c in &m.tool_calls {
            // The client's arguments text as it is when it is JSON, else as a string.
            let args = match serde_json::from_str::<Value>(&c.arguments) {
                Ok(_) => c.arguments.clone(),
                Err(_) => Value::String(c.arguments.clone()).to_string(),
            };
            if !content.is_empty() {
                content.push('\n');
            }
            content.push_str(&format!(
                "<tool_call>\n{{\"name\": {}, \"arguments\": {args}}}\n</tool_call>",
                Value::String(c.name.clone())
            ));
        }
        out.push(ChatMessage {
            role: m.role.clone(),
            content,
            ..ChatMessage::default()
        });
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::request::ToolCall;

    fn tool() -> FunctionTool {
        FunctionTool {
            name: "get_weather".into(),
            description: Some("Weather of a city".into()),
            parameters: json!({"type": "object", "properties": {"city": {"type": "string"}}}),
        }
    }

    #[test]
    fn fallback_describes_tools_and_rewrites_history() {
        let history = vec![
            ChatMessage::new("system", "Be brief."),
            ChatMessage::new("user", "Weather in Paris?"),
            ChatMessage {
                role: "assistant".into(),
                tool_calls: vec![ToolCall {
                    id: "call_1".into(),
                    name: "get_weather".into(),
                    arguments: "{\"city\": \"Paris\"}".into(),
                }],
                ..ChatMessage::default()
            },
            ChatMessage {
                role: "tool".into(),
                content: "18 C".into(),
                tool_call_id: Some("call_1".into()),
                ..ChatMessage::default()
            },
            ChatMessage {
                role: "tool".into(),
                content: "sunny".into(),
                ..ChatMessage::default()
            },
        ];
        let out = fallback_messages(&history, &[tool()]);
        let roles: Vec<&str> = out.iter().map(|m| m.role.as_str()).collect();
        assert_eq!(roles, ["system", "user", "assistant", "user"]);
        assert!(out[0].content.starts_with("Be brief.\n\n# Tools"));
        assert!(out[0].content.contains(
            "{\"type\":\"function\",\"function\":{\"name\":\"get_weather\",\"description\":\"Weather of a city\""
        ));
        assert_eq!(
            out[2].content,
            "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>"
        );
        assert_eq!(
            out[3].content,
            "<tool_response>\n18 C\n</tool_response>\n<tool_response>\nsunny\n</tool_response>"
        );
    }

    #[test]
    fn a_system_message_is_added_when_there_is_none() {
        let out = fallback_messages(&[ChatMessage::new("user", "hi")], &[tool()]);
        assert_eq!(out.len(), 2);
        assert_eq!(out[0].role, "system");
        assert!(out[0].content.starts_with("# Tools"));
        let out = fallback_messages(&[ChatMessage::new("user", "hi")], &[]);
        assert_eq!(out, vec![ChatMessage::new("user", "hi")]);
    }
}
