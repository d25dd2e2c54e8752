//! The SigLIP / CLIP projector types of an mmproj file: `gemma3`, `idefics3` and the
//! legacy LLaVA converter's `mlp`, as transformers' Gemma 3, Idefics3 and LLaVA
//! checkpoints.

use std::collections::HashMap;
use std::fs::File;
use std::io::BufReader;

use candle_core::quantized::gguf_file::Content;
use candle_core::Tensor;
use serde_json::json;

use super::{meta, read_tensors, tensor_err, with_rescale, Keys, Mmproj};
use crate::model::source::quote;
use crate::model::ModelError;

/// Reads a `gemma3`, `idefics3` or `mlp` file (`projector`); `id_of` looks up a token of
/// the text model's vocabulary.
pub(super) fn read(
    content: &Content,
    reader: &mut BufReader<File>,
    k: &Keys<'_>,
    projector: &str,
    id_of: &dyn Fn(&str) -> Result<u32, ModelError>,
    text_hidden: usize,
) -> Result<Mmproj, ModelError> {
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
    let (config, preprocessor, root) = match projector {
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
                // clip.cpp's fixed-size preprocessing letterboxes (PAD_CEIL, black).
                super::PAD_COLOR: [0, 0, 0],
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
            // The prompt's tile texts must be tokens of the vocabulary (llama.cpp refuses
            // the request otherwise): the wrappers, and a row/column token for every tile
            // of the largest image (`preproc_image_size` / `image_size` per side).
            id_of("<fake_token_around_image>")?;
            id_of("<global-img>")?;
            let tiles = (longest as usize).div_ceil(image_size.max(1));
            for r in 1..=tiles {
                for c in 1..=tiles {
                    id_of(&format!("<row_{r}_col_{c}>"))?;
                }
            }
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
                // clip.cpp pads LLaVA's image to the square (`image_pad_color`).
                super::PAD_COLOR: [122, 116, 104],
                "resample": 3,
                "image_mean": mean, "image_std": std,
            });
            (config, pp, "vision_tower.vision_model.")
        }
        other => {
            return Err(ModelError::UnsupportedArchitecture {
                key: "clip.projector_type".into(),
                value: quote(other),
                supported: super::SUPPORTED.into(),
            })
        }
    };
    let layers = k.u32("clip.vision.block_count", None)? as usize;
    names.extend(vit_names(root, layers));
    let mut tensors = read_tensors(content, reader, &names)?;
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
