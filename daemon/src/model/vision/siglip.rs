//! The pre-LN ViT shared by SigLIP (Gemma 3, Idefics3) and CLIP (LLaVA), after
//! transformers 5.24.0 `models/siglip/modeling_siglip.py`, `models/clip/modeling_clip.py`
//! and `models/idefics3/modeling_idefics3.py` (`Idefics3VisionTransformer`).
//!
//! One frame `(3, H, W)` in, `(tokens, hidden)` out, all f32:
//! patch embedding (a stride = kernel convolution, done as unfold + matmul), CLIP's class
//! token, the learned position embedding, CLIP's `pre_layrnorm`, encoder layers
//! (`x + attn(ln1(x))`, `x + fc2(act(fc1(ln2(x))))`, non-causal attention over the frame)
//! and SigLIP's `post_layernorm`.

use candle_core::{Result, Tensor, D};

use super::load::{meta, Config, Weights};
use crate::model::ModelError;

/// Score-matrix elements one attention step may hold (queries are chunked above it).
const MAX_SCORES: usize = 1 << 26;

/// An activation named by `hidden_act` / `projector_hidden_act` (transformers `ACT2FN`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Activation {
    /// `gelu`: exact, with erf.
    GeluErf,
    /// `gelu_pytorch_tanh`, `gelu_new`: the tanh approximation.
    GeluTanh,
    /// `quick_gelu`: `x · sigmoid(1.702 x)`.
    QuickGelu,
    /// `silu`, `swish`.
    Silu,
}

impl Activation {
    /// From its transformers name; `key` names the config key for the error.
    pub(super) fn parse(name: &str, key: &str) -> std::result::Result<Self, ModelError> {
        Ok(match name {
            "gelu" => Self::GeluErf,
            "gelu_pytorch_tanh" | "gelu_new" => Self::GeluTanh,
            "quick_gelu" => Self::QuickGelu,
            "silu" | "swish" => Self::Silu,
            other => {
                return Err(meta(
                    key,
                    format!(
                        "activation {} is not supported (supported: gelu, gelu_pytorch_tanh, \
                         gelu_new, quick_gelu, silu)",
                        crate::model::source::quote(other)
                    ),
                ))
            }
        })
    }

    pub(super) fn apply(self, x: &Tensor) -> Result<Tensor> {
        match self {
            Self::GeluErf => x.gelu_erf(),
            Self::GeluTanh => x.gelu(),
            Self::QuickGelu => x.mul(&candle_nn::ops::sigmoid(&x.affine(1.702, 0.0)?)?),
            Self::Silu => x.silu(),
        }
    }
}

/// `y = x Wᵀ + b`, `W` stored `[out, in]` (`nn.Linear`).
#[derive(Debug)]
pub(super) struct Linear {
    w: Tensor,
    b: Option<Tensor>,
}

impl Linear {
    /// `{prefix}.weight` `[out, in]` and, when `bias`, `{prefix}.bias` `[out]`.
    pub(super) fn load(
        w: &mut Weights,
        prefix: &str,
        out: usize,
        inp: usize,
        bias: bool,
    ) -> std::result::Result<Self, ModelError> {
        let weight = w.take(&format!("{prefix}.weight"), &[out, inp])?;
        let b = match bias {
            true => Some(w.take(&format!("{prefix}.bias"), &[out])?),
            false => None,
        };
        Ok(Self { w: weight, b })
    }

    /// `(n, in)` → `(n, out)`.
    pub(super) fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let y = x.matmul(&self.w.t()?)?;
        match &self.b {
            Some(b) => y.broadcast_add(b),
            None => Ok(y),
        }
    }
}

/// `nn.LayerNorm` over the last dimension, two-pass (mean, then the centred variance).
#[derive(Debug)]
pub(super) struct LayerNorm {
    w: Tensor,
    b: Tensor,
    eps: f64,
}

impl LayerNorm {
    fn load(
        w: &mut Weights,
        prefix: &str,
        dim: usize,
        eps: f64,
    ) -> std::result::Result<Self, ModelError> {
        Ok(Self {
            w: w.take(&format!("{prefix}.weight"), &[dim])?,
            b: w.take(&format!("{prefix}.bias"), &[dim])?,
            eps,
        })
    }

    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let xc = x.broadcast_sub(&x.mean_keepdim(D::Minus1)?)?;
        let var = xc.sqr()?.mean_keepdim(D::Minus1)?;
        let inv = (var + self.eps)?.sqrt()?.recip()?;
        xc.broadcast_mul(&inv)?
            .broadcast_mul(&self.w)?
            .broadcast_add(&self.b)
    }
}

/// The tower's shape and numerics (`vision_config`).
#[derive(Debug, Clone, Copy)]
pub(super) struct VitConfig {
    pub(super) hidden: usize,
    pub(super) intermediate: usize,
    pub(super) layers: usize,
    pub(super) heads: usize,
    pub(super) channels: usize,
    pub(super) image_size: usize,
    pub(super) patch: usize,
    pub(super) act: Activation,
    pub(super) eps: f64,
}

/// Where SigLIP and CLIP differ.
#[derive(Debug, Clone, Copy)]
pub(super) struct VitLayout {
    /// CLIP: `class_embedding` prepended, positions over `1 + N`.
    pub(super) class_token: bool,
    /// SigLIP: the patch convolution has a bias.
    pub(super) patch_bias: bool,
    /// CLIP: `pre_layrnorm` after the embeddings.
    pub(super) pre_norm: bool,
    /// SigLIP: `post_layernorm` after the last layer.
    pub(super) post_norm: bool,
}

impl VitConfig {
    /// From `vision_config`, with the defaults of transformers' config class
    /// (`SiglipVisionConfig` / `Idefics3VisionConfig` / `CLIPVisionConfig`):
    /// `defaults` = (hidden, intermediate, heads, patch, hidden_act, layer_norm_eps).
    pub(super) fn from_config(
        cfg: Config,
        defaults: (usize, usize, usize, usize, &str, f64),
    ) -> std::result::Result<Self, ModelError> {
        let (d_hidden, d_inter, d_heads, d_patch, d_act, d_eps) = defaults;
        if cfg
            .get("vision_config")
            .and_then(|v| v.as_object())
            .is_none()
        {
            return Err(meta("vision_config", "missing or not an object"));
        }
        let hidden = cfg.usize("vision_config.hidden_size", Some(d_hidden))?;
        let heads = cfg.usize("vision_config.num_attention_heads", Some(d_heads))?;
        if hidden % heads != 0 {
            return Err(meta(
                "vision_config.num_attention_heads",
                format!("{heads} does not divide hidden_size {hidden}"),
            ));
        }
        let image_size = cfg.usize("vision_config.image_size", Some(224))?;
        let patch = cfg.usize("vision_config.patch_size", Some(d_patch))?;
        if image_size % patch != 0 {
            return Err(meta(
                "vision_config.patch_size",
                format!("{patch} does not divide image_size {image_size}"),
            ));
        }
        let act_key = "vision_config.hidden_act";
        Ok(Self {
            hidden,
            intermediate: cfg.usize("vision_config.intermediate_size", Some(d_inter))?,
            layers: cfg.usize("vision_config.num_hidden_layers", Some(12))?,
            heads,
            channels: cfg.usize("vision_config.num_channels", Some(3))?,
            image_size,
            patch,
            act: Activation::parse(cfg.str(act_key, d_act)?, act_key)?,
            eps: cfg.f64("vision_config.layer_norm_eps", d_eps)?,
        })
    }

    /// Patches per side of a frame.
    pub(super) fn grid(&self) -> usize {
        self.image_size / self.patch
    }
}

/// One pre-LN encoder layer (`SiglipEncoderLayer` / `CLIPEncoderLayer`).
#[derive(Debug)]
struct EncoderLayer {
    ln1: LayerNorm,
    q: Linear,
    k: Linear,
    v: Linear,
    o: Linear,
    ln2: LayerNorm,
    fc1: Linear,
    fc2: Linear,
}

impl EncoderLayer {
    fn load(w: &mut Weights, p: &str, c: &VitConfig) -> std::result::Result<Self, ModelError> {
        let (h, i) = (c.hidden, c.intermediate);
        Ok(Self {
            ln1: LayerNorm::load(w, &format!("{p}.layer_norm1"), h, c.eps)?,
            q: Linear::load(w, &format!("{p}.self_attn.q_proj"), h, h, true)?,
            k: Linear::load(w, &format!("{p}.self_attn.k_proj"), h, h, true)?,
            v: Linear::load(w, &format!("{p}.self_attn.v_proj"), h, h, true)?,
            o: Linear::load(w, &format!("{p}.self_attn.out_proj"), h, h, true)?,
            ln2: LayerNorm::load(w, &format!("{p}.layer_norm2"), h, c.eps)?,
            fc1: Linear::load(w, &format!("{p}.mlp.fc1"), i, h, true)?,
            fc2: Linear::load(w, &format!("{p}.mlp.fc2"), h, i, true)?,
        })
    }

    /// `(n, hidden)` → `(n, hidden)`.
    fn forward(&self, x: &Tensor, heads: usize, act: Activation) -> Result<Tensor> {
        let x = (x + self.attention(&self.ln1.forward(x)?, heads)?)?;
        let y = self
            .fc2
            .forward(&act.apply(&self.fc1.forward(&self.ln2.forward(&x)?)?)?)?;
        x + y
    }

    /// Non-causal multi-head attention over all rows, softmax in f32, scale `head_dim^-0.5`.
    fn attention(&self, x: &Tensor, heads: usize) -> Result<Tensor> {
        let (n, c) = x.dims2()?;
        let d = c / heads;
        let split = |t: Tensor| t.reshape((n, heads, d))?.transpose(0, 1)?.contiguous();
        let q = split(self.q.forward(x)?)?;
        let kt = split(self.k.forward(x)?)?.t()?.contiguous()?;
        let v = split(self.v.forward(x)?)?;
        let scale = (d as f64).powf(-0.5);
        let chunk = (MAX_SCORES / (heads * n).max(1)).clamp(1, n.max(1));
        let mut outs = Vec::with_capacity(n.div_ceil(chunk));
        let mut start = 0;
        while start < n {
            let len = chunk.min(n - start);
            let qc = match len == n {
                true => q.clone(),
                false => q.narrow(1, start, len)?.contiguous()?,
            };
            let scores = (qc.matmul(&kt)? * scale)?;
            let probs = candle_nn::ops::softmax_last_dim(&scores)?;
            outs.push(probs.matmul(&v)?);
            start += len;
        }
        let out = match outs.len() {
            1 => outs.swap_remove(0),
            _ => Tensor::cat(&outs, 1)?,
        };
        let out = out.transpose(0, 1)?.reshape((n, c))?;
        self.o.forward(&out)
    }
}

/// The tower: embeddings, the first `layers.len()` encoder layers, optional norms.
#[derive(Debug)]
pub(super) struct VisionTransformer {
    pub(super) cfg: VitConfig,
    /// The patch convolution flattened: `[hidden, channels·patch·patch]`, (c, ky, kx) order.
    patch_w: Tensor,
    patch_b: Option<Tensor>,
    /// CLIP's `class_embedding` as `[1, hidden]`.
    class: Option<Tensor>,
    /// `[positions, hidden]`.
    pos: Tensor,
    pre_norm: Option<LayerNorm>,
    layers: Vec<EncoderLayer>,
    post_norm: Option<LayerNorm>,
}

impl VisionTransformer {
    /// Reads `{root}embeddings.*`, `{root}pre_layrnorm.*`, `{root}encoder.layers.{i}.*` for
    /// `i < run_layers`, `{root}post_layernorm.*` (`root` ends with a dot).
    pub(super) fn load(
        w: &mut Weights,
        root: &str,
        cfg: VitConfig,
        layout: VitLayout,
        run_layers: usize,
    ) -> std::result::Result<Self, ModelError> {
        let (h, c, p) = (cfg.hidden, cfg.channels, cfg.patch);
        let patch_name = format!("{root}embeddings.patch_embedding.weight");
        let patch_w = w.take(&patch_name, &[h, c, p, p])?;
        let patch_w = patch_w
            .reshape((h, c * p * p))
            .map_err(|e| ModelError::Tensor {
                name: patch_name,
                message: crate::model::candle_error_message(&e),
            })?;
        let patch_b = match layout.patch_bias {
            true => Some(w.take(&format!("{root}embeddings.patch_embedding.bias"), &[h])?),
            false => None,
        };
        let class = match layout.class_token {
            true => {
                let name = format!("{root}embeddings.class_embedding");
                let t = w.take(&name, &[h])?;
                Some(t.reshape((1, h)).map_err(|e| ModelError::Tensor {
                    name,
                    message: crate::model::candle_error_message(&e),
                })?)
            }
            false => None,
        };
        let positions = cfg.grid() * cfg.grid() + usize::from(layout.class_token);
        let pos = w.take(
            &format!("{root}embeddings.position_embedding.weight"),
            &[positions, h],
        )?;
        let pre_norm = match layout.pre_norm {
            true => Some(LayerNorm::load(
                w,
                &format!("{root}pre_layrnorm"),
                h,
                cfg.eps,
            )?),
            false => None,
        };
        let layers = (0..run_layers)
            .map(|i| EncoderLayer::load(w, &format!("{root}encoder.layers.{i}"), &cfg))
            .collect::<std::result::Result<Vec<_>, _>>()?;
        let post_norm = match layout.post_norm {
            true => Some(LayerNorm::load(
                w,
                &format!("{root}post_layernorm"),
                h,
                cfg.eps,
            )?),
            false => None,
        };
        Ok(Self {
            cfg,
            patch_w,
            patch_b,
            class,
            pos,
            pre_norm,
            layers,
            post_norm,
        })
    }

    /// One frame `(channels, image_size, image_size)` → `(positions, hidden)`: patches
    /// row-major over the grid, after CLIP's class row.
    pub(super) fn forward(&self, frame: &Tensor) -> Result<Tensor> {
        let (c, p, g) = (self.cfg.channels, self.cfg.patch, self.cfg.grid());
        let rows = frame
            .reshape((c, g, p, g, p))?
            .permute((1, 3, 0, 2, 4))?
            .reshape((g * g, c * p * p))?;
        let mut x = rows.matmul(&self.patch_w.t()?)?;
        if let Some(b) = &self.patch_b {
            x = x.broadcast_add(b)?;
        }
        if let Some(class) = &self.class {
            x = Tensor::cat(&[class, &x], 0)?;
        }
        x = (x + &self.pos)?;
        if let Some(n) = &self.pre_norm {
            x = n.forward(&x)?;
        }
        for layer in &self.layers {
            x = layer.forward(&x, self.cfg.heads, self.cfg.act)?;
        }
        match &self.post_norm {
            Some(n) => n.forward(&x),
            None => Ok(x),
        }
    }
}
