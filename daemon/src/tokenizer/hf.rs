//! A Hugging Face model directory's tokenizer: `tokenizer.json` used as is, plus
//! `tokenizer_config.json`, the chat template files and `generation_config.json`.
//!
//! Encoding: the special added tokens (`"special": true` in tokenizer.json's `added_tokens` or
//! in tokenizer_config.json's `added_tokens_decoder`) go into the same special-token partition
//! as GGUF control tokens ([`super::special`]), with their `lstrip` / `rstrip` flags, so that
//! special-token text typed in message content stays text. Each remaining fragment is encoded by
//! the `tokenizers` tokenizer with `encode_special_tokens` on (special text left in a fragment is
//! plain text) and `add_special_tokens = false`; non-special added tokens are still matched by
//! `tokenizers` itself. `tokenizers` also splits its input at added tokens and normalizes and
//! pre-tokenizes each piece on its own, so encoding fragment by fragment gives the ids of
//! encoding the whole string. The one position-dependent step, a `Metaspace` pre-tokenizer with
//! `prepend_scheme: "first"` (prepend `▁` only to the piece at offset 0), is kept by a second
//! tokenizer with `"never"` for fragments that do not start the text. Not modelled: the
//! `single_word` and `normalized: true` flags of special added tokens (matched as plain,
//! unnormalized text).
//!
//! BOS/EOS: `bos_token` / `eos_token` of tokenizer_config.json (a string or an `AddedToken`
//! object). `add_bos` / `add_eos`: `add_bos_token` / `add_eos_token` of tokenizer_config.json
//! when present (what transformers' Llama/Gemma fast tokenizers apply), otherwise whether the
//! `TemplateProcessing` post-processor's `single` template starts with the BOS / ends with the
//! EOS token (gguf-py `SpecialVocab._try_load_from_tokenizer_json`). End of generation: every
//! `eos_token_id` of generation_config.json plus `eos_token` (transformers stops on any id of
//! `generation_config.eos_token_id`).

use std::ops::Range;
use std::path::Path;

use serde_json::Value as Json;
use tokenizers::{AddedToken, Tokenizer};

use super::chat_template::ChatTemplate;
use super::hf_config::{self, file_error, message, GenerationDefaults, JsonFile};
use super::hf_decode::DecoderPlan;
use super::special::{SpecialEntry, SpecialTokens, TokenType};
use super::{quote, Backend, Parts, TokenizerError};

/// File names inside the directory.
pub const TOKENIZER_JSON: &str = "tokenizer.json";
/// See [`TOKENIZER_JSON`].
pub const TOKENIZER_CONFIG_JSON: &str = "tokenizer_config.json";
/// See [`TOKENIZER_JSON`].
pub const GENERATION_CONFIG_JSON: &str = "generation_config.json";

/// Ids may have holes (ids no token uses), but at most this many per token plus a constant,
/// so a stray huge id in a file cannot size the tables.
const MAX_ID_SPREAD: usize = 2;

/// The `tokenizers` side of a Hugging Face tokenizer.
#[derive(Debug)]
pub struct HfBackend {
    /// tokenizer.json, with `encode_special_tokens` on and no truncation or padding.
    tokenizer: Tokenizer,
    /// The same with a `Metaspace` pre-tokenizer's `prepend_scheme` "first" set to "never",
    /// for fragments that do not start at byte 0; `None` when there is no such pre-tokenizer.
    not_first: Option<Tokenizer>,
    /// Per-token bytes and the start/end edits of the decoder.
    decoder: DecoderPlan,
}

impl HfBackend {
    /// Appends the ids of `text[range]` (a fragment between special tokens).
    pub(crate) fn encode_fragment(
        &self,
        text: &str,
        range: Range<usize>,
        out: &mut Vec<u32>,
    ) -> Result<(), TokenizerError> {
        let tokenizer = match (&self.not_first, range.start) {
            (Some(t), start) if start > 0 => t,
            _ => &self.tokenizer,
        };
        let encoding =
            tokenizer
                .encode(&text[range], false)
                .map_err(|e| TokenizerError::Encode {
                    reason: e.to_string(),
                })?;
        out.extend_from_slice(encoding.get_ids());
        Ok(())
    }

    /// The bytes of the first token of a sequence when the decoder treats it differently
    /// (`Metaspace`), `None` otherwise. Special tokens decode to nothing wherever they are.
    pub(crate) fn first_token_bytes(&self, text: &str, ty: Option<TokenType>) -> Option<Vec<u8>> {
        if !self.decoder.first_differs() || ty.is_none_or(|t| t.needs_parse_special()) {
            return None;
        }
        Some(self.decoder.token_bytes(text, true))
    }

    /// Sequence-level edits of the decoder (a `Strip` after `Fuse`) on the decoded bytes.
    pub(crate) fn finish_decode(&self, buf: &mut Vec<u8>) {
        self.decoder.finish(buf);
    }

    /// The tokenizer.json tokenizer (special-token matching off).
    pub fn tokenizer(&self) -> &Tokenizer {
        &self.tokenizer
    }
}

/// An added token as both files describe it.
struct Added {
    content: String,
    special: bool,
    lstrip: bool,
    rstrip: bool,
}

/// Reads the directory (see the module docs).
pub(super) fn load(dir: &Path) -> Result<Parts, TokenizerError> {
    let tj_path = dir.join(TOKENIZER_JSON);
    let tj = JsonFile::read(&tj_path)?;
    let mut tokenizer = build(&tj, &tj.value)?;
    let mut not_first = match metaspace_first_to_never(&tj.value) {
        Some(variant) => Some(build(&tj, &variant)?),
        None => None,
    };
    let decoder = DecoderPlan::from_json(tj.value.get("decoder").unwrap_or(&Json::Null))
        .map_err(|reason| tj.error("decoder", reason))?;

    // Vocabulary by id, holes left empty.
    let vocab = tokenizer.get_vocab(true);
    let max_id = vocab.values().copied().max().unwrap_or(0) as usize;
    if vocab.is_empty() || max_id >= vocab.len() * MAX_ID_SPREAD + 1024 {
        return Err(tj.error(
            "model.vocab",
            format!(
                "{} tokens with ids up to {max_id}: the vocabulary must be non-empty and its \
                 ids dense",
                vocab.len()
            ),
        ));
    }
    let n = max_id + 1;
    let mut tokens = vec![String::new(); n];
    let mut types = vec![TokenType::Undefined; n];
    for (text, id) in vocab {
        let i = id as usize;
        tokens[i] = text;
        types[i] = TokenType::Normal;
    }

    let mut added: Vec<(u32, Added)> = tokenizer
        .get_added_tokens_decoder()
        .into_iter()
        .map(|(id, t)| {
            (
                id,
                Added {
                    content: t.content,
                    special: t.special,
                    lstrip: t.lstrip,
                    rstrip: t.rstrip,
                },
            )
        })
        .collect();
    added.sort_by_key(|(id, _)| *id);

    let config = JsonFile::read_optional(&dir.join(TOKENIZER_CONFIG_JSON))?;
    if let Some(config) = &config {
        let promoted = merge_added_tokens_decoder(config, &tokens, &mut added)?;
        if !promoted.is_empty() {
            for t in [Some(&mut tokenizer), not_first.as_mut()]
                .into_iter()
                .flatten()
            {
                t.add_special_tokens(promoted.iter().cloned())
                    .map_err(|e| config.error("added_tokens_decoder", message(&e.to_string())))?;
            }
        }
    }
    let mut entries = Vec::new();
    for (id, a) in &added {
        // Added ids are part of `get_vocab(true)`, so always below `n`.
        if let Some(t) = types.get_mut(*id as usize) {
            *t = if a.special {
                TokenType::Control
            } else {
                TokenType::UserDefined
            };
        }
        if a.special {
            entries.push(SpecialEntry {
                id: *id,
                text: a.content.clone(),
                ty: TokenType::Control,
                lstrip: a.lstrip,
                rstrip: a.rstrip,
            });
        }
    }

    let id_of = |file: &JsonFile, key: &str| -> Result<Option<(u32, String)>, TokenizerError> {
        match file.opt_token_text(key)? {
            None => Ok(None),
            Some(text) => match tokenizer.token_to_id(&text) {
                Some(id) => Ok(Some((id, text))),
                None => Err(file.error(
                    key,
                    format!("{} is not a token of {TOKENIZER_JSON}", quote(&text)),
                )),
            },
        }
    };
    let (bos, eos, add_bos_cfg, add_eos_cfg) = match &config {
        Some(c) => (
            id_of(c, "bos_token")?,
            id_of(c, "eos_token")?,
            c.opt_bool("add_bos_token")?,
            c.opt_bool("add_eos_token")?,
        ),
        None => (None, None, None, None),
    };
    let (single_first, single_last) = template_processing_ends(&tj.value);
    let add_bos = add_bos_cfg.unwrap_or_else(|| {
        bos.as_ref()
            .is_some_and(|(_, t)| single_first.as_deref() == Some(t.as_str()))
    });
    let add_eos = add_eos_cfg.unwrap_or_else(|| {
        eos.as_ref()
            .is_some_and(|(_, t)| single_last.as_deref() == Some(t.as_str()))
    });
    if add_bos && bos.is_none() {
        return Err(file_error(
            &dir.join(TOKENIZER_CONFIG_JSON),
            "bos_token",
            "missing, but BOS is to be added (add_bos_token or the post-processor)",
        ));
    }
    if add_eos && eos.is_none() {
        return Err(file_error(
            &dir.join(TOKENIZER_CONFIG_JSON),
            "eos_token",
            "missing, but EOS is to be added (add_eos_token or the post-processor)",
        ));
    }

    let generation = JsonFile::read_optional(&dir.join(GENERATION_CONFIG_JSON))?;
    let (gen_eos, defaults) = match &generation {
        Some(g) => (
            hf_config::eos_token_ids(g, n)?,
            GenerationDefaults::read(g)?,
        ),
        None => (Vec::new(), GenerationDefaults::default()),
    };
    let mut eog: Vec<u32> = gen_eos.clone();
    eog.extend(eos.as_ref().map(|(id, _)| *id));
    eog.sort_unstable();
    eog.dedup();

    let chat_template = match hf_config::chat_template(dir, config.as_ref())? {
        Some(t) => {
            let text =
                |v: &Option<(u32, String)>| v.as_ref().map(|p| p.1.clone()).unwrap_or_default();
            Some(
                ChatTemplate::new(&t.source, text(&bos), text(&eos)).map_err(|e| {
                    let reason = match e {
                        TokenizerError::Template { message } => message,
                        other => other.to_string(),
                    };
                    file_error(
                        &t.file,
                        &t.key,
                        format!("does not compile: {}", message(&reason)),
                    )
                })?,
            )
        }
        None => None,
    };

    let token_bytes = tokens
        .iter()
        .zip(&types)
        .map(|(text, ty)| match ty {
            TokenType::Normal | TokenType::UserDefined => decoder.token_bytes(text, false),
            _ => Vec::new(),
        })
        .collect();

    Ok(Parts {
        backend: Backend::Hf(Box::new(HfBackend {
            tokenizer,
            not_first,
            decoder,
        })),
        tokens,
        types,
        token_bytes,
        special: SpecialTokens::from_entries(entries),
        bos: bos.map(|b| b.0),
        eos: eos.map(|e| e.0).or_else(|| gen_eos.first().copied()),
        eog,
        add_bos,
        add_eos,
        chat_template,
        generation: defaults,
    })
}

/// A tokenizer from (a variant of) tokenizer.json, set up for fragment encoding.
fn build(tj: &JsonFile, value: &Json) -> Result<Tokenizer, TokenizerError> {
    let mut t: Tokenizer = serde_json::from_value(value.clone()).map_err(|e| {
        tj.error(
            "",
            format!(
                "not a tokenizer the `tokenizers` crate can load: {}",
                message(&e.to_string())
            ),
        )
    })?;
    t.with_truncation(None)
        .map_err(|e| tj.error("truncation", message(&e.to_string())))?;
    t.with_padding(None);
    t.set_encode_special_tokens(true);
    Ok(t)
}

/// tokenizer.json with every `Metaspace` pre-tokenizer whose `prepend_scheme` is `first` set
/// to `never`; `None` when there is none.
fn metaspace_first_to_never(value: &Json) -> Option<Json> {
    fn walk(v: &mut Json, depth: usize) -> bool {
        if depth > 8 {
            return false;
        }
        let mut changed = false;
        if v.get("type").and_then(Json::as_str) == Some("Metaspace")
            && v.get("prepend_scheme").and_then(Json::as_str) == Some("first")
        {
            v["prepend_scheme"] = Json::String("never".to_string());
            changed = true;
        }
        if let Some(items) = v.get_mut("pretokenizers").and_then(Json::as_array_mut) {
            for item in items {
                changed |= walk(item, depth + 1);
            }
        }
        changed
    }
    let pre = value.get("pre_tokenizer")?;
    let mut pre = pre.clone();
    if !walk(&mut pre, 0) {
        return None;
    }
    let mut variant = value.clone();
    variant["pre_tokenizer"] = pre;
    Some(variant)
}

/// The special tokens that start and end the post-processor's `single` template
/// (`TemplateProcessing`, possibly inside a `Sequence`), as gguf-py reads them.
fn template_processing_ends(value: &Json) -> (Option<String>, Option<String>) {
    let Some(pp) = value.get("post_processor") else {
        return (None, None);
    };
    let processors: Vec<&Json> = match pp.get("processors").and_then(Json::as_array) {
        Some(list) => list.iter().collect(),
        None => vec![pp],
    };
    for p in processors {
        if p.get("type").and_then(Json::as_str) != Some("TemplateProcessing") {
            continue;
        }
        let Some(single) = p.get("single").and_then(Json::as_array) else {
            continue;
        };
        if single.len() < 2 {
            continue;
        }
        let special = |item: Option<&Json>| {
            item.and_then(|i| i.get("SpecialToken"))
                .and_then(|s| s.get("id"))
                .and_then(Json::as_str)
                .map(str::to_string)
        };
        return (special(single.first()), special(single.last()));
    }
    (None, None)
}

/// Merges tokenizer_config.json's `added_tokens_decoder` into `added`: each entry must name a
/// token of tokenizer.json by id and content; `special: true` there makes it special (as
/// transformers does when it loads both). Returns the tokens that became special, to register
/// with `tokenizers`.
fn merge_added_tokens_decoder(
    config: &JsonFile,
    tokens: &[String],
    added: &mut Vec<(u32, Added)>,
) -> Result<Vec<AddedToken>, TokenizerError> {
    const KEY: &str = "added_tokens_decoder";
    let Some(decoder) = config.get(KEY) else {
        return Ok(Vec::new());
    };
    let Some(map) = decoder.as_object() else {
        return Err(config.error(KEY, hf_config::expected("an object", decoder)));
    };
    let mut promoted = Vec::new();
    for (id_text, entry) in map {
        let key = format!("{KEY}.{}", super::cut(id_text));
        let id: u32 = id_text
            .parse()
            .map_err(|_| config.error(&key, format!("{} is not a token id", quote(id_text))))?;
        let Some(known) = tokens.get(id as usize) else {
            return Err(config.error(
                &key,
                format!(
                    "token id {id} is beyond the vocabulary ({} tokens)",
                    tokens.len()
                ),
            ));
        };
        let content = match entry.get("content") {
            Some(Json::String(s)) => s,
            Some(other) => {
                return Err(config.error(
                    &format!("{key}.content"),
                    hf_config::expected("a string", other),
                ))
            }
            None => return Err(config.error(&format!("{key}.content"), "missing")),
        };
        if content != known {
            return Err(config.error(
                &format!("{key}.content"),
                format!(
                    "{} differs from token {id} of {TOKENIZER_JSON}, {}",
                    quote(content),
                    quote(known)
                ),
            ));
        }
        let flag = |name: &str| -> Result<bool, TokenizerError> {
            match entry.get(name) {
                None | Some(Json::Null) => Ok(false),
                Some(Json::Bool(b)) => Ok(*b),
                Some(other) => Err(config.error(
                    &format!("{key}.{name}"),
                    hf_config::expected("a boolean", other),
                )),
            }
        };
        let (special, lstrip, rstrip) = (flag("special")?, flag("lstrip")?, flag("rstrip")?);
        match added.iter_mut().find(|(i, _)| *i == id) {
            Some((_, a)) => {
                if special && !a.special {
                    a.special = true;
                    promoted.push(
                        AddedToken::from(a.content.clone(), true)
                            .lstrip(a.lstrip)
                            .rstrip(a.rstrip),
                    );
                }
            }
            None => {
                // A vocabulary token that the config declares as added: transformers adds it
                // to the added vocabulary with the config's flags.
                added.push((
                    id,
                    Added {
                        content: content.clone(),
                        special,
                        lstrip,
                        rstrip,
                    },
                ));
                promoted.push(
                    AddedToken::from(content.clone(), special)
                        .lstrip(lstrip)
                        .rstrip(rstrip),
                );
            }
        }
    }
    added.sort_by_key(|(id, _)| *id);
    Ok(promoted)
}
