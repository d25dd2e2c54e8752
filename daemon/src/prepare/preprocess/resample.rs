//! Pillow's `Image.resize` for 8-bit images, to the bit: the image processors of
//! transformers resize a PIL image, so matching their pixel values means matching
//! Pillow's arithmetic. Ported from Pillow's `src/libImaging/Resample.c`
//! (`precompute_coeffs`, `normalize_coeffs_8bpc`, `ImagingResampleHorizontal_8bpc` /
//! `Vertical_8bpc`, `ImagingResampleInner`): a separable convolution whose support
//! grows with the downscale factor (antialiasing), coefficients in f64 normalized to
//! sum 1, then rounded to fixed point with 22 fractional bits; two passes, each clipped
//! to u8, in Pillow 13's order (`Image8::resize`).

/// Pillow's resampling filters (`PIL.Image.Resampling`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Filter {
    /// `BILINEAR` (triangle, support 1).
    Bilinear,
    /// `BICUBIC` (Keys' cubic with a = −0.5, support 2).
    Bicubic,
    /// `LANCZOS` (sinc windowed by sinc, support 3).
    Lanczos,
}

impl Filter {
    /// Pillow's `Resampling` number (`PIL.Image.Resampling`: 2 bilinear, 3 bicubic,
    /// 1 lanczos), as `preprocessor_config.json` stores `resample`.
    pub fn from_pil(n: u64) -> Option<Self> {
        match n {
            1 => Some(Self::Lanczos),
            2 => Some(Self::Bilinear),
            3 => Some(Self::Bicubic),
            _ => None,
        }
    }

    fn support(self) -> f64 {
        match self {
            Self::Bilinear => 1.0,
            Self::Bicubic => 2.0,
            Self::Lanczos => 3.0,
        }
    }

    fn weight(self, x: f64) -> f64 {
        match self {
            Self::Bilinear => {
                let x = x.abs();
                if x < 1.0 {
                    1.0 - x
                } else {
                    0.0
                }
            }
            Self::Bicubic => {
                const A: f64 = -0.5;
                let x = x.abs();
                if x < 1.0 {
                    ((A + 2.0) * x - (A + 3.0)) * x * x + 1.0
                } else if x < 2.0 {
                    (((x - 5.0) * x + 8.0) * x - 4.0) * A
                } else {
                    0.0
                }
            }
            Self::Lanczos => {
                if (-3.0..3.0).contains(&x) {
                    sinc(x) * sinc(x / 3.0)
                } else {
                    0.0
                }
            }
        }
    }
}

fn sinc(x: f64) -> f64 {
    if x == 0.0 {
        1.0
    } else {
        let x = x * std::f64::consts::PI;
        x.sin() / x
    }
}

/// Fractional bits of the fixed-point coefficients (`32 - 8 - 2`).
const PRECISION_BITS: u32 = 22;

/// One output position's taps: the first input index and the fixed-point weights.
struct Taps {
    /// `ksize` weights per output position.
    ksize: usize,
    /// First input index of each output position.
    first: Vec<usize>,
    /// Taps used by each output position.
    len: Vec<usize>,
    /// `out × ksize` fixed-point weights.
    weights: Vec<i32>,
}

/// `precompute_coeffs` + `normalize_coeffs_8bpc` for `in_size → out_size`.
fn taps(in_size: usize, out_size: usize, filter: Filter) -> Taps {
    let scale = in_size as f32 as f64 / out_size as f64;
    let filterscale = scale.max(1.0);
    let support = filter.support() * filterscale;
    let ksize = support.ceil() as usize * 2 + 1;
    let mut first = Vec::with_capacity(out_size);
    let mut len = Vec::with_capacity(out_size);
    let mut weights = vec![0i32; out_size * ksize];
    let mut k = vec![0f64; ksize];
    for xx in 0..out_size {
        let center = (xx as f64 + 0.5) * scale;
        let ss = 1.0 / filterscale;
        // C's `(int)` truncates toward zero; negatives are clamped to 0 next.
        let xmin = ((center - support + 0.5) as i64).max(0) as usize;
        let xmax = ((center + support + 0.5) as i64).min(in_size as i64) as usize;
        let n = xmax.saturating_sub(xmin);
        let mut ww = 0.0;
        for (x, kx) in k.iter_mut().enumerate().take(n) {
            let w = filter.weight((x as f64 + xmin as f64 - center + 0.5) * ss);
            *kx = w;
            ww += w;
        }
        for (x, &kx) in k.iter().enumerate().take(n) {
            let w = if ww != 0.0 { kx / ww } else { kx };
            let fixed = w * f64::from(1u32 << PRECISION_BITS);
            weights[xx * ksize + x] = if w < 0.0 {
                (fixed - 0.5) as i32
            } else {
                (fixed + 0.5) as i32
            };
        }
        first.push(xmin);
        len.push(n);
    }
    Taps {
        ksize,
        first,
        len,
        weights,
    }
}

/// `clip8`: the fixed-point sum back to a byte.
fn clip8(ss: i32) -> u8 {
    (ss >> PRECISION_BITS).clamp(0, 255) as u8
}

/// An interleaved 8-bit image: `height × width × channels` bytes, row-major.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Image8 {
    /// Width in pixels.
    pub width: usize,
    /// Height in pixels.
    pub height: usize,
    /// Channels per pixel (1 to 4).
    pub channels: usize,
    /// The bytes.
    pub data: Vec<u8>,
}

impl Image8 {
    /// Pillow's `resize((width, height), filter)` (no box, no `reducing_gap`); the
    /// same size returns a copy, as Pillow does. Pillow 13's pass order: the vertical
    /// pass first when the height shrinks by more than twice what the width does, else
    /// the horizontal pass first over only the rows the vertical pass reads (the pass
    /// between is stored as bytes, so the order shows in the output).
    pub fn resize(&self, width: usize, height: usize, filter: Filter) -> Image8 {
        let need_h = width != self.width;
        let need_v = height != self.height;
        let dh = self.height as i64 - height as i64;
        let dw = self.width as i64 - width as i64;
        let horizontal_first = !(dh > 0 && dh > dw * 2);
        let mut img = self.clone();
        if horizontal_first {
            if need_h {
                let (first, rows) = if need_v {
                    let vert = taps(self.height, height, filter);
                    let first = vert.first.first().copied().unwrap_or(0);
                    let last = match (vert.first.last(), vert.len.last()) {
                        (Some(f), Some(l)) => f + l,
                        _ => 0,
                    };
                    (first, last - first)
                } else {
                    (0, self.height)
                };
                img = img.horizontal(&taps(self.width, width, filter), first, rows);
                if need_v {
                    img = img.vertical(&taps(self.height, height, filter), first);
                }
            } else if need_v {
                img = img.vertical(&taps(self.height, height, filter), 0);
            }
        } else {
            if need_v {
                img = img.vertical(&taps(self.height, height, filter), 0);
            }
            if need_h {
                let rows = img.height;
                img = img.horizontal(&taps(self.width, width, filter), 0, rows);
            }
        }
        img
    }

    /// `ImagingResampleHorizontal_8bpc` over input rows `first..first + rows`.
    fn horizontal(&self, h: &Taps, first: usize, rows: usize) -> Image8 {
        let (c, width) = (self.channels, h.first.len());
        let mut out = vec![0u8; rows * width * c];
        for yy in 0..rows {
            let line = &self.data[(yy + first) * self.width * c..][..self.width * c];
            for xx in 0..width {
                let k = &h.weights[xx * h.ksize..][..h.len[xx]];
                let x0 = h.first[xx];
                for ch in 0..c {
                    let mut ss = 1i32 << (PRECISION_BITS - 1);
                    for (x, &w) in k.iter().enumerate() {
                        ss = ss.wrapping_add(i32::from(line[(x0 + x) * c + ch]) * w);
                    }
                    out[(yy * width + xx) * c + ch] = clip8(ss);
                }
            }
        }
        Image8 {
            width,
            height: rows,
            channels: c,
            data: out,
        }
    }

    /// `ImagingResampleVertical_8bpc`; this image's row 0 is the input's row `row0`.
    fn vertical(&self, v: &Taps, row0: usize) -> Image8 {
        let (c, width, height) = (self.channels, self.width, v.first.len());
        let mut out = vec![0u8; height * width * c];
        for yy in 0..height {
            let k = &v.weights[yy * v.ksize..][..v.len[yy]];
            let y0 = v.first[yy] - row0;
            for xx in 0..width {
                for ch in 0..c {
                    let mut ss = 1i32 << (PRECISION_BITS - 1);
                    for (y, &w) in k.iter().enumerate() {
                        let px = self.data[((y0 + y) * width + xx) * c + ch];
                        ss = ss.wrapping_add(i32::from(px) * w);
                    }
                    out[(yy * width + xx) * c + ch] = clip8(ss);
                }
            }
        }
        Image8 {
            width,
            height,
            channels: c,
            data: out,
        }
    }
}
