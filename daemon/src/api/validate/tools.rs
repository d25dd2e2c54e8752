//! The tool-calling fields of a chat `generate` — `tools`, `tool_choice`,
//! `parallel_tool_calls`, `chat_template_kwargs` — and the tool fields of history
//! messages (`tool_calls`, `tool_call_id`, `name`), in OpenAI's shapes.

use serde_json::{Map, Value};

use super::{check_fields, optional, quote, quote_str, VResult};
use crate::api::body::GenerateBody;
use crate::error::InferError;
use crate::request::{FunctionTool, ToolCall, ToolChoice, ToolOptions};

/// The tool fields of a `generate` (chat only).
pub const TOOL_FIELDS: &[&str] = &[
    "tools",
    "tool_choice",
    "parallel_tool_calls",
    "chat_template_kwargs",
];
/// Most tools one request may declare (OpenAI's bound).
pub const MAX_TOOLS: usize = 128;
/// Longest tool name, characters (OpenAI's bound).
pub const MAX_TOOL_NAME_CHARS: usize = 64;
/// Template variables the daemon sets itself: `chat_template_kwargs` may not name them.
pub const RESERVED_TEMPLATE_VARS: &[&str] = &[
    "messages",
    "tools",
    "add_generation_prompt",
    "bos_token",
    "eos_token",
];
const TOOL_ENTRY_FIELDS: &[&str] = &["type", "function"];
const FUNCTION_FIELDS: &[&str] = &["name", "description", "parameters", "strict"];
const CALL_FIELDS: &[&str] = &["id", "type", "function"];
const CALL_FUNCTION_FIELDS: &[&str] = &["name", "arguments"];

fn err<T>(message: String) -> VResult<T> {
    Err(InferError::validation(message))
}

/// A function name: 1–64 characters from `a-z A-Z 0-9 _ -`.
fn tool_name(at: &str, v: Option<&Value>) -> VResult<String> {
    match v {
        Some(Value::String(s))
            if !s.is_empty()
                && s.chars().count() <= MAX_TOOL_NAME_CHARS
                && s.chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-') =>
        {
            Ok(s.clone())
        }
        None => err(format!("{at} is missing field \"name\"")),
        Some(other) => err(format!(
            "{at}.name must be 1 to {MAX_TOOL_NAME_CHARS} characters from a-z, A-Z, 0-9, _ \
             and - (got {})",
            quote(other)
        )),
    }
}

fn parse_tool(i: usize, v: &Value) -> VResult<FunctionTool> {
    let at = format!("tools[{i}]");
    let Value::Object(obj) = v else {
        return err(format!(
            "{at} must be an object {{\"type\": \"function\", \"function\": {{…}}}} (got {})",
            quote(v)
        ));
    };
    check_fields(obj, TOOL_ENTRY_FIELDS, &at)?;
    match obj.get("type") {
        Some(Value::String(t)) if t == "function" => {}
        None => {
            return err(format!(
                "{at} is missing field \"type\" (expected \"function\")"
            ))
        }
        Some(other) => {
            return err(format!(
                "{at}.type must be \"function\" (got {})",
                quote(other)
            ))
        }
    }
    let fat = format!("{at}.function");
    let Some(Value::Object(f)) = obj.get("function") else {
        return err(format!(
            "{fat} must be an object with name, description, parameters (got {})",
            obj.get("function").map_or("nothing".into(), quote)
        ));
    };
    check_fields(f, FUNCTION_FIELDS, &fat)?;
    let name = tool_name(&fat, f.get("name"))?;
    let description = match optional(f, "description") {
        None => None,
        Some(Value::String(s)) => Some(s.clone()),
        Some(other) => {
            return err(format!(
                "{fat}.description must be a string (got {})",
                quote(other)
            ))
        }
    };
    let parameters = match optional(f, "parameters") {
        None => serde_json::json!({"type": "object", "properties": {}}),
        Some(Value::Object(p)) if p.get("type").is_some_and(|t| t != "object") => {
            return err(format!(
                "{fat}.parameters.type must be \"object\": a function's arguments are an \
                 object (got {})",
                p.get("type").map_or("nothing".into(), quote)
            ))
        }
        Some(p @ Value::Object(_)) => p.clone(),
        Some(other) => {
            return err(format!(
                "{fat}.parameters must be a JSON schema object (got {})",
                quote(other)
            ))
        }
    };
    if let Some(s) = optional(f, "strict") {
        if !s.is_boolean() {
            return err(format!("{fat}.strict must be a boolean (got {})", quote(s)));
        }
    }
    Ok(FunctionTool {
        name,
        description,
        parameters,
    })
}

fn parse_choice(v: Option<&Value>, tools: &[FunctionTool]) -> VResult<ToolChoice> {
    let choice = match v {
        None if tools.is_empty() => ToolChoice::None,
        None => ToolChoice::Auto,
        Some(Value::String(s)) if s == "none" => ToolChoice::None,
        Some(Value::String(s)) if s == "auto" => ToolChoice::Auto,
        Some(Value::String(s)) if s == "required" => ToolChoice::Required,
        Some(Value::Object(o)) => {
            check_fields(o, TOOL_ENTRY_FIELDS, "tool_choice")?;
            if o.get("type") != Some(&Value::String("function".into())) {
                return err(format!(
                    "tool_choice.type must be \"function\" (got {})",
                    o.get("type").map_or("nothing".into(), quote)
                ));
            }
            let Some(Value::Object(f)) = o.get("function") else {
                return err("tool_choice.function must be an object {\"name\": …}".to_string());
            };
            check_fields(f, &["name"], "tool_choice.function")?;
            let name = tool_name("tool_choice.function", f.get("name"))?;
            if !tools.iter().any(|t| t.name == name) {
                let names: Vec<&str> = tools.iter().map(|t| t.name.as_str()).collect();
                return err(format!(
                    "tool_choice.function.name must name one of tools ({}) (got {})",
                    names.join(", "),
                    quote_str(&name)
                ));
            }
            ToolChoice::Function(name)
        }
        Some(other) => {
            return err(format!(
                "tool_choice must be \"none\", \"auto\", \"required\" or {{\"type\": \
                 \"function\", \"function\": {{\"name\": …}}}} (got {})",
                quote(other)
            ))
        }
    };
    if tools.is_empty() && matches!(choice, ToolChoice::Required | ToolChoice::Function(_)) {
        return err("tool_choice \"required\" or a named function needs a non-empty tools".into());
    }
    Ok(choice)
}

/// `tools`, `tool_choice`, `parallel_tool_calls` of a chat request; `None` when none is
/// given. `is_chat`: the request has `messages` (tools need them).
pub fn parse_tool_options(body: &GenerateBody, is_chat: bool) -> VResult<Option<ToolOptions>> {
    let given = [
        ("tools", body.tools.is_some()),
        ("tool_choice", body.tool_choice.is_some()),
        ("parallel_tool_calls", body.parallel_tool_calls.is_some()),
    ]
    .into_iter()
    .find_map(|(f, given)| given.then_some(f));
    let Some(first) = given else {
        return Ok(None);
    };
    if !is_chat {
        return err(format!(
            "{first} needs messages (tools are for chat requests)"
        ));
    }
    let tools = match &body.tools {
        None => Vec::new(),
        Some(Value::Array(items)) if items.len() <= MAX_TOOLS => items
            .iter()
            .enumerate()
            .map(|(i, t)| parse_tool(i, t))
            .collect::<VResult<Vec<_>>>()?,
        Some(Value::Array(items)) => {
            return err(format!(
                "tools must have at most {MAX_TOOLS} entries (got {})",
                items.len()
            ))
        }
        Some(other) => return err(format!("tools must be an array (got {})", quote(other))),
    };
    for (i, t) in tools.iter().enumerate() {
        if tools[..i].iter().any(|u| u.name == t.name) {
            return err(format!(
                "tools[{i}].function.name {} is not unique",
                quote_str(&t.name)
            ));
        }
    }
    let choice = parse_choice(body.tool_choice.as_ref(), &tools)?;
    let parallel = body.parallel_tool_calls.unwrap_or(true);
    Ok(Some(ToolOptions {
        tools,
        choice,
        parallel,
    }))
}

/// `chat_template_kwargs`: an object of extra template variables (chat only).
pub fn parse_template_kwargs(kwargs: Option<&Value>, is_chat: bool) -> VResult<Map<String, Value>> {
    match kwargs {
        None => Ok(Map::new()),
        Some(_) if !is_chat => err("chat_template_kwargs needs messages".into()),
        Some(Value::Object(kw)) => {
            if let Some(k) = kw
                .keys()
                .find(|k| RESERVED_TEMPLATE_VARS.contains(&k.as_str()))
            {
                return err(format!(
                    "chat_template_kwargs may not set {k:?} (the daemon sets {})",
                    RESERVED_TEMPLATE_VARS.join(", ")
                ));
            }
            Ok(kw.clone())
        }
        Some(other) => err(format!(
            "chat_template_kwargs must be an object (got {})",
            quote(other)
        )),
    }
}

/// `messages[i].tool_calls`.
pub fn parse_message_calls(i: usize, v: &Value) -> VResult<Vec<ToolCall>> {
    let at = format!("messages[{i}].tool_calls");
    let Value::Array(items) = v else {
        return err(format!("{at} must be an array (got {})", quote(v)));
    };
    items
        .iter()
        .enumerate()
        .map(|(j, c)| {
            let at = format!("{at}[{j}]");
            let Value::Object(obj) = c else {
                return err(format!("{at} must be an object (got {})", quote(c)));
            };
            check_fields(obj, CALL_FIELDS, &at)?;
            let id = match optional(obj, "id") {
                None => format!("call_{i}_{j}"),
                Some(Value::String(s)) => s.clone(),
                Some(other) => {
                    return err(format!("{at}.id must be a string (got {})", quote(other)))
                }
            };
            if let Some(t) = optional(obj, "type") {
                if t != "function" {
                    return err(format!("{at}.type must be \"function\" (got {})", quote(t)));
                }
            }
            let fat = format!("{at}.function");
            let Some(Value::Object(f)) = obj.get("function") else {
                return err(format!("{fat} must be an object with name and arguments"));
            };
            check_fields(f, CALL_FUNCTION_FIELDS, &fat)?;
            let name = tool_name(&fat, f.get("name"))?;
            let arguments = match optional(f, "arguments") {
                None => "{}".to_string(),
                Some(Value::String(s)) => s.clone(),
                Some(other) => {
                    return err(format!(
                        "{fat}.arguments must be a string of JSON (got {})",
                        quote(other)
                    ))
                }
            };
            Ok(ToolCall {
                id,
                name,
                arguments,
            })
        })
        .collect()
}

/// An optional string field of a message (`tool_call_id`, `name`).
pub fn message_string(i: usize, obj: &Map<String, Value>, field: &str) -> VResult<Option<String>> {
    match optional(obj, field) {
        None => Ok(None),
        Some(Value::String(s)) => Ok(Some(s.clone())),
        Some(other) => err(format!(
            "messages[{i}].{field} must be a string (got {})",
            quote(other)
        )),
    }
}
