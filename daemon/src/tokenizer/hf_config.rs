//! The JSON files of a Hugging Face model directory, read with one clear error per bad value.
//!
//! Every error is a [`TokenizerError::HfFile`] naming the file and the key; values quoted from
//! files are cut to [`QUOTE_MAX_CHARS`](super::QUOTE_MAX_CHARS) characters and escaped. Nothing is
//! allocated from a count written in a file: arrays are walked as parsed.

use std::path::{Path, PathBuf};

use serde_json::Value as Json;

use super::{cut, quote, TokenizerError};

/// Largest JSON file read (tokenizer.json of a 262k vocabulary is about 35 MB).
pub const MAX_JSON_BYTES: u64 = 1 << 30;

/// A parsed JSON object and where it came from.
#[derive(Debug, Clone)]
pub struct JsonFile {
    /// The file's path.
    pub path: PathBuf,
    /// The top-level object.
    pub value: Json,
}

impl JsonFile {
    /// Reads and parses `path`, which must hold a JSON object.
    ///
    /// # Errors
    /// [`TokenizerError::HfFile`] when it cannot be read, is larger than [`MAX_JSON_BYTES`], is
    /// not JSON or is not an object.
    pub fn read(path: &Path) -> Result<Self, TokenizerError> {
        let text = read_text(path)?;
        let value: Json = serde_json::from_str(&text).map_err(|e| {
            file_error(
                path,
                "",
                format!("not valid JSON: {}", message(&e.to_string())),
            )
        })?;
        if !value.is_object() {
            return Err(file_error(
                path,
                "",
                format!("expected a JSON object, found {}", kind(&value)),
            ));
        }
        Ok(Self {
            path: path.to_path_buf(),
            value,
        })
    }

    /// Like [`Self::read`], `None` when the file does not exist.
    ///
    /// # Errors
    /// As [`Self::read`].
    pub fn read_optional(path: &Path) -> Result<Option<Self>, TokenizerError> {
        if path.exists() {
            Self::read(path).map(Some)
        } else {
            Ok(None)
        }
    }

    /// An error about `key` of this file.
    pub fn error(&self, key: &str, reason: impl Into<String>) -> TokenizerError {
        file_error(&self.path, key, reason)
    }

    /// The value under a top-level `key`; JSON `null` counts as absent.
    pub fn get(&self, key: &str) -> Option<&Json> {
        self.value.get(key).filter(|v| !v.is_null())
    }

    /// An optional boolean.
    ///
    /// # Errors
    /// When present with another type.
    pub fn opt_bool(&self, key: &str) -> Result<Option<bool>, TokenizerError> {
        match self.get(key) {
            None => Ok(None),
            Some(Json::Bool(b)) => Ok(Some(*b)),
            Some(other) => Err(self.error(key, expected("a boolean", other))),
        }
    }

    /// An optional finite number, checked by `valid` (which describes the allowed range).
    ///
    /// # Errors
    /// When present with another type or out of range.
    pub fn opt_f32(
        &self,
        key: &str,
        range: &str,
        valid: impl Fn(f64) -> bool,
    ) -> Result<Option<f32>, TokenizerError> {
        let Some(v) = self.get(key) else {
            return Ok(None);
        };
        match v.as_f64() {
            Some(x) if x.is_finite() && valid(x) => Ok(Some(x as f32)),
            Some(_) => Err(self.error(key, format!("{} is out of range: {range}", short(v)))),
            None => Err(self.error(key, expected("a number", v))),
        }
    }

    /// A token text given as a string or as an `AddedToken` object `{"content": ...}`
    /// (transformers writes both); `None` when absent or null.
    ///
    /// # Errors
    /// Any other shape.
    pub fn opt_token_text(&self, key: &str) -> Result<Option<String>, TokenizerError> {
        match self.get(key) {
            None => Ok(None),
            Some(Json::String(s)) => Ok(Some(s.clone())),
            Some(Json::Object(o)) => match o.get("content") {
                Some(Json::String(s)) => Ok(Some(s.clone())),
                _ => Err(self.error(
                    key,
                    "an object here needs a string `content` (an AddedToken)",
                )),
            },
            Some(other) => {
                Err(self.error(key, expected("a string or an object with `content`", other)))
            }
        }
    }
}

/// Reads a whole text file, refusing one over [`MAX_JSON_BYTES`].
///
/// # Errors
/// [`TokenizerError::HfFile`] when it cannot be read, is too large or is not UTF-8.
pub fn read_text(path: &Path) -> Result<String, TokenizerError> {
    let meta = std::fs::metadata(path).map_err(|e| {
        file_error(
            path,
            "",
            format!("cannot read: {}", message(&e.to_string())),
        )
    })?;
    if meta.len() > MAX_JSON_BYTES {
        return Err(file_error(
            path,
            "",
            format!(
                "{} bytes is larger than the {MAX_JSON_BYTES}-byte limit",
                meta.len()
            ),
        ));
    }
    let bytes = std::fs::read(path).map_err(|e| {
        file_error(
            path,
            "",
            format!("cannot read: {}", message(&e.to_string())),
        )
    })?;
    String::from_utf8(bytes).map_err(|e| {
        file_error(
            path,
            "",
            format!("not UTF-8 (at byte {})", e.utf8_error().valid_up_to()),
        )
    })
}

/// A [`TokenizerError::HfFile`].
pub fn file_error(path: &Path, key: &str, reason: impl Into<String>) -> TokenizerError {
    TokenizerError::HfFile {
        file: path.display().to_string(),
        key: key.to_string(),
        reason: reason.into(),
    }
}

/// A foreign error message (serde, tokenizers, minijinja) made safe to embed: cut to the
/// quote bound, control characters escaped.
pub fn message(msg: &str) -> String {
    cut(msg)
        .chars()
        .flat_map(|c| {
            let escaped: Vec<char> = if c.is_control() {
                c.escape_default().collect()
            } else {
                vec![c]
            };
            escaped
        })
        .collect()
}

/// `expected X, found <kind> <value>`.
pub fn expected(what: &str, found: &Json) -> String {
    format!("expected {what}, found {} {}", kind(found), short(found))
}

/// JSON type name of a value.
pub fn kind(v: &Json) -> &'static str {
    match v {
        Json::Null => "null",
        Json::Bool(_) => "boolean",
        Json::Number(_) => "number",
        Json::String(_) => "string",
        Json::Array(_) => "array",
        Json::Object(_) => "object",
    }
}

/// A value as JSON text, cut and escaped for an error message.
pub fn short(v: &Json) -> String {
    match v {
        Json::String(s) => quote(s),
        other => message(&other.to_string()),
    }
}

/// Sampling defaults a model ships in `generation_config.json`, for requests that omit the
/// field. Each is `None` when the file or the key is absent (or `null`). Semantics are those of
/// transformers' `GenerationConfig` (`generation/configuration_utils.py`) and its logits
/// processors (`generation/logits_process.py`).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct GenerationDefaults {
    /// `do_sample`: when false, transformers decodes greedily and ignores `temperature`,
    /// `top_k`, `top_p` and `min_p` (it defaults to false when absent).
    pub do_sample: Option<bool>,
    /// `temperature` (finite, ≥ 0): logits are divided by it (`TemperatureLogitsWarper`).
    pub temperature: Option<f32>,
    /// `top_k` (integer ≥ 0): keep the k most likely tokens; 0 disables (`TopKLogitsWarper`).
    pub top_k: Option<usize>,
    /// `top_p` (in [0, 1]): nucleus sampling, keep the smallest set whose probability mass
    /// reaches it; 1 disables (`TopPLogitsWarper`).
    pub top_p: Option<f32>,
    /// `min_p` (in [0, 1]): drop tokens below `min_p` × the top probability; 0 disables
    /// (`MinPLogitsWarper`).
    pub min_p: Option<f32>,
    /// `repetition_penalty` (finite, > 0): logits of tokens already in the sequence are divided
    /// by it when positive and multiplied when negative; 1 disables
    /// (`RepetitionPenaltyLogitsProcessor`, Keskar et al. 2019).
    pub repetition_penalty: Option<f32>,
}

impl GenerationDefaults {
    /// Reads the sampling keys of a parsed `generation_config.json`.
    ///
    /// # Errors
    /// A key with the wrong type or out of its range.
    pub fn read(file: &JsonFile) -> Result<Self, TokenizerError> {
        let top_k = match file.get("top_k") {
            None => None,
            Some(v) => Some(
                v.as_u64()
                    .and_then(|k| usize::try_from(k).ok())
                    .ok_or_else(|| file.error("top_k", expected("an integer ≥ 0", v)))?,
            ),
        };
        Ok(Self {
            do_sample: file.opt_bool("do_sample")?,
            temperature: file.opt_f32("temperature", "expected ≥ 0", |x| x >= 0.0)?,
            top_k,
            top_p: file.opt_f32("top_p", "expected 0 ≤ top_p ≤ 1", |x| {
                (0.0..=1.0).contains(&x)
            })?,
            min_p: file.opt_f32("min_p", "expected 0 ≤ min_p ≤ 1", |x| {
                (0.0..=1.0).contains(&x)
            })?,
            repetition_penalty: file.opt_f32("repetition_penalty", "expected > 0", |x| x > 0.0)?,
        })
    }
}

/// A token id from a JSON number, checked against the vocabulary size.
///
/// # Errors
/// Not a non-negative integer, or not below `vocab_size`.
pub fn token_id(
    file: &JsonFile,
    key: &str,
    v: &Json,
    vocab_size: usize,
) -> Result<u32, TokenizerError> {
    let id = v
        .as_u64()
        .ok_or_else(|| file.error(key, expected("a token id (integer ≥ 0)", v)))?;
    match u32::try_from(id) {
        Ok(id) if (id as usize) < vocab_size => Ok(id),
        _ => Err(file.error(
            key,
            format!("token id {id} is beyond the vocabulary ({vocab_size} tokens)"),
        )),
    }
}

/// `eos_token_id` of generation_config.json: one id or a list of ids (all end generation).
///
/// # Errors
/// Another shape, or an id beyond the vocabulary.
pub fn eos_token_ids(file: &JsonFile, vocab_size: usize) -> Result<Vec<u32>, TokenizerError> {
    const KEY: &str = "eos_token_id";
    match file.get(KEY) {
        None => Ok(Vec::new()),
        Some(Json::Array(items)) => items
            .iter()
            .enumerate()
            .map(|(i, v)| token_id(file, &format!("{KEY}[{i}]"), v, vocab_size))
            .collect(),
        Some(v) => token_id(file, KEY, v, vocab_size).map(|id| vec![id]),
    }
}

/// The chat template source and the file it came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TemplateSource {
    /// The Jinja source.
    pub source: String,
    /// The file it was read from.
    pub file: PathBuf,
    /// The key inside that file (empty for `chat_template.jinja`).
    pub key: String,
}

/// Finds the chat template as transformers does: `chat_template.jinja` when present (it
/// takes priority over the config's), else `chat_template` of tokenizer_config.json (a
/// string, or a list of `{name, template}` of which `default` is used), else
/// `chat_template` of `chat_template.json`.
///
/// # Errors
/// A bad `chat_template` value or an unreadable template file.
pub fn chat_template(
    dir: &Path,
    config: Option<&JsonFile>,
) -> Result<Option<TemplateSource>, TokenizerError> {
    // transformers: a `chat_template.jinja` file clobbers the template in
    // tokenizer_config.json (`test_chat_template_file_priority`).
    let jinja = dir.join("chat_template.jinja");
    if jinja.exists() {
        let source = read_text(&jinja)?;
        if source.trim().is_empty() {
            return Err(file_error(&jinja, "", "the template file is empty"));
        }
        return Ok(Some(TemplateSource {
            source,
            file: jinja,
            key: String::new(),
        }));
    }
    if let Some(found) = config
        .map(|c| template_value(c, "chat_template"))
        .transpose()?
    {
        if found.is_some() {
            return Ok(found);
        }
    }
    match JsonFile::read_optional(&dir.join("chat_template.json"))? {
        Some(file) => template_value(&file, "chat_template"),
        None => Ok(None),
    }
}

/// A `chat_template` value: string, or list of `{name, template}` (the `default` entry).
fn template_value(file: &JsonFile, key: &str) -> Result<Option<TemplateSource>, TokenizerError> {
    let found = |source: &str, key: String| TemplateSource {
        source: source.to_string(),
        file: file.path.clone(),
        key,
    };
    match file.get(key) {
        None => Ok(None),
        Some(Json::String(s)) => Ok(Some(found(s, key.to_string()))),
        Some(Json::Array(items)) => {
            let mut names = Vec::new();
            for (i, item) in items.iter().enumerate() {
                let entry_key = format!("{key}[{i}]");
                let name = item.get("name").and_then(Json::as_str);
                let template = item.get("template").and_then(Json::as_str);
                let (Some(name), Some(template)) = (name, template) else {
                    return Err(file.error(
                        &entry_key,
                        expected("an object with string `name` and `template`", item),
                    ));
                };
                if name == "default" {
                    return Ok(Some(found(template, format!("{entry_key}.template"))));
                }
                names.push(quote(name));
            }
            Err(file.error(
                key,
                format!(
                    "a list of templates needs one named \"default\" (found: {})",
                    cut(&names.join(", "))
                ),
            ))
        }
        Some(other) => Err(file.error(
            key,
            expected("a string or a list of {name, template}", other),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(json: &str) -> JsonFile {
        JsonFile {
            path: PathBuf::from("/x/generation_config.json"),
            value: serde_json::from_str(json).expect("json"),
        }
    }

    #[test]
    fn generation_defaults_read_and_checked() {
        let f = file(
            r#"{"do_sample": true, "temperature": 0.7, "top_k": 64, "top_p": 0.95,
                "min_p": null, "repetition_penalty": 1, "eos_token_id": [1, 106]}"#,
        );
        let d = GenerationDefaults::read(&f).expect("defaults");
        assert_eq!(
            d,
            GenerationDefaults {
                do_sample: Some(true),
                temperature: Some(0.7),
                top_k: Some(64),
                top_p: Some(0.95),
                min_p: None,
                repetition_penalty: Some(1.0),
            }
        );
        assert_eq!(eos_token_ids(&f, 262_144).expect("ids"), vec![1, 106]);
        let err = eos_token_ids(&f, 100).expect_err("beyond vocab");
        assert_eq!(
            err.to_string(),
            "/x/generation_config.json: key `eos_token_id[1]`: token id 106 is beyond the \
             vocabulary (100 tokens)"
        );
        let err = GenerationDefaults::read(&file(r#"{"top_p": 1.5}"#)).expect_err("range");
        assert_eq!(
            err.to_string(),
            "/x/generation_config.json: key `top_p`: 1.5 is out of range: expected 0 ≤ top_p ≤ 1"
        );
        let err = GenerationDefaults::read(&file(r#"{"top_k": "many"}"#)).expect_err("type");
        assert_eq!(
            err.to_string(),
            "/x/generation_config.json: key `top_k`: expected an integer ≥ 0, found string \
             \"many\""
        );
        let err = eos_token_ids(&file(r#"{"eos_token_id": -1}"#), 10).expect_err("negative");
        assert!(err.to_string().contains("`eos_token_id`"), "{err}");
    }

    #[test]
    fn quoted_values_are_bounded_and_escaped() {
        let long = "x\n".repeat(500);
        let f = file(&format!(r#"{{"temperature": {}}}"#, Json::String(long)));
        let msg = GenerationDefaults::read(&f).expect_err("type").to_string();
        assert!(msg.len() < 600, "{}", msg.len());
        assert!(
            !msg.contains('\n') && msg.contains("x\\n") && msg.contains('…'),
            "{msg}"
        );
    }

    #[test]
    fn template_lists_use_default() {
        let f = file(
            r#"{"chat_template": [{"name": "tool_use", "template": "T"},
                                  {"name": "default", "template": "D"}]}"#,
        );
        let t = template_value(&f, "chat_template")
            .expect("ok")
            .expect("some");
        assert_eq!(t.source, "D");
        assert_eq!(t.key, "chat_template[1].template");
        let f = file(r#"{"chat_template": [{"name": "tool_use", "template": "T"}]}"#);
        let err = template_value(&f, "chat_template").expect_err("no default");
        assert!(err.to_string().contains("\"tool_use\""), "{err}");
        let f = file(r#"{"chat_template": 3}"#);
        assert!(template_value(&f, "chat_template").is_err());
    }
}
