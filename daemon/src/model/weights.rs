//! The one internal weight layout every source maps onto, and the builder that reads it
//! from a [`WeightSource`] for a [`ModelSpec`]. Tensor roles ([`Role`]) name what a
//! tensor is, not how a file spells it; the sources own the spelling.

use candle_core::{Device, Tensor};

use super::layers::{Linear, Part, Proj, Site};
use super::matrix::{Matrix, MatrixPolicy, RawMatrix};
use super::spec::ModelSpec;
use super::ModelError;

pub use super::layers::Projection;

/// What a tensor is, independent of the file format.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// Token embeddings `(vocab, n_embd)`.
    TokenEmbd,
    /// Output head `(vocab, n_embd)` (absent when tied to the embeddings).
    Output,
    /// Final norm `(n_embd)`.
    OutputNorm,
    /// Per-layer tensors.
    Layer(usize, LayerRole),
    /// Expert `e` of a layer's MoE MLP.
    Expert(usize, usize, ExpertRole),
}

/// Tensors of one transformer block.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LayerRole {
    /// Norm before attention `(n_embd)`.
    AttnNorm,
    /// Query projection `(q_dim, n_embd)`.
    Q,
    /// Key projection `(kv_dim, n_embd)`.
    K,
    /// Value projection `(kv_dim, n_embd)`.
    V,
    /// Query, key and value stacked `(q_dim + 2 kv_dim, n_embd)` (Phi-3's `qkv_proj`).
    Qkv,
    /// Biases `(q_dim)`, `(kv_dim)`, `(kv_dim)`.
    QBias,
    /// Key bias.
    KBias,
    /// Value bias.
    VBias,
    /// Per-head query norm `(head_dim)`.
    QNorm,
    /// Per-head key norm `(head_dim)`.
    KNorm,
    /// Attention output `(n_embd, q_dim)`.
    AttnOutput,
    /// Norm of the attention output before the residual add (Gemma).
    PostAttnNorm,
    /// Norm before the MLP `(n_embd)`.
    FfnNorm,
    /// Norm of the MLP output before the residual add (Gemma).
    PostFfnNorm,
    /// Gate `(n_ff, n_embd)`.
    Gate,
    /// Up `(n_ff, n_embd)`.
    Up,
    /// Gate and up stacked `(2 n_ff, n_embd)` (Phi-3's `gate_up_proj`).
    GateUp,
    /// Down `(n_embd, n_ff)`.
    Down,
    /// MoE router `(n_expert, n_embd)`.
    Router,
}

/// Tensors of one expert.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExpertRole {
    /// Gate `(n_ff_expert, n_embd)`.
    Gate,
    /// Up `(n_ff_expert, n_embd)`.
    Up,
    /// Down `(n_embd, n_ff_expert)`.
    Down,
}

/// A file format's view of its tensors.
pub trait WeightSource {
    /// The tensor's name in the file (for messages), or `None` if the format has no
    /// tensor for that role.
    fn name(&self, role: Role) -> Option<String>;
    /// Whether the file holds the role's tensor.
    fn has(&self, role: Role) -> bool;
    /// The matrix for `role`, checked to be `(rows, cols)`.
    ///
    /// # Errors
    /// Missing, mis-shaped or unreadable.
    fn matrix(&mut self, role: Role, rows: usize, cols: usize) -> Result<RawMatrix, ModelError>;
    /// The vector for `role` as f32, checked to be `len` long, with the source's
    /// convention applied (Gemma's `1 + w` on Hugging Face norms).
    ///
    /// # Errors
    /// Missing, mis-shaped or unreadable.
    fn vector(&mut self, role: Role, len: usize) -> Result<Vec<f32>, ModelError>;
}

/// A 1-D weight (norm or bias), on the host and as a device tensor.
#[derive(Debug)]
pub struct Vector {
    /// Values on the host, for the CPU path.
    pub host: Vec<f32>,
    /// The same values on the model's device, for the tensor path.
    pub tensor: Tensor,
}

impl Vector {
    fn new(host: Vec<f32>, device: &Device) -> Result<Self, ModelError> {
        let tensor = Tensor::from_slice(&host, host.len(), device)?;
        Ok(Self { host, tensor })
    }
}

/// The MoE MLP of one layer.
#[derive(Debug)]
pub struct MoeWeights {
    /// Router `(n_expert, n_embd)`.
    pub router: Linear,
    /// Per expert: gate/up and down.
    pub experts: Vec<(Projection, Linear)>,
}

/// A layer's MLP.
#[derive(Debug)]
pub enum Ffn {
    /// Gated dense MLP: gate/up, then down.
    Dense {
        /// Gate and up.
        gate_up: Projection,
        /// Down.
        down: Linear,
    },
    /// Mixture of experts.
    Moe(MoeWeights),
}

/// One transformer block's weights.
#[derive(Debug)]
pub struct LayerWeights {
    /// Norm before attention.
    pub attn_norm: Vector,
    /// q, k, v.
    pub qkv: Projection,
    /// q, k, v biases.
    pub qkv_bias: Option<[Vector; 3]>,
    /// Per-head q and k norms.
    pub qk_norm: Option<[Vector; 2]>,
    /// Attention output.
    pub attn_output: Linear,
    /// Norm of the attention output (Gemma).
    pub post_attn_norm: Option<Vector>,
    /// Norm before the MLP.
    pub ffn_norm: Vector,
    /// The MLP.
    pub ffn: Ffn,
    /// Norm of the MLP output (Gemma).
    pub post_ffn_norm: Option<Vector>,
}

/// Where embedding rows are read from.
#[derive(Debug)]
pub enum Embedding {
    /// Its own matrix (kept in the stored type; rows dequantized on lookup).
    Own(Matrix),
    /// The output head's rows (tied embeddings, one copy).
    Output,
}

/// All weights of a model, in the internal layout.
#[derive(Debug)]
pub struct Weights {
    /// Token embeddings.
    pub embedding: Embedding,
    /// Blocks.
    pub layers: Vec<LayerWeights>,
    /// Final norm.
    pub output_norm: Vector,
    /// Output head `(vocab, n_embd)`.
    pub output: Linear,
}

impl Weights {
    /// `(out, in)` of every projection an adapter may target, by site (the MoE
    /// experts, the router and the output head have none).
    pub fn site_shapes(&self) -> std::collections::HashMap<Site, (usize, usize)> {
        let mut out = std::collections::HashMap::new();
        let mut add = |l: &Linear| {
            let (_, k) = l.dims();
            for p in &l.parts {
                if let Some(s) = p.site {
                    out.insert(s, (p.width, k));
                }
            }
        };
        for w in &self.layers {
            w.qkv.0.iter().for_each(&mut add);
            add(&w.attn_output);
            if let Ffn::Dense { gate_up, down } = &w.ffn {
                gate_up.0.iter().for_each(&mut add);
                add(down);
            }
        }
        out
    }

    /// The matrix embedding rows come from.
    pub fn embedding_matrix(&self) -> &Matrix {
        match &self.embedding {
            Embedding::Own(m) => m,
            Embedding::Output => &self.output.base,
        }
    }
}

/// Reads every weight `spec` needs from `src`.
///
/// # Errors
/// The first missing, mis-shaped or unreadable tensor, named as the file names it.
pub fn build<S: WeightSource>(
    src: &mut S,
    spec: &ModelSpec,
    policy: MatrixPolicy,
    device: &Device,
) -> Result<Weights, ModelError> {
    let e = spec.n_embd;
    let mut b = Builder {
        src,
        policy,
        device,
    };
    let output_norm = b.vector(Role::OutputNorm, e)?;
    let vocab = spec.vocab_size;
    let (embedding, output) = if b.src.has(Role::Output) {
        let out = Linear::single(b.matrix(Role::Output, vocab, e)?, None);
        let raw = b.src.matrix(Role::TokenEmbd, vocab, e)?;
        (Embedding::Own(lookup_matrix(raw, device)?), out)
    } else {
        let out = Linear::single(b.matrix(Role::TokenEmbd, vocab, e)?, None);
        if device.is_cpu() && out.base.rows_readable() {
            (Embedding::Output, out)
        } else {
            // Some CPU layouts cannot hand out rows, and a device copy would be read back
            // whole for each lookup: keep a host copy for lookups.
            let raw = b.src.matrix(Role::TokenEmbd, vocab, e)?;
            (Embedding::Own(lookup_matrix(raw, device)?), out)
        }
    };
    let layers = (0..spec.n_layer)
        .map(|l| b.layer(spec, l))
        .collect::<Result<Vec<_>, _>>()?;
    Ok(Weights {
        embedding,
        layers,
        output_norm,
        output,
    })
}

/// An embedding matrix for row lookups, on the host: quantized types stay in their ggml
/// blocks, so a 262k-row vocabulary is never expanded to f32; rows are dequantized on
/// the host (ggml's `dequantize_row_*`, what its `get_rows` does) and only they go to
/// the device.
fn lookup_matrix(raw: RawMatrix, device: &Device) -> Result<Matrix, ModelError> {
    Ok(match raw {
        RawMatrix::Quant(t) if inferd_kernels::CpuMatrix::supports(t.dtype()) => Matrix::Cpu(
            inferd_kernels::CpuMatrix::Ggml(inferd_kernels::GgmlMatrix::from_qtensor(&t)?),
        ),
        RawMatrix::Quant(t) => Matrix::Quant(candle_core::quantized::QMatMul::QTensor(
            std::sync::Arc::new(t),
        )),
        RawMatrix::Dense(t) => Matrix::Dense(t.to_device(device)?),
    })
}

struct Builder<'a, S> {
    src: &'a mut S,
    policy: MatrixPolicy,
    device: &'a Device,
}

impl<S: WeightSource> Builder<'_, S> {
    fn matrix(&mut self, role: Role, rows: usize, cols: usize) -> Result<Matrix, ModelError> {
        let raw = self.src.matrix(role, rows, cols)?;
        self.kernel(role, raw)
    }

    /// The matrix of `role` as a one-part linear layer, adaptable at its site.
    fn linear(&mut self, role: Role, rows: usize, cols: usize) -> Result<Linear, ModelError> {
        Ok(Linear::single(
            self.matrix(role, rows, cols)?,
            site_of(role),
        ))
    }

    fn kernel(&self, role: Role, raw: RawMatrix) -> Result<Matrix, ModelError> {
        Matrix::build(raw, self.policy, self.device).map_err(|e| ModelError::Tensor {
            name: self.src.name(role).unwrap_or_else(|| format!("{role:?}")),
            message: super::candle_error_message(&e),
        })
    }

    fn vector(&mut self, role: Role, len: usize) -> Result<Vector, ModelError> {
        let v = self.src.vector(role, len)?;
        Vector::new(v, self.device)
    }

    /// Parts stacked when the file already stores them fused (`fused`), else read
    /// one by one and fused when their types agree.
    fn projection(
        &mut self,
        fused: Option<Role>,
        parts: &[(Role, usize)],
        cols: usize,
    ) -> Result<Projection, ModelError> {
        let all: Vec<Part> = parts
            .iter()
            .map(|&(r, width)| Part {
                site: site_of(r),
                width,
            })
            .collect();
        if let Some(f) = fused.filter(|&f| self.src.has(f)) {
            let rows = all.iter().map(|p| p.width).sum();
            return Ok(Projection(vec![Linear {
                base: self.matrix(f, rows, cols)?,
                parts: all,
            }]));
        }
        let raws = parts
            .iter()
            .map(|&(r, w)| self.src.matrix(r, w, cols))
            .collect::<Result<Vec<_>, _>>()?;
        let first = parts[0].0;
        match RawMatrix::concat(raws).map_err(|e| ModelError::Tensor {
            name: self.src.name(first).unwrap_or_default(),
            message: super::candle_error_message(&e),
        })? {
            Ok(raw) => Ok(Projection(vec![Linear {
                base: self.kernel(first, raw)?,
                parts: all,
            }])),
            Err(raws) => Ok(Projection(
                raws.into_iter()
                    .zip(parts)
                    .map(|(raw, &(r, _))| Ok(Linear::single(self.kernel(r, raw)?, site_of(r))))
                    .collect::<Result<_, ModelError>>()?,
            )),
        }
    }

    fn layer(&mut self, spec: &ModelSpec, l: usize) -> Result<LayerWeights, ModelError> {
        let (e, q, kv, hd) = (spec.n_embd, spec.q_dim(), spec.kv_dim(), spec.head_dim);
        let r = |x| Role::Layer(l, x);
        use LayerRole as L;
        let qkv = self.projection(
            Some(r(L::Qkv)),
            &[(r(L::Q), q), (r(L::K), kv), (r(L::V), kv)],
            e,
        )?;
        let qkv_bias = if spec.qkv_bias {
            Some([
                self.vector(r(L::QBias), q)?,
                self.vector(r(L::KBias), kv)?,
                self.vector(r(L::VBias), kv)?,
            ])
        } else {
            None
        };
        let qk_norm = if spec.qk_norm {
            Some([self.vector(r(L::QNorm), hd)?, self.vector(r(L::KNorm), hd)?])
        } else {
            None
        };
        let post = |b: &mut Self, role| -> Result<Option<Vector>, ModelError> {
            if spec.post_norms {
                b.vector(r(role), e).map(Some)
            } else {
                Ok(None)
            }
        };
        let moe = spec.moe.as_ref().filter(|m| m.layers[l]);
        let ffn = match moe {
            None => Ffn::Dense {
                gate_up: self.projection(
                    Some(r(L::GateUp)),
                    &[(r(L::Gate), spec.n_ff), (r(L::Up), spec.n_ff)],
                    e,
                )?,
                down: self.linear(r(L::Down), e, spec.n_ff)?,
            },
            Some(m) => {
                let router = self.linear(r(L::Router), m.n_expert, e)?;
                let f = m.n_ff_expert;
                let experts = (0..m.n_expert)
                    .map(|x| {
                        let er = |k| Role::Expert(l, x, k);
                        Ok((
                            self.projection(
                                None,
                                &[(er(ExpertRole::Gate), f), (er(ExpertRole::Up), f)],
                                e,
                            )?,
                            self.linear(er(ExpertRole::Down), e, f)?,
                        ))
                    })
                    .collect::<Result<Vec<_>, ModelError>>()?;
                Ffn::Moe(MoeWeights { router, experts })
            }
        };
        Ok(LayerWeights {
            attn_norm: self.vector(r(L::AttnNorm), e)?,
            qkv,
            qkv_bias,
            qk_norm,
            attn_output: self.linear(r(L::AttnOutput), e, q)?,
            post_attn_norm: post(self, L::PostAttnNorm)?,
            ffn_norm: self.vector(r(L::FfnNorm), e)?,
            ffn,
            post_ffn_norm: post(self, L::PostFfnNorm)?,
        })
    }
}

/// The adapter site of a tensor role: the seven projections of a block (a file's fused
/// QKV or gate/up tensor is split into its parts' sites by the caller); none for the
/// rest.
fn site_of(role: Role) -> Option<Site> {
    let Role::Layer(layer, r) = role else {
        return None;
    };
    let proj = match r {
        LayerRole::Q => Proj::Q,
        LayerRole::K => Proj::K,
        LayerRole::V => Proj::V,
        LayerRole::AttnOutput => Proj::O,
        LayerRole::Gate => Proj::Gate,
        LayerRole::Up => Proj::Up,
        LayerRole::Down => Proj::Down,
        _ => return None,
    };
    Some(Site { layer, proj })
}
