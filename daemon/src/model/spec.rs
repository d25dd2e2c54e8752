//! [`ModelSpec`]: everything that differs between the decoder architectures inferd runs,
//! as data. One decoder loop ([`super::transformer`]) runs any spec; each weight source
//! ([`super::source`]) reads one from its metadata (GGUF keys or `config.json`).
//!
//! The architectures and the reference each field follows: transformers'
//! `modeling_{llama,mistral,qwen2,qwen3,qwen3_moe,gemma3,phi3}.py` for Hugging Face
//! weights, llama.cpp's `src/models/*.cpp` and `llama-model.cpp` for GGUF files.

/// Most transformer blocks a spec may have (read before any per-layer list is made).
pub const MAX_LAYERS: usize = 1 << 12;

/// The architectures this build implements (GGUF `general.architecture` /
/// `config.json` `architectures[0]`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Architecture {
    /// Llama 2/3, SmolLM, Mistral (`llama`; `LlamaForCausalLM`, `MistralForCausalLM`).
    Llama,
    /// Qwen2 / Qwen2.5 (`qwen2`; `Qwen2ForCausalLM`): q/k/v biases.
    Qwen2,
    /// Qwen3 (`qwen3`; `Qwen3ForCausalLM`): per-head q/k RMSNorm.
    Qwen3,
    /// Qwen3-MoE (`qwen3moe`; `Qwen3MoeForCausalLM`).
    Qwen3Moe,
    /// Gemma 3 text (`gemma3`; `Gemma3ForCausalLM`).
    Gemma3,
    /// Phi-3 (`phi3`; `Phi3ForCausalLM`).
    Phi3,
}

/// The GGUF architecture names accepted, for error messages.
pub const SUPPORTED_GGUF: &str = "llama, qwen2, qwen2vl, qwen3, qwen3moe, gemma3, phi3";
/// The `config.json` classes accepted, for error messages.
pub const SUPPORTED_HF: &str = "LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM, \
     Qwen3ForCausalLM, Qwen3MoeForCausalLM, Gemma3ForCausalLM, Phi3ForCausalLM";

impl Architecture {
    /// From GGUF `general.architecture`.
    pub fn from_gguf(name: &str) -> Option<Self> {
        Some(match name {
            "llama" => Self::Llama,
            // Qwen2-VL / Qwen2.5-VL's text model: Qwen2 with M-RoPE sections.
            "qwen2" | "qwen2vl" => Self::Qwen2,
            "qwen3" => Self::Qwen3,
            "qwen3moe" => Self::Qwen3Moe,
            "gemma3" => Self::Gemma3,
            "phi3" => Self::Phi3,
            _ => return None,
        })
    }

    /// From `config.json` `architectures[0]`.
    pub fn from_hf(class: &str) -> Option<Self> {
        Some(match class {
            "LlamaForCausalLM" | "MistralForCausalLM" => Self::Llama,
            "Qwen2ForCausalLM" => Self::Qwen2,
            "Qwen3ForCausalLM" => Self::Qwen3,
            "Qwen3MoeForCausalLM" => Self::Qwen3Moe,
            "Gemma3ForCausalLM" => Self::Gemma3,
            "Phi3ForCausalLM" => Self::Phi3,
            _ => return None,
        })
    }

    /// The GGUF spelling, used in logs and in the prefix-store fingerprint.
    pub fn name(self) -> &'static str {
        match self {
            Self::Llama => "llama",
            Self::Qwen2 => "qwen2",
            Self::Qwen3 => "qwen3",
            Self::Qwen3Moe => "qwen3moe",
            Self::Gemma3 => "gemma3",
            Self::Phi3 => "phi3",
        }
    }
}

/// Which dimensions RoPE rotates together.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RopeStyle {
    /// Adjacent pairs `(2i, 2i+1)` (GPT-J; llama.cpp `LLAMA_ROPE_TYPE_NORM`), which GGUF
    /// llama files use after the converter's q/k row permutation.
    Interleaved,
    /// Halves `(i, i + d/2)` (GPT-NeoX; transformers' `rotate_half`; llama.cpp
    /// `LLAMA_ROPE_TYPE_NEOX`).
    Neox,
}

/// RoPE frequency scaling.
#[derive(Debug, Clone, PartialEq)]
pub enum RopeScaling {
    /// `θ_i = base^(-2i/d)` unchanged.
    None,
    /// Llama 3.1 (`rope_type: llama3`; transformers `_compute_llama3_parameters`):
    /// wavelengths above `original_max / low_freq_factor` are divided by `factor`, below
    /// `original_max / high_freq_factor` kept, smoothly interpolated between.
    Llama3 {
        /// `factor`.
        factor: f32,
        /// `low_freq_factor`.
        low_freq_factor: f32,
        /// `high_freq_factor`.
        high_freq_factor: f32,
        /// `original_max_position_embeddings`.
        original_max: f32,
    },
    /// Per-dimension divisors of the frequencies (`θ_i / f_i`): Phi-3 longrope
    /// (transformers `_compute_longrope_parameters`: `inv_freq = 1 / (ext · base^(2i/d))`)
    /// and GGUF `rope_freqs.weight` (llama.cpp's `freq_factors`). cos and sin are
    /// multiplied by `attention_factor`.
    Factors {
        /// One divisor per rotated pair, `rope_dim / 2` values.
        factors: Vec<f32>,
        /// Multiplier of cos and sin (longrope's `sqrt(1 + ln(s)/ln(orig))`, else 1).
        attention_factor: f32,
    },
}

/// Rotary position embedding (Su et al. 2021, RoFormer).
#[derive(Debug, Clone, PartialEq)]
pub struct RopeSpec {
    /// Pairing of dimensions.
    pub style: RopeStyle,
    /// Dimensions rotated per head (even, ≤ head_dim); the rest pass through.
    pub dim: usize,
    /// Base θ of global (full-attention) layers.
    pub theta: f32,
    /// Base θ of sliding-window layers when it differs (Gemma 3's
    /// `rope_local_base_freq`, 10 000; unscaled).
    pub local_theta: Option<f32>,
    /// Frequency scaling of the global layers.
    pub scaling: RopeScaling,
    /// Multimodal RoPE (Qwen2-VL, Qwen2.5-VL; transformers `mrope_section`): rotation
    /// frequencies `0 .. s₀` take a token's temporal position, the next `s₁` its row,
    /// the next `s₂` its column. Text tokens have all three equal, which is plain RoPE.
    pub mrope_section: Option<[usize; 3]>,
}

/// The MLP's activation (gated: `act(gate) · up`), defined beside its kernels.
pub use inferd_kernels::eltwise::Activation;

/// Whose formulas the element-wise ops follow (RMSNorm, RoPE angles, the MLP's
/// activation); the matrices always run their own kernels. Where llama.cpp and
/// transformers differ, GGUF files follow llama.cpp and Hugging Face weights follow
/// transformers ([`super::host`], [`super::rope`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Numerics {
    /// llama.cpp's CPU backend (`ggml/src/ggml-cpu/ops.cpp`, `vec.h`, `vec.cpp`).
    Ggml,
    /// transformers / candle.
    Transformers,
}

/// Mixture-of-experts MLP (Qwen3-MoE; transformers `Qwen3MoeSparseMoeBlock`).
#[derive(Debug, Clone, PartialEq)]
pub struct MoeSpec {
    /// Experts per MoE layer (`num_experts` / `expert_count`).
    pub n_expert: usize,
    /// Experts used per token (`num_experts_per_tok` / `expert_used_count`).
    pub n_expert_used: usize,
    /// Width of each expert's MLP (`moe_intermediate_size`).
    pub n_ff_expert: usize,
    /// Renormalize the top-k router weights to sum 1 (`norm_topk_prob`).
    pub norm_topk_prob: bool,
    /// Which layers are MoE (`decoder_sparse_step` and `mlp_only_layers`); the others
    /// have a dense MLP of `n_ff`.
    pub layers: Vec<bool>,
}

/// Which spec field a [`SpecError`] is about; each source maps it to its own key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SpecField {
    /// Transformer blocks.
    Layers,
    /// Hidden size.
    Hidden,
    /// Query heads.
    Heads,
    /// Key/value heads.
    KvHeads,
    /// Per-head dimension.
    HeadDim,
    /// MLP width.
    Ffn,
    /// Vocabulary size.
    Vocab,
    /// Context window.
    Context,
    /// RoPE dimension.
    RopeDim,
    /// RoPE scaling factors.
    RopeScaling,
    /// RoPE base.
    RopeTheta,
    /// Sliding windows.
    Window,
    /// RMSNorm ε.
    NormEps,
    /// MoE counts.
    Experts,
}

/// An inconsistent or out-of-bounds spec.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SpecError {
    /// The field.
    pub field: SpecField,
    /// What is wrong.
    pub message: String,
}

/// Everything the decoder loop needs to know about an architecture instance.
#[derive(Debug, Clone, PartialEq)]
pub struct ModelSpec {
    /// The architecture.
    pub architecture: Architecture,
    /// Transformer blocks.
    pub n_layer: usize,
    /// Hidden size.
    pub n_embd: usize,
    /// Query heads.
    pub n_head: usize,
    /// Key/value heads; query head `h` uses KV head `h / (n_head / n_kv_head)`.
    pub n_kv_head: usize,
    /// Per-head dimension (explicit in Qwen3 and Gemma 3, where it is not
    /// `n_embd / n_head`).
    pub head_dim: usize,
    /// Dense MLP width.
    pub n_ff: usize,
    /// Vocabulary size (rows of the embedding matrix).
    pub vocab_size: usize,
    /// Context window in tokens.
    pub context_length: usize,
    /// RMSNorm ε.
    pub norm_eps: f32,
    /// RoPE.
    pub rope: RopeSpec,
    /// MLP activation.
    pub activation: Activation,
    /// Sliding-window size of each layer (`None`: full causal attention). A query at
    /// position `i` attends keys `j` with `i − window < j ≤ i` (transformers'
    /// `sliding_window_causal` mask; llama.cpp's `LLAMA_SWA_TYPE_STANDARD`).
    pub window: Vec<Option<usize>>,
    /// Attention score scale (`1/√head_dim`, or Gemma's `query_pre_attn_scalar^-½`).
    pub attn_scale: f32,
    /// The scale is applied to the queries before attention, which then scales scores
    /// by 1: llama.cpp's Gemma 3 graph (`ggml_scale(Qcur, f_attention_scale)` and
    /// `kq_scale = 1` in `src/models/gemma3.cpp`). Equal in exact arithmetic; it rounds
    /// differently where the query is converted to f16 (values that become f16
    /// subnormals once scaled). transformers scales the scores (`false`).
    pub q_prescaled: bool,
    /// q, k and v projections have biases (Qwen2).
    pub qkv_bias: bool,
    /// RMSNorm over each head of q and k before RoPE (Qwen3, Gemma 3).
    pub qk_norm: bool,
    /// RMSNorm on the attention and MLP outputs before the residual adds (Gemma 3's
    /// `post_attention_layernorm` / `post_feedforward_layernorm`).
    pub post_norms: bool,
    /// Embeddings are multiplied by this (Gemma: `√n_embd` rounded to the weights'
    /// dtype; transformers `Gemma3TextScaledWordEmbedding`).
    pub embed_scale: Option<f32>,
    /// Final logits `c · tanh(l / c)` (Gemma 2/3 `final_logit_softcapping`).
    pub final_softcap: Option<f32>,
    /// MoE layers.
    pub moe: Option<MoeSpec>,
    /// Element-wise numerics (GGUF: llama.cpp's, Hugging Face: transformers').
    pub numerics: Numerics,
}

impl ModelSpec {
    /// Width of the query projection, `n_head × head_dim`.
    pub fn q_dim(&self) -> usize {
        self.n_head * self.head_dim
    }

    /// Width of the key (and value) projection, `n_kv_head × head_dim`.
    pub fn kv_dim(&self) -> usize {
        self.n_kv_head * self.head_dim
    }

    /// KV cache bytes per token for an element size of `dtype_bytes`:
    /// `2 × layers × kv_heads × head_dim × dtype_bytes`.
    pub fn kv_bytes_per_token(&self, dtype_bytes: usize) -> usize {
        2 * self.n_layer * self.kv_dim() * dtype_bytes
    }

    /// Checks the numbers are consistent and within bounds.
    ///
    /// # Errors
    /// A [`SpecError`] naming the field for zero sizes, counts above the bounds, heads
    /// that do not divide, an odd or too large RoPE dimension, per-layer lists of the
    /// wrong length, or MoE counts out of range; each source names its own key for it.
    pub fn check(&self) -> Result<(), SpecError> {
        self.check_inner()
            .map_err(|(field, message)| SpecError { field, message })
    }

    fn check_inner(&self) -> Result<(), (SpecField, String)> {
        use SpecField as F;
        let nonzero = [
            (F::Layers, "layers", self.n_layer),
            (F::Hidden, "hidden size", self.n_embd),
            (F::Heads, "attention heads", self.n_head),
            (F::KvHeads, "key/value heads", self.n_kv_head),
            (F::HeadDim, "head_dim", self.head_dim),
            (F::Ffn, "intermediate size", self.n_ff),
            (F::Vocab, "vocabulary", self.vocab_size),
            (F::Context, "context length", self.context_length),
        ];
        if let Some((f, what, _)) = nonzero.iter().find(|(_, _, v)| *v == 0) {
            return Err((*f, format!("{what} must be > 0")));
        }
        // Bounds well above every released model, so that no count in a file can drive
        // an allocation or overflow the arithmetic of the shapes.
        let limits = [
            MAX_LAYERS,
            1 << 17,
            1 << 12,
            1 << 12,
            1 << 12,
            1 << 20,
            1 << 22,
            1 << 21,
        ];
        if let Some(((f, what, v), max)) =
            nonzero.iter().zip(limits).find(|((_, _, v), max)| v > max)
        {
            return Err((*f, format!("{what} is {v}, above the supported {max}")));
        }
        if !self.n_head.is_multiple_of(self.n_kv_head) {
            return Err((
                F::KvHeads,
                format!(
                    "attention heads ({}) must be a multiple of key/value heads ({})",
                    self.n_head, self.n_kv_head
                ),
            ));
        }
        let r = self.rope.dim;
        if r == 0 || r > self.head_dim || !r.is_multiple_of(2) {
            return Err((
                F::RopeDim,
                format!(
                    "RoPE dimension must be even and in [2, {}] (got {r})",
                    self.head_dim
                ),
            ));
        }
        if let RopeScaling::Factors { factors, .. } = &self.rope.scaling {
            if factors.len() != r / 2 {
                return Err((
                    F::RopeScaling,
                    format!(
                        "RoPE factors: {} values, the RoPE dimension {r} needs {}",
                        factors.len(),
                        r / 2
                    ),
                ));
            }
        }
        if self.window.len() != self.n_layer {
            return Err((
                F::Window,
                format!(
                    "sliding-window list has {} entries for {} layers",
                    self.window.len(),
                    self.n_layer
                ),
            ));
        }
        for w in self.window.iter().flatten() {
            if *w == 0 {
                return Err((F::Window, "a sliding window of 0 tokens".into()));
            }
        }
        if !self.norm_eps.is_finite() || self.norm_eps < 0.0 {
            return Err((
                F::NormEps,
                format!(
                    "RMSNorm epsilon {} is not a finite number ≥ 0",
                    self.norm_eps
                ),
            ));
        }
        if !(self.rope.theta.is_finite() && self.rope.theta > 0.0) {
            return Err((
                F::RopeTheta,
                format!("RoPE base {} is not a finite number > 0", self.rope.theta),
            ));
        }
        if let Some(m) = &self.moe {
            if m.n_expert == 0 || m.n_expert_used == 0 || m.n_expert_used > m.n_expert {
                return Err((
                    F::Experts,
                    format!(
                        "experts: {} used of {} (need 1 ≤ used ≤ experts)",
                        m.n_expert_used, m.n_expert
                    ),
                ));
            }
            if m.n_expert > 1 << 12 || m.n_ff_expert > 1 << 20 {
                return Err((
                    F::Experts,
                    format!(
                        "{} experts of width {}: above the supported 4096 experts of 1048576",
                        m.n_expert, m.n_ff_expert
                    ),
                ));
            }
            if m.n_ff_expert == 0 || m.layers.len() != self.n_layer {
                return Err((
                    F::Experts,
                    "expert MLP width is 0 or the MoE layer list is wrong".into(),
                ));
            }
        }
        Ok(())
    }

    /// The identity of the K/V values this spec computes, for the prefix-store
    /// fingerprint: every field that changes a layer's K or V given the same tokens.
    pub fn fingerprint_text(&self) -> String {
        format!("{self:?}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    pub(crate) fn llama_like() -> ModelSpec {
        ModelSpec {
            architecture: Architecture::Llama,
            n_layer: 2,
            n_embd: 64,
            n_head: 4,
            n_kv_head: 2,
            head_dim: 16,
            n_ff: 128,
            vocab_size: 1024,
            context_length: 512,
            norm_eps: 1e-6,
            rope: RopeSpec {
                style: RopeStyle::Neox,
                dim: 16,
                theta: 1e4,
                local_theta: None,
                scaling: RopeScaling::None,
                mrope_section: None,
            },
            activation: Activation::Silu,
            window: vec![None; 2],
            attn_scale: 0.25,
            q_prescaled: false,
            qkv_bias: false,
            qk_norm: false,
            post_norms: false,
            embed_scale: None,
            final_softcap: None,
            moe: None,
            numerics: Numerics::Transformers,
        }
    }

    #[test]
    fn check_names_the_inconsistency() {
        assert_eq!(llama_like().check(), Ok(()));
        let msg = |s: &ModelSpec| s.check().map_err(|e| e.message);
        let mut s = llama_like();
        s.n_kv_head = 3;
        assert_eq!(
            msg(&s),
            Err("attention heads (4) must be a multiple of key/value heads (3)".into())
        );
        let mut s = llama_like();
        s.rope.dim = 17;
        assert_eq!(
            msg(&s),
            Err("RoPE dimension must be even and in [2, 16] (got 17)".into())
        );
        let mut s = llama_like();
        s.window = vec![None];
        assert_eq!(
            msg(&s),
            Err("sliding-window list has 1 entries for 2 layers".into())
        );
        let mut s = llama_like();
        s.vocab_size = 0;
        assert_eq!(
            s.check(),
            Err(SpecError {
                field: SpecField::Vocab,
                message: "vocabulary must be > 0".into()
            })
        );
    }

    #[test]
    fn architectures_round_trip_their_names() {
        for a in [
            Architecture::Llama,
            Architecture::Qwen2,
            Architecture::Qwen3,
            Architecture::Qwen3Moe,
            Architecture::Gemma3,
            Architecture::Phi3,
        ] {
            assert_eq!(Architecture::from_gguf(a.name()), Some(a));
        }
        assert_eq!(
            Architecture::from_hf("MistralForCausalLM"),
            Some(Architecture::Llama)
        );
        assert_eq!(Architecture::from_gguf("falcon"), None);
    }
}
