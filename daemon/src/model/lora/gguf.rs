//! GGUF LoRA adapters as llama.cpp's `convert_lora_to_gguf.py` writes them and
//! `llama_adapter_lora_init` reads them (`src/llama-adapter.cpp`): `general.type =
//! "adapter"`, `adapter.type = "lora"`, `adapter.lora.alpha` (f32, 0 or absent: the
//! request's scale alone), `general.architecture` as the base's, and per adapted tensor
//! `<base name>.lora_a` (ggml ne `[n_in, r]`, a `(r, n_in)` matrix) and `.lora_b`
//! (ne `[r, n_out]`, `(n_out, r)`), each F32, F16, BF16 or Q8_0.
//!
//! Checked as llama.cpp checks them: both halves present, the same type family, rank
//! `A.ne[1] == B.ne[0]`, and `A.ne[0]`/`B.ne[1]` equal to the base tensor's `ne[0]`/
//! `ne[1]`. Phi-3's fused `attn_qkv` and `ffn_up` (gate and up) are split into their
//! parts' rows of `B`, `A` shared.

use std::fs::File;
use std::io::BufReader;
use std::path::Path;

use candle_core::quantized::gguf_file::{Content, Value};
use candle_core::quantized::GgmlDType;
use candle_core::Device;

use super::LoraBase;
use super::{fit_pair, LoraError, LoraFormat, RawAdapter};
use crate::model::candle_error_message;
use crate::model::layers::{Proj, Site};
use crate::model::matrix::RawMatrix;
use crate::model::source::{bounded, quote};
use crate::model::spec::Architecture;

/// The projections a base tensor name (`attn_q`, …) holds, in row order.
fn tensor_parts(arch: Architecture, name: &str) -> Option<&'static [Proj]> {
    Some(match name {
        "attn_q" => &[Proj::Q],
        "attn_k" => &[Proj::K],
        "attn_v" => &[Proj::V],
        "attn_qkv" => &[Proj::Q, Proj::K, Proj::V],
        "attn_output" => &[Proj::O],
        "ffn_gate" => &[Proj::Gate],
        // Phi-3's `ffn_up` holds gate and up stacked.
        "ffn_up" if arch == Architecture::Phi3 => &[Proj::Gate, Proj::Up],
        "ffn_up" => &[Proj::Up],
        "ffn_down" => &[Proj::Down],
        _ => return None,
    })
}

/// Largest adapter matrix read, values (a rank-4096 adapter of a 262,144-wide
/// projection).
const MAX_ELEMENTS: usize = 1 << 30;

const SUPPORTED_TENSORS: &str =
    "attn_q, attn_k, attn_v, attn_qkv, attn_output, ffn_gate, ffn_up, ffn_down";

fn string(md: &std::collections::HashMap<String, Value>, key: &str) -> Option<String> {
    match md.get(key) {
        Some(Value::String(s)) => Some(s.clone()),
        Some(v) => Some(format!("{v:?}")),
        None => None,
    }
}

/// Reads and checks the GGUF adapter `path` against `model`.
pub(super) fn read(adapter: &str, path: &Path, lb: &LoraBase) -> Result<RawAdapter, LoraError> {
    let shown = path.display().to_string();
    let err = |message: String| LoraError {
        adapter: adapter.into(),
        message: format!("{shown}: {message}"),
    };
    let file = File::open(path).map_err(|e| err(format!("cannot read it: {e}")))?;
    let mut reader = BufReader::new(file);
    let content = Content::read(&mut reader).map_err(|e| {
        err(format!(
            "not a valid GGUF file: {}",
            quote(&candle_error_message(&e))
        ))
    })?;
    let md = &content.metadata;
    match string(md, "general.type").as_deref() {
        Some("adapter") => {}
        Some(t) => {
            return Err(err(format!(
                "general.type is {}, not \"adapter\" (a model file, not a LoRA adapter?)",
                quote(t)
            )))
        }
        None => return Err(err("general.type is missing (not a GGUF adapter)".into())),
    }
    match string(md, "adapter.type").as_deref() {
        Some("lora") => {}
        other => {
            return Err(err(format!(
                "adapter.type is {}; only \"lora\" adapters are implemented",
                other.map_or("missing".into(), quote)
            )))
        }
    }
    if md.contains_key("adapter.alora.invocation_tokens") {
        return Err(err(
            "adapter.alora.invocation_tokens: activated LoRA (aLoRA) is not implemented".into(),
        ));
    }
    let base = lb.architecture;
    let arch = string(md, "general.architecture").unwrap_or_default();
    if Architecture::from_gguf(&arch) != Some(base) {
        return Err(err(format!(
            "general.architecture is {}, but the base model is {}",
            quote(&arch),
            base.name()
        )));
    }
    let alpha = match md.get("adapter.lora.alpha") {
        None => 0.0,
        Some(v) => v.to_f32().ok().filter(|a| a.is_finite()).ok_or_else(|| {
            err(format!(
                "adapter.lora.alpha is {}, not a finite float",
                quote(&format!("{v:?}"))
            ))
        })?,
    };
    // Pair the halves per base tensor, in a stable order.
    let mut names: Vec<&String> = content.tensor_infos.keys().collect();
    names.sort();
    let mut bases: Vec<(usize, String, String)> = Vec::new();
    for name in names {
        let q = quote(name);
        let Some(base_name) = name
            .strip_suffix(".weight.lora_a")
            .or_else(|| name.strip_suffix(".weight.lora_b"))
        else {
            return Err(err(format!(
                "tensor {q} is not a .lora_a or .lora_b tensor"
            )));
        };
        let Some((layer, proj)) = base_name
            .strip_prefix("blk.")
            .and_then(|r| r.split_once('.'))
            .and_then(|(l, p)| Some((l.parse::<usize>().ok()?, p)))
        else {
            return Err(err(format!(
                "tensor {q} adapts `{}`, which inferd does not implement (supported: \
                 blk.N.{{{SUPPORTED_TENSORS}}})",
                bounded(base_name)
            )));
        };
        if tensor_parts(base, proj).is_none() {
            return Err(err(format!(
                "tensor {q} adapts `{}`, which inferd does not implement (supported: {SUPPORTED_TENSORS})",
                bounded(proj)
            )));
        }
        if !bases.iter().any(|(l, p, _)| *l == layer && p == proj) {
            bases.push((layer, proj.to_string(), base_name.to_string()));
        }
    }
    if bases.is_empty() {
        return Err(err("holds no LoRA tensors".into()));
    }
    let mut rank = None;
    let mut pairs = Vec::new();
    for (layer, proj, base_name) in bases {
        let mut half = |suffix: &str| -> Result<(RawMatrix, GgmlDType), LoraError> {
            let name = format!("{base_name}.weight.{suffix}");
            let Some(info) = content.tensor_infos.get(&name) else {
                return Err(err(format!(
                    "tensor `{base_name}.weight` has no .{suffix} half"
                )));
            };
            let ty = info.ggml_dtype;
            if !matches!(
                ty,
                GgmlDType::F32 | GgmlDType::F16 | GgmlDType::BF16 | GgmlDType::Q8_0
            ) {
                return Err(err(format!(
                    "tensor `{name}` has type {ty:?} (llama.cpp's adapters are F32, F16, BF16 or Q8_0)"
                )));
            }
            let dims = info.shape.dims();
            // Checked before candle counts the elements (a damaged header's dimensions
            // may overflow the product).
            let elems = dims.iter().try_fold(1usize, |a, &d| a.checked_mul(d));
            if dims.len() != 2 || elems.is_none_or(|e| e > MAX_ELEMENTS) {
                return Err(err(format!(
                    "tensor `{name}` has shape {dims:?}, not a matrix of at most {MAX_ELEMENTS} values"
                )));
            }
            let t = content
                .tensor(&mut reader, &name, &Device::Cpu)
                .map_err(|e| {
                    err(format!(
                        "tensor `{name}`: {}",
                        quote(&candle_error_message(&e))
                    ))
                })?;
            Ok((RawMatrix::Quant(t), ty))
        };
        let (a, _) = half("lora_a")?;
        let (b, _) = half("lora_b")?;
        let (r, _) = a.dims().map_err(|e| err(candle_error_message(&e)))?;
        let r = *rank.get_or_insert(r);
        let sites: Vec<Site> = tensor_parts(base, &proj)
            .unwrap_or(&[])
            .iter()
            .map(|&p| Site { layer, proj: p })
            .collect();
        pairs.extend(
            fit_pair(adapter, &format!("{base_name}.weight"), lb, &sites, a, b, r).map_err(
                |e| LoraError {
                    adapter: e.adapter,
                    message: format!("{shown}: {}", e.message),
                },
            )?,
        );
    }
    Ok(RawAdapter {
        format: LoraFormat::Gguf,
        rank: rank.unwrap_or(0),
        alpha,
        pairs,
    })
}
