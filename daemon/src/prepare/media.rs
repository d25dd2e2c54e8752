//! The media step of preparation: a request's images read (a `data:` URL's base64, or
//! a file inside `media.local_dirs`) and decoded under the `[media]` bounds, each
//! refusal a `validation` error naming the part, the key and the value.
//!
//! Decoding is bounded before it starts: the encoded size against
//! `media.max_image_bytes`, then the header's width × height against
//! `media.max_image_pixels` and `media.max_aspect_ratio`, and only then the pixels,
//! with `image::Limits` holding the decoder to the header's size and to an allocation
//! budget (a decompression bomb or a header that lies is refused, never decoded into
//! memory). A panic inside a decoder fails only its request.

use std::io::{Cursor, Read};
use std::path::{Path, PathBuf};

use image::{ImageFormat, ImageReader, Limits};
use sha2::{Digest, Sha256};

use crate::config::MediaConfig;
use crate::error::InferError;
use crate::request::{ChatMessage, ImageInput, ImageSource};

/// Bytes a decoder may allocate beyond the 8 bytes per pixel of the largest output
/// (RGBA16): its own buffers.
const DECODER_SLACK_BYTES: u64 = 64 << 20;

/// One decoded image.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DecodedImage {
    /// The part's path in the request (`messages[0].content[1]`).
    pub at: String,
    /// Which message it is in, and its byte offset in that message's text.
    pub message: usize,
    /// See [`ImageInput::offset`].
    pub offset: usize,
    /// The file format it came in.
    pub format: ImageFormat,
    /// Width in pixels.
    pub width: u32,
    /// Height in pixels.
    pub height: u32,
    /// RGBA, 8 bits per channel, row-major: `height × width × 4` bytes (alpha kept;
    /// each model's preprocessing flattens it as its image processor does).
    pub rgba: Vec<u8>,
    /// SHA-256 of width, height (little-endian u32) and `rgba`: the key the prefix
    /// cache hashes the image's tokens by (equal pictures hit whatever their file).
    pub content_hash: [u8; 32],
}

/// The media step's settings: the `[media]` bounds.
#[derive(Debug)]
pub struct MediaStep {
    config: MediaConfig,
    /// Held while one image is decoded and processed: whatever the prepare pool's
    /// size, one decoded image (at most `max_image_pixels` RGBA pixels) is in memory
    /// at a time, so a burst of large images cannot multiply it by the threads.
    gate: std::sync::Mutex<()>,
}

impl MediaStep {
    /// The step for `config`. `local_dirs` are resolved at each request, so a
    /// directory created after start-up counts; one missing at start is warned about.
    pub fn new(config: &MediaConfig) -> Self {
        for d in &config.local_dirs {
            if let Err(e) = d.canonicalize() {
                tracing::warn!(dir = %d.display(), error = %e, "media.local_dirs entry unusable now");
            }
        }
        Self {
            config: config.clone(),
            gate: std::sync::Mutex::new(()),
        }
    }

    /// Every image of `messages`, decoded, in order.
    ///
    /// # Errors
    /// `validation`: more images than `media.max_images_per_request`, or the first
    /// image that cannot be read or decoded within the bounds, naming its part.
    pub fn decode_all(&self, messages: &[ChatMessage]) -> Result<Vec<DecodedImage>, InferError> {
        self.decode_each(messages, |d| d)
    }

    /// Every image of `messages`, decoded and handed to `then` (a model's processor),
    /// in order, one image at a time in the whole process: the decoded pixels are
    /// dropped before the next image is decoded.
    ///
    /// # Errors
    /// As [`Self::decode_all`].
    pub fn decode_each<T>(
        &self,
        messages: &[ChatMessage],
        mut then: impl FnMut(DecodedImage) -> T,
    ) -> Result<Vec<T>, InferError> {
        let count: usize = messages.iter().map(|m| m.images.len()).sum();
        let max = self.config.max_images_per_request;
        if count > max {
            return Err(InferError::validation(format!(
                "messages: {count} image{}, above media.max_images_per_request = {max}",
                if count == 1 { "" } else { "s" }
            )));
        }
        let mut out = Vec::with_capacity(count);
        for (i, m) in messages.iter().enumerate() {
            for img in &m.images {
                let bytes = self.read(img)?;
                // A panic while holding it (caught in the decoder) leaves nothing to
                // repair: the lock guards no data.
                let _one = self
                    .gate
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner);
                let mut d = self.decode(&img.at, &bytes)?;
                drop(bytes);
                d.message = i;
                d.offset = img.offset;
                out.push(then(d));
            }
        }
        Ok(out)
    }

    /// Whether an image is being decoded or processed now (tests).
    #[cfg(test)]
    pub(super) fn gate_is_held(&self) -> bool {
        self.gate.try_lock().is_err()
    }

    /// The encoded bytes of `img`, at most `media.max_image_bytes` of them.
    fn read(&self, img: &ImageInput) -> Result<Vec<u8>, InferError> {
        let max = self.config.max_image_bytes;
        let url = format!("{}.image_url.url", img.at);
        let too_big = |n: u64| {
            InferError::validation(format!(
                "{}: the image is {n} bytes, above media.max_image_bytes = {max}",
                img.at
            ))
        };
        match &img.source {
            ImageSource::Data { base64, .. } => {
                let text: Vec<u8> = base64
                    .bytes()
                    .filter(|b| !b.is_ascii_whitespace())
                    .collect();
                let encoding = if text.len().is_multiple_of(4) {
                    &data_encoding::BASE64
                } else {
                    &data_encoding::BASE64_NOPAD
                };
                let bound = encoding.decode_len(text.len()).map_err(|e| {
                    InferError::validation(format!("{url}: the data is not valid base64 ({e})"))
                })?;
                if bound as u64 > max + 2 {
                    let pad = text.iter().rev().take_while(|&&b| b == b'=').count();
                    return Err(too_big(((text.len() - pad) * 3 / 4) as u64));
                }
                let bytes = encoding.decode(&text).map_err(|e| {
                    InferError::validation(format!("{url}: the data is not valid base64 ({e})"))
                })?;
                if bytes.len() as u64 > max {
                    return Err(too_big(bytes.len() as u64));
                }
                Ok(bytes)
            }
            ImageSource::File(path) => {
                let real = self.allowed(&url, path)?;
                let file = std::fs::File::open(&real).map_err(|e| {
                    InferError::validation(format!("{url}: cannot read {}: {e}", path.display()))
                })?;
                let mut bytes = Vec::new();
                file.take(max + 1).read_to_end(&mut bytes).map_err(|e| {
                    InferError::validation(format!("{url}: cannot read {}: {e}", path.display()))
                })?;
                if bytes.len() as u64 > max {
                    let len = real.metadata().map_or(bytes.len() as u64, |m| m.len());
                    return Err(too_big(len));
                }
                Ok(bytes)
            }
        }
    }

    /// `path` with symbolic links resolved, when it names a regular file inside a
    /// `local_dirs` entry. The path must lie inside an entry as written (no `..`)
    /// before the file system is asked anything, and every failure after that gives
    /// the same answer, so a request cannot learn which files exist elsewhere.
    fn allowed(&self, url: &str, path: &Path) -> Result<PathBuf, InferError> {
        let dirs = &self.config.local_dirs;
        if dirs.is_empty() {
            return Err(InferError::validation(format!(
                "{url}: file: URLs are refused (media.local_dirs is empty; got {})",
                path.display()
            )));
        }
        let refused = || {
            InferError::validation(format!(
                "{url}: {} is not a readable file inside a directory of media.local_dirs",
                path.display()
            ))
        };
        let plain = path
            .components()
            .all(|c| !matches!(c, std::path::Component::ParentDir));
        let resolved: Vec<PathBuf> = dirs.iter().filter_map(|d| d.canonicalize().ok()).collect();
        let inside = |p: &Path| dirs.iter().chain(&resolved).any(|d| p.starts_with(d));
        if !plain || !inside(path) {
            return Err(refused());
        }
        let real = path.canonicalize().map_err(|_| refused())?;
        if !resolved.iter().any(|d| real.starts_with(d)) || !real.is_file() {
            return Err(refused());
        }
        Ok(real)
    }

    /// Decodes `bytes` within the bounds.
    fn decode(&self, at: &str, bytes: &[u8]) -> Result<DecodedImage, InferError> {
        let reader = ImageReader::new(Cursor::new(bytes))
            .with_guessed_format()
            .map_err(|e| InferError::validation(format!("{at}: cannot read the image: {e}")))?;
        let format = match reader.format() {
            Some(
                f @ (ImageFormat::Png | ImageFormat::Jpeg | ImageFormat::WebP | ImageFormat::Gif),
            ) => f,
            other => {
                let got = other.map_or("an unknown format".to_owned(), |f| format!("{f:?}"));
                return Err(InferError::validation(format!(
                    "{at}: the image format is not supported (PNG, JPEG, WebP or GIF; got {got})"
                )));
            }
        };
        let name = format!("{format:?}").to_uppercase();
        let (width, height) = guarded(|| {
            let mut r = ImageReader::with_format(Cursor::new(bytes), format);
            r.limits(Limits::default());
            r.into_dimensions()
        })
        .map_err(|e| {
            InferError::validation(format!(
                "{at}: the {name} header does not decode: {}",
                decoder_message(&e)
            ))
        })?;
        self.check_size(at, width, height)?;
        let mut limits = Limits::default();
        limits.max_image_width = Some(width);
        limits.max_image_height = Some(height);
        limits.max_alloc = Some(u64::from(width) * u64::from(height) * 8 + DECODER_SLACK_BYTES);
        let image = guarded(|| {
            let mut r = ImageReader::with_format(Cursor::new(bytes), format);
            r.limits(limits);
            r.decode()
        })
        .map_err(|e| {
            InferError::validation(format!(
                "{at}: the {name} image does not decode: {}",
                decoder_message(&e)
            ))
        })?;
        // zune-jpeg fills a cut-off scan with grey; the end-of-image marker tells.
        if format == ImageFormat::Jpeg && !jpeg_ends(bytes) {
            return Err(InferError::validation(format!(
                "{at}: the JPEG image is truncated (no end-of-image marker near its end)"
            )));
        }
        if (image.width(), image.height()) != (width, height) {
            return Err(InferError::validation(format!(
                "{at}: the {name} image decodes to {}x{}, not the {width}x{height} its header says",
                image.width(),
                image.height()
            )));
        }
        let rgba = image.into_rgba8().into_raw();
        let mut h = Sha256::new();
        h.update(width.to_le_bytes());
        h.update(height.to_le_bytes());
        h.update(&rgba);
        Ok(DecodedImage {
            at: at.to_owned(),
            message: 0,
            offset: 0,
            format,
            width,
            height,
            rgba,
            content_hash: h.finalize().into(),
        })
    }

    /// The header's size against `max_image_pixels` and `max_aspect_ratio`.
    fn check_size(&self, at: &str, width: u32, height: u32) -> Result<(), InferError> {
        if width == 0 || height == 0 {
            return Err(InferError::validation(format!(
                "{at}: the image has no pixels ({width}x{height})"
            )));
        }
        let pixels = u64::from(width) * u64::from(height);
        let max = self.config.max_image_pixels;
        if pixels > max {
            return Err(InferError::validation(format!(
                "{at}: the image is {width}x{height} = {pixels} pixels, above \
                 media.max_image_pixels = {max}"
            )));
        }
        let (long, short) = (width.max(height), width.min(height));
        let max = self.config.max_aspect_ratio;
        if u64::from(long) > max * u64::from(short) {
            return Err(InferError::validation(format!(
                "{at}: the image's aspect ratio is {:.1} ({width}x{height}), above \
                 media.max_aspect_ratio = {max}",
                f64::from(long) / f64::from(short)
            )));
        }
        Ok(())
    }
}

/// Whether a JPEG's last 4 KiB hold its end-of-image marker (`FF D9`; bytes after it
/// are tolerated, as decoders do). An embedded EXIF thumbnail's own marker sits near
/// the start of the file, so a file cut after it is still caught unless the cut falls
/// within 4 KiB of it.
/// A decoder's message as one line a client can read: trailing whitespace dropped,
/// control characters escaped and its length bounded (a corrupt file's bytes can
/// appear in it).
fn decoder_message(e: &str) -> String {
    crate::model::source::bounded(e.trim_end())
}

fn jpeg_ends(bytes: &[u8]) -> bool {
    let tail = &bytes[bytes.len().saturating_sub(4096)..];
    tail.windows(2).any(|w| w == [0xFF, 0xD9])
}

/// Runs a decoder call, turning a panic inside it into an error.
fn guarded<T>(f: impl FnOnce() -> image::ImageResult<T>) -> Result<T, String> {
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)) {
        Ok(Ok(v)) => Ok(v),
        Ok(Err(e)) => Err(e.to_string()),
        Err(_) => Err("the decoder failed".into()),
    }
}
