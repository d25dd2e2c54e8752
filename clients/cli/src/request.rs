//! Client frames: the `generate` frame built from the command-line options, and the
//! one-field `cancel`, `stats` and `plugins` frames.

use serde_json::{json, Map, Value};

use crate::args::GenerateOptions;

/// What a `generate` asks the model to continue.
#[derive(Debug, Clone, PartialEq)]
pub enum Input {
    /// Chat messages, rendered with the model's chat template.
    Messages(Vec<Value>),
    /// A raw prompt, tokenized as is.
    Prompt(String),
}

/// A chat message `{"role": role, "content": content}`.
pub fn message(role: &str, content: &str) -> Value {
    json!({"role": role, "content": content})
}

/// An image content part: `bytes` as a base64 `data:` URL, its media type from the
/// file name's extension (none for an unknown one: the daemon reads the format from
/// the bytes).
pub fn image_part(path: &std::path::Path, bytes: &[u8]) -> Value {
    let ext = path
        .extension()
        .and_then(|e| e.to_str())
        .map(str::to_ascii_lowercase);
    let media_type = match ext.as_deref() {
        Some("png") => "image/png",
        Some("jpg" | "jpeg") => "image/jpeg",
        Some("webp") => "image/webp",
        Some("gif") => "image/gif",
        _ => "",
    };
    let url = format!(
        "data:{media_type};base64,{}",
        data_encoding::BASE64.encode(bytes)
    );
    json!({"type": "image_url", "image_url": {"url": url}})
}

/// The `generate` frame with request id `id`. Options left unset are not sent, so the
/// daemon's defaults apply.
pub fn generate(id: &str, input: Input, options: &GenerateOptions) -> Value {
    let mut frame = Map::new();
    frame.insert("type".into(), json!("generate"));
    frame.insert("id".into(), json!(id));
    match input {
        Input::Messages(messages) => frame.insert("messages".into(), Value::Array(messages)),
        Input::Prompt(prompt) => frame.insert("prompt".into(), json!(prompt)),
    };
    let mut set = |key: &str, value: Option<Value>| {
        if let Some(value) = value {
            frame.insert(key.into(), value);
        }
    };
    set("max_tokens", options.max_tokens.map(Value::from));
    set("temperature", options.temperature.clone().map(Value::from));
    set("top_p", options.top_p.clone().map(Value::from));
    set("top_k", options.top_k.map(Value::from));
    set("min_p", options.min_p.clone().map(Value::from));
    set("min_tokens", options.min_tokens.map(Value::from));
    set(
        "stop",
        (!options.stop.is_empty()).then(|| json!(options.stop)),
    );
    set("seed", options.seed.map(Value::from));
    set("cache", options.no_cache.then_some(Value::Bool(false)));
    set("cache_salt", options.cache_salt.as_ref().map(|s| json!(s)));
    set("adapter", options.adapter.as_ref().map(|a| json!(a)));
    set("lora_scale", options.lora_scale.clone().map(Value::from));
    Value::Object(frame)
}

/// The `cancel` frame for request `id`.
pub fn cancel(id: &str) -> Value {
    json!({"type": "cancel", "id": id})
}

/// A `stats` or `plugins` request frame (`kind`) with id `id`.
pub fn query(kind: &str, id: &str) -> Value {
    json!({"type": kind, "id": id})
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_image_part_is_a_base64_data_url_typed_by_extension() {
        let part = image_part(std::path::Path::new("/tmp/Cat.JPG"), b"\xff\xd8\xff");
        assert_eq!(
            part,
            json!({"type": "image_url", "image_url": {"url": "data:image/jpeg;base64,/9j/"}})
        );
        let part = image_part(std::path::Path::new("scan.tiff"), b"II*");
        assert_eq!(part["image_url"]["url"], "data:;base64,SUkq");
    }
    use crate::args::{parse, Command};
    use clap::Parser;

    fn chat_frame(args: &[&str]) -> Value {
        let Command::Chat(chat) = parse(args).command else {
            panic!("chat expected");
        };
        let mut messages = Vec::new();
        if let Some(system) = &chat.system {
            messages.push(message("system", system));
        }
        messages.push(message(
            "user",
            chat.question.as_deref().unwrap_or_default(),
        ));
        generate("cli-1", Input::Messages(messages), &chat.options)
    }

    #[test]
    fn chat_frame_has_system_and_options() {
        let frame = chat_frame(&[
            "chat",
            "why?",
            "--system",
            "brief",
            "--max-tokens",
            "5",
            "--temperature",
            "0.5",
            "--seed",
            "9",
        ]);
        assert_eq!(
            frame,
            json!({"type": "generate", "id": "cli-1",
                   "messages": [{"role": "system", "content": "brief"}, {"role": "user", "content": "why?"}],
                   "max_tokens": 5, "temperature": 0.5, "seed": 9})
        );
    }

    #[test]
    fn unset_options_are_left_to_the_daemon() {
        let frame = generate(
            "cli-1",
            Input::Prompt("Once".into()),
            &GenerateOptions::default(),
        );
        assert_eq!(
            frame,
            json!({"type": "generate", "id": "cli-1", "prompt": "Once"})
        );
    }

    #[test]
    fn sampling_options_and_stops_are_sent() {
        let frame = chat_frame(&[
            "chat",
            "hi",
            "--top-p",
            "0.9",
            "--top-k",
            "20",
            "--min-p",
            "0.1",
            "--min-tokens",
            "3",
            "--stop",
            "\n\n",
            "--stop",
            "END",
        ]);
        assert_eq!(frame["top_p"], json!(0.9));
        assert_eq!(frame["top_k"], json!(20));
        assert_eq!(frame["min_p"], json!(0.1));
        assert_eq!(frame["min_tokens"], json!(3));
        assert_eq!(frame["stop"], json!(["\n\n", "END"]));
    }

    #[test]
    fn numbers_are_sent_as_written() {
        let frame = chat_frame(&["chat", "hi", "--temperature", "-1", "--top-p", "1e-1"]);
        assert_eq!(frame["temperature"].to_string(), "-1");
        assert_eq!(frame["top_p"], json!(0.1));
        for bad in ["nan", "inf", "-inf", "Infinity", "0.5x", ""] {
            let e = crate::args::Cli::try_parse_from(["inferd-cli", "chat", "hi", "--min-p", bad])
                .expect_err(bad)
                .to_string();
            assert!(
                e.contains(&format!(
                    "must be a finite number such as 0.7 (got {bad:?})"
                )),
                "{bad}: {e}"
            );
        }
    }

    #[test]
    fn negative_counts_are_refused_as_values_not_taken_for_flags() {
        for flag in ["--top-k", "--seed", "--max-tokens", "--min-tokens"] {
            let e = crate::args::Cli::try_parse_from(["inferd-cli", "chat", "hi", flag, "-1"])
                .expect_err(flag)
                .to_string();
            assert!(e.contains("invalid value '-1'"), "{flag}: {e}");
        }
    }

    #[test]
    fn cache_flags_set_cache_and_salt() {
        let frame = chat_frame(&["chat", "hi", "--no-cache", "--cache-salt", "tenant-a"]);
        assert_eq!(frame["cache"], json!(false));
        assert_eq!(frame["cache_salt"], json!("tenant-a"));
        let frame = chat_frame(&["chat", "hi", "--cache-salt", "s"]);
        assert_eq!(frame["cache_salt"], json!("s"));
        assert!(frame.get("cache").is_none());
    }

    #[test]
    fn adapter_and_scale_are_sent() {
        let frame = chat_frame(&["chat", "hi", "--adapter", "sql", "--lora-scale", "0.5"]);
        assert_eq!(
            frame,
            json!({"type": "generate", "id": "cli-1",
                   "messages": [{"role": "user", "content": "hi"}],
                   "adapter": "sql", "lora_scale": 0.5})
        );
        // The daemon's default scale (1) is left to it; a scale is sent as written.
        let frame = chat_frame(&["chat", "hi", "--adapter", "sql"]);
        assert_eq!(frame["adapter"], json!("sql"));
        assert!(frame.get("lora_scale").is_none());
        let frame = chat_frame(&["chat", "hi", "--adapter", "sql", "--lora-scale", "-2"]);
        assert_eq!(frame["lora_scale"].to_string(), "-2");
    }
}
