//! The `qwen2.5vl_merger` projector type of an mmproj file as transformers'
//! Qwen2.5-VL vision side.

use std::collections::HashMap;
use std::fs::File;
use std::io::BufReader;

use candle_core::quantized::gguf_file::Content;
use candle_core::Tensor;
use serde_json::json;

use super::{meta, read_tensors, required, tensor_err, with_rescale, Keys, Mmproj};
use crate::model::ModelError;

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
pub(super) fn read(
    content: &Content,
    reader: &mut BufReader<File>,
    k: &Keys<'_>,
    id_of: &dyn Fn(&str) -> Result<u32, ModelError>,
    text_hidden: usize,
) -> Result<Mmproj, ModelError> {
    let [image_pad, vision_start, vision_end] = tokens_qwen(id_of)?;
    let mean = k.floats3("clip.vision.image_mean")?;
    let std = k.floats3("clip.vision.image_std")?;
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
        super::MTMD_SIZING: true,
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
