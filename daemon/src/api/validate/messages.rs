//! `messages` of a chat `generate`: roles, content (a string, or text and image parts)
//! and the tool fields of history turns, each error naming its path
//! (`messages[2].role`).

use serde_json::Value;

use super::images::parse_image_part;
use super::{check_fields, optional, quote, tools, VResult};
use crate::error::InferError;
use crate::request::{ChatMessage, ImageInput};

const MESSAGE_FIELDS: &[&str] = &["role", "content", "tool_calls", "tool_call_id", "name"];
const TEXT_PART_FIELDS: &[&str] = &["type", "text"];
const IMAGE_PART_FIELDS: &[&str] = &["type", "image_url"];

pub(super) fn parse_messages(v: &Value) -> VResult<Vec<ChatMessage>> {
    let Value::Array(items) = v else {
        return Err(InferError::validation(format!(
            "messages must be an array of messages (got {})",
            quote(v)
        )));
    };
    if items.is_empty() {
        return Err(InferError::validation(
            "messages must be a non-empty array (got [])",
        ));
    }
    items
        .iter()
        .enumerate()
        .map(|(i, item)| parse_message(i, item))
        .collect()
}

fn parse_message(i: usize, v: &Value) -> VResult<ChatMessage> {
    let Value::Object(obj) = v else {
        return Err(InferError::validation(format!(
            "messages[{i}] must be an object with role and content (got {})",
            quote(v)
        )));
    };
    check_fields(obj, MESSAGE_FIELDS, &format!("messages[{i}]"))?;
    let role = match obj.get("role") {
        None => {
            return Err(InferError::validation(format!(
                "messages[{i}] is missing field \"role\""
            )))
        }
        Some(Value::String(s)) if s.is_empty() => {
            return Err(InferError::validation(format!(
                "messages[{i}].role must be a non-empty string"
            )))
        }
        Some(Value::String(s)) => s.clone(),
        Some(other) => {
            return Err(InferError::validation(format!(
                "messages[{i}].role must be a string (got {})",
                quote(other)
            )))
        }
    };
    let tool_calls = match optional(obj, "tool_calls") {
        None => Vec::new(),
        Some(v) => tools::parse_message_calls(i, v)?,
    };
    let mut images = Vec::new();
    let content = match obj.get("content") {
        // An assistant turn that only calls tools has no content.
        None | Some(Value::Null) if !tool_calls.is_empty() => String::new(),
        None => {
            return Err(InferError::validation(format!(
                "messages[{i}] is missing field \"content\""
            )))
        }
        Some(Value::String(s)) => s.clone(),
        Some(Value::Array(parts)) => parse_parts(i, &role, parts, &mut images)?,
        Some(other) => {
            return Err(InferError::validation(format!(
                "messages[{i}].content must be a string or an array of content parts (got {})",
                quote(other)
            )))
        }
    };
    Ok(ChatMessage {
        role,
        content,
        tool_calls,
        tool_call_id: tools::message_string(i, obj, "tool_call_id")?,
        name: tools::message_string(i, obj, "name")?,
        images,
    })
}

/// Concatenates the texts of `[{"type":"text","text":"..."}, ...]`; image parts (user
/// messages only) go to `images`, each at the text offset where it sits.
fn parse_parts(
    i: usize,
    role: &str,
    parts: &[Value],
    images: &mut Vec<ImageInput>,
) -> VResult<String> {
    let mut content = String::new();
    for (j, part) in parts.iter().enumerate() {
        let at = format!("messages[{i}].content[{j}]");
        let Value::Object(obj) = part else {
            return Err(InferError::validation(format!(
                "{at} must be an object {{\"type\":\"text\",\"text\":...}} or \
                 {{\"type\":\"image_url\",\"image_url\":{{\"url\":...}}}} (got {})",
                quote(part)
            )));
        };
        match obj.get("type") {
            Some(Value::String(t)) if t == "text" => {}
            Some(Value::String(t)) if t == "image_url" => {
                if role != "user" {
                    return Err(InferError::validation(format!(
                        "{at}: image parts are allowed in user messages only (role {role:?})"
                    )));
                }
                check_fields(obj, IMAGE_PART_FIELDS, &at)?;
                images.push(parse_image_part(&at, content.len(), obj)?);
                continue;
            }
            None => {
                return Err(InferError::validation(format!(
                    "{at} is missing field \"type\" (expected \"text\" or \"image_url\")"
                )))
            }
            Some(other) => {
                return Err(InferError::validation(format!(
                    "{at}.type must be \"text\" or \"image_url\" (got {})",
                    quote(other)
                )))
            }
        }
        check_fields(obj, TEXT_PART_FIELDS, &at)?;
        match obj.get("text") {
            Some(Value::String(t)) => content.push_str(t),
            None => {
                return Err(InferError::validation(format!(
                    "{at} is missing field \"text\""
                )))
            }
            Some(other) => {
                return Err(InferError::validation(format!(
                    "{at}.text must be a string (got {})",
                    quote(other)
                )))
            }
        }
    }
    Ok(content)
}
