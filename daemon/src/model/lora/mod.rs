//! LoRA adapters (Hu et al. 2021, "LoRA: Low-Rank Adaptation of Large Language
//! Models"): per adapted projection a pair `A (r, in)`, `B (out, r)`, and the output
//! `y = x · Wᵀ + s · (x · Aᵀ) · Bᵀ`. Loaded from a PEFT directory ([`peft`]) or a GGUF
//! adapter as llama.cpp writes it ([`gguf`]); checked against the base model's
//! projection shapes at load; applied per batch row ([`apply`]), so one batch mixes
//! adapters over the shared base products (S-LoRA, Sheng et al. 2023; Punica).
//!
//! The scale `s`: PEFT's `scaling = lora_alpha / r` (`lora_alpha / √r` with
//! `use_rslora`; `peft/tuners/lora/layer.py`) times the request's scale; llama.cpp's
//! `adapter_scale · alpha / rank` with `rank = B.ne[0]`, or the request's scale alone
//! when `alpha` is 0 (`llama_adapter_lora_weight::get_scale`, `src/llama-adapter.h`).
//! The delta is scaled after `B` and then added, as both do.

pub mod apply;
pub mod gguf;
pub mod peft;

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use candle_core::Device;

use super::layers::Site;
use super::matrix::{Matrix, RawMatrix};
use super::spec::{Architecture, RopeStyle};
use super::Model;

pub use apply::{AdapterUse, RowAdapters};

/// What an adapter is checked against and built for: the base model's shapes and
/// device (a snapshot, so adapters load on any thread while the model runs).
#[derive(Debug, Clone)]
pub struct LoraBase {
    /// The base's architecture (a GGUF adapter names its own).
    pub architecture: Architecture,
    /// Transformer blocks.
    pub n_layer: usize,
    /// Whether the MLP is a mixture of experts (its experts take no adapter).
    pub moe: bool,
    /// Whether q/k rows are in GGUF's interleaved-RoPE order (Llama-family GGUF).
    pub rope_interleaved: bool,
    /// Query heads.
    pub n_head: usize,
    /// Key/value heads.
    pub n_kv_head: usize,
    /// `(out, in)` of every adaptable projection.
    pub sites: HashMap<Site, (usize, usize)>,
    /// Where the adapter's matrices go.
    pub device: Device,
}

impl LoraBase {
    /// The snapshot of `model`.
    pub fn of(model: &Model) -> Self {
        let s = model.spec();
        Self {
            architecture: s.architecture,
            n_layer: s.n_layer,
            moe: s.moe.is_some(),
            rope_interleaved: s.rope.style == RopeStyle::Interleaved,
            n_head: s.n_head,
            n_kv_head: s.n_kv_head,
            sites: model.site_shapes(),
            device: model.device().clone(),
        }
    }
}

/// A load or fit failure, always naming the adapter; one line.
#[derive(Debug, Clone, thiserror::Error, PartialEq, Eq)]
#[error("LoRA adapter `{adapter}`: {message}")]
pub struct LoraError {
    /// The adapter's name (as the operator gave it).
    pub adapter: String,
    /// What is wrong, naming the file, key or tensor and the values.
    pub message: String,
}

/// Which file format an adapter came from; decides the scale formula.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LoraFormat {
    /// A PEFT directory: `lora_alpha / r` (or `/ √r`, rsLoRA).
    Peft {
        /// `use_rslora`.
        rslora: bool,
    },
    /// A llama.cpp GGUF adapter: `alpha / rank`, or 1 when `alpha` is 0.
    Gguf,
}

/// One adapted projection: `A (r, in)` and `B (out, r)`, as matrices on the model's
/// device (their stored type kept: F32/F16/BF16/Q8_0).
#[derive(Debug)]
pub struct LoraPair {
    /// Down-projection `(r, in)`.
    pub a: Matrix,
    /// Up-projection `(out, r)`.
    pub b: Matrix,
}

/// A loaded adapter: its pairs by site and how to scale them.
#[derive(Debug)]
pub struct LoraAdapter {
    /// The name requests use.
    pub name: String,
    /// Where it was loaded from.
    pub path: PathBuf,
    /// Its format.
    pub format: LoraFormat,
    /// Rank `r`.
    pub rank: usize,
    /// `lora_alpha` (PEFT) or `adapter.lora.alpha` (GGUF).
    pub alpha: f32,
    /// The adapted projections.
    pub pairs: HashMap<Site, LoraPair>,
}

impl LoraAdapter {
    /// Loads `path` (a PEFT directory, or a GGUF file) as adapter `name` for `model`,
    /// checking that it fits: architecture (GGUF), layers, every pair's shapes against
    /// the projection it adapts, and the rank against `max_rank` when given.
    ///
    /// # Errors
    /// An unreadable or damaged file, a key or feature this build does not implement,
    /// or an adapter that does not fit the model; the message names the adapter, the
    /// file, key or tensor, and the values.
    pub fn load(
        name: &str,
        path: &Path,
        base: &LoraBase,
        max_rank: Option<usize>,
    ) -> Result<Self, LoraError> {
        let parts = if path.is_dir() {
            peft::read(name, path, base)?
        } else {
            gguf::read(name, path, base)?
        };
        if let Some(max) = max_rank {
            if parts.rank > max {
                return Err(LoraError {
                    adapter: name.into(),
                    message: format!(
                        "rank {} exceeds lora.max_rank = {max} ({})",
                        parts.rank,
                        path.display()
                    ),
                });
            }
        }
        let device = &base.device;
        let mut pairs = HashMap::with_capacity(parts.pairs.len());
        for (site, (a, b)) in parts.pairs {
            let build = |m: RawMatrix| {
                Matrix::build(m, super::MatrixPolicy::default(), device).map_err(|e| LoraError {
                    adapter: name.into(),
                    message: format!(
                        "layer {} {:?}: {}",
                        site.layer,
                        site.proj,
                        super::candle_error_message(&e)
                    ),
                })
            };
            pairs.insert(
                site,
                LoraPair {
                    a: build(a)?,
                    b: build(b)?,
                },
            );
        }
        Ok(Self {
            name: name.into(),
            path: path.to_path_buf(),
            format: parts.format,
            rank: parts.rank,
            alpha: parts.alpha,
            pairs,
        })
    }

    /// The factor the delta `B(A x)` is multiplied by for a request scale `s` (see the
    /// module docs), computed in the order of the format's own code.
    pub fn scale(&self, s: f32) -> f32 {
        let r = self.rank as f32;
        match self.format {
            // llama.cpp: `adapter_scale * alpha / rank` in f32.
            LoraFormat::Gguf if self.alpha != 0.0 => s * self.alpha / r,
            LoraFormat::Gguf => s,
            // PEFT: `scale * lora_alpha / r` in Python floats (f64), then the f32 delta
            // times that number.
            LoraFormat::Peft { rslora } => {
                let r = f64::from(r);
                let div = if rslora { r.sqrt() } else { r };
                (f64::from(s) * f64::from(self.alpha) / div) as f32
            }
        }
    }
}

/// Raw `(A, B)` pairs by site.
pub(super) type SitePairs = Vec<(Site, (RawMatrix, RawMatrix))>;

/// What a format reader hands back: raw pairs already split per site and checked
/// against the model's shapes.
pub(super) struct RawAdapter {
    pub format: LoraFormat,
    pub rank: usize,
    pub alpha: f32,
    pub pairs: SitePairs,
}

/// Checks one raw pair against the model's projection at `site` and splits a pair
/// over a fused tensor (`B` rows per part, `A` shared) into one pair per part site.
///
/// `parts`: the sites the file's tensor covers, in row order (one for a plain
/// projection; Q, K, V for Phi-3's `qkv_proj`; gate, up for its `gate_up_proj`).
pub(super) fn fit_pair(
    adapter: &str,
    tensor: &str,
    base: &LoraBase,
    parts: &[Site],
    a: RawMatrix,
    b: RawMatrix,
    rank: usize,
) -> Result<SitePairs, LoraError> {
    let err = |message: String| LoraError {
        adapter: adapter.into(),
        message: format!("tensor `{tensor}`: {message}"),
    };
    let shapes = &base.sites;
    let mut widths = Vec::with_capacity(parts.len());
    let mut input = None;
    for s in parts {
        let Some(&(out, inp)) = shapes.get(s) else {
            return Err(err(format!(
                "the base model has no adaptable {:?} projection in layer {} ({} layers{})",
                s.proj,
                s.layer,
                base.n_layer,
                if base.moe {
                    "; the MoE experts and router take no adapter"
                } else {
                    ""
                }
            )));
        };
        widths.push(out);
        input = Some(inp);
    }
    let total: usize = widths.iter().sum();
    let input = input.unwrap_or(0);
    let dims = |m: &RawMatrix| m.dims().map_err(|e| err(super::candle_error_message(&e)));
    let (ar, ai) = dims(&a)?;
    let (bo, br) = dims(&b)?;
    if ar != rank || br != rank {
        return Err(err(format!(
            "rank {ar} (A) and {br} (B) where the adapter's rank is {rank}"
        )));
    }
    if ai != input || bo != total {
        return Err(err(format!(
            "A (r, in) × B (out, r) adapt a ({total}, {input}) matrix, but the adapter's are \
             A ({ar}, {ai}) and B ({bo}, {br})"
        )));
    }
    if parts.len() == 1 {
        return Ok(vec![(parts[0], (a, b))]);
    }
    let bs = b
        .split_rows(&widths)
        .map_err(|e| err(super::candle_error_message(&e)))?;
    let mut out = Vec::with_capacity(parts.len());
    for (s, bp) in parts.iter().zip(bs) {
        let ap = a
            .try_clone()
            .map_err(|e| err(super::candle_error_message(&e)))?;
        out.push((*s, (ap, bp)));
    }
    Ok(out)
}

#[cfg(test)]
mod fuzz_tests;
#[cfg(test)]
pub(crate) mod tests;
