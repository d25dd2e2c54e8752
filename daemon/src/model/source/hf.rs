//! Hugging Face checkpoint directories: `config.json` (transformers 4.x and 5.x key
//! spellings: `rope_theta`/`rope_scaling` or `rope_parameters`, `num_experts` or
//! `num_local_experts`), `model.safetensors` or the shards listed in
//! `model.safetensors.index.json`, tensors in F32, F16 or BF16 kept in their dtype.
//! Tensor names are transformers' (`model.layers.N.self_attn.q_proj.weight`, ...).

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use candle_core::{DType, Device, Tensor};
use serde_json::Value;

use super::super::matrix::RawMatrix;
use super::super::spec::{
    Activation, Architecture, ModelSpec, MoeSpec, Numerics, RopeScaling, RopeSpec, RopeStyle,
    MAX_LAYERS, SUPPORTED_HF,
};
use super::super::weights::{ExpertRole, LayerRole, Role, WeightSource};
use super::super::{candle_error_message, ModelError};
use super::hf_vlm::{text_config, VlmFamily, SUPPORTED_VLM};
use super::{quote, read_bounded};

/// Largest `config.json` / index file read, bytes.
const MAX_JSON_BYTES: u64 = 16 << 20;

/// An HF directory with its tensors loaded (in their stored dtypes) on the CPU.
pub struct HfSource {
    arch: Architecture,
    config: Value,
    /// A vision-language checkpoint's whole `config.json` and its vision-side tensors
    /// (`config` is then its `text_config`).
    vision: Option<(Value, HashMap<String, Tensor>)>,
    tensors: HashMap<String, Tensor>,
    /// Which file each tensor came from, for messages.
    files: HashMap<String, PathBuf>,
    /// Gemma stores norm weights as `w` for `x · (1 + w)`: add 1 at load.
    norm_offset: f32,
}

/// The first `*.gguf` file name in `dir` (sorted), for the hint when a GGUF file's
/// directory is given as the model.
fn first_gguf(dir: &Path) -> Option<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .ok()?
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter(|n| n.ends_with(".gguf"))
        .collect();
    names.sort();
    names.into_iter().next()
}

fn json_file(path: &Path) -> Result<Value, ModelError> {
    let text = read_bounded(path, MAX_JSON_BYTES)?;
    serde_json::from_slice(&text).map_err(|e| ModelError::Corrupt {
        path: path.display().to_string(),
        format: "JSON file",
        message: format!("not valid JSON: {e}"),
    })
}

impl HfSource {
    /// Reads `dir/config.json` and the safetensors files.
    ///
    /// # Errors
    /// A missing or malformed file, an unknown architecture, a tensor in another dtype.
    pub fn open(dir: &Path) -> Result<Self, ModelError> {
        let cfg_path = dir.join("config.json");
        if !cfg_path.exists() {
            if let Some(gguf) = first_gguf(dir) {
                return Err(ModelError::Config(format!(
                    "model.path: {} is a directory without config.json, so not a Hugging \
                     Face model directory; it holds the GGUF file {}: give that file's path",
                    dir.display(),
                    quote(&gguf)
                )));
            }
        }
        let config = json_file(&cfg_path)?;
        let class = config
            .get("architectures")
            .and_then(|a| a.get(0))
            .and_then(Value::as_str)
            .ok_or_else(|| ModelError::Metadata {
                key: format!("{}: architectures[0]", cfg_path.display()),
                message: "missing or not a string".into(),
            })?;
        let vlm = VlmFamily::from_hf(class);
        let (arch, config, root) = match vlm {
            Some(family) => {
                let text = text_config(&config).ok_or_else(|| ModelError::Metadata {
                    key: format!("{}: text_config", cfg_path.display()),
                    message: format!("missing or not an object (needed by {class})"),
                })?;
                let arch =
                    family
                        .text_architecture(&text)
                        .map_err(|message| ModelError::Metadata {
                            key: format!("{}: text_config.model_type", cfg_path.display()),
                            message,
                        })?;
                (arch, text, Some(config))
            }
            None => {
                let arch = Architecture::from_hf(class).ok_or_else(|| {
                    ModelError::UnsupportedArchitecture {
                        key: format!("{}: architectures[0]", cfg_path.display()),
                        value: quote(class),
                        supported: format!("{SUPPORTED_HF}, {SUPPORTED_VLM}"),
                    }
                })?;
                (arch, config, None)
            }
        };
        let mut files = Vec::new();
        let index = dir.join("model.safetensors.index.json");
        if index.is_file() {
            let idx = json_file(&index)?;
            let map = idx
                .get("weight_map")
                .and_then(Value::as_object)
                .ok_or_else(|| ModelError::Metadata {
                    key: format!("{}: weight_map", index.display()),
                    message: "missing or not an object".into(),
                })?;
            for f in map.values() {
                let Some(f) = f.as_str().filter(|f| !f.contains('/') && !f.contains("..")) else {
                    return Err(ModelError::Metadata {
                        key: format!("{}: weight_map", index.display()),
                        message: format!("bad shard file name {}", json_value(f)),
                    });
                };
                let p = dir.join(f);
                if !files.contains(&p) {
                    files.push(p);
                }
            }
        } else {
            files.push(dir.join("model.safetensors"));
        }
        let mut tensors = HashMap::new();
        let mut vision = HashMap::new();
        let mut origin = HashMap::new();
        for f in &files {
            let display = f.display().to_string();
            if !f.is_file() {
                let listed = if index.is_file() {
                    " (listed in model.safetensors.index.json)"
                } else {
                    ""
                };
                return Err(ModelError::Io {
                    path: format!("{display}{listed}"),
                    error: std::io::Error::new(std::io::ErrorKind::NotFound, "no such file"),
                });
            }
            let loaded = candle_core::safetensors::load(f, &Device::Cpu).map_err(|e| {
                ModelError::Corrupt {
                    path: display.clone(),
                    format: "safetensors file",
                    message: quote(&candle_error_message(&e)),
                }
            })?;
            for (name, t) in loaded {
                if !matches!(t.dtype(), DType::F32 | DType::F16 | DType::BF16) {
                    return Err(ModelError::Tensor {
                        name: format!("{display}: {}", quote(&name)),
                        message: format!("dtype {:?} (supported: F32, F16, BF16)", t.dtype()),
                    });
                }
                let name = match vlm {
                    Some(family) => family.rename(&name),
                    None => name,
                };
                origin.insert(name.clone(), f.clone());
                match vlm {
                    Some(family)
                        if family.vision_prefixes().iter().any(|p| name.starts_with(p)) =>
                    {
                        vision.insert(name, t);
                    }
                    _ => {
                        tensors.insert(name, t);
                    }
                }
            }
        }
        Ok(Self {
            arch,
            config,
            vision: root.map(|root| (root, vision)),
            tensors,
            files: origin,
            norm_offset: if arch == Architecture::Gemma3 {
                1.0
            } else {
                0.0
            },
        })
    }

    /// A vision-language checkpoint's whole `config.json` and vision-side tensors
    /// (stored dtypes, CPU), taken out of the source; `None` for a text model.
    pub fn take_vision(&mut self) -> Option<(Value, HashMap<String, Tensor>)> {
        self.vision.take()
    }

    /// The architecture.
    pub fn architecture(&self) -> Architecture {
        self.arch
    }

    /// The dtype of the embedding matrix (what the checkpoint stores).
    pub fn dtype(&self) -> DType {
        self.tensors
            .get("model.embed_tokens.weight")
            .map_or(DType::F32, Tensor::dtype)
    }

    fn get(&self, key: &str) -> Option<&Value> {
        self.config.get(key).filter(|v| !v.is_null())
    }

    fn usize_key(&self, key: &str) -> Result<Option<usize>, ModelError> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => v
                .as_u64()
                .and_then(|x| usize::try_from(x).ok())
                .map(Some)
                .ok_or_else(|| self.bad(key, "an unsigned integer", v)),
        }
    }

    fn require(&self, key: &str) -> Result<usize, ModelError> {
        self.usize_key(key)?.ok_or_else(|| ModelError::Metadata {
            key: format!("config.json: {key}"),
            message: "missing".into(),
        })
    }

    fn f32_key(&self, key: &str) -> Result<Option<f32>, ModelError> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => v
                .as_f64()
                .map(|x| Some(x as f32))
                .ok_or_else(|| self.bad(key, "a number", v)),
        }
    }

    fn bool_key(&self, key: &str) -> Result<Option<bool>, ModelError> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => v
                .as_bool()
                .map(Some)
                .ok_or_else(|| self.bad(key, "true or false", v)),
        }
    }

    fn bad(&self, key: &str, want: &str, v: &Value) -> ModelError {
        ModelError::Metadata {
            key: format!("config.json: {key}"),
            message: format!("expected {want}, found {}", json_value(v)),
        }
    }

    /// The RoPE parameters of one attention type: `rope_parameters` (5.x; nested per
    /// layer type for Gemma 3) before `rope_theta` + `rope_scaling` (4.x).
    fn rope_params(&self, layer_type: &str) -> Option<&Value> {
        let p = self.get("rope_parameters")?;
        p.get(layer_type).or(Some(p)).filter(|v| v.is_object())
    }

    fn rope_theta(
        &self,
        layer_type: &str,
        fallback_key: &str,
        default: f32,
    ) -> Result<f32, ModelError> {
        if let Some(t) = self
            .rope_params(layer_type)
            .and_then(|p| p.get("rope_theta"))
            .and_then(Value::as_f64)
        {
            return Ok(t as f32);
        }
        Ok(self.f32_key(fallback_key)?.unwrap_or(default))
    }

    /// `mrope_section` (Qwen2-VL / Qwen2.5-VL: `rope_parameters` in 5.x,
    /// `rope_scaling` in 4.x): three counts of rotation frequencies summing to
    /// `rope_dim / 2`.
    fn mrope_section(&self, rope_dim: usize) -> Result<Option<[usize; 3]>, ModelError> {
        let Some(v) = self
            .rope_params("full_attention")
            .or_else(|| self.get("rope_scaling"))
            .and_then(|p| p.get("mrope_section"))
        else {
            return Ok(None);
        };
        let s: Vec<usize> = v
            .as_array()
            .map(|a| {
                a.iter()
                    .filter_map(|x| x.as_u64().map(|x| x as usize))
                    .collect()
            })
            .unwrap_or_default();
        match s.as_slice() {
            &[t, h, w] if t + h + w == rope_dim / 2 => Ok(Some([t, h, w])),
            _ => Err(ModelError::Metadata {
                key: "config.json: rope_parameters.mrope_section".into(),
                message: format!(
                    "must be three counts summing to {} (got {})",
                    rope_dim / 2,
                    json_value(v)
                ),
            }),
        }
    }

    /// `rope_scaling` (4.x) or the 5.x `rope_parameters` of full attention.
    fn rope_scaling(&self, rope_dim: usize) -> Result<RopeScaling, ModelError> {
        let p = self
            .get("rope_scaling")
            .or_else(|| self.rope_params("full_attention"));
        let Some(p) = p else {
            return Ok(RopeScaling::None);
        };
        let kind = p
            .get("rope_type")
            .or_else(|| p.get("type"))
            .and_then(Value::as_str)
            .unwrap_or("default");
        let num = |k: &str| p.get(k).and_then(Value::as_f64).map(|x| x as f32);
        let orig = num("original_max_position_embeddings")
            .or(self.f32_key("original_max_position_embeddings")?);
        match kind {
            "default" => Ok(RopeScaling::None),
            "llama3" => {
                let need = |k: &str| {
                    num(k).ok_or_else(|| ModelError::Metadata {
                        key: format!("config.json: rope_scaling.{k}"),
                        message: "missing for rope_type llama3".into(),
                    })
                };
                Ok(RopeScaling::Llama3 {
                    factor: need("factor")?,
                    low_freq_factor: need("low_freq_factor")?,
                    high_freq_factor: need("high_freq_factor")?,
                    original_max: orig.ok_or_else(|| ModelError::Metadata {
                        key: "config.json: rope_scaling.original_max_position_embeddings".into(),
                        message: "missing for rope_type llama3".into(),
                    })?,
                })
            }
            "longrope" => {
                // transformers `_compute_longrope_parameters`: long factors when the
                // context exceeds the original one (decided here for the configured
                // maximum, as llama.cpp decides at load), and cos/sin scaled by
                // sqrt(1 + ln(s) / ln(orig)) with s = max / orig.
                let max = self.require("max_position_embeddings")? as f32;
                let orig = orig.unwrap_or(max);
                let key = if max > orig {
                    "long_factor"
                } else {
                    "short_factor"
                };
                let factors: Vec<f32> = p
                    .get(key)
                    .and_then(Value::as_array)
                    .map(|a| {
                        a.iter()
                            .filter_map(|x| x.as_f64().map(|x| x as f32))
                            .collect()
                    })
                    .unwrap_or_default();
                if factors.len() != rope_dim / 2 {
                    return Err(ModelError::Metadata {
                        key: format!("config.json: rope_scaling.{key}"),
                        message: format!("needs {} numbers, found {}", rope_dim / 2, factors.len()),
                    });
                }
                let s = max / orig;
                let attention_factor = num("attention_factor").unwrap_or(if s <= 1.0 {
                    1.0
                } else {
                    (1.0 + s.ln() / orig.ln()).sqrt()
                });
                Ok(RopeScaling::Factors {
                    factors,
                    attention_factor,
                })
            }
            other => Err(ModelError::Metadata {
                key: "config.json: rope_scaling.rope_type".into(),
                message: format!(
                    "{} is not supported (supported: default, llama3, longrope)",
                    quote(other)
                ),
            }),
        }
    }

    /// Per-layer windows: `layer_types` when given (5.x), else each architecture's rule
    /// (Qwen2/3: `use_sliding_window` from `max_window_layers` on; Gemma 3: every
    /// `sliding_window_pattern`-th layer is global; Mistral/Phi-3: every layer).
    fn windows(&self, n_layer: usize) -> Result<Vec<Option<usize>>, ModelError> {
        let w = self.usize_key("sliding_window")?;
        if let Some(types) = self.get("layer_types").and_then(Value::as_array) {
            if types.len() != n_layer {
                return Err(ModelError::Metadata {
                    key: "config.json: layer_types".into(),
                    message: format!("{} entries for {n_layer} layers", types.len()),
                });
            }
            return Ok(types
                .iter()
                .map(|t| {
                    if t.as_str() == Some("sliding_attention") {
                        w
                    } else {
                        None
                    }
                })
                .collect());
        }
        let Some(w) = w else {
            return Ok(vec![None; n_layer]);
        };
        Ok(match self.arch {
            Architecture::Qwen2 | Architecture::Qwen3 | Architecture::Qwen3Moe => {
                if self.bool_key("use_sliding_window")?.unwrap_or(false) {
                    let from = self.usize_key("max_window_layers")?.unwrap_or(0);
                    (0..n_layer).map(|l| (l >= from).then_some(w)).collect()
                } else {
                    vec![None; n_layer]
                }
            }
            Architecture::Gemma3 => {
                let p = self
                    .usize_key("sliding_window_pattern")?
                    .unwrap_or(6)
                    .max(1);
                (0..n_layer)
                    .map(|l| ((l + 1) % p != 0).then_some(w))
                    .collect()
            }
            Architecture::Llama | Architecture::Phi3 => vec![Some(w); n_layer],
        })
    }

    /// The spec from `config.json`.
    ///
    /// # Errors
    /// A missing or inconsistent key, named.
    pub fn spec(&self) -> Result<ModelSpec, ModelError> {
        let n_layer = self.require("num_hidden_layers")?;
        if n_layer > MAX_LAYERS {
            return Err(ModelError::Metadata {
                key: "config.json: num_hidden_layers".to_string(),
                message: format!("{n_layer} layers, above the supported {MAX_LAYERS}"),
            });
        }
        let n_embd = self.require("hidden_size")?;
        let n_head = self.require("num_attention_heads")?;
        let n_kv_head = self.usize_key("num_key_value_heads")?.unwrap_or(n_head);
        let head_dim = self
            .usize_key("head_dim")?
            .unwrap_or(n_embd / n_head.max(1));
        let partial = self
            .rope_params("full_attention")
            .and_then(|p| p.get("partial_rotary_factor"))
            .and_then(Value::as_f64)
            .map(|x| x as f32)
            .or(self.f32_key("partial_rotary_factor")?)
            .unwrap_or(1.0);
        let rope_dim = ((head_dim as f32 * partial) as usize) & !1;
        let gemma = self.arch == Architecture::Gemma3;
        let moe = if self.arch == Architecture::Qwen3Moe {
            let n_expert = match self.usize_key("num_experts")? {
                Some(n) => n,
                None => self.require("num_local_experts")?,
            };
            let step = self.usize_key("decoder_sparse_step")?.unwrap_or(1).max(1);
            let dense: Vec<usize> = self
                .get("mlp_only_layers")
                .and_then(Value::as_array)
                .map(|a| {
                    a.iter()
                        .filter_map(|x| x.as_u64().map(|x| x as usize))
                        .collect()
                })
                .unwrap_or_default();
            Some(MoeSpec {
                n_expert,
                n_expert_used: self.require("num_experts_per_tok")?,
                n_ff_expert: self.require("moe_intermediate_size")?,
                norm_topk_prob: self.bool_key("norm_topk_prob")?.unwrap_or(false),
                // transformers: MoE where not listed and (l + 1) % step == 0.
                layers: (0..n_layer)
                    .map(|l| !dense.contains(&l) && (l + 1) % step == 0)
                    .collect(),
            })
        } else {
            None
        };
        let act = self
            .get("hidden_activation")
            .or_else(|| self.get("hidden_act"))
            .and_then(Value::as_str)
            .unwrap_or("silu");
        let activation = match act {
            "silu" | "swish" => Activation::Silu,
            "gelu_pytorch_tanh" | "gelu_tanh" => Activation::GeluTanh,
            other => {
                return Err(ModelError::Metadata {
                    key: "config.json: hidden_act".into(),
                    message: format!(
                        "{} is not supported (supported: silu, gelu_pytorch_tanh)",
                        quote(other)
                    ),
                })
            }
        };
        let attn_scale = match self.f32_key("query_pre_attn_scalar")? {
            Some(s) if gemma => 1.0 / s.sqrt(),
            _ => 1.0 / (head_dim as f32).sqrt(),
        };
        let theta_default = if gemma { 1_000_000.0 } else { 10_000.0 };
        let spec = ModelSpec {
            architecture: self.arch,
            n_layer,
            n_embd,
            n_head,
            n_kv_head,
            head_dim,
            n_ff: match &moe {
                Some(m) => self
                    .usize_key("intermediate_size")?
                    .unwrap_or(m.n_ff_expert),
                None => self.require("intermediate_size")?,
            },
            vocab_size: self.require("vocab_size")?,
            context_length: self.require("max_position_embeddings")?,
            norm_eps: self.f32_key("rms_norm_eps")?.unwrap_or(1e-6),
            rope: RopeSpec {
                // transformers' rotate_half pairs dimension i with i + d/2.
                style: RopeStyle::Neox,
                dim: rope_dim,
                theta: self.rope_theta("full_attention", "rope_theta", theta_default)?,
                local_theta: if gemma {
                    Some(self.rope_theta("sliding_attention", "rope_local_base_freq", 10_000.0)?)
                } else {
                    None
                },
                scaling: self.rope_scaling(rope_dim)?,
                mrope_section: self.mrope_section(rope_dim)?,
            },
            activation,
            window: self.windows(n_layer)?,
            attn_scale,
            q_prescaled: false,
            qkv_bias: self.arch == Architecture::Qwen2
                || self.bool_key("attention_bias")?.unwrap_or(false),
            qk_norm: matches!(
                self.arch,
                Architecture::Qwen3 | Architecture::Qwen3Moe | Architecture::Gemma3
            ),
            post_norms: gemma,
            // Gemma3TextScaledWordEmbedding: √hidden rounded to the weights' dtype.
            embed_scale: gemma.then(|| round_to(self.dtype(), (n_embd as f32).sqrt())),
            final_softcap: self.f32_key("final_logit_softcapping")?,
            moe,
            numerics: Numerics::Transformers,
        };
        spec.check().map_err(|e| {
            use super::super::spec::SpecField as F;
            let key = match e.field {
                F::Layers => "num_hidden_layers",
                F::Hidden => "hidden_size",
                F::Heads => "num_attention_heads",
                F::KvHeads => "num_key_value_heads",
                F::HeadDim => "head_dim",
                F::Ffn => "intermediate_size",
                F::Vocab => "vocab_size",
                F::Context => "max_position_embeddings",
                F::RopeDim => "partial_rotary_factor",
                F::RopeScaling => "rope_scaling",
                F::RopeTheta => "rope_theta",
                F::Window => "sliding_window",
                F::NormEps => "rms_norm_eps",
                F::Experts => "num_experts / num_experts_per_tok / moe_intermediate_size",
            };
            ModelError::Metadata {
                key: format!("config.json: {key}"),
                message: e.message,
            }
        })?;
        Ok(spec)
    }

    fn tensor_name(&self, role: Role) -> Option<String> {
        use LayerRole as L;
        let gemma = self.arch == Architecture::Gemma3;
        let phi3 = self.arch == Architecture::Phi3;
        Some(match role {
            Role::TokenEmbd => "model.embed_tokens.weight".into(),
            Role::Output => "lm_head.weight".into(),
            Role::OutputNorm => "model.norm.weight".into(),
            Role::Layer(l, r) => {
                let s = match r {
                    L::AttnNorm => "input_layernorm.weight",
                    L::Q if phi3 => return None,
                    L::K if phi3 => return None,
                    L::V if phi3 => return None,
                    L::Q => "self_attn.q_proj.weight",
                    L::K => "self_attn.k_proj.weight",
                    L::V => "self_attn.v_proj.weight",
                    L::Qkv => "self_attn.qkv_proj.weight",
                    L::QBias => "self_attn.q_proj.bias",
                    L::KBias => "self_attn.k_proj.bias",
                    L::VBias => "self_attn.v_proj.bias",
                    L::QNorm => "self_attn.q_norm.weight",
                    L::KNorm => "self_attn.k_norm.weight",
                    L::AttnOutput => "self_attn.o_proj.weight",
                    L::PostAttnNorm if gemma => "post_attention_layernorm.weight",
                    L::PostAttnNorm => return None,
                    L::FfnNorm if gemma => "pre_feedforward_layernorm.weight",
                    L::FfnNorm => "post_attention_layernorm.weight",
                    L::PostFfnNorm => "post_feedforward_layernorm.weight",
                    L::Gate => "mlp.gate_proj.weight",
                    L::Up => "mlp.up_proj.weight",
                    L::GateUp => "mlp.gate_up_proj.weight",
                    L::Down => "mlp.down_proj.weight",
                    L::Router => "mlp.gate.weight",
                };
                format!("model.layers.{l}.{s}")
            }
            Role::Expert(l, e, r) => format!(
                "model.layers.{l}.mlp.experts.{e}.{}_proj.weight",
                match r {
                    ExpertRole::Gate => "gate",
                    ExpertRole::Up => "up",
                    ExpertRole::Down => "down",
                }
            ),
        })
    }

    fn take(&mut self, role: Role, dims: &[usize]) -> Result<(String, Tensor), ModelError> {
        let name = self.tensor_name(role).ok_or_else(|| ModelError::Tensor {
            name: format!("{role:?}"),
            message: "this architecture's checkpoints have no such tensor".into(),
        })?;
        let t = self.tensors.get(&name).ok_or_else(|| ModelError::Tensor {
            name: name.clone(),
            message: "missing".into(),
        })?;
        if t.dims() != dims {
            let file = self
                .files
                .get(&name)
                .map(|p| p.display().to_string())
                .unwrap_or_default();
            return Err(ModelError::Tensor {
                name: format!("{file}: {name}"),
                message: format!("expected shape {dims:?}, found {:?}", t.dims()),
            });
        }
        Ok((name, t.clone()))
    }
}

/// A JSON value for a message: strings quoted once, other values as JSON, cut and escaped.
fn json_value(v: &Value) -> String {
    match v {
        Value::String(s) => quote(s),
        other => super::bounded(&other.to_string()),
    }
}

/// `x` rounded to `dtype` and back.
fn round_to(dtype: DType, x: f32) -> f32 {
    match dtype {
        DType::F16 => half::f16::from_f32(x).to_f32(),
        DType::BF16 => half::bf16::from_f32(x).to_f32(),
        _ => x,
    }
}

impl WeightSource for HfSource {
    fn name(&self, role: Role) -> Option<String> {
        self.tensor_name(role)
    }

    fn has(&self, role: Role) -> bool {
        self.tensor_name(role)
            .is_some_and(|n| self.tensors.contains_key(&n))
    }

    fn matrix(&mut self, role: Role, rows: usize, cols: usize) -> Result<RawMatrix, ModelError> {
        let (_, t) = self.take(role, &[rows, cols])?;
        Ok(RawMatrix::Dense(t))
    }

    fn vector(&mut self, role: Role, len: usize) -> Result<Vec<f32>, ModelError> {
        let (name, t) = self.take(role, &[len])?;
        let is_norm = !matches!(
            role,
            Role::Layer(_, LayerRole::QBias | LayerRole::KBias | LayerRole::VBias)
        );
        let mut v = t
            .to_dtype(DType::F32)
            .and_then(|t| t.to_vec1::<f32>())
            .map_err(|e| ModelError::Tensor {
                name,
                message: candle_error_message(&e),
            })?;
        if is_norm && self.norm_offset != 0.0 {
            v.iter_mut().for_each(|w| *w += self.norm_offset);
        }
        Ok(v)
    }
}
