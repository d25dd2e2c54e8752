//! The per-family image processors.

use super::resample::{Filter, Image8};

/// A float tensor in row-major order.
#[derive(Debug, Clone, PartialEq)]
pub struct PixelValues {
    /// Its shape.
    pub shape: Vec<usize>,
    /// `shape.iter().product()` values.
    pub data: Vec<f32>,
}

/// Rescale and normalize settings (`rescale_factor`, `image_mean`, `image_std`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Rescale {
    /// `rescale_factor` (1/255 in every processor here).
    pub factor: f64,
    /// `image_mean`, per channel.
    pub mean: [f32; 3],
    /// `image_std`, per channel.
    pub std: [f32; 3],
}

impl Rescale {
    /// Mean and std 0.5 (Gemma 3's SigLIP, Idefics3).
    pub const HALF: Rescale = Rescale {
        factor: 1.0 / 255.0,
        mean: [0.5; 3],
        std: [0.5; 3],
    };
    /// OpenAI CLIP's mean and std (`OPENAI_CLIP_MEAN` / `OPENAI_CLIP_STD` in
    /// transformers' `image_utils.py`; LLaVA, Qwen2-VL).
    pub const CLIP: Rescale = Rescale {
        factor: 1.0 / 255.0,
        mean: [0.481_454_66, 0.457_827_5, 0.408_210_73],
        std: [0.268_629_54, 0.261_302_6, 0.275_777_1],
    };
}

/// `pixel_values` of one RGB image, channels first (`[3, height, width]`), rescaled and
/// normalized as transformers does.
pub fn normalize(img: &Image8, r: &Rescale) -> PixelValues {
    let (w, h) = (img.width, img.height);
    let mut data = vec![0f32; 3 * h * w];
    for (i, px) in img.data.chunks_exact(img.channels).enumerate() {
        for c in 0..3 {
            let v = px[c.min(img.channels - 1)];
            let scaled = (f64::from(v) * r.factor) as f32;
            data[c * h * w + i] = (scaled - r.mean[c]) / r.std[c];
        }
    }
    PixelValues {
        shape: vec![3, h, w],
        data,
    }
}

/// `Gemma3ImageProcessor` without pan-and-scan: RGB, a resize to `size × size`
/// (bilinear in Gemma 3's config), mean and std 0.5.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Gemma3Processor {
    /// `size.height` = `size.width` (896 for Gemma 3).
    pub size: usize,
    /// `resample`.
    pub filter: Filter,
    /// Rescale and normalize.
    pub rescale: Rescale,
    /// `None`: stretched to the square (transformers); a colour: [`letterbox`]ed in it
    /// (llama.cpp's fixed-size preprocessing, black for Gemma 3).
    pub pad: Option<[u8; 3]>,
}

impl Gemma3Processor {
    /// `pixel_values` `[3, size, size]`.
    pub fn process(&self, rgb: &Image8) -> PixelValues {
        let img = match self.pad {
            None => rgb.resize(self.size, self.size, self.filter),
            Some(color) => letterbox(rgb, self.size, self.size, self.filter, color),
        };
        normalize(&img, &self.rescale)
    }
}

/// llama.cpp's `img_tool::resize` with `PAD_CEIL` (`tools/mtmd/mtmd-image.cpp`): the
/// image scaled by `min(tw / w, th / h)` (f32), its size rounded up and clamped to the
/// target, resized (Pillow's resampling, which llama.cpp ports), and drawn on a
/// `tw × th` canvas of `color` at `((tw − nw) / 2, (th − nh) / 2)`; an image already of
/// the target size is copied. `img` has 3 channels.
pub fn letterbox(img: &Image8, tw: usize, th: usize, filter: Filter, color: [u8; 3]) -> Image8 {
    if (img.width, img.height) == (tw, th) {
        return img.clone();
    }
    let scale = (tw as f32 / img.width as f32).min(th as f32 / img.height as f32);
    let nw = ((img.width as f32 * scale).ceil() as usize).clamp(1, tw);
    let nh = ((img.height as f32 * scale).ceil() as usize).clamp(1, th);
    let inner = img.resize(nw, nh, filter);
    let c = img.channels;
    let mut data: Vec<u8> = (0..tw * th).flat_map(|_| color).collect();
    let (ox, oy) = ((tw - nw) / 2, (th - nh) / 2);
    for y in 0..nh {
        let src = &inner.data[y * nw * c..(y + 1) * nw * c];
        let at = ((oy + y) * tw + ox) * c;
        data[at..at + nw * c].copy_from_slice(src);
    }
    Image8 {
        width: tw,
        height: th,
        channels: c,
        data,
    }
}

/// `CLIPImageProcessor` as LLaVA-1.5 configures it: the shortest edge resized to
/// `shortest_edge` (the other as `int(shortest_edge · long / short)`, transformers'
/// `get_resize_output_image_size` with `default_to_square = False`), a center crop of
/// `crop × crop` (offsets `(size − crop) // 2`), CLIP's mean and std.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ClipProcessor {
    /// `size.shortest_edge`.
    pub shortest_edge: usize,
    /// `crop_size` (square).
    pub crop: usize,
    /// `resample` (bicubic for CLIP).
    pub filter: Filter,
    /// Rescale and normalize.
    pub rescale: Rescale,
    /// `None`: shortest edge then centre crop (transformers); a colour: [`letterbox`]ed
    /// in `crop × crop` (llama.cpp's LLaVA-1.5 preprocessing, pad colour 122, 116, 104).
    pub pad: Option<[u8; 3]>,
}

impl ClipProcessor {
    /// The resized size `(width, height)`.
    pub fn resized(&self, width: usize, height: usize) -> (usize, usize) {
        let (short, long) = if width <= height {
            (width, height)
        } else {
            (height, width)
        };
        let s = self.shortest_edge;
        // `int(requested_new_short * long / short)`: Python's float division, truncated.
        let new_long = (s as f64 * long as f64 / short as f64) as usize;
        if width <= height {
            (s, new_long)
        } else {
            (new_long, s)
        }
    }

    /// `pixel_values` `[3, crop, crop]`.
    pub fn process(&self, rgb: &Image8) -> PixelValues {
        if let Some(color) = self.pad {
            let img = letterbox(rgb, self.crop, self.crop, self.filter, color);
            return normalize(&img, &self.rescale);
        }
        let (w, h) = self.resized(rgb.width, rgb.height);
        let resized = rgb.resize(w, h, self.filter);
        normalize(&center_crop(&resized, self.crop, self.crop), &self.rescale)
    }
}

/// transformers' `center_crop` for a crop inside the image (the processors here
/// always resize first so that it is): rows from `(h − crop_h) // 2`, columns from
/// `(w − crop_w) // 2`.
fn center_crop(img: &Image8, crop_w: usize, crop_h: usize) -> Image8 {
    let c = img.channels;
    let top = img.height.saturating_sub(crop_h) / 2;
    let left = img.width.saturating_sub(crop_w) / 2;
    let (crop_w, crop_h) = (crop_w.min(img.width), crop_h.min(img.height));
    let mut data = Vec::with_capacity(crop_w * crop_h * c);
    for y in top..top + crop_h {
        let row = &img.data[(y * img.width + left) * c..][..crop_w * c];
        data.extend_from_slice(row);
    }
    Image8 {
        width: crop_w,
        height: crop_h,
        channels: c,
        data,
    }
}

/// Qwen2-VL's `smart_resize` (`image_processing_qwen2_vl.py`): `(height, width)`
/// rounded to multiples of `factor` (`patch_size · merge_size`), scaled down by
/// `sqrt(h · w / max_pixels)` or up by `sqrt(min_pixels / (h · w))` when the rounded
/// area falls outside `[min_pixels, max_pixels]`. Python's `round` is half-to-even.
pub fn smart_resize(
    height: usize,
    width: usize,
    factor: usize,
    min_pixels: usize,
    max_pixels: usize,
) -> (usize, usize) {
    let (h, w, f) = (height as f64, width as f64, factor as f64);
    let mut h_bar = (h / f).round_ties_even() as usize * factor;
    let mut w_bar = (w / f).round_ties_even() as usize * factor;
    if h_bar * w_bar > max_pixels {
        let beta = (h * w / max_pixels as f64).sqrt();
        h_bar = factor.max((h / beta / f).floor() as usize * factor);
        w_bar = factor.max((w / beta / f).floor() as usize * factor);
    } else if h_bar * w_bar < min_pixels {
        let beta = (min_pixels as f64 / (h * w)).sqrt();
        h_bar = (h * beta / f).ceil() as usize * factor;
        w_bar = (w * beta / f).ceil() as usize * factor;
    }
    (h_bar, w_bar)
}

/// llama.cpp's `calc_size_preserved_ratio` without a longest edge
/// (`tools/mtmd/mtmd-image.cpp`), its Qwen-VL sizing: as [`smart_resize`] but in f32,
/// rounding halves away from zero (`std::round`) and never below one `factor`.
/// Returns `(height, width)`.
pub fn mtmd_size(
    height: usize,
    width: usize,
    factor: usize,
    min_pixels: usize,
    max_pixels: usize,
) -> (usize, usize) {
    let f = factor as f32;
    let (h, w) = (height as f32, width as f32);
    let by = |x: f32, op: fn(f32) -> f32| op(x / f) as usize * factor;
    let mut w_bar = factor.max(by(w, f32::round));
    let mut h_bar = factor.max(by(h, f32::round));
    if h_bar * w_bar > max_pixels {
        let beta = (h * w / max_pixels as f32).sqrt();
        h_bar = factor.max(by(h / beta, f32::floor));
        w_bar = factor.max(by(w / beta, f32::floor));
    } else if h_bar * w_bar < min_pixels {
        let beta = (min_pixels as f32 / (h * w)).sqrt();
        h_bar = by(h * beta, f32::ceil);
        w_bar = by(w * beta, f32::ceil);
    }
    (h_bar, w_bar)
}

/// `Qwen2VLImageProcessor` for one image.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct QwenVlProcessor {
    /// `patch_size` (14).
    pub patch_size: usize,
    /// `temporal_patch_size` (2): an image is repeated to fill it.
    pub temporal_patch_size: usize,
    /// `merge_size` (2): patches merged per side into one token.
    pub merge_size: usize,
    /// `min_pixels`.
    pub min_pixels: usize,
    /// `max_pixels`.
    pub max_pixels: usize,
    /// `resample` (bicubic).
    pub filter: Filter,
    /// Rescale and normalize (CLIP's mean and std).
    pub rescale: Rescale,
    /// llama.cpp's sizing ([`mtmd_size`]) and a black [`letterbox`] into it, instead of
    /// transformers' [`smart_resize`] and a stretch.
    pub mtmd: bool,
}

impl QwenVlProcessor {
    /// `pixel_values` `[grid_t · grid_h · grid_w, 3 · temporal · patch · patch]` and
    /// `image_grid_thw` `[grid_t, grid_h, grid_w]`. Rows run over merge windows
    /// (`grid_h / merge` × `grid_w / merge`), then the `merge × merge` patches inside
    /// one; each row holds channel, temporal copy, then the patch's pixels — the
    /// processor's `transpose(0, 3, 6, 4, 7, 2, 1, 5, 8)`.
    pub fn process(&self, rgb: &Image8) -> (PixelValues, [usize; 3]) {
        let factor = self.patch_size * self.merge_size;
        let size = match self.mtmd {
            false => smart_resize,
            true => mtmd_size,
        };
        let (h, w) = size(
            rgb.height,
            rgb.width,
            factor,
            self.min_pixels,
            self.max_pixels,
        );
        let img = match self.mtmd {
            false => rgb.resize(w, h, self.filter),
            true => letterbox(rgb, w, h, self.filter, [0, 0, 0]),
        };
        let pv = normalize(&img, &self.rescale);
        let (p, m, t) = (self.patch_size, self.merge_size, self.temporal_patch_size);
        let (gh, gw) = (h / p, w / p);
        let row = 3 * t * p * p;
        let mut data = Vec::with_capacity(gh * gw * row);
        for bh in 0..gh / m {
            for bw in 0..gw / m {
                for mh in 0..m {
                    for mw in 0..m {
                        let (py, px) = ((bh * m + mh) * p, (bw * m + mw) * p);
                        for c in 0..3 {
                            for _ in 0..t {
                                for y in 0..p {
                                    let at = c * h * w + (py + y) * w + px;
                                    data.extend_from_slice(&pv.data[at..at + p]);
                                }
                            }
                        }
                    }
                }
            }
        }
        (
            PixelValues {
                shape: vec![gh * gw, row],
                data,
            },
            [1, gh, gw],
        )
    }
}
