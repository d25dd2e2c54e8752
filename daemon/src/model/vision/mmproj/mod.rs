//! llama.cpp's vision projector files ("mmproj" GGUF: `general.architecture = clip`,
//! written by `convert_hf_to_gguf.py --mmproj`), read as the Hugging Face checkpoint
//! they were converted from: the `clip.*` keys become a `config.json` and a
//! `preprocessor_config.json`, the `v.*` / `mm.*` tensors take their transformers names,
//! so the towers of this module run them unchanged.
//!
//! Keys and tensor names: llama.cpp `tools/mtmd/clip-impl.h` (`KEY_*`, `TN_*`), and how
//! `clip.cpp` reads them per `clip.projector_type`:
//! - `gemma3`: SigLIP + `mm.input_projection.weight` / `mm.soft_emb_norm.weight` (stored
//!   as `1 + w`, the converter folds Gemma's RMSNorm offset in), `projector.scale_factor`
//!   (default 4) patches pooled per side.
//! - `idefics3`: SigLIP + `mm.model.fc.weight`, pixel shuffle by `projector.scale_factor`,
//!   tiles of `image_size` after resizing the longest edge to `preproc_image_size`.
//! - `qwen2.5vl_merger`: the Qwen2.5-VL ViT, its 3-D patch convolution split in
//!   `v.patch_embd.weight` and `.weight.1` (the two temporal slices), q/k/v apart, the
//!   merger as `v.post_ln` + `mm.0` / `mm.2`; window attention on all blocks but every
//!   `n_wa_pattern`-th, windows of 112 px and spatial merge 2, as `clip.cpp` fixes them.
//!
//! Where llama.cpp and transformers differ for the same weights, the GGUF path follows
//! llama.cpp: Qwen2.5-VL's window size (112) and image-token bounds (8 to 4096, from
//! `clip.cpp`'s `set_limit_image_tokens`), the resampling filters `clip.cpp` picks
//! (bilinear for Gemma 3, bicubic for Qwen, Lanczos for Idefics3).

use std::collections::HashMap;
use std::fs::File;
use std::io::BufReader;
use std::path::Path;

use candle_core::quantized::gguf_file::{Content, Value as Gv};
use candle_core::{Device, Tensor};
use serde_json::{json, Value};

use crate::model::source::{bounded, quote};
use crate::model::{candle_error_message, ModelError};

mod qwen;
mod vit;

/// An mmproj file as a transformers checkpoint's vision side.
#[derive(Debug)]
pub struct Mmproj {
    /// A `config.json` for [`crate::model::Tower::from_hf`] and the prompt side:
    /// `architectures`, `vision_config`, the image token ids, the projector settings.
    pub config: Value,
    /// The tower's and projector's tensors under their transformers names, f32 on the CPU.
    pub tensors: HashMap<String, Tensor>,
    /// A `preprocessor_config.json` with `clip.vision.image_mean` / `image_std`, sizes
    /// from `clip.vision.*`, and `clip.cpp`'s filter.
    pub preprocessor: Value,
}

pub(super) fn meta(key: &str, message: impl Into<String>) -> ModelError {
    ModelError::Metadata {
        key: key.to_string(),
        message: message.into(),
    }
}

pub(super) struct Keys<'a>(&'a HashMap<String, Gv>);

impl Keys<'_> {
    pub(super) fn u32(&self, key: &str, default: Option<u32>) -> Result<u32, ModelError> {
        match self.0.get(key) {
            None => default.ok_or_else(|| meta(key, "missing")),
            Some(v) => v
                .to_u32()
                .ok()
                .filter(|&x| x > 0)
                .ok_or_else(|| meta(key, format!("expected a positive integer, found {v:?}"))),
        }
    }

    pub(super) fn f32(&self, key: &str, default: f32) -> Result<f32, ModelError> {
        match self.0.get(key) {
            None => Ok(default),
            Some(v) => v
                .to_f32()
                .map_err(|_| meta(key, format!("expected a float, found {v:?}"))),
        }
    }

    pub(super) fn floats3(&self, key: &str) -> Result<[f32; 3], ModelError> {
        let v = self.0.get(key).ok_or_else(|| meta(key, "missing"))?;
        let vals: Option<Vec<f32>> = v
            .to_vec()
            .ok()
            .map(|a| a.iter().map(|x| x.to_f32().ok()).collect())
            .and_then(|x: Option<Vec<f32>>| x);
        match vals.as_deref() {
            Some(&[a, b, c]) => Ok([a, b, c]),
            _ => Err(meta(key, format!("expected three floats, found {v:?}"))),
        }
    }

    pub(super) fn str(&self, key: &str) -> Result<&str, ModelError> {
        match self.0.get(key) {
            Some(Gv::String(s)) => Ok(s),
            Some(v) => Err(meta(key, format!("expected a string, found {v:?}"))),
            None => Err(meta(key, "missing")),
        }
    }

    pub(super) fn flag(&self, key: &str) -> bool {
        self.0.get(key).and_then(|v| v.to_bool().ok()) == Some(true)
    }
}

/// A key of the image processor settings made here (never in a Hugging Face file):
/// letterbox the image in a canvas of this colour, as llama.cpp's `img_tool::resize`
/// pads (`PAD_CEIL`).
pub const PAD_COLOR: &str = "inferd_pad_color";
/// A key of the image processor settings made here: size a Qwen-VL image as llama.cpp's
/// `calc_size_preserved_ratio` does, and letterbox it in black.
pub const MTMD_SIZING: &str = "inferd_mtmd_sizing";

/// The projector types read here (`clip.projector_type`).
pub(super) const SUPPORTED: &str = "gemma3, idefics3, mlp, qwen2.5vl_merger";

/// Reads the mmproj file at `path` for a text model of hidden size `text_hidden` whose
/// vocabulary is `tokens` (`tokenizer.ggml.tokens`, where the image tokens are looked up).
///
/// # Errors
/// An unreadable or non-GGUF file, `general.architecture` not `clip`, no vision encoder,
/// an unsupported `clip.projector_type`, a missing or bad key (named), a missing tensor,
/// an image token missing from the vocabulary.
pub fn read(path: &Path, text_hidden: usize, tokens: &[String]) -> Result<Mmproj, ModelError> {
    let (content, mut reader) = crate::model::source::gguf::read_header(path, "mmproj GGUF file")?;
    let k = Keys(&content.metadata);
    let arch = k.str("general.architecture")?;
    if arch != "clip" {
        return Err(meta(
            "general.architecture",
            format!("an mmproj file has \"clip\" (got {})", quote(arch)),
        ));
    }
    if !k.flag("clip.has_vision_encoder") {
        return Err(meta("clip.has_vision_encoder", "must be true"));
    }
    let projector = k.str("clip.projector_type")?.to_string();
    let id_of = |text: &str| -> Result<u32, ModelError> {
        tokens
            .iter()
            .position(|t| t == text)
            .map(|i| i as u32)
            .ok_or_else(|| {
                meta(
                    "clip.projector_type",
                    format!(
                        "{} needs the token {} in the text model's vocabulary",
                        quote(&projector),
                        quote(text)
                    ),
                )
            })
    };
    match projector.as_str() {
        "qwen2.5vl_merger" => qwen::read(&content, &mut reader, &k, &id_of, text_hidden),
        _ => vit::read(&content, &mut reader, &k, &projector, &id_of, text_hidden),
    }
}

/// `rescale_factor` 1/255 and the `do_*` switches every processor here reads.
pub(super) fn with_rescale(mut pp: Value) -> Value {
    if let Some(o) = pp.as_object_mut() {
        o.insert("rescale_factor".into(), json!(1.0 / 255.0));
        for key in ["do_resize", "do_rescale", "do_normalize", "do_convert_rgb"] {
            o.insert(key.into(), json!(true));
        }
    }
    pp
}

pub(super) fn tensor_err(name: &str, e: &candle_core::Error) -> ModelError {
    ModelError::Tensor {
        name: name.to_string(),
        message: candle_error_message(e),
    }
}

/// One tensor of the file as f32 on the CPU (`None`: not in the file).
pub(super) fn read_one(
    content: &Content,
    reader: &mut BufReader<File>,
    name: &str,
) -> Result<Option<Tensor>, ModelError> {
    if !content.tensor_infos.contains_key(name) {
        return Ok(None);
    }
    let q = content
        .tensor(reader, name, &Device::Cpu)
        .map_err(|e| tensor_err(name, &e))?;
    q.dequantize(&Device::Cpu)
        .map(Some)
        .map_err(|e| tensor_err(name, &e))
}

/// The tensors of `names` (GGUF name, transformers name) present in the file; a missing
/// one is left for the tower's loader to name.
pub(super) fn read_tensors(
    content: &Content,
    reader: &mut BufReader<File>,
    names: &[(String, String)],
) -> Result<HashMap<String, Tensor>, ModelError> {
    let mut out = HashMap::new();
    for (g, h) in names {
        if let Some(t) = read_one(content, reader, g)? {
            out.insert(h.clone(), t);
        }
    }
    Ok(out)
}

pub(super) fn required(
    content: &Content,
    reader: &mut BufReader<File>,
    name: &str,
) -> Result<Tensor, ModelError> {
    read_one(content, reader, name)?.ok_or_else(|| ModelError::Tensor {
        name: bounded(name),
        message: "missing".into(),
    })
}
