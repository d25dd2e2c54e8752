//! The projectors from a frame's tower output to text-embedding rows, one per family:
//! Gemma 3's pooled RMSNorm projection (`models/gemma3/modeling_gemma3.py`
//! `Gemma3MultiModalProjector`), LLaVA's two-layer MLP (`models/llava/modeling_llava.py`
//! `LlavaMultiModalProjector`) and Idefics3's pixel shuffle + linear connector
//! (`models/idefics3/modeling_idefics3.py` `Idefics3Connector`). Each maps one frame.

use candle_core::{Result, Tensor};

use super::load::{meta, Config, Weights};
use super::siglip::{Activation, Linear};
use crate::model::ModelError;

/// Gemma 3: `(P², C)` → average pool to `(T, C)` → Gemma RMSNorm `(1 + w)` → `x @ W`,
/// `W` stored `[C, text_hidden]` (`mm_input_projection_weight`, no transpose).
#[derive(Debug)]
pub(super) struct Gemma3Projector {
    /// `1 + mm_soft_emb_norm.weight`, `[C]`.
    norm: Tensor,
    eps: f32,
    /// `[C, text_hidden]`.
    proj: Tensor,
    /// Patches per side.
    side: usize,
    /// Pooling kernel (= stride).
    kernel: usize,
}

impl Gemma3Projector {
    /// `side` = patches per side; `c` = vision hidden; `text_hidden` = `text_config.hidden_size`
    /// when given. Returns it and the tokens per frame (`mm_tokens_per_image`).
    pub(super) fn load(
        w: &mut Weights,
        root: &str,
        cfg: Config,
        side: usize,
        c: usize,
        text_hidden: Option<usize>,
    ) -> std::result::Result<(Self, usize), ModelError> {
        let key = "mm_tokens_per_image";
        let tokens = cfg.usize(key, Some(256))?;
        let per_side = (1..=tokens).find(|s| s * s >= tokens).unwrap_or(1);
        if per_side * per_side != tokens || !side.is_multiple_of(per_side) {
            return Err(meta(
                key,
                format!(
                    "{tokens} is not the square of a divisor of the {side} patches per side \
                     (vision_config.image_size / patch_size)"
                ),
            ));
        }
        let eps = cfg.f64("vision_config.layer_norm_eps", 1e-6)? as f32;
        let norm = w.take(&format!("{root}mm_soft_emb_norm.weight"), &[c])?;
        let norm = norm.affine(1.0, 1.0).map_err(|e| ModelError::Tensor {
            name: format!("{root}mm_soft_emb_norm.weight"),
            message: crate::model::candle_error_message(&e),
        })?;
        let name = format!("{root}mm_input_projection_weight");
        let proj = w.take(&name, &[c, w.dim2(&name, 1, text_hidden)?])?;
        let me = Self {
            norm,
            eps,
            proj,
            side,
            kernel: side / per_side,
        };
        Ok((me, tokens))
    }

    /// The text hidden size (columns of the output).
    pub(super) fn out_dim(&self) -> usize {
        self.proj.dims().get(1).copied().unwrap_or(0)
    }

    /// `(P², C)` → `(tokens, text_hidden)`.
    pub(super) fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let (_, c) = x.dims2()?;
        let (k, t) = (self.kernel, self.side / self.kernel);
        let pooled = x
            .reshape((t, k, t, k, c))?
            .sum(3)?
            .sum(1)?
            .affine(1.0 / (k * k) as f64, 0.0)?
            .reshape((t * t, c))?;
        let normed = candle_nn::ops::rms_norm(&pooled, &self.norm, self.eps)?;
        normed.matmul(&self.proj)
    }
}

/// LLaVA: `linear_2(act(linear_1(x)))`, biases per `multimodal_projector_bias`.
#[derive(Debug)]
pub(super) struct LlavaProjector {
    l1: Linear,
    l2: Linear,
    act: Activation,
    out: usize,
}

impl LlavaProjector {
    /// `c` = vision hidden; `text_hidden` = `text_config.hidden_size` when given.
    pub(super) fn load(
        w: &mut Weights,
        root: &str,
        cfg: Config,
        c: usize,
        text_hidden: Option<usize>,
    ) -> std::result::Result<Self, ModelError> {
        let key = "projector_hidden_act";
        let act = Activation::parse(cfg.str(key, "gelu")?, key)?;
        let bias = cfg.bool("multimodal_projector_bias", true)?;
        let l1_name = format!("{root}linear_1.weight");
        let out = w.dim2(&l1_name, 0, text_hidden)?;
        let l1 = Linear::load(w, &format!("{root}linear_1"), out, c, bias)?;
        let l2 = Linear::load(w, &format!("{root}linear_2"), out, out, bias)?;
        Ok(Self { l1, l2, act, out })
    }

    /// The text hidden size.
    pub(super) fn out_dim(&self) -> usize {
        self.out
    }

    /// `(n, c)` → `(n, text_hidden)`.
    pub(super) fn forward(&self, x: &Tensor) -> Result<Tensor> {
        self.l2.forward(&self.act.apply(&self.l1.forward(x)?)?)
    }
}

/// Idefics3: pixel shuffle by `scale_factor` s, then `modality_projection.proj` (no bias).
#[derive(Debug)]
pub(super) struct Idefics3Connector {
    proj: Linear,
    scale: usize,
    side: usize,
    out: usize,
}

impl Idefics3Connector {
    /// `side` = patches per side; `c` = vision hidden; `text_hidden` = `text_config.hidden_size`
    /// when given. Returns it and the tokens per frame.
    pub(super) fn load(
        w: &mut Weights,
        root: &str,
        cfg: Config,
        side: usize,
        c: usize,
        text_hidden: Option<usize>,
    ) -> std::result::Result<(Self, usize), ModelError> {
        let scale = cfg.usize("scale_factor", Some(2))?;
        if !side.is_multiple_of(scale) {
            return Err(meta(
                "scale_factor",
                format!("{scale} does not divide the {side} patches per side"),
            ));
        }
        let name = format!("{root}modality_projection.proj.weight");
        let out = w.dim2(&name, 0, text_hidden)?;
        let proj = Linear::load(
            w,
            &format!("{root}modality_projection.proj"),
            out,
            c * scale * scale,
            false,
        )?;
        let tokens = (side / scale) * (side / scale);
        Ok((
            Self {
                proj,
                scale,
                side,
                out,
            },
            tokens,
        ))
    }

    /// The text hidden size.
    pub(super) fn out_dim(&self) -> usize {
        self.out
    }

    /// `(side², c)` → `((side/s)², text_hidden)`: token (i, j) row-major is the
    /// concatenation over r then c' in 0..s of patch (s·i + r, s·j + c').
    pub(super) fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let (_, c) = x.dims2()?;
        let (s, t) = (self.scale, self.side / self.scale);
        let shuffled = x
            .reshape((t, s, t, s, c))?
            .permute((0, 2, 1, 3, 4))?
            .reshape((t * t, s * s * c))?;
        self.proj.forward(&shuffled)
    }
}
