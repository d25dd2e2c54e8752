//! `[media]`: bounds on the images chat messages carry (decoded in `prepare/`), and the
//! local directories `file:` URLs may read from.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use super::{whole_number, ConfigError};

/// Largest `max_image_bytes`: 1 GiB.
pub const MAX_IMAGE_BYTES: u64 = 1 << 30;
/// Largest `max_image_pixels`: 2^30.
pub const MAX_IMAGE_PIXELS: u64 = 1 << 30;
/// Largest `max_images_per_request`.
pub const MAX_IMAGES_PER_REQUEST: usize = 256;

/// `[media]` settings.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct MediaConfig {
    /// Largest encoded image (bytes after base64 decoding, or the file's size), in
    /// `[1024, 1073741824]`. Default 20 MiB, OpenAI's limit per image.
    #[serde(deserialize_with = "whole_number")]
    pub max_image_bytes: u64,
    /// Largest decoded image, width × height in pixels, in `[1, 1073741824]`; checked
    /// from the header before any pixel is decoded (decompression bombs stop there).
    /// Default 33,554,432 (2^25: a 48-megapixel photo does not fit, 8K UHD does).
    #[serde(deserialize_with = "whole_number")]
    pub max_image_pixels: u64,
    /// Largest ratio of the longer side to the shorter, in `[1, 1000]`. Default 200,
    /// Qwen2.5-VL's processor's bound (`smart_resize`).
    #[serde(deserialize_with = "whole_number")]
    pub max_aspect_ratio: u64,
    /// Most images in one request (all its messages), in `[0, 256]`; 0 refuses
    /// images. Default 8.
    #[serde(deserialize_with = "whole_number")]
    pub max_images_per_request: usize,
    /// Absolute directories `file:` image URLs may name files inside (after resolving
    /// symbolic links). Empty (the default): `file:` URLs are refused.
    pub local_dirs: Vec<PathBuf>,
}

impl Default for MediaConfig {
    fn default() -> Self {
        Self {
            max_image_bytes: 20 << 20,
            max_image_pixels: 1 << 25,
            max_aspect_ratio: 200,
            max_images_per_request: 8,
            local_dirs: Vec::new(),
        }
    }
}

impl MediaConfig {
    /// Checks the bounds; each message names the key, the bound and the value.
    ///
    /// # Errors
    /// The first bad value.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let bad = |m: String| Err(ConfigError(m));
        if !(1024..=MAX_IMAGE_BYTES).contains(&self.max_image_bytes) {
            return bad(format!(
                "media.max_image_bytes must be in [1024, {MAX_IMAGE_BYTES}] (got {})",
                self.max_image_bytes
            ));
        }
        if !(1..=MAX_IMAGE_PIXELS).contains(&self.max_image_pixels) {
            return bad(format!(
                "media.max_image_pixels must be in [1, {MAX_IMAGE_PIXELS}] (got {})",
                self.max_image_pixels
            ));
        }
        if !(1..=1000).contains(&self.max_aspect_ratio) {
            return bad(format!(
                "media.max_aspect_ratio must be in [1, 1000] (got {})",
                self.max_aspect_ratio
            ));
        }
        if self.max_images_per_request > MAX_IMAGES_PER_REQUEST {
            return bad(format!(
                "media.max_images_per_request must be in [0, {MAX_IMAGES_PER_REQUEST}] (got {})",
                self.max_images_per_request
            ));
        }
        for (i, d) in self.local_dirs.iter().enumerate() {
            if !d.is_absolute() {
                return bad(format!(
                    "media.local_dirs[{i}] must be an absolute directory (got {:?})",
                    d.display().to_string()
                ));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(f: impl FnOnce(&mut MediaConfig)) -> String {
        let mut c = MediaConfig::default();
        f(&mut c);
        c.validate().map_or_else(|e| e.0, |()| "ok".into())
    }

    #[test]
    fn bounds_name_key_bound_and_value() {
        assert_eq!(check(|_| {}), "ok");
        assert_eq!(
            check(|c| c.max_image_bytes = 1023),
            "media.max_image_bytes must be in [1024, 1073741824] (got 1023)"
        );
        assert_eq!(
            check(|c| c.max_image_pixels = 0),
            "media.max_image_pixels must be in [1, 1073741824] (got 0)"
        );
        assert_eq!(
            check(|c| c.max_aspect_ratio = 1001),
            "media.max_aspect_ratio must be in [1, 1000] (got 1001)"
        );
        assert_eq!(
            check(|c| c.max_images_per_request = 257),
            "media.max_images_per_request must be in [0, 256] (got 257)"
        );
        assert_eq!(
            check(|c| c.local_dirs = vec!["/srv".into(), "img".into()]),
            "media.local_dirs[1] must be an absolute directory (got \"img\")"
        );
    }
}
