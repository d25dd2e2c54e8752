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

fn meta(key: &str, message: impl Into<String>) -> ModelError {
    ModelError::Metadata {
        key: key.to_string(),
        message: message.into(),
    }
}

struct Keys<'a>(&'a HashMap<String, Gv>);

impl Keys<'_> {
    fn u32(&self, key: &str, default: Option<u32>) -> Result<u32, ModelError> {
        match self.0.get(key) {
            None => default.ok_or_else(|| meta(key, "missing")),
            Some(v) => v
                .to_u32()
                .ok()
                .filter(|&x| x > 0)
                .ok_or_else(|| meta(key, format!("expected a positive integer, found {v:?}"))),
        }
    }

    fn f32(&self, key: &str, default: f32) -> Result<f32, ModelError> {
        match self.0.get(key) {
            None => Ok(default),
            Some(v) => v
                .to_f32()
                .map_err(|_| meta(key, format!("expected a float, found {v:?}"))),
        }
    }

    fn floats3(&self, key: &str) -> Result<[f32; 3], ModelError> {
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

    fn str(&self, key: &str) -> Result<&str, ModelError> {
        match self.0.get(key) {
            Some(Gv::String(s)) => Ok(s),
            Some(v) => Err(meta(key, format!("expected a string, found {v:?}"))),
            None => Err(meta(key, "missing")),
        }
    }

    fn flag(&self, key: &str) -> bool {
        self.0.get(key).and_then(|v| v.to_bool().ok()) == Some(true)
    }
}

/// The projector types read here (`clip.projector_type`).
const SUPPORTED: &str = "gemma3, idefics3, mlp, qwen2.5vl_merger";

/// Reads the mmproj file at `path` for a text model of hidden size `text_hidden` whose
/// vocabulary is `tokens` (`tokenizer.ggml.tokens`, where the image tokens are looked up).
///
/// # Errors
/// An unreadable or non-GGUF file, `general.architecture` not `clip`, no vision encoder,
/// an unsupported `clip.projector_type`, a missing or bad key (named), a missing tensor,
/// an image token missing from the vocabulary.
pub fn read(path: &Path, text_hidden: usize, tokens: &[String]) -> Result<Mmproj, ModelError> {
    let display = path.display().to_string();
    let file = File::open(path).map_err(|error| ModelError::Io {
        path: display.clone(),
        error,
    })?;
    let mut reader = BufReader::new(file);
    let content = Content::read(&mut reader).map_err(|e| ModelError::Corrupt {
        path: display.clone(),
        format: "mmproj GGUF file",
        message: quote(&candle_error_message(&e)),
    })?;
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
    let hidden = k.u32("clip.vision.embedding_length", None)? as usize;
    let image_size = k.u32("clip.vision.image_size", None)? as usize;
    let patch = k.u32("clip.vision.patch_size", None)? as usize;
    let vision = json!({
        "hidden_size": hidden,
        "intermediate_size": k.u32("clip.vision.feed_forward_length", None)?,
        "num_hidden_layers": k.u32("clip.vision.block_count", None)?,
        "num_attention_heads": k.u32("clip.vision.attention.head_count", None)?,
        "image_size": image_size,
        "patch_size": patch,
        "layer_norm_eps": k.f32("clip.vision.attention.layer_norm_epsilon", 1e-6)?,
        "hidden_act": "gelu_pytorch_tanh",
    });
    let mean = k.floats3("clip.vision.image_mean")?;
    let std = k.floats3("clip.vision.image_std")?;
    let mut names: Vec<(String, String)> = Vec::new();
    let (config, preprocessor, root) = match projector.as_str() {
        "gemma3" => {
            let scale = k.u32("clip.vision.projector.scale_factor", Some(4))? as usize;
            let side = image_size / patch / scale;
            if side == 0 || !(image_size / patch).is_multiple_of(scale) {
                return Err(meta(
                    "clip.vision.projector.scale_factor",
                    format!(
                        "{scale} does not divide the {} patches per side",
                        image_size / patch
                    ),
                ));
            }
            names.push((
                "mm.input_projection.weight".into(),
                "multi_modal_projector.mm_input_projection_weight".into(),
            ));
            names.push((
                "mm.soft_emb_norm.weight".into(),
                "multi_modal_projector.mm_soft_emb_norm.weight".into(),
            ));
            let config = json!({
                "architectures": ["Gemma3ForConditionalGeneration"],
                "mm_tokens_per_image": side * side,
                "image_token_index": id_of("<image_soft_token>")?,
                "boi_token_index": id_of("<start_of_image>")?,
                "eoi_token_index": id_of("<end_of_image>")?,
                "text_config": {"hidden_size": text_hidden},
                "vision_config": vision,
            });
            let pp = json!({
                "image_processor_type": "Gemma3ImageProcessor",
                "size": {"height": image_size, "width": image_size},
                "resample": 2,
                "do_pan_and_scan": false,
                "image_mean": mean, "image_std": std,
            });
            (config, pp, "vision_tower.vision_model.")
        }
        "idefics3" => {
            let scale = k.u32("clip.vision.projector.scale_factor", Some(2))?;
            let longest = k.u32(
                "clip.vision.preproc_image_size",
                Some(image_size as u32 * 4),
            )?;
            names.push((
                "mm.model.fc.weight".into(),
                "model.connector.modality_projection.proj.weight".into(),
            ));
            let config = json!({
                "architectures": ["Idefics3ForConditionalGeneration"],
                "image_token_id": id_of("<image>")?,
                "scale_factor": scale,
                "text_config": {"hidden_size": text_hidden},
                "vision_config": vision,
            });
            let pp = json!({
                "image_processor_type": "Idefics3ImageProcessor",
                "size": {"longest_edge": longest},
                "max_image_size": {"longest_edge": image_size},
                "do_image_splitting": true,
                "resample": 1,
                "image_mean": mean, "image_std": std,
            });
            (config, pp, "model.vision_model.")
        }
        "mlp" => {
            // LLaVA-1.5 through llama.cpp's legacy converter: CLIP with its class token and
            // pre-layernorm, the last stored block's output unused (models/llava.cpp runs
            // `block_count − 1` blocks unless `clip.vision.feature_layer` names the
            // deepest), the class row dropped, then mm.0 → GELU → mm.2.
            let stored = k.u32("clip.vision.block_count", None)? as usize;
            let run = match content.metadata.get("clip.vision.feature_layer") {
                Some(v) => v
                    .to_vec()
                    .ok()
                    .and_then(|a| a.iter().filter_map(|x| x.to_i32().ok()).max())
                    .and_then(|m| usize::try_from(m).ok())
                    .filter(|&m| m > 0 && m <= stored)
                    .ok_or_else(|| {
                        meta(
                            "clip.vision.feature_layer",
                            format!("expected layer indexes in 1..={stored}, found {v:?}"),
                        )
                    })?,
                None => stored,
            };
            let mut vision = vision;
            vision["hidden_act"] = json!(match k.flag("clip.use_gelu") {
                true => "gelu_pytorch_tanh",
                false => "quick_gelu",
            });
            for (g, h) in [
                (
                    "v.class_embd",
                    "vision_tower.vision_model.embeddings.class_embedding",
                ),
                (
                    "v.pre_ln.weight",
                    "vision_tower.vision_model.pre_layrnorm.weight",
                ),
                (
                    "v.pre_ln.bias",
                    "vision_tower.vision_model.pre_layrnorm.bias",
                ),
                ("mm.0.weight", "multi_modal_projector.linear_1.weight"),
                ("mm.0.bias", "multi_modal_projector.linear_1.bias"),
                ("mm.2.weight", "multi_modal_projector.linear_2.weight"),
                ("mm.2.bias", "multi_modal_projector.linear_2.bias"),
            ] {
                names.push((g.into(), h.into()));
            }
            let config = json!({
                "architectures": ["LlavaForConditionalGeneration"],
                "image_token_index": id_of("<image>")?,
                "vision_feature_layer": run,
                "vision_feature_select_strategy": "default",
                // LLaVA-1.5's projector GELU is the exact (erf) one in transformers;
                // clip.cpp's ggml_gelu is the tanh form.
                "projector_hidden_act": "gelu",
                "text_config": {"hidden_size": text_hidden},
                "vision_config": vision,
            });
            let pp = json!({
                "image_processor_type": "CLIPImageProcessor",
                "size": {"shortest_edge": image_size},
                "crop_size": {"height": image_size, "width": image_size},
                "do_center_crop": true,
                "resample": 3,
                "image_mean": mean, "image_std": std,
            });
            (config, pp, "vision_tower.vision_model.")
        }
        "qwen2.5vl_merger" => {
            return qwen(
                &content,
                &mut reader,
                &k,
                tokens_qwen(&id_of)?,
                text_hidden,
                mean,
                std,
            );
        }
        other => {
            return Err(ModelError::UnsupportedArchitecture {
                key: "clip.projector_type".into(),
                value: quote(other),
                supported: SUPPORTED.into(),
            })
        }
    };
    let layers = k.u32("clip.vision.block_count", None)? as usize;
    names.extend(vit_names(root, layers));
    let mut tensors = read_tensors(&content, &mut reader, &names)?;
    swap_legacy_ffn(&mut tensors, root, layers, hidden);
    if projector == "gemma3" {
        // The converter stores Gemma's RMSNorm weight as 1 + w; transformers keeps w.
        let name = "multi_modal_projector.mm_soft_emb_norm.weight";
        if let Some(t) = tensors.remove(name) {
            let w = t
                .affine(1.0, -1.0)
                .map_err(|e| tensor_err("mm.soft_emb_norm.weight", &e))?;
            tensors.insert(name.into(), w);
        }
    }
    Ok(Mmproj {
        config,
        tensors,
        preprocessor: with_rescale(preprocessor),
    })
}

/// llama.cpp's legacy LLaVA converter (`legacy-models/convert_image_encoder_to_gguf.py`)
/// names `fc1` `ffn_down` and `fc2` `ffn_up`; `clip.cpp` tells them apart by shape, and
/// so does this: a "fc1" whose rows are the hidden size is the second matrix.
fn swap_legacy_ffn(
    tensors: &mut HashMap<String, Tensor>,
    root: &str,
    layers: usize,
    hidden: usize,
) {
    for i in 0..layers {
        let l = format!("{root}encoder.layers.{i}.mlp");
        let fc1 = format!("{l}.fc1.weight");
        let swapped = tensors
            .get(&fc1)
            .is_some_and(|t| t.dims().first() == Some(&hidden) && t.dims().get(1) != Some(&hidden));
        if swapped {
            for suffix in ["weight", "bias"] {
                let (a, b) = (format!("{l}.fc1.{suffix}"), format!("{l}.fc2.{suffix}"));
                let ta = tensors.remove(&a);
                let tb = tensors.remove(&b);
                if let Some(t) = ta {
                    tensors.insert(b, t);
                }
                if let Some(t) = tb {
                    tensors.insert(a, t);
                }
            }
        }
    }
}

/// `rescale_factor` 1/255 and the `do_*` switches every processor here reads.
fn with_rescale(mut pp: Value) -> Value {
    if let Some(o) = pp.as_object_mut() {
        o.insert("rescale_factor".into(), json!(1.0 / 255.0));
        for key in ["do_resize", "do_rescale", "do_normalize", "do_convert_rgb"] {
            o.insert(key.into(), json!(true));
        }
    }
    pp
}

/// A SigLIP tower's GGUF names and transformers names under `root`.
fn vit_names(root: &str, layers: usize) -> Vec<(String, String)> {
    let mut names = vec![
        (
            "v.patch_embd.weight".to_string(),
            format!("{root}embeddings.patch_embedding.weight"),
        ),
        (
            "v.patch_embd.bias".to_string(),
            format!("{root}embeddings.patch_embedding.bias"),
        ),
        (
            "v.position_embd.weight".to_string(),
            format!("{root}embeddings.position_embedding.weight"),
        ),
    ];
    for suffix in ["weight", "bias"] {
        names.push((
            format!("v.post_ln.{suffix}"),
            format!("{root}post_layernorm.{suffix}"),
        ));
    }
    for i in 0..layers {
        let l = format!("{root}encoder.layers.{i}");
        for (g, h) in [
            ("attn_q", "self_attn.q_proj"),
            ("attn_k", "self_attn.k_proj"),
            ("attn_v", "self_attn.v_proj"),
            ("attn_out", "self_attn.out_proj"),
            ("ln1", "layer_norm1"),
            ("ln2", "layer_norm2"),
            ("ffn_up", "mlp.fc1"),
            ("ffn_down", "mlp.fc2"),
        ] {
            for suffix in ["weight", "bias"] {
                names.push((
                    format!("v.blk.{i}.{g}.{suffix}"),
                    format!("{l}.{h}.{suffix}"),
                ));
            }
        }
    }
    names
}

fn tensor_err(name: &str, e: &candle_core::Error) -> ModelError {
    ModelError::Tensor {
        name: name.to_string(),
        message: candle_error_message(e),
    }
}

/// One tensor of the file as f32 on the CPU (`None`: not in the file).
fn read_one(
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
fn read_tensors(
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

fn required(
    content: &Content,
    reader: &mut BufReader<File>,
    name: &str,
) -> Result<Tensor, ModelError> {
    read_one(content, reader, name)?.ok_or_else(|| ModelError::Tensor {
        name: bounded(name),
        message: "missing".into(),
    })
}

/// Qwen2.5-VL's image pad token (the prompt side also uses `<|vision_start|>` /
/// `<|vision_end|>` from the template).
fn tokens_qwen(id_of: &dyn Fn(&str) -> Result<u32, ModelError>) -> Result<[u32; 3], ModelError> {
    Ok([
        id_of("<|image_pad|>")?,
        id_of("<|vision_start|>")?,
        id_of("<|vision_end|>")?,
    ])
}

/// `qwen2.5vl_merger`: the config, the tensors (3-D patch convolution and fused q/k/v
/// rebuilt) and a `Qwen2VLImageProcessor` with `clip.cpp`'s token bounds.
fn qwen(
    content: &Content,
    reader: &mut BufReader<File>,
    k: &Keys<'_>,
    [image_pad, vision_start, vision_end]: [u32; 3],
    text_hidden: usize,
    mean: [f32; 3],
    std: [f32; 3],
) -> Result<Mmproj, ModelError> {
    let depth = k.u32("clip.vision.block_count", None)? as usize;
    let patch = k.u32("clip.vision.patch_size", None)? as usize;
    let merge = k.u32("clip.vision.spatial_merge_size", Some(2))? as usize;
    let pattern = k.u32("clip.vision.n_wa_pattern", None)? as usize;
    // clip.cpp's qwen2vl graph: block `il` attends fully when (il + 1) % n_wa_pattern == 0.
    let full: Vec<usize> = (0..depth).filter(|i| (i + 1) % pattern == 0).collect();
    if !k.flag("clip.use_silu") {
        return Err(meta(
            "clip.use_silu",
            "Qwen2.5-VL's tower needs SiLU (true)",
        ));
    }
    let config = json!({
        "architectures": ["Qwen2_5_VLForConditionalGeneration"],
        "image_token_id": image_pad,
        "vision_start_token_id": vision_start,
        "vision_end_token_id": vision_end,
        "text_config": {"hidden_size": text_hidden},
        "vision_config": {
            "depth": depth,
            "hidden_size": k.u32("clip.vision.embedding_length", None)?,
            "num_heads": k.u32("clip.vision.attention.head_count", None)?,
            "intermediate_size": k.u32("clip.vision.feed_forward_length", None)?,
            "out_hidden_size": k.u32("clip.vision.projection_dim", None)?,
            "patch_size": patch,
            "temporal_patch_size": 2,
            "spatial_merge_size": merge,
            // clip.cpp: `attn_window_size > 0 ? attn_window_size : 112`, never read for 2.5.
            "window_size": 112,
            "fullatt_block_indexes": full,
            "hidden_act": "silu",
        },
    });
    let unit = patch * merge;
    let preprocessor = with_rescale(json!({
        "image_processor_type": "Qwen2VLImageProcessor",
        "patch_size": patch,
        "merge_size": merge,
        "temporal_patch_size": 2,
        "min_pixels": 8 * unit * unit,
        "max_pixels": 4096 * unit * unit,
        "resample": 3,
        "image_mean": mean, "image_std": std,
    }));
    let mut tensors = HashMap::new();
    let t0 = required(content, reader, "v.patch_embd.weight")?;
    let t1 = required(content, reader, "v.patch_embd.weight.1")?;
    let pe = Tensor::stack(&[&t0, &t1], 2).map_err(|e| tensor_err("v.patch_embd.weight", &e))?;
    tensors.insert("visual.patch_embed.proj.weight".to_string(), pe);
    for i in 0..depth {
        let b = format!("visual.blocks.{i}");
        for suffix in ["weight", "bias"] {
            let parts = ["attn_q", "attn_k", "attn_v"]
                .iter()
                .map(|p| required(content, reader, &format!("v.blk.{i}.{p}.{suffix}")))
                .collect::<Result<Vec<_>, _>>()?;
            let qkv = Tensor::cat(&parts, 0)
                .map_err(|e| tensor_err(&format!("v.blk.{i}.attn_q.{suffix}"), &e))?;
            tensors.insert(format!("{b}.attn.qkv.{suffix}"), qkv);
        }
        let mut names = vec![
            (format!("v.blk.{i}.ln1.weight"), format!("{b}.norm1.weight")),
            (format!("v.blk.{i}.ln2.weight"), format!("{b}.norm2.weight")),
        ];
        for (g, h) in [
            ("attn_out", "attn.proj"),
            ("ffn_gate", "mlp.gate_proj"),
            ("ffn_up", "mlp.up_proj"),
            ("ffn_down", "mlp.down_proj"),
        ] {
            for suffix in ["weight", "bias"] {
                names.push((
                    format!("v.blk.{i}.{g}.{suffix}"),
                    format!("{b}.{h}.{suffix}"),
                ));
            }
        }
        tensors.extend(read_tensors(content, reader, &names)?);
    }
    let names = [
        ("v.post_ln.weight", "visual.merger.ln_q.weight"),
        ("mm.0.weight", "visual.merger.mlp.0.weight"),
        ("mm.0.bias", "visual.merger.mlp.0.bias"),
        ("mm.2.weight", "visual.merger.mlp.2.weight"),
        ("mm.2.bias", "visual.merger.mlp.2.bias"),
    ]
    .map(|(g, h)| (g.to_string(), h.to_string()));
    tensors.extend(read_tensors(content, reader, &names)?);
    Ok(Mmproj {
        config,
        tensors,
        preprocessor,
    })
}
