//! Rotary position embedding tables and their application (Su et al. 2021, RoFormer,
//! arXiv:2104.09864), in both pairings ([`RopeStyle`]) and with the frequency scalings of
//! [`RopeScaling`].

use candle_core::{DType, Device, Tensor, D};

use super::spec::{Numerics, RopeScaling, RopeSpec, RopeStyle};

/// cos/sin tables for one RoPE base: `(max_pos, dim / 2)` each, on the host and as
/// device tensors.
#[derive(Debug)]
pub struct RopeTable {
    /// Pairing.
    pub style: RopeStyle,
    /// Whose angle and rotation arithmetic ([`Numerics`]).
    pub numerics: Numerics,
    /// Rotated dimensions per head.
    pub dim: usize,
    /// Host cos, row-major `(max_pos, dim / 2)`.
    pub cos_host: Vec<f32>,
    /// Host sin.
    pub sin_host: Vec<f32>,
    /// Device cos `(max_pos, dim / 2)`.
    pub cos: Tensor,
    /// Device sin.
    pub sin: Tensor,
    /// [`RopeSpec::mrope_section`].
    pub mrope_section: Option<[usize; 3]>,
}

/// Inverse frequencies `θ_i = base^(-2i/d)` for `i < d/2`, with `scaling` applied.
/// Llama 3: transformers `_compute_llama3_parameters` (rope_utils.py); factors:
/// `θ_i / f_i` (longrope, llama.cpp `rope_freqs`).
pub fn inv_freq(dim: usize, base: f32, scaling: &RopeScaling) -> Vec<f32> {
    let plain = (0..dim)
        .step_by(2)
        .map(|i| 1f32 / base.powf(i as f32 / dim as f32));
    match scaling {
        RopeScaling::None => plain.collect(),
        RopeScaling::Factors { factors, .. } => plain.zip(factors).map(|(f, s)| f / s).collect(),
        RopeScaling::Llama3 {
            factor,
            low_freq_factor,
            high_freq_factor,
            original_max,
        } => {
            let low_wavelen = original_max / low_freq_factor;
            let high_wavelen = original_max / high_freq_factor;
            plain
                .map(|f| {
                    let wavelen = 2.0 * std::f32::consts::PI / f;
                    if wavelen < high_wavelen {
                        f
                    } else if wavelen > low_wavelen {
                        f / factor
                    } else {
                        let smooth = (original_max / wavelen - low_freq_factor)
                            / (high_freq_factor - low_freq_factor);
                        (1.0 - smooth) * f / factor + smooth * f
                    }
                })
                .collect()
        }
    }
}

impl RopeTable {
    /// Tables for `spec` with base `base` (the global θ, or the local one unscaled).
    ///
    /// # Errors
    /// A device error.
    pub fn new(
        spec: &RopeSpec,
        base: f32,
        scaled: bool,
        max_pos: usize,
        numerics: Numerics,
        device: &Device,
    ) -> candle_core::Result<Self> {
        let none = RopeScaling::None;
        let scaling = if scaled { &spec.scaling } else { &none };
        let inv = inv_freq(spec.dim, base, scaling);
        let attn_factor = match scaling {
            RopeScaling::Factors {
                attention_factor, ..
            } => *attention_factor,
            _ => 1.0,
        };
        let n = inv.len();
        let ggml_factors = match scaling {
            RopeScaling::None => Some(None),
            RopeScaling::Factors { factors, .. } => Some(Some(factors.as_slice())),
            RopeScaling::Llama3 { .. } => None,
        };
        let (mut cos, mut sin) = match (numerics, ggml_factors) {
            // llama.cpp's running-product angles (llama 3 scaling keeps transformers'
            // frequencies: llama.cpp reads them from the file's `rope_freqs` instead).
            (Numerics::Ggml, Some(factors)) => {
                let (c, s) = inferd_kernels::eltwise::rope_tables(spec.dim, base, factors, max_pos);
                (
                    Tensor::from_vec(c, (max_pos, n), &Device::Cpu)?,
                    Tensor::from_vec(s, (max_pos, n), &Device::Cpu)?,
                )
            }
            _ => {
                let inv_t = Tensor::from_vec(inv, (1, n), &Device::Cpu)?;
                let pos = Tensor::arange(0u32, max_pos as u32, &Device::Cpu)?
                    .to_dtype(DType::F32)?
                    .reshape((max_pos, 1))?;
                let freqs = pos.matmul(&inv_t)?;
                (freqs.cos()?, freqs.sin()?)
            }
        };
        if attn_factor != 1.0 {
            cos = (cos * f64::from(attn_factor))?;
            sin = (sin * f64::from(attn_factor))?;
        }
        Ok(Self {
            style: spec.style,
            numerics,
            dim: spec.dim,
            cos_host: cos.flatten_all()?.to_vec1()?,
            sin_host: sin.flatten_all()?.to_vec1()?,
            cos: cos.to_device(device)?,
            sin: sin.to_device(device)?,
            mrope_section: spec.mrope_section,
        })
    }

    /// cos and sin rows `(T, dim / 2)` for multimodal positions `[t, h, w]` per row:
    /// frequency `i` takes the position of its [`Self::mrope_section`] (transformers
    /// `apply_multimodal_rotary_pos_emb`, which picks the sections of the table's
    /// rows); the plain rows when the table has no sections.
    pub fn mrope_rows(&self, positions: &[[u32; 3]]) -> (Vec<f32>, Vec<f32>) {
        let half = self.dim / 2;
        let [s0, s1, _] = self.mrope_section.unwrap_or([half, 0, 0]);
        let (mut cos, mut sin) = (Vec::with_capacity(positions.len() * half), Vec::new());
        sin.reserve(positions.len() * half);
        for p in positions {
            for i in 0..half {
                let sec = if i < s0 {
                    0
                } else if i < s0 + s1 {
                    1
                } else {
                    2
                };
                let at = p[sec] as usize * half + i;
                cos.push(self.cos_host.get(at).copied().unwrap_or(1.0));
                sin.push(self.sin_host.get(at).copied().unwrap_or(0.0));
            }
        }
        (cos, sin)
    }

    /// [`Self::apply_host`] at multimodal positions (cos/sin from [`Self::mrope_rows`]).
    pub fn apply_host_mrope(
        &self,
        x: &mut [f32],
        heads: usize,
        head_dim: usize,
        positions: &[[u32; 3]],
    ) {
        let half = self.dim / 2;
        let (cos, sin) = self.mrope_rows(positions);
        for t in 0..positions.len() {
            let (c, s) = (
                &cos[t * half..(t + 1) * half],
                &sin[t * half..(t + 1) * half],
            );
            for h in 0..heads {
                let base = (t * heads + h) * head_dim;
                self.rotate(&mut x[base..base + self.dim], c, s);
            }
        }
    }

    /// One head's rotated dimensions by `cos`/`sin` (`dim / 2` each).
    #[inline(always)]
    fn rotate(&self, row: &mut [f32], cos: &[f32], sin: &[f32]) {
        let half = self.dim / 2;
        for i in 0..half {
            let (ia, ib) = match self.style {
                RopeStyle::Interleaved => (2 * i, 2 * i + 1),
                RopeStyle::Neox => (i, i + half),
            };
            let (a, b) = (row[ia], row[ib]);
            (row[ia], row[ib]) = match self.numerics {
                Numerics::Ggml => inferd_kernels::eltwise::rotate(a, b, cos[i], sin[i]),
                Numerics::Transformers => (a * cos[i] - b * sin[i], a * sin[i] + b * cos[i]),
            };
        }
    }

    /// RoPE in place on host rows `(T, heads · head_dim)`, row `t` at `positions[t]`;
    /// dimensions past `dim` pass through. Interleaved: candle's `rope_i` arithmetic;
    /// NEOX: candle's `rope` (`x_i cos − x_{i+d/2} sin`, `x_i sin + x_{i+d/2} cos`);
    /// under [`Numerics::Ggml`] ggml's fused form ([`inferd_kernels::eltwise::rotate`]).
    pub fn apply_host(&self, x: &mut [f32], heads: usize, head_dim: usize, positions: &[u32]) {
        /// Rows per task when a prompt's rows are spread over the compute team.
        const ROWS: usize = 32;
        let width = heads * head_dim;
        let rows = |t0: usize, chunk: &mut [f32]| {
            let n = chunk.len() / width.max(1);
            self.apply_rows(chunk, heads, head_dim, &positions[t0..t0 + n]);
        };
        if positions.len() > ROWS && inferd_kernels::team::threads() > 1 && width > 0 {
            let x = &mut x[..positions.len() * width];
            inferd_kernels::team::for_each_chunk_mut(x, ROWS * width, |i, chunk| {
                rows(i * ROWS, chunk)
            });
        } else {
            rows(0, x);
        }
    }

    /// [`Self::apply_host`] for the rows of `x`, compiled with FMA where the CPU has it
    /// (`mul_add` is exactly rounded either way; without the feature it is a call).
    fn apply_rows(&self, x: &mut [f32], heads: usize, head_dim: usize, positions: &[u32]) {
        #[cfg(target_arch = "x86_64")]
        if is_x86_feature_detected!("fma") {
            // SAFETY: FMA was detected; the function only changes how `mul_add` compiles.
            return unsafe { self.apply_rows_fma(x, heads, head_dim, positions) };
        }
        self.apply_rows_plain(x, heads, head_dim, positions);
    }

    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "fma")]
    unsafe fn apply_rows_fma(
        &self,
        x: &mut [f32],
        heads: usize,
        head_dim: usize,
        positions: &[u32],
    ) {
        self.apply_rows_plain(x, heads, head_dim, positions);
    }

    #[inline(always)]
    fn apply_rows_plain(&self, x: &mut [f32], heads: usize, head_dim: usize, positions: &[u32]) {
        let half = self.dim / 2;
        for (t, &pos) in positions.iter().enumerate() {
            let p = pos as usize;
            let cos = &self.cos_host[p * half..(p + 1) * half];
            let sin = &self.sin_host[p * half..(p + 1) * half];
            for h in 0..heads {
                let base = (t * heads + h) * head_dim;
                self.rotate(&mut x[base..base + self.dim], cos, sin);
            }
        }
    }

    /// RoPE on `x` `(1, heads, T, head_dim)` with `cos`/`sin` rows `(T, dim / 2)`
    /// gathered for the tokens' positions (candle's `rope_i` / `rope` kernels).
    ///
    /// # Errors
    /// A candle error.
    pub fn apply(&self, x: &Tensor, cos: &Tensor, sin: &Tensor) -> candle_core::Result<Tensor> {
        let head_dim = x.dim(D::Minus1)?;
        let f = match self.style {
            RopeStyle::Interleaved => candle_nn::rotary_emb::rope_i,
            RopeStyle::Neox => candle_nn::rotary_emb::rope,
        };
        if self.dim == head_dim {
            f(&x.contiguous()?, cos, sin)
        } else {
            let rot = x.narrow(D::Minus1, 0, self.dim)?.contiguous()?;
            let pass = x.narrow(D::Minus1, self.dim, head_dim - self.dim)?;
            let rot = f(&rot, cos, sin)?;
            Tensor::cat(&[&rot, &pass], D::Minus1)?.contiguous()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// transformers' llama3 scaling at the three regimes (Llama 3.1 8B's values:
    /// factor 8, low 1, high 4, original 8192, θ 500 000, d 128).
    #[test]
    fn llama3_scaling_keeps_high_and_divides_low_frequencies() {
        let s = RopeScaling::Llama3 {
            factor: 8.0,
            low_freq_factor: 1.0,
            high_freq_factor: 4.0,
            original_max: 8192.0,
        };
        let plain = inv_freq(128, 500_000.0, &RopeScaling::None);
        let scaled = inv_freq(128, 500_000.0, &s);
        assert_eq!(scaled[0], plain[0]);
        assert_eq!(scaled[63], plain[63] / 8.0);
        let mid = scaled
            .iter()
            .zip(&plain)
            .filter(|(a, b)| *a != *b && **a != **b / 8.0)
            .count();
        assert!(mid > 0, "some frequencies are interpolated");
    }

    #[test]
    fn neox_rotates_halves_and_interleaved_pairs() {
        let spec = |style| RopeSpec {
            style,
            dim: 4,
            theta: 10_000.0,
            local_theta: None,
            scaling: RopeScaling::None,
            mrope_section: None,
        };
        for style in [RopeStyle::Neox, RopeStyle::Interleaved] {
            let t = RopeTable::new(
                &spec(style),
                10_000.0,
                true,
                4,
                Numerics::Transformers,
                &Device::Cpu,
            )
            .expect("t");
            let mut x = vec![1.0, 2.0, 3.0, 4.0];
            t.apply_host(&mut x, 1, 4, &[1]);
            let (c, s) = (1f32.cos(), 1f32.sin());
            let want = match style {
                // pairs (0, 2) and (1, 3); pair 0 turns by 1 rad.
                RopeStyle::Neox => x[0] == 1.0 * c - 3.0 * s && x[2] == 1.0 * s + 3.0 * c,
                // pairs (0, 1) and (2, 3).
                RopeStyle::Interleaved => x[0] == 1.0 * c - 2.0 * s && x[1] == 1.0 * s + 2.0 * c,
            };
            assert!(want, "{style:?}: {x:?}");
        }
    }
}
