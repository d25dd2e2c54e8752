//! `Idefics3ImageProcessor` (Idefics3, SmolVLM and SmolVLM2; transformers'
//! `image_processing_idefics3.py`, PIL backend): the longest edge resized to
//! `size.longest_edge` (the other side even), then, with image splitting, resized up to
//! whole tiles of `max_image_size.longest_edge` and cut into row-major tiles followed by
//! the whole image squashed to one tile (the "global" image); all with Lanczos.

use super::processors::{normalize, PixelValues, Rescale};
use super::resample::{Filter, Image8};

/// transformers' `MAX_IMAGE_SIZE` for Idefics3: no side beyond 4096 px.
const MAX_IMAGE_SIDE: usize = 4096;

/// What one image becomes.
#[derive(Debug, Clone, PartialEq)]
pub struct Idefics3Image {
    /// The frames, each `[3, tile, tile]`: the tiles row by row, then the global image
    /// (one frame when the image was not split).
    pub frames: Vec<PixelValues>,
    /// Tile rows (0: not split).
    pub rows: usize,
    /// Tile columns (0: not split).
    pub cols: usize,
}

/// The processor's settings (`preprocessor_config.json`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Idefics3Processor {
    /// `size.longest_edge` (SmolVLM: 1536; SmolVLM2: 2048).
    pub longest_edge: usize,
    /// `max_image_size.longest_edge`, the tile side (384; 512).
    pub tile: usize,
    /// `do_image_splitting`.
    pub split: bool,
    /// `resample` (Lanczos).
    pub filter: Filter,
    /// Rescale and normalize (mean and std 0.5).
    pub rescale: Rescale,
}

/// `_resize_output_size_rescale_to_max_len` then
/// `_resize_output_size_scale_below_upper_bound`: `(height, width)`.
pub fn resized_size(height: usize, width: usize, longest_edge: usize) -> (usize, usize) {
    let aspect = width as f64 / height as f64;
    let (mut h, mut w) = if width >= height {
        let mut h = (longest_edge as f64 / aspect) as usize;
        h += h % 2;
        (h, longest_edge)
    } else {
        let mut w = (longest_edge as f64 * aspect) as usize;
        w += w % 2;
        (longest_edge, w)
    };
    (h, w) = (h.max(1), w.max(1));
    let aspect = w as f64 / h as f64;
    if w >= h && w > MAX_IMAGE_SIDE {
        (h, w) = ((MAX_IMAGE_SIDE as f64 / aspect) as usize, MAX_IMAGE_SIDE);
    } else if h > w && h > MAX_IMAGE_SIDE {
        (h, w) = (MAX_IMAGE_SIDE, (MAX_IMAGE_SIDE as f64 * aspect) as usize);
    }
    (h.max(1), w.max(1))
}

/// `resize_for_vision_encoder`: `(height, width)` rounded up to whole tiles, the
/// shorter side through the aspect ratio first.
pub fn tiled_size(height: usize, width: usize, tile: usize) -> (usize, usize) {
    let aspect = width as f64 / height as f64;
    let up = |x: f64| (x / tile as f64).ceil() as usize * tile;
    if width >= height {
        let w = up(width as f64);
        let h = (w as f64 / aspect) as usize;
        (up(h as f64), w)
    } else {
        let h = up(height as f64);
        let w = (h as f64 * aspect) as usize;
        (h, up(w as f64))
    }
}

impl Idefics3Processor {
    /// The frames of one RGB image, with its tile grid.
    pub fn process(&self, rgb: &Image8) -> Idefics3Image {
        let (h, w) = resized_size(rgb.height, rgb.width, self.longest_edge);
        let img = rgb.resize(w, h, self.filter);
        let t = self.tile;
        if !self.split {
            let frame = normalize(&img.resize(t, t, self.filter), &self.rescale);
            return Idefics3Image {
                frames: vec![frame],
                rows: 0,
                cols: 0,
            };
        }
        let (h2, w2) = tiled_size(h, w, t);
        let img = img.resize(w2, h2, self.filter);
        if h2 <= t && w2 <= t {
            return Idefics3Image {
                frames: vec![normalize(&img, &self.rescale)],
                rows: 0,
                cols: 0,
            };
        }
        let (rows, cols) = ((h2 - t) / t + 1, (w2 - t) / t + 1);
        let mut frames = Vec::with_capacity(rows * cols + 1);
        for r in 0..rows {
            for c in 0..cols {
                frames.push(normalize(&crop(&img, c * t, r * t, t), &self.rescale));
            }
        }
        frames.push(normalize(&img.resize(t, t, self.filter), &self.rescale));
        Idefics3Image { frames, rows, cols }
    }
}

/// The `side × side` square at `(left, top)`.
fn crop(img: &Image8, left: usize, top: usize, side: usize) -> Image8 {
    let c = img.channels;
    let mut data = Vec::with_capacity(side * side * c);
    for y in top..top + side {
        data.extend_from_slice(&img.data[(y * img.width + left) * c..][..side * c]);
    }
    Image8 {
        width: side,
        height: side,
        channels: c,
        data,
    }
}
