//! The draft model of `speculative.method = "draft"`: loaded beside the target with the
//! same device and kernels, refused unless its vocabulary is the target's.

use std::path::Path;

use anyhow::Context as _;

use crate::config::{Settings, SpecMethod};
use crate::model::{LoadOptions, MatrixPolicy, Model, ModelFormat};
use crate::tokenizer::TextTokenizer;

/// A loaded draft model.
pub(super) struct Draft {
    /// The model (its KV pool is made beside the target's).
    pub model: Model,
    /// What one of its decode steps costs against one of the target's: the ratio of
    /// their weight bytes (single-stream decode reads every weight once per token).
    pub cost: f64,
}

/// Loads `speculative.draft_model` when the method is `"draft"`.
///
/// # Errors
/// The file cannot be loaded, or its vocabulary differs from `target`'s (the message
/// names `speculative.draft_model`, the sizes or the first token that differs).
pub(super) fn load_draft(
    settings: &Settings,
    device: &candle_core::Device,
    target: &TextTokenizer,
) -> anyhow::Result<Option<Draft>> {
    let sp = &settings.speculative;
    if sp.method != SpecMethod::Draft {
        if !sp.draft_model.as_os_str().is_empty() {
            tracing::warn!(
                draft_model = %sp.draft_model.display(),
                method = ?sp.method,
                "speculative.draft_model is set but speculative.method is not \"draft\": it is not loaded"
            );
        }
        return Ok(None);
    }
    let path = &sp.draft_model;
    let what = || format!("speculative.draft_model = {}", path.display());
    let loaded = crate::model::load(
        path,
        &LoadOptions {
            device: device.clone(),
            matrices: MatrixPolicy {
                kernels: settings.model.kernels,
                quantize: settings.model.quantize,
            },
        },
    )
    .with_context(|| format!("loading the draft model ({})", what()))?;
    let tokenizer = match loaded.format {
        ModelFormat::Gguf => TextTokenizer::from_gguf(&loaded.metadata),
        ModelFormat::HfDir => TextTokenizer::from_hf_dir(&loaded.path),
    }
    .with_context(|| format!("the draft model's tokenizer ({})", what()))?;
    check_vocabulary(target, &tokenizer).map_err(|m| anyhow::anyhow!("{}: {m}", what()))?;
    let cost = weight_bytes(path) as f64 / weight_bytes(&settings.model.path).max(1) as f64;
    tracing::info!(
        path = %path.display(),
        layers = loaded.model.spec().n_layer,
        cost = format_args!("{cost:.2}"),
        "draft model loaded"
    );
    Ok(Some(Draft {
        model: loaded.model,
        cost,
    }))
}

/// Whether `draft` has `target`'s vocabulary: as many tokens, each with the same bytes.
fn check_vocabulary(target: &TextTokenizer, draft: &TextTokenizer) -> Result<(), String> {
    let (t, d) = (target.vocab_size(), draft.vocab_size());
    if t != d {
        return Err(format!(
            "a draft model must have the model's vocabulary, but it has {d} tokens and the \
             model {t}"
        ));
    }
    match (0..t as u32).find(|&id| target.token_bytes(id) != draft.token_bytes(id)) {
        Some(id) => Err(format!(
            "a draft model must have the model's vocabulary, but token {id} is {:?} in it \
             and {:?} in the model's",
            String::from_utf8_lossy(draft.token_bytes(id)),
            String::from_utf8_lossy(target.token_bytes(id))
        )),
        None => Ok(()),
    }
}

/// Bytes of a model's weights: the file, or a directory's safetensors files.
fn weight_bytes(path: &Path) -> u64 {
    if !path.is_dir() {
        return std::fs::metadata(path).map_or(0, |m| m.len());
    }
    std::fs::read_dir(path)
        .into_iter()
        .flatten()
        .filter_map(Result::ok)
        .filter(|e| e.path().extension().is_some_and(|x| x == "safetensors"))
        .filter_map(|e| e.metadata().ok())
        .map(|m| m.len())
        .sum()
}
