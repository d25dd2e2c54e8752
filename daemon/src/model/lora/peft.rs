//! PEFT LoRA directories: `adapter_config.json` and `adapter_model.safetensors` as
//! `PeftModel.save_pretrained` writes them (`peft/tuners/lora/config.py`,
//! `peft/utils/save_and_load.py`). Tensors are named
//! `base_model.model.<module>.lora_A.weight` `(r, in)` and `….lora_B.weight` `(out, r)`,
//! `<module>` the base model's module path (`model.layers.N.self_attn.q_proj`).
//!
//! Read: `peft_type`, `r`, `lora_alpha`, `use_rslora`, `target_modules` (a list of
//! names, matched as the last components of the module path, or one regular
//! expression matched against the whole path as Python's `re.fullmatch`),
//! `layers_to_transform`, `fan_in_fan_out` (PEFT resets it to false for `nn.Linear`
//! layers, the only kind these architectures adapt; it does not change the forward).
//! Refused, naming the key: DoRA (`use_dora`), `lora_bias`, `bias` other than `"none"`,
//! `modules_to_save`, `rank_pattern`, `alpha_pattern`, `target_parameters`,
//! `layer_replication`, `trainable_token_indices`, aLoRA invocation tokens, and
//! embedding or output-head targets.

use std::path::Path;

use candle_core::{DType, Device};
use serde_json::Value;

use super::LoraBase;
use super::{fit_pair, LoraError, LoraFormat, RawAdapter};
use crate::model::layers::{Proj, Site};
use crate::model::matrix::RawMatrix;
use crate::model::source::{quote, read_bounded};

/// Largest `adapter_config.json` read, bytes.
const MAX_CONFIG_BYTES: u64 = 1 << 20;

/// What a module name adapts: one site kind, or a fused tensor's parts in row order.
fn module_parts(name: &str) -> Option<&'static [Proj]> {
    Some(match name {
        "q_proj" => &[Proj::Q],
        "k_proj" => &[Proj::K],
        "v_proj" => &[Proj::V],
        "o_proj" => &[Proj::O],
        "gate_proj" => &[Proj::Gate],
        "up_proj" => &[Proj::Up],
        "down_proj" => &[Proj::Down],
        "qkv_proj" => &[Proj::Q, Proj::K, Proj::V],
        "gate_up_proj" => &[Proj::Gate, Proj::Up],
        _ => return None,
    })
}

const SUPPORTED_MODULES: &str =
    "q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj, qkv_proj, gate_up_proj";

/// `target_modules` as PEFT matches it (`check_target_module_exists`).
enum Targets {
    Names(Vec<String>),
    Regex(regex::Regex),
}

impl Targets {
    fn matches(&self, module: &str) -> bool {
        match self {
            Targets::Names(n) => n
                .iter()
                .any(|t| module == t || module.ends_with(&format!(".{t}"))),
            Targets::Regex(r) => r.is_match(module),
        }
    }
}

/// The adapter's settings from `adapter_config.json`.
struct Config {
    r: usize,
    alpha: f32,
    rslora: bool,
    targets: Targets,
    layers: Option<Vec<usize>>,
}

fn config(adapter: &str, path: &Path) -> Result<Config, LoraError> {
    let err = |message: String| LoraError {
        adapter: adapter.into(),
        message: format!("{}: {message}", path.display()),
    };
    let bytes = read_bounded(path, MAX_CONFIG_BYTES).map_err(|e| err(e.to_string()))?;
    let v: Value =
        serde_json::from_slice(&bytes).map_err(|e| err(format!("not valid JSON: {e}")))?;
    let Some(obj) = v.as_object() else {
        return Err(err("not a JSON object".into()));
    };
    // The JSON text of a value (strings keep their quotes), cut after 120 characters.
    let shown = |v: &Value| {
        let t = v.to_string();
        match t.char_indices().nth(120) {
            Some((at, _)) => format!("{}…", &t[..at]),
            None => t,
        }
    };
    if let Some(t) = obj.get("peft_type").filter(|t| !t.is_null()) {
        if t.as_str() != Some("LORA") {
            return Err(err(format!(
                "peft_type is {}; only \"LORA\" adapters are implemented",
                shown(t)
            )));
        }
    }
    // Features that change the forward and are not implemented: refused by key.
    let truthy = |k: &str| match obj.get(k) {
        None | Some(Value::Null) | Some(Value::Bool(false)) => false,
        Some(Value::Array(a)) => !a.is_empty(),
        Some(Value::Object(o)) => !o.is_empty(),
        Some(Value::String(s)) => !s.is_empty(),
        Some(_) => true,
    };
    for key in [
        "use_dora",
        "lora_bias",
        "modules_to_save",
        "rank_pattern",
        "alpha_pattern",
        "target_parameters",
        "layer_replication",
        "trainable_token_indices",
        "alora_invocation_tokens",
    ] {
        if truthy(key) {
            return Err(err(format!(
                "{key} = {} is not implemented (only plain LoRA on the attention and MLP \
                 projections is)",
                shown(&obj[key])
            )));
        }
    }
    if let Some(b) = obj.get("bias").filter(|b| !b.is_null()) {
        if b.as_str() != Some("none") {
            return Err(err(format!(
                "bias = {} is not implemented (only \"none\")",
                shown(b)
            )));
        }
    }
    let r = match obj.get("r").and_then(Value::as_u64) {
        Some(r) if (1..=65_536).contains(&r) => r as usize,
        _ => {
            return Err(err(format!(
                "r must be an integer in 1..=65536, found {}",
                obj.get("r").map_or("nothing".into(), shown)
            )))
        }
    };
    let alpha = match obj.get("lora_alpha").and_then(Value::as_f64) {
        Some(a) if a.is_finite() => a as f32,
        _ => {
            return Err(err(format!(
                "lora_alpha must be a finite number, found {}",
                obj.get("lora_alpha").map_or("nothing".into(), shown)
            )))
        }
    };
    let rslora = match obj.get("use_rslora") {
        None | Some(Value::Null) => false,
        Some(Value::Bool(b)) => *b,
        Some(v) => {
            return Err(err(format!(
                "use_rslora must be a boolean, found {}",
                shown(v)
            )))
        }
    };
    let targets = match obj.get("target_modules") {
        Some(Value::String(s)) => {
            Targets::Regex(regex::Regex::new(&format!("^(?:{s})$")).map_err(|e| {
                let e = e.to_string();
                let e = e.split_whitespace().collect::<Vec<_>>().join(" ");
                err(format!(
                    "target_modules {} is not a regular expression this build reads: {e}",
                    quote(s)
                ))
            })?)
        }
        Some(Value::Array(a)) => Targets::Names(
            a.iter()
                .map(|t| {
                    t.as_str().map(str::to_string).ok_or_else(|| {
                        err(format!("target_modules holds {}, not a name", shown(t)))
                    })
                })
                .collect::<Result<_, _>>()?,
        ),
        other => {
            return Err(err(format!(
                "target_modules must be a list of module names or a regular expression, found {}",
                other.map_or("nothing".into(), shown)
            )))
        }
    };
    let layers = match obj.get("layers_to_transform") {
        None | Some(Value::Null) => None,
        Some(Value::Number(n)) => Some(vec![n.as_u64().unwrap_or(u64::MAX) as usize]),
        Some(Value::Array(a)) => Some(
            a.iter()
                .map(|x| {
                    x.as_u64().map(|x| x as usize).ok_or_else(|| {
                        err(format!(
                            "layers_to_transform holds {}, not a layer index",
                            shown(x)
                        ))
                    })
                })
                .collect::<Result<_, _>>()?,
        ),
        Some(v) => {
            return Err(err(format!(
                "layers_to_transform must be a layer index or a list of them, found {}",
                shown(v)
            )))
        }
    };
    Ok(Config {
        r,
        alpha,
        rslora,
        targets,
        layers,
    })
}

/// `B` of a query or key projection in the row order of a GGUF base: llama.cpp's
/// converter permutes the rows of Llama-family `q_proj`/`k_proj` within each head so
/// that ggml's interleaved RoPE rotates them (`LlamaModel.permute` in
/// `convert_hf_to_gguf.py`: new row `2i + j` is old row `j · d/2 + i`), and
/// `convert_lora_to_gguf.py` does the same to `lora_B`. A PEFT adapter on such a base
/// gets the same permutation here; other bases and projections keep their order.
fn gguf_rope_order(base: &LoraBase, site: Site, b: RawMatrix) -> candle_core::Result<RawMatrix> {
    if !base.rope_interleaved {
        return Ok(b);
    }
    let heads = match site.proj {
        Proj::Q => base.n_head,
        Proj::K => base.n_kv_head,
        _ => return Ok(b),
    };
    let RawMatrix::Dense(t) = b else {
        return Ok(b);
    };
    let (out, r) = t.dims2()?;
    let half = out / heads / 2;
    let p = t
        .reshape((heads, 2, half, r))?
        .transpose(1, 2)?
        .contiguous()?
        .reshape((out, r))?;
    Ok(RawMatrix::Dense(p))
}

/// `(module path, layer, module name, is A)` of a PEFT tensor name.
fn parse_name(name: &str) -> Option<(&str, usize, &str, bool)> {
    let rest = name.strip_prefix("base_model.model.")?;
    let (module, is_a) = if let Some(m) = rest.strip_suffix(".lora_A.weight") {
        (m, true)
    } else if let Some(m) = rest.strip_suffix(".lora_B.weight") {
        (m, false)
    } else {
        return None;
    };
    let after = &module[module.find("layers.")? + "layers.".len()..];
    let (layer, _) = after.split_once('.')?;
    let layer = layer.parse().ok()?;
    let last = module.rsplit('.').next()?;
    Some((module, layer, last, is_a))
}

/// Reads and checks the PEFT directory `dir` against `model`.
pub(super) fn read(adapter: &str, dir: &Path, base: &LoraBase) -> Result<RawAdapter, LoraError> {
    let err = |message: String| LoraError {
        adapter: adapter.into(),
        message,
    };
    let cfg = config(adapter, &dir.join("adapter_config.json"))?;
    let file = dir.join("adapter_model.safetensors");
    if !file.is_file() {
        let pickle = dir.join("adapter_model.bin").is_file();
        return Err(err(format!(
            "{} is missing{}",
            file.display(),
            if pickle {
                " (adapter_model.bin is a pickle, which inferd does not load: save the adapter \
                 with safe_serialization=True)"
            } else {
                ""
            }
        )));
    }
    let tensors = candle_core::safetensors::load(&file, &Device::Cpu).map_err(|e| {
        err(format!(
            "{} is not a valid safetensors file: {}",
            file.display(),
            quote(&crate::model::candle_error_message(&e))
        ))
    })?;
    // Pair A and B per module.
    let mut modules: std::collections::BTreeMap<(usize, String), [Option<RawMatrix>; 2]> =
        std::collections::BTreeMap::new();
    let mut tensors: Vec<_> = tensors.into_iter().collect();
    tensors.sort_by(|a, b| a.0.cmp(&b.0));
    for (name, t) in tensors {
        let shown = quote(&name);
        if name.contains("lora_embedding_")
            || name.contains("embed_tokens")
            || name.contains("lm_head")
        {
            return Err(err(format!(
                "tensor {shown} adapts the embeddings or the output head, which inferd does not \
                 implement"
            )));
        }
        let Some((module, layer, last, is_a)) = parse_name(&name) else {
            return Err(err(format!(
                "tensor {shown} is not a LoRA A/B weight of a decoder layer \
                 (base_model.model.….layers.N.<module>.lora_A|lora_B.weight)"
            )));
        };
        if module_parts(last).is_none() {
            return Err(err(format!(
                "tensor {shown} adapts module `{last}`, which inferd does not implement \
                 (supported: {SUPPORTED_MODULES})"
            )));
        }
        if !cfg.targets.matches(module) {
            return Err(err(format!(
                "tensor {shown}: module {} is not in target_modules",
                quote(module)
            )));
        }
        if let Some(ls) = &cfg.layers {
            if !ls.contains(&layer) {
                return Err(err(format!(
                    "tensor {shown}: layer {layer} is not in layers_to_transform {ls:?}"
                )));
            }
        }
        if !matches!(t.dtype(), DType::F32 | DType::F16 | DType::BF16) {
            return Err(err(format!(
                "tensor {shown} has dtype {:?} (supported: F32, F16, BF16)",
                t.dtype()
            )));
        }
        let slot = modules.entry((layer, last.to_string())).or_default();
        slot[usize::from(!is_a)] = Some(RawMatrix::Dense(t));
    }
    if modules.is_empty() {
        return Err(err(format!("{} holds no LoRA weights", file.display())));
    }
    let mut pairs = Vec::new();
    for ((layer, last), [a, b]) in modules {
        let tensor = format!("layers.{layer}.{last}");
        let (Some(a), Some(b)) = (a, b) else {
            return Err(err(format!(
                "tensor `{tensor}` has only one of lora_A and lora_B"
            )));
        };
        let kinds = module_parts(&last).unwrap_or(&[]);
        let sites: Vec<Site> = kinds.iter().map(|&proj| Site { layer, proj }).collect();
        for (site, (a, b)) in fit_pair(adapter, &tensor, base, &sites, a, b, cfg.r)? {
            let b = gguf_rope_order(base, site, b).map_err(|e| {
                err(format!(
                    "tensor `{tensor}`: {}",
                    crate::model::candle_error_message(&e)
                ))
            })?;
            pairs.push((site, (a, b)));
        }
    }
    Ok(RawAdapter {
        format: LoraFormat::Peft { rslora: cfg.rslora },
        rank: cfg.r,
        alpha: cfg.alpha,
        pairs,
    })
}
