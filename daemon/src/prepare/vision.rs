//! A vision-language model's prompt side: each decoded image through the model's image
//! processor, the placeholder text that replaces the template's image marker, and the
//! image's place among the prompt ids.
//!
//! Expansions (transformers 5.24.0 processors):
//! - Gemma 3 (`processing_gemma3.py`): the template's `<start_of_image>` becomes
//!   `"\n\n" + boi + image_token × mm_tokens_per_image + eoi + "\n\n"`; the image's
//!   tokens attend to each other both ways (`token_type_ids`).
//! - LLaVA (`processing_llava.py`): `<image>` becomes `<image>` × the tower's tokens.
//! - Qwen2.5-VL (`processing_qwen2_5_vl.py`): the template's `<|image_pad|>` (between
//!   `<|vision_start|>` and `<|vision_end|>`) becomes `<|image_pad|>` × `t·h·w / merge²`.
//! - Idefics3 / SmolVLM (`processing_idefics3.py` `_prompt_split_image`): per tile
//!   `<fake_token_around_image><row_R_col_C>` + `<image>` × N, `"\n"` after each tile row,
//!   then `"\n<fake_token_around_image><global-img>"` + `<image>` × N +
//!   `<fake_token_around_image>`; an image not split: `<fake><global-img>` + `<image>` × N
//!   + `<fake>`.

use std::path::Path;
use std::sync::Arc;

use serde_json::Value;

use super::media::DecodedImage;
use super::preprocess::rgb::{rgba_over_white, rgba_without_alpha};
use super::preprocess::{ImageProcessor, PixelValues};
use crate::error::InferError;
use crate::model::source::hf_vlm::VlmFamily;
use crate::request::{PixelLayout, PromptImage};
use crate::tokenizer::{ContentParts, TextTokenizer};

/// A VLM's prompt side.
#[derive(Debug, Clone)]
pub struct VisionPrompt {
    family: VlmFamily,
    processor: ImageProcessor,
    /// The token whose rows the tower's output replaces, and its text.
    image_token: (u32, String),
    /// The template's text for one image.
    marker: String,
    /// Gemma 3's begin / end of image texts.
    boi_eoi: Option<(String, String)>,
    /// Placeholder tokens per frame (tile).
    tokens_per_frame: usize,
    /// llama.cpp's mtmd texts around an image (the GGUF + mmproj path), not
    /// transformers': the template gets the media marker as a text part, Gemma 3's
    /// image is `<start_of_image>` … `<end_of_image>` without `"\n\n"` around it,
    /// Qwen's is wrapped in these `<|vision_start|>` / `<|vision_end|>` texts
    /// (`tools/mtmd/mtmd.cpp`, `init_vision`).
    mtmd: Option<(String, String)>,
}

/// llama.cpp's media marker (`mtmd_default_marker()`), which llama-server puts where an
/// image part was before it applies the template.
pub const MTMD_MARKER: &str = "<__media__>";

/// One image ready for the prompt: its pixel values, its placeholder text, its hash.
#[derive(Debug)]
pub struct ProcessedImage {
    /// What the tower reads.
    pub pixels: Vec<f32>,
    /// Their form.
    pub layout: PixelLayout,
    /// What replaces the template's marker.
    pub text: String,
    /// Placeholder tokens (rows the tower gives).
    pub tokens: usize,
    /// The decoded image's content hash.
    pub hash: [u8; 32],
}

fn token_id(config: &Value, keys: &[&str]) -> Option<u32> {
    keys.iter()
        .find_map(|k| config.get(*k).and_then(Value::as_u64))
        .and_then(|v| u32::try_from(v).ok())
}

impl VisionPrompt {
    /// The prompt side of the checkpoint in `dir` (its `preprocessor_config.json`), with
    /// the whole `config.json` and the tower's tokens per frame.
    ///
    /// # Errors
    /// A message naming the file and key: no or a bad `preprocessor_config.json`, an
    /// image token id missing or outside the vocabulary.
    pub fn from_hf(
        dir: &Path,
        config: &Value,
        tokenizer: &TextTokenizer,
        tokens_per_frame: usize,
    ) -> Result<Self, String> {
        let pp = dir.join("preprocessor_config.json");
        let text = std::fs::read_to_string(&pp).map_err(|e| format!("{}: {e}", pp.display()))?;
        Self::from_parts(config, &text, tokenizer, tokens_per_frame)
    }

    /// The prompt side of an mmproj GGUF ([`crate::model::vision::mmproj::Mmproj`]'s
    /// `config` and `preprocessor`), with llama.cpp's mtmd placeholder texts.
    ///
    /// # Errors
    /// As [`Self::from_hf`].
    pub fn from_mmproj(
        config: &Value,
        preprocessor: &Value,
        tokenizer: &TextTokenizer,
        tokens_per_frame: usize,
    ) -> Result<Self, String> {
        let mut me = Self::from_parts(
            config,
            &preprocessor.to_string(),
            tokenizer,
            tokens_per_frame,
        )?;
        let text_of = |key: &str| {
            token_id(config, &[key])
                .and_then(|id| tokenizer.token_text(id))
                .map(str::to_string)
                .unwrap_or_default()
        };
        let wrap = match me.family {
            VlmFamily::Qwen25Vl => (
                text_of("vision_start_token_id"),
                text_of("vision_end_token_id"),
            ),
            _ => (String::new(), String::new()),
        };
        me.mtmd = Some(wrap);
        me.marker = MTMD_MARKER.to_string();
        Ok(me)
    }

    fn from_parts(
        config: &Value,
        preprocessor_json: &str,
        tokenizer: &TextTokenizer,
        tokens_per_frame: usize,
    ) -> Result<Self, String> {
        let class = config
            .get("architectures")
            .and_then(|a| a.get(0))
            .and_then(Value::as_str)
            .unwrap_or_default();
        let family = VlmFamily::from_hf(class).ok_or_else(|| {
            format!("config.json: architectures[0] {class:?} has no vision prompt here")
        })?;
        let processor = ImageProcessor::from_hf_json(preprocessor_json)?;
        let text_of = |id: u32, key: &str| -> Result<String, String> {
            tokenizer
                .token_text(id)
                .map(str::to_string)
                .ok_or_else(|| format!("config.json: {key} = {id} is outside the vocabulary"))
        };
        let image_id =
            token_id(config, &["image_token_id", "image_token_index"]).ok_or_else(|| {
                "config.json: image_token_id (or image_token_index) is missing".to_string()
            })?;
        let image_text = text_of(image_id, "image_token_id")?;
        let (marker, boi_eoi) = match family {
            VlmFamily::Gemma3 => {
                let boi = token_id(config, &["boi_token_index", "boi_token_id"])
                    .ok_or("config.json: boi_token_index is missing")?;
                let eoi = token_id(config, &["eoi_token_index", "eoi_token_id"])
                    .ok_or("config.json: eoi_token_index is missing")?;
                let boi = text_of(boi, "boi_token_index")?;
                let eoi = text_of(eoi, "eoi_token_index")?;
                (boi.clone(), Some((boi, eoi)))
            }
            VlmFamily::Llava | VlmFamily::Idefics3 | VlmFamily::Qwen25Vl => {
                (image_text.clone(), None)
            }
        };
        let matches = matches!(
            (family, &processor),
            (VlmFamily::Gemma3, ImageProcessor::Gemma3(_))
                | (VlmFamily::Llava, ImageProcessor::Clip(_))
                | (VlmFamily::Idefics3, ImageProcessor::Idefics3(_))
                | (VlmFamily::Qwen25Vl, ImageProcessor::QwenVl(_))
        );
        if !matches {
            return Err(format!(
                "preprocessor_config.json: image_processor_type does not fit {class}"
            ));
        }
        Ok(Self {
            family,
            processor,
            image_token: (image_id, image_text),
            marker,
            boi_eoi,
            tokens_per_frame,
            mtmd: None,
        })
    }

    /// How messages reach the template: typed parts (transformers), or the media
    /// marker as a text part (llama-server, the GGUF + mmproj path).
    pub fn content_parts(&self) -> ContentParts {
        match self.mtmd {
            None => ContentParts::Typed,
            Some(_) => ContentParts::MediaText(self.marker.clone()),
        }
    }

    /// The template's text for one image.
    pub fn marker(&self) -> &str {
        &self.marker
    }

    /// Whether an image's tokens attend to each other both ways (Gemma 3).
    pub fn bidirectional(&self) -> bool {
        self.family == VlmFamily::Gemma3
    }

    /// One decoded image through the processor.
    pub fn process(&self, img: &DecodedImage) -> ProcessedImage {
        let (w, h) = (img.width as usize, img.height as usize);
        let rgb = match self.mtmd {
            None => rgba_over_white(w, h, &img.rgba),
            Some(_) => rgba_without_alpha(w, h, &img.rgba),
        };
        let n = self.tokens_per_frame;
        let tok = &self.image_token.1;
        let frames = |f: &[PixelValues]| -> (Vec<f32>, PixelLayout) {
            let (height, width) = f.first().map_or((0, 0), |p| {
                (p.shape[p.shape.len() - 2], p.shape[p.shape.len() - 1])
            });
            let pixels = f.iter().flat_map(|p| p.data.iter().copied()).collect();
            let layout = PixelLayout::Frames {
                frames: f.len(),
                height,
                width,
            };
            (pixels, layout)
        };
        let (pixels, layout, text, tokens) = match &self.processor {
            ImageProcessor::Gemma3(p) => {
                let (pixels, layout) = frames(&[p.process(&rgb)]);
                let (boi, eoi) = self.boi_eoi.clone().unwrap_or_default();
                let text = match self.mtmd {
                    None => format!("\n\n{boi}{}{eoi}\n\n", tok.repeat(n)),
                    Some(_) => format!("{boi}{}{eoi}", tok.repeat(n)),
                };
                (pixels, layout, text, n)
            }
            ImageProcessor::Clip(p) => {
                let (pixels, layout) = frames(&[p.process(&rgb)]);
                (pixels, layout, tok.repeat(n), n)
            }
            ImageProcessor::Idefics3(p) => {
                let im = p.process(&rgb);
                let (pixels, layout) = frames(&im.frames);
                let fake = "<fake_token_around_image>";
                let mut text = String::new();
                if im.rows == 0 && im.cols == 0 {
                    text.push_str(&format!("{fake}<global-img>{}{fake}", tok.repeat(n)));
                } else {
                    for r in 0..im.rows {
                        for c in 0..im.cols {
                            text.push_str(&format!(
                                "{fake}<row_{}_col_{}>{}",
                                r + 1,
                                c + 1,
                                tok.repeat(n)
                            ));
                        }
                        text.push('\n');
                    }
                    text.push_str(&format!("\n{fake}<global-img>{}{fake}", tok.repeat(n)));
                }
                (pixels, layout, text, n * im.frames.len())
            }
            ImageProcessor::QwenVl(p) => {
                let (pv, grid) = p.process(&rgb);
                let merged = grid[0] * grid[1] * grid[2] / (p.merge_size * p.merge_size).max(1);
                let (start, end) = self.mtmd.clone().unwrap_or_default();
                (
                    pv.data,
                    PixelLayout::Patches {
                        grid_thw: grid,
                        merge: p.merge_size,
                    },
                    format!("{start}{}{end}", tok.repeat(merged)),
                    merged,
                )
            }
        };
        ProcessedImage {
            pixels,
            layout,
            text,
            tokens,
            hash: img.content_hash,
        }
    }

    /// The images' places in `ids` (the prompt after expansion): each takes the next
    /// `tokens` image-token positions, in runs.
    ///
    /// # Errors
    /// `validation` when the prompt's image tokens do not match the images (a template
    /// that drops or repeats an image part).
    pub fn place(
        &self,
        ids: &[u32],
        images: Vec<ProcessedImage>,
    ) -> Result<Vec<Arc<PromptImage>>, InferError> {
        let id = self.image_token.0;
        let mut runs: Vec<std::ops::Range<usize>> = Vec::new();
        for (i, &t) in ids.iter().enumerate() {
            if t != id {
                continue;
            }
            match runs.last_mut() {
                Some(r) if r.end == i => r.end = i + 1,
                _ => runs.push(i..i + 1),
            }
        }
        let found: usize = runs.iter().map(|r| r.len()).sum();
        let want: usize = images.iter().map(|p| p.tokens).sum();
        if found != want {
            return Err(InferError::validation(format!(
                "messages: the chat template placed {found} image tokens for {} images of {want} \
                 tokens (each image part must reach the template once)",
                images.len()
            )));
        }
        let mut runs = runs.into_iter().peekable();
        let mut out = Vec::with_capacity(images.len());
        for p in images {
            let mut mine = Vec::new();
            let mut left = p.tokens;
            while left > 0 {
                let Some(r) = runs.peek_mut() else { break };
                let take = left.min(r.len());
                mine.push(r.start..r.start + take);
                r.start += take;
                left -= take;
                if r.start >= r.end {
                    runs.next();
                }
            }
            out.push(Arc::new(PromptImage {
                hash: p.hash,
                pixels: p.pixels,
                layout: p.layout,
                runs: mine,
                bidirectional: self.bidirectional(),
                features: std::sync::OnceLock::new(),
            }));
        }
        Ok(out)
    }
}
