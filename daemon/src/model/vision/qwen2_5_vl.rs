//! Qwen2.5-VL's vision transformer and patch merger, after transformers 5.24.0
//! `models/qwen2_5_vl/modeling_qwen2_5_vl.py` (`Qwen2_5_VisionTransformerPretrainedModel`,
//! l.99-198 and 422-489) and `vision_utils.py` (2-D rotary positions, window index).
//!
//! One image: Conv3d patch embedding (a matmul of the processor's flattened patch rows),
//! 2-D RoPE per patch, rows permuted into window order, `depth` pre-RMSNorm blocks (full
//! attention per frame in `fullatt_block_indexes`, windowed attention elsewhere, SwiGLU
//! MLP), the merger (RMSNorm, 2×2 merge units concatenated, Linear → GELU → Linear),
//! rows un-permuted back to the processor's merge-block order.

use std::collections::HashMap;

use candle_core::{DType, Device, Tensor};
use serde_json::Value;

use crate::model::ModelError;

/// `Qwen2RMSNorm` eps of the vision blocks and of `merger.ln_q` (hard-coded 1e-6).
const RMS_EPS: f32 = 1e-6;
/// Most attention scores (f32 elements) computed at once; longer runs are split by query.
const MAX_SCORES: usize = 1 << 26;

/// `x · wᵀ + b`, with `wᵀ` stored `(in, out)`.
#[derive(Debug)]
struct Linear {
    wt: Tensor,
    b: Tensor,
}

impl Linear {
    fn forward(&self, x: &Tensor) -> candle_core::Result<Tensor> {
        x.matmul(&self.wt)?.broadcast_add(&self.b)
    }
}

/// `Qwen2_5_VLVisionBlock`: `x + attn(norm1(x))`, then `x + mlp(norm2(x))`.
#[derive(Debug)]
struct Block {
    norm1: Tensor,
    norm2: Tensor,
    qkv: Linear,
    proj: Linear,
    gate: Linear,
    up: Linear,
    down: Linear,
    full: bool,
}

/// Qwen2.5-VL's vision transformer and merger (transformers 5.24.0 models/qwen2_5_vl/modeling_qwen2_5_vl.py).
///
/// Weights are f32 on the device given to [`Qwen25VlTower::from_hf`]: `patch_embed.proj.weight`
/// `[hidden, 3, temporal_patch, patch, patch]` kept as `(3·temporal_patch·patch², hidden)`,
/// `depth` blocks (`qkv` `[3·hidden, hidden]`, `proj`, SwiGLU `gate/up/down_proj`, all with
/// biases), `merger.ln_q` `[hidden]`, `merger.mlp.0` `[4·hidden, 4·hidden]`, `merger.mlp.2`
/// `[out_hidden_size, 4·hidden]`.
#[derive(Debug)]
pub struct Qwen25VlTower {
    patch_embed: Tensor,
    blocks: Vec<Block>,
    ln_q: Tensor,
    mlp0: Linear,
    mlp2: Linear,
    hidden: usize,
    heads: usize,
    patch_dim: usize,
    merge: usize,
    window_units: usize,
    out_dim: usize,
    inv_freq: Vec<f32>,
    device: Device,
}

fn meta(key: &str, message: impl Into<String>) -> ModelError {
    ModelError::Metadata {
        key: format!("config.json: vision_config.{key}"),
        message: message.into(),
    }
}

fn cfg_usize(vc: &Value, key: &str) -> Result<usize, ModelError> {
    let v = vc.get(key).ok_or_else(|| meta(key, "missing"))?;
    match v.as_u64().and_then(|n| usize::try_from(n).ok()) {
        Some(n) if n > 0 => Ok(n),
        _ => Err(meta(key, format!("expected a positive integer, got {v}"))),
    }
}

/// Takes `visual.{name}` (or `model.visual.{name}`) out of the map as f32 on the device.
struct Weights<'a> {
    tensors: HashMap<String, Tensor>,
    device: &'a Device,
}

impl Weights<'_> {
    fn take(&mut self, name: &str, shape: Option<&[usize]>) -> Result<Tensor, ModelError> {
        let name = format!("visual.{name}");
        let t = self.tensors.remove(&name);
        let t = t.or_else(|| self.tensors.remove(&format!("model.{name}")));
        let message = match (&t, shape) {
            (None, _) => "missing".to_string(),
            (Some(t), Some(shape)) if t.dims() != shape => {
                format!("shape {:?}, expected {shape:?}", t.dims())
            }
            (Some(t), _) => return Ok(t.to_dtype(DType::F32)?.to_device(self.device)?),
        };
        Err(ModelError::Tensor { name, message })
    }

    fn linear(&mut self, name: &str, out: usize, inp: usize) -> Result<Linear, ModelError> {
        let w = self.take(&format!("{name}.weight"), Some(&[out, inp]))?;
        let b = self.take(&format!("{name}.bias"), Some(&[out]))?;
        let wt = w.t()?.contiguous()?;
        Ok(Linear { wt, b })
    }
}

/// transformers `get_window_index` (vision_utils.py:130-186) for one image: merge units of
/// the `(t, h/merge, w/merge)` grid taken window by window (`window_units` units per window
/// side, windows row-major per frame, units row-major inside a window), and the cumulative
/// window lengths in patch rows (`units · merge²`), starting at 0, empty windows dropped
/// (`unique_consecutive`). Fixture `grad`: grid `[1, 4, 6]`, merge 2, 2 units → `[0, 1, 3, 4,
/// 2, 5]`, `[0, 16, 24]`.
pub fn window_index(
    grid_thw: [usize; 3],
    merge: usize,
    window_units: usize,
) -> (Vec<usize>, Vec<usize>) {
    let [t, h, w] = grid_thw;
    let (lh, lw, ws) = (h / merge, w / merge, window_units.max(1));
    let mut index = Vec::with_capacity(t * lh * lw);
    let mut cu = vec![0];
    for f in 0..t {
        for wy in (0..lh).step_by(ws) {
            for wx in (0..lw).step_by(ws) {
                for y in wy..(wy + ws).min(lh) {
                    index.extend((wx..(wx + ws).min(lw)).map(|x| f * lh * lw + y * lw + x));
                }
                cu.push(index.len() * merge * merge);
            }
        }
    }
    (index, cu)
}

/// `(start, len, count)`: `count` consecutive attention segments of `len` rows from `start`.
type Run = (usize, usize, usize);

/// The segments between consecutive `cu` entries grouped into runs of equal length.
fn runs(cu: &[usize]) -> Vec<Run> {
    let mut out: Vec<Run> = Vec::new();
    for pair in cu.windows(2) {
        let len = pair[1] - pair[0];
        match out.last_mut() {
            Some(last) if last.1 == len => last.2 += 1,
            _ if len > 0 => out.push((pair[0], len, 1)),
            _ => {}
        }
    }
    out
}

/// Non-causal attention within each segment of each run; `q, k, v`: `(heads, n, head_dim)`
/// → `(heads, n, head_dim)`.
fn attend(q: &Tensor, k: &Tensor, v: &Tensor, runs: &[Run]) -> candle_core::Result<Tensor> {
    let (heads, _, hd) = q.dims3()?;
    let scale = (hd as f64).powf(-0.5);
    let mut parts = Vec::with_capacity(runs.len());
    for &(start, len, count) in runs {
        let seg = |x: &Tensor| {
            x.narrow(1, start, len * count)?
                .reshape((heads * count, len, hd))
        };
        let (q, k, v) = (seg(q)?, seg(k)?, seg(v)?);
        let kt = k.t()?;
        let chunk = (MAX_SCORES / (heads * count * len)).clamp(1, len);
        let mut outs = Vec::with_capacity(len.div_ceil(chunk));
        for qs in (0..len).step_by(chunk) {
            let qc = q.narrow(1, qs, chunk.min(len - qs))?;
            let att = candle_nn::ops::softmax_last_dim(&(qc.matmul(&kt)? * scale)?)?;
            outs.push(att.matmul(&v)?);
        }
        parts.push(Tensor::cat(&outs, 1)?.reshape((heads, count * len, hd))?);
    }
    Tensor::cat(&parts, 1)
}

impl Qwen25VlTower {
    /// From the whole config.json and the tensors named `visual.*` (stored dtype, CPU); moved to `device` as f32.
    ///
    /// Reads `vision_config.{depth, hidden_size, num_heads, intermediate_size, out_hidden_size,
    /// patch_size, temporal_patch_size, spatial_merge_size, window_size, fullatt_block_indexes}`,
    /// `rope_parameters.rope_theta` (default 10000) and `hidden_act` (only `silu`).
    pub fn from_hf(
        config: &Value,
        tensors: HashMap<String, Tensor>,
        device: &Device,
    ) -> Result<Self, ModelError> {
        let missing = || ModelError::Metadata {
            key: "config.json: vision_config".into(),
            message: "missing".into(),
        };
        let vc = config.get("vision_config").ok_or_else(missing)?;
        let get = |key| cfg_usize(vc, key);
        let (depth, hidden, heads) = (get("depth")?, get("hidden_size")?, get("num_heads")?);
        let (inter, out_dim) = (get("intermediate_size")?, get("out_hidden_size")?);
        let (patch, temporal) = (get("patch_size")?, get("temporal_patch_size")?);
        let (merge, window_size) = (get("spatial_merge_size")?, get("window_size")?);
        if !hidden.is_multiple_of(4 * heads) {
            let message = format!("{hidden} / {heads} is no multiple of 4");
            return Err(meta("num_heads", message));
        }
        let window_units = window_size / merge / patch;
        if window_units == 0 {
            let message = format!("{window_size} < {merge} · {patch}");
            return Err(meta("window_size", message));
        }
        let fk = "fullatt_block_indexes";
        let full = vc
            .get(fk)
            .cloned()
            .map(serde_json::from_value::<Vec<usize>>);
        let full = full
            .and_then(Result::ok)
            .filter(|v| v.iter().all(|&i| i < depth));
        let full = full.ok_or_else(|| meta(fk, "expected block indexes below depth"))?;
        if let Some(act) = vc.get("hidden_act").filter(|a| a.as_str() != Some("silu")) {
            let message = format!("only \"silu\" is implemented, got {act}");
            return Err(meta("hidden_act", message));
        }
        let theta = match vc.get("rope_parameters").and_then(|r| r.get("rope_theta")) {
            None => 10000.0,
            Some(v) => v.as_f64().filter(|t| *t > 0.0).ok_or_else(|| {
                meta(
                    "rope_parameters.rope_theta",
                    format!("expected a positive number: {v}"),
                )
            })?,
        };
        // Qwen2_5_VisionRotaryEmbedding(head_dim / 2): 1/θ^(arange(0, dim, 2)/dim).
        let rope_dim = hidden / heads / 2;
        let inv_freq = (0..rope_dim).step_by(2);
        let inv_freq = inv_freq.map(|i| (1.0 / theta.powf(i as f64 / rope_dim as f64)) as f32);

        let mut w = Weights { tensors, device };
        let pe_name = "patch_embed.proj.weight";
        let pe = w.take(pe_name, None)?;
        let channels = match pe.dims() {
            &[o, c, t, p, q] if o == hidden && t == temporal && p == patch && q == patch => c,
            dims => {
                let message =
                    format!("shape {dims:?}, expected [{hidden}, c, {temporal}, {patch}, _]");
                let name = format!("visual.{pe_name}");
                return Err(ModelError::Tensor { name, message });
            }
        };
        let patch_dim = channels * temporal * patch * patch;
        let patch_embed = pe.reshape((hidden, patch_dim))?.t()?.contiguous()?;
        let blocks = (0..depth)
            .map(|i| {
                let p = format!("blocks.{i}");
                Ok(Block {
                    norm1: w.take(&format!("{p}.norm1.weight"), Some(&[hidden]))?,
                    norm2: w.take(&format!("{p}.norm2.weight"), Some(&[hidden]))?,
                    qkv: w.linear(&format!("{p}.attn.qkv"), 3 * hidden, hidden)?,
                    proj: w.linear(&format!("{p}.attn.proj"), hidden, hidden)?,
                    gate: w.linear(&format!("{p}.mlp.gate_proj"), inter, hidden)?,
                    up: w.linear(&format!("{p}.mlp.up_proj"), inter, hidden)?,
                    down: w.linear(&format!("{p}.mlp.down_proj"), hidden, inter)?,
                    full: full.contains(&i),
                })
            })
            .collect::<Result<Vec<_>, ModelError>>()?;
        let unit = hidden * merge * merge;
        let ln_q = w.take("merger.ln_q.weight", Some(&[hidden]))?;
        let mlp0 = w.linear("merger.mlp.0", unit, unit)?;
        let mlp2 = w.linear("merger.mlp.2", out_dim, unit)?;
        Ok(Self {
            patch_embed,
            blocks,
            ln_q,
            mlp0,
            mlp2,
            hidden,
            heads,
            patch_dim,
            merge,
            window_units,
            out_dim,
            inv_freq: inv_freq.collect(),
            device: device.clone(),
        })
    }

    /// spatial_merge_size.
    pub fn merge_size(&self) -> usize {
        self.merge
    }

    /// out_hidden_size.
    pub fn out_dim(&self) -> usize {
        self.out_dim
    }

    /// RoPE `(cos, sin)`, each `(n, head_dim / 2)`, for the patches of the merge units in
    /// `order` (`rot_pos_emb`: angles `[h·inv_freq, w·inv_freq]`; the duplicated half is
    /// implied by `candle_nn::rotary_emb::rope`).
    fn rope(&self, grid_thw: [usize; 3], order: &[usize]) -> candle_core::Result<(Tensor, Tensor)> {
        let m = self.merge;
        let (lw, per_frame) = (grid_thw[2] / m, grid_thw[1] * grid_thw[2] / (m * m));
        let half = 2 * self.inv_freq.len();
        let n = order.len() * m * m;
        let (mut cos, mut sin) = (Vec::with_capacity(n * half), Vec::with_capacity(n * half));
        for &u in order {
            let (by, bx) = ((u % per_frame) / lw, u % lw);
            for k in 0..m * m {
                for pos in [by * m + k / m, bx * m + k % m] {
                    for &f in &self.inv_freq {
                        let a = pos as f32 * f;
                        cos.push(a.cos());
                        sin.push(a.sin());
                    }
                }
            }
        }
        let cos = Tensor::from_vec(cos, (n, half), &self.device)?;
        Ok((cos, Tensor::from_vec(sin, (n, half), &self.device)?))
    }

    /// One image's patch rows `(t·h·w, 3·temporal_patch·patch·patch)` in the processor's merge-block order and its grid
    /// → `(t·h·w / merge², out_hidden_size)` f32 on the device: the rows replacing its `<|image_pad|>` tokens, in order.
    ///
    /// `Qwen2_5_VisionTransformerPretrainedModel.forward` (modeling_qwen2_5_vl.py:422-489).
    pub fn encode(&self, data: &[f32], grid_thw: [usize; 3]) -> candle_core::Result<Tensor> {
        let [t, h, w] = grid_thw;
        let m = self.merge;
        let n = t * h * w;
        if n == 0 || !h.is_multiple_of(m) || !w.is_multiple_of(m) {
            candle_core::bail!("qwen2.5-vl vision: grid {grid_thw:?}, merge {m}");
        }
        if data.len() != n * self.patch_dim {
            let (len, pd) = (data.len(), self.patch_dim);
            candle_core::bail!("qwen2.5-vl vision: {len} values, not {n} × {pd}");
        }
        let (order, cu_window) = window_index(grid_thw, m, self.window_units);
        let ids = |v: &[usize]| Tensor::from_iter(v.iter().map(|&i| i as u32), &self.device);
        let mut inverse = vec![0; order.len()];
        for (i, &u) in order.iter().enumerate() {
            inverse[u] = i;
        }
        let (cos, sin) = self.rope(grid_thw, &order)?;
        let window_runs = runs(&cu_window);
        let full_runs = [(0, h * w, t)];
        let (c, heads) = (self.hidden, self.heads);
        let hd = c / heads;

        let x = Tensor::from_slice(data, (n, self.patch_dim), &self.device)?;
        let x = x
            .matmul(&self.patch_embed)?
            .reshape((n / (m * m), m * m * c))?;
        // permute_input_for_window_attn: merge units (m² consecutive rows) into window order.
        let mut x = x.index_select(&ids(&order)?, 0)?.reshape((n, c))?;
        let rope = |x: Tensor| -> candle_core::Result<Tensor> {
            candle_nn::rotary_emb::rope(&x.unsqueeze(0)?.contiguous()?, &cos, &sin)?.squeeze(0)
        };
        for b in &self.blocks {
            let y = candle_nn::ops::rms_norm(&x, &b.norm1, RMS_EPS)?;
            // (3, heads, n, head_dim)
            let qkv = b.qkv.forward(&y)?.reshape((n, 3, heads, hd))?;
            let qkv = qkv.permute((1, 2, 0, 3))?;
            let (q, k) = (rope(qkv.get(0)?)?, rope(qkv.get(1)?)?);
            let v = qkv.get(2)?.contiguous()?;
            let o = attend(&q, &k, &v, if b.full { &full_runs } else { &window_runs })?;
            x = (x + b.proj.forward(&o.transpose(0, 1)?.reshape((n, c))?)?)?;
            let y = candle_nn::ops::rms_norm(&x, &b.norm2, RMS_EPS)?;
            let g = b.gate.forward(&y)?.silu()?;
            x = (&x + b.down.forward(&(g * b.up.forward(&y)?)?)?)?;
        }
        let y = candle_nn::ops::rms_norm(&x, &self.ln_q, RMS_EPS)?;
        let y = y.reshape((n / (m * m), m * m * c))?;
        let y = self.mlp2.forward(&self.mlp0.forward(&y)?.gelu_erf()?)?;
        // merged[argsort(window_index)]: back to merge-block (row-major) order.
        y.index_select(&ids(&inverse)?, 0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const DIR: &str = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/vlm/qwen2_5_vl/"
    );

    fn read(file: &str) -> Value {
        serde_json::from_slice(&std::fs::read(format!("{DIR}{file}")).unwrap()).unwrap()
    }

    fn load() -> (Value, HashMap<String, Tensor>) {
        let path = format!("{DIR}model.safetensors");
        let all = candle_core::safetensors::load(path, &Device::Cpu).unwrap();
        let visual = all.into_iter().filter(|(k, _)| k.starts_with("visual."));
        (read("config.json"), visual.collect())
    }

    fn nums<T>(v: &Value, f: impl Fn(&Value) -> Option<T>) -> Vec<T> {
        v.as_array()
            .unwrap()
            .iter()
            .map(|x| f(x).unwrap())
            .collect()
    }

    fn floats(v: &Value) -> Vec<f32> {
        nums(&v["values"], |x| x.as_f64().map(|x| x as f32))
    }

    fn usizes(v: &Value) -> Vec<usize> {
        nums(v, |x| x.as_u64().map(|x| x as usize))
    }

    #[test]
    fn image_features_match_transformers() {
        let (config, tensors) = load();
        let tower = Qwen25VlTower::from_hf(&config, tensors, &Device::Cpu).unwrap();
        assert_eq!((tower.merge_size(), tower.out_dim()), (2, 64));
        let (reference, mut earlier) = (read("reference.json"), Vec::new());
        for case in reference["cases"].as_array().unwrap() {
            let name = &case["name"];
            // A multi-image case stores null: the earlier cases' pixel values concatenated.
            let pixels = if case["pixel_values"]["values"].is_null() {
                earlier.concat()
            } else {
                floats(&case["pixel_values"])
            };
            let grids = case["image_grid_thw"].as_array().unwrap();
            let mut row = 0;
            for (i, (grid, want)) in grids
                .iter()
                .zip(case["image_features"].as_array().unwrap())
                .enumerate()
            {
                let grid: [usize; 3] = usizes(grid).try_into().unwrap();
                let rows = grid.iter().product::<usize>();
                let got = tower
                    .encode(&pixels[row * 1176..(row + rows) * 1176], grid)
                    .unwrap();
                row += rows;
                assert_eq!(got.dims(), usizes(&want["shape"]));
                let got = got.flatten_all().unwrap().to_vec1::<f32>().unwrap();
                let diffs = got.iter().zip(floats(want)).map(|(a, b)| (a - b).abs());
                let diff = diffs.fold(0f32, f32::max);
                println!("case {name} image {i} grid {grid:?}: max abs diff {diff:e}");
                assert!(diff < 1e-4, "case {name} image {i}: max abs diff {diff}");
            }
            assert_eq!(row * 1176, pixels.len(), "case {name}");
            earlier.push(pixels);
        }
    }

    #[test]
    fn window_index_matches_transformers() {
        let reference = read("reference.json");
        let cases = reference["cases"].as_array().unwrap();
        let cases: Vec<_> = cases
            .iter()
            .filter(|c| c.get("window_index").is_some())
            .collect();
        assert_eq!(cases.len(), 2);
        for case in cases {
            let grid: [usize; 3] = usizes(&case["image_grid_thw"][0]).try_into().unwrap();
            let want_index = usizes(&case["window_index"]["values"]);
            let want_cu = usizes(&case["cu_window_seqlens"]["values"]);
            let got = window_index(grid, 2, 56 / 2 / 14);
            assert_eq!(got, (want_index, want_cu), "{}", case["name"]);
        }
        // Real models: 4 units per window; a divisible grid adds no empty windows.
        assert_eq!(
            window_index([1, 8, 8], 2, 4),
            ((0..16).collect(), vec![0, 64])
        );
        // Frames one after the other, windows row-major within each.
        let want = ((0..6).collect(), vec![0, 8, 12, 20, 24]);
        assert_eq!(window_index([2, 2, 6], 2, 2), want);
        let want = (vec![0, 1, 3, 4, 2, 5, 6, 7, 8], vec![0, 16, 24, 32, 36]);
        assert_eq!(window_index([1, 6, 6], 2, 2), want);
    }

    #[test]
    fn missing_tensor_and_bad_config_are_named() {
        let (config, mut tensors) = load();
        tensors.remove("visual.blocks.2.attn.qkv.bias");
        let err = Qwen25VlTower::from_hf(&config, tensors, &Device::Cpu).unwrap_err();
        let want = "visual.blocks.2.attn.qkv.bias";
        assert!(
            matches!(&err, ModelError::Tensor { name, .. } if name == want),
            "{err}"
        );
        let (mut config, tensors) = load();
        let vision = config["vision_config"].as_object_mut().unwrap();
        vision.remove("window_size");
        let err = Qwen25VlTower::from_hf(&config, tensors, &Device::Cpu).unwrap_err();
        let want = "config.json: vision_config.window_size";
        assert!(
            matches!(&err, ModelError::Metadata { key, .. } if key == want),
            "{err}"
        );
    }
}
