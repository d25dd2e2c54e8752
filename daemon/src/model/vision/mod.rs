//! Vision towers and projectors: one image's pixel values in, the rows that replace its
//! placeholder tokens' embeddings out, `(tokens, text_hidden)` f32 on the runner's
//! device. Written with candle tensor ops, so they run wherever the decoder's
//! Hugging Face weights run.
//!
//! Families (transformers 5.24.0, `models/*/modeling_*.py`):
//! - Gemma 3: SigLIP tower, average-pooled RMSNorm projector (`siglip.rs`, `projector.rs`).
//! - LLaVA-1.5: CLIP tower, its second-to-last layer, a two-layer GELU MLP.
//! - Idefics3 / SmolVLM: SigLIP tower per tile, pixel shuffle and a linear connector.
//! - Qwen2.5-VL: its own ViT with window attention and a patch merger (`qwen2_5_vl.rs`).

use std::collections::HashMap;

use candle_core::{bail, Device, Tensor};
use serde_json::Value;

use crate::model::source::quote;
use crate::model::ModelError;

use load::{meta, shown, Config, Weights};
use projector::{Gemma3Projector, Idefics3Connector, LlavaProjector};
use siglip::{VisionTransformer, VitConfig, VitLayout};

mod load;
pub mod mmproj;
#[cfg(test)]
mod mmproj_tests;
mod projector;
pub mod qwen2_5_vl;
mod siglip;
#[cfg(test)]
mod tests;

/// One image's pixel values as its processor gave them (`prepare::preprocess`).
#[derive(Debug, Clone, Copy)]
pub enum VisionPixels<'a> {
    /// `(frames, 3, height, width)` row-major: one frame for Gemma 3 and CLIP; the
    /// tiles then the global image for Idefics3.
    Frames {
        /// The values.
        data: &'a [f32],
        /// Frames (tiles).
        frames: usize,
        /// Pixels per column.
        height: usize,
        /// Pixels per row.
        width: usize,
    },
    /// Qwen2-VL's patch rows `(t·h·w, 3·temporal·patch·patch)` in merge-block order, and
    /// the grid `[t, h, w]` in patches.
    Patches {
        /// The values.
        data: &'a [f32],
        /// `[t, h, w]`.
        grid_thw: [usize; 3],
    },
}

/// The supported classes, for messages.
const SUPPORTED: &str = "Gemma3ForConditionalGeneration, LlavaForConditionalGeneration, \
     Idefics3ForConditionalGeneration, SmolVLMForConditionalGeneration";

/// Where each family keeps its vision tower (`root`s ending with a dot, in the order tried;
/// the first is the Hub spelling, named when none is found) and its projector.
const GEMMA_LLAVA_TOWER: &[&str] = &[
    "vision_tower.vision_model.",
    "model.vision_tower.vision_model.",
    "vision_tower.",
    "model.vision_tower.",
];
const GEMMA_LLAVA_PROJECTOR: &[&str] = &["multi_modal_projector.", "model.multi_modal_projector."];
const IDEFICS3_TOWER: &[&str] = &["model.vision_model."];
const IDEFICS3_CONNECTOR: &[&str] = &["model.connector."];

/// The vision side of a VLM checkpoint: the tower and the projector of one family,
/// f32 on one device.
#[derive(Debug)]
pub struct VisionTower {
    family: Family,
    tokens_per_frame: usize,
    out_dim: usize,
    device: Device,
}

#[derive(Debug)]
enum Family {
    /// SigLIP (`post_layernorm` output) → [`Gemma3Projector`].
    Gemma3 {
        vit: VisionTransformer,
        proj: Gemma3Projector,
    },
    /// CLIP up to `vision_feature_layer` (class row first) → [`LlavaProjector`].
    Llava {
        vit: VisionTransformer,
        proj: LlavaProjector,
        keep_cls: bool,
    },
    /// SigLIP per tile → [`Idefics3Connector`].
    Idefics3 {
        vit: VisionTransformer,
        conn: Idefics3Connector,
    },
}

impl VisionTower {
    /// From the whole `config.json` of the checkpoint and its vision + projector tensors
    /// (full stored names, e.g. `vision_tower.vision_model.encoder.layers.0.self_attn.q_proj.weight`,
    /// `multi_modal_projector.linear_1.weight`, `model.vision_model.*`, `model.connector.*`),
    /// in their stored dtype on the CPU; moves them to `device` as f32. The family comes
    /// from `architectures[0]`: `Gemma3ForConditionalGeneration` (transformers
    /// `models/gemma3/modeling_gemma3.py` over `models/siglip/modeling_siglip.py`),
    /// `LlavaForConditionalGeneration` (`models/llava/modeling_llava.py` over
    /// `models/clip/modeling_clip.py`), `Idefics3ForConditionalGeneration` /
    /// `SmolVLMForConditionalGeneration` (`models/idefics3/modeling_idefics3.py`).
    ///
    /// Keys absent from `vision_config` take the defaults of transformers' config class
    /// (`SiglipVisionConfig`, `CLIPVisionConfig`, `Idefics3VisionConfig`), as the Hub
    /// configs rely on them (Gemma 3's has no `layer_norm_eps`). Errors: a missing or
    /// misshapen tensor is [`ModelError::Tensor`] naming it; a bad config value, an
    /// unsupported `hidden_act` / `projector_hidden_act` / `vision_feature_layer` /
    /// `vision_feature_select_strategy` is [`ModelError::Metadata`] naming the key.
    pub fn from_hf(
        config: &Value,
        tensors: HashMap<String, Tensor>,
        device: &Device,
    ) -> Result<Self, ModelError> {
        let cfg = Config { root: config };
        let class = config
            .get("architectures")
            .and_then(|a| a.get(0))
            .and_then(Value::as_str)
            .ok_or_else(|| meta("architectures[0]", "missing or not a string"))?;
        let text_hidden = match cfg.get("text_config.hidden_size") {
            Some(_) => Some(cfg.usize("text_config.hidden_size", None)?),
            None => None,
        };
        let mut w = Weights::new(tensors, device);
        let siglip = VitLayout {
            class_token: false,
            patch_bias: true,
            pre_norm: false,
            post_norm: true,
        };
        let (family, tokens_per_frame, out_dim) = match class {
            "Gemma3ForConditionalGeneration" => {
                let c =
                    VitConfig::from_config(cfg, (768, 3072, 12, 16, "gelu_pytorch_tanh", 1e-6))?;
                let root = pick(&w, GEMMA_LLAVA_TOWER, "embeddings.patch_embedding.weight");
                let vit = VisionTransformer::load(&mut w, root, c, siglip, c.layers)?;
                let proot = pick(&w, GEMMA_LLAVA_PROJECTOR, "mm_soft_emb_norm.weight");
                let (proj, tokens) =
                    Gemma3Projector::load(&mut w, proot, cfg, c.grid(), c.hidden, text_hidden)?;
                let out = proj.out_dim();
                (Family::Gemma3 { vit, proj }, tokens, out)
            }
            "LlavaForConditionalGeneration" => {
                let c = VitConfig::from_config(cfg, (768, 3072, 12, 32, "quick_gelu", 1e-5))?;
                let run_layers = feature_layer(cfg, c.layers)?;
                let key = "vision_feature_select_strategy";
                let keep_cls = match cfg.str(key, "default")? {
                    "default" => false,
                    "full" => true,
                    other => {
                        return Err(meta(
                            key,
                            format!("{} is not supported (default, full)", quote(other)),
                        ))
                    }
                };
                let clip = VitLayout {
                    class_token: true,
                    patch_bias: false,
                    pre_norm: true,
                    post_norm: false,
                };
                let root = pick(&w, GEMMA_LLAVA_TOWER, "embeddings.patch_embedding.weight");
                let vit = VisionTransformer::load(&mut w, root, c, clip, run_layers)?;
                let proot = pick(&w, GEMMA_LLAVA_PROJECTOR, "linear_1.weight");
                let proj = LlavaProjector::load(&mut w, proot, cfg, c.hidden, text_hidden)?;
                let (tokens, out) = (c.grid() * c.grid() + usize::from(keep_cls), proj.out_dim());
                (
                    Family::Llava {
                        vit,
                        proj,
                        keep_cls,
                    },
                    tokens,
                    out,
                )
            }
            "Idefics3ForConditionalGeneration" | "SmolVLMForConditionalGeneration" => {
                let c =
                    VitConfig::from_config(cfg, (1152, 3072, 16, 32, "gelu_pytorch_tanh", 1e-6))?;
                let vit = VisionTransformer::load(&mut w, IDEFICS3_TOWER[0], c, siglip, c.layers)?;
                let (conn, tokens) = Idefics3Connector::load(
                    &mut w,
                    IDEFICS3_CONNECTOR[0],
                    cfg,
                    c.grid(),
                    c.hidden,
                    text_hidden,
                )?;
                let out = conn.out_dim();
                (Family::Idefics3 { vit, conn }, tokens, out)
            }
            other => {
                return Err(ModelError::UnsupportedArchitecture {
                    key: "config.json: architectures[0]".into(),
                    value: quote(other),
                    supported: SUPPORTED.into(),
                })
            }
        };
        Ok(Self {
            family,
            tokens_per_frame,
            out_dim,
            device: device.clone(),
        })
    }

    /// Prefixes of the stored tensor names that belong to the vision side of
    /// `architecture` (`config.json` `architectures[0]`), so a loader can split them off;
    /// empty for a class without one here.
    pub fn tensor_prefixes(architecture: &str) -> &'static [&'static str] {
        match architecture {
            "Gemma3ForConditionalGeneration" | "LlavaForConditionalGeneration" => &[
                "vision_tower.",
                "multi_modal_projector.",
                "model.vision_tower.",
                "model.multi_modal_projector.",
            ],
            "Idefics3ForConditionalGeneration" | "SmolVLMForConditionalGeneration" => {
                &["model.vision_model.", "model.connector."]
            }
            _ => &[],
        }
    }

    /// Encodes one image: `(frames · tokens_per_frame, out_dim)` f32 on the device, the
    /// rows that replace its placeholder tokens, in order (frame after frame: Idefics3's
    /// tiles, then its global image). Frames must be `image_size × image_size`
    /// (`vision_config`); Qwen2-VL patch rows are refused.
    pub fn encode(&self, px: VisionPixels<'_>) -> candle_core::Result<Tensor> {
        let rows = self
            .encode_hidden(px)?
            .iter()
            .map(|h| self.project(h))
            .collect::<candle_core::Result<Vec<_>>>()?;
        Tensor::cat(&rows, 0)
    }

    /// Placeholder tokens per frame (tile): Gemma 3 `mm_tokens_per_image`; LLaVA
    /// `(image_size / patch_size)²` (+1 with the `full` strategy's class row); Idefics3
    /// `(image_size / patch_size)² / scale_factor²`.
    pub fn tokens_per_frame(&self) -> usize {
        self.tokens_per_frame
    }

    /// The text hidden size (columns of [`encode`](Self::encode)'s output).
    pub fn out_dim(&self) -> usize {
        self.out_dim
    }

    /// The tower's output per frame, before the projector: `(positions, vision_hidden)`
    /// (SigLIP's `last_hidden_state`; LLaVA's selected hidden state, class row first).
    pub(crate) fn encode_hidden(&self, px: VisionPixels<'_>) -> candle_core::Result<Vec<Tensor>> {
        let vit = match &self.family {
            Family::Gemma3 { vit, .. }
            | Family::Llava { vit, .. }
            | Family::Idefics3 { vit, .. } => vit,
        };
        let VisionPixels::Frames {
            data,
            frames,
            height,
            width,
        } = px
        else {
            bail!("this vision tower takes frames of pixels, not Qwen2-VL patch rows");
        };
        let (s, ch) = (vit.cfg.image_size, vit.cfg.channels);
        if frames == 0 || height != s || width != s {
            bail!("this vision tower takes frames of {s}×{s} pixels, got {frames} of {height}×{width}");
        }
        if data.len() != frames * ch * s * s {
            bail!(
                "{} pixel values for {frames} frames of {ch}×{s}×{s}",
                data.len()
            );
        }
        let all = Tensor::from_slice(data, (frames, ch, s, s), &self.device)?;
        (0..frames).map(|f| vit.forward(&all.get(f)?)).collect()
    }

    /// One frame's tower output → its rows of text embeddings.
    fn project(&self, h: &Tensor) -> candle_core::Result<Tensor> {
        match &self.family {
            Family::Gemma3 { proj, .. } => proj.forward(h),
            Family::Llava { proj, keep_cls, .. } => match keep_cls {
                true => proj.forward(h),
                false => proj.forward(&h.narrow(0, 1, h.dim(0)?.saturating_sub(1))?),
            },
            Family::Idefics3 { conn, .. } => conn.forward(h),
        }
    }
}

/// The first root in `roots` under which `probe` is stored (the first when none is).
fn pick(w: &Weights, roots: &[&'static str], probe: &str) -> &'static str {
    roots
        .iter()
        .copied()
        .find(|r| w.has(&format!("{r}{probe}")))
        .unwrap_or(roots[0])
}

/// LLaVA's `vision_feature_layer` (default −2) as the number of encoder layers to run:
/// `hidden_states[0]` is `pre_layrnorm(embeddings)`, `hidden_states[i + 1]` layer i's output.
fn feature_layer(cfg: Config, layers: usize) -> Result<usize, ModelError> {
    let key = "vision_feature_layer";
    let layer = match cfg.get(key) {
        None => -2,
        Some(v) => v.as_i64().ok_or_else(|| {
            meta(
                key,
                format!(
                    "{} is not supported: only one layer index (several layers are not)",
                    shown(v)
                ),
            )
        })?,
    };
    let total = layers as i64;
    let index = if layer < 0 { total + 1 + layer } else { layer };
    match usize::try_from(index) {
        Ok(i) if i <= layers => Ok(i),
        _ => Err(meta(
            key,
            format!(
                "{layer} is outside the {} hidden states of vision_config.num_hidden_layers = {layers}",
                layers + 1
            ),
        )),
    }
}
