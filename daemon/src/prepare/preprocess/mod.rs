//! Image preprocessing as each model family's transformers image processor does it,
//! from the decoded RGBA pixels to the `pixel_values` its vision tower takes. Every
//! step follows the slow (PIL + NumPy) processors: `convert_to_rgb` ([`rgb`]), a
//! Pillow resize on 8-bit pixels ([`resample`]), crops, then rescale and normalize in
//! transformers' arithmetic (`image_transforms.rescale`: `f64(x) · factor` stored as
//! f32; `normalize`: `(x − mean) / std` in f32).
//!
//! - [`Gemma3Processor`]: `Gemma3ImageProcessor` (a fixed square resize).
//! - [`ClipProcessor`]: `CLIPImageProcessor` as LLaVA-1.5 uses it (shortest edge,
//!   center crop).
//! - [`QwenVlProcessor`]: `Qwen2VLImageProcessor` (Qwen2-VL and Qwen2.5-VL:
//!   `smart_resize` to a multiple of the merged patch, patches flattened in the merge
//!   order, the image repeated over the temporal patch).
//! - [`idefics3::Idefics3Processor`]: `Idefics3ImageProcessor` (Idefics3, SmolVLM:
//!   longest edge, tiles and a global image).

pub mod config;
pub mod idefics3;
pub mod resample;
pub mod rgb;

mod processors;

pub use config::ImageProcessor;
pub use processors::{
    letterbox, mtmd_size, normalize, smart_resize, ClipProcessor, Gemma3Processor, PixelValues,
    QwenVlProcessor, Rescale,
};
pub use resample::{Filter, Image8};

#[cfg(test)]
mod mtmd_tests;
#[cfg(test)]
mod tests;
