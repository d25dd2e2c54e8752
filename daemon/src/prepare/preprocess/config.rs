//! Which image processor a Hugging Face model directory asks for, read from its
//! `preprocessor_config.json` (transformers' `image_processor_type` and the keys of
//! that class), each refusal naming the file, the key and the value. Flags this port
//! does not implement (pan-and-scan, no center crop, no rescale) are refused, not
//! ignored.

use serde_json::{Map, Value};

use super::idefics3::Idefics3Processor;
use super::processors::{ClipProcessor, Gemma3Processor, QwenVlProcessor, Rescale};
use super::resample::Filter;
use crate::model::vision::mmproj::{MTMD_SIZING, PAD_COLOR};

/// A model's image processor.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum ImageProcessor {
    /// `Gemma3ImageProcessor`.
    Gemma3(Gemma3Processor),
    /// `CLIPImageProcessor` (LLaVA-1.5).
    Clip(ClipProcessor),
    /// `Qwen2VLImageProcessor` (Qwen2-VL, Qwen2.5-VL).
    QwenVl(QwenVlProcessor),
    /// `Idefics3ImageProcessor` / `SmolVLMImageProcessor`.
    Idefics3(Idefics3Processor),
}

const FILE: &str = "preprocessor_config.json";

type Result<T> = std::result::Result<T, String>;

fn bad(key: &str, want: &str, got: Option<&Value>) -> String {
    match got {
        Some(v) => format!("{FILE}: {key} must be {want} (got {v})"),
        None => format!("{FILE}: {key} is missing (it must be {want})"),
    }
}

fn uint(o: &Map<String, Value>, key: &str) -> Result<Option<usize>> {
    match o.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(v) => v
            .as_u64()
            .filter(|&n| n > 0)
            .map(|n| Some(n as usize))
            .ok_or_else(|| bad(key, "a positive integer", Some(v))),
    }
}

/// `obj[outer][inner]` as a positive integer, where `outer` is a `size`-like object.
fn nested(o: &Map<String, Value>, outer: &str, inner: &str) -> Result<Option<usize>> {
    match o.get(outer) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Object(m)) => uint(m, inner).map_err(|_| {
            bad(
                &format!("{outer}.{inner}"),
                "a positive integer",
                m.get(inner),
            )
        }),
        Some(v) => Err(bad(outer, "an object", Some(v))),
    }
}

fn required(o: &Map<String, Value>, outer: &str, inner: &str) -> Result<usize> {
    nested(o, outer, inner)?
        .ok_or_else(|| bad(&format!("{outer}.{inner}"), "a positive integer", None))
}

/// A flag that must not be `false` (`null` and absent mean the class default, on).
fn on(o: &Map<String, Value>, key: &str) -> Result<()> {
    match o.get(key) {
        None | Some(Value::Null) | Some(Value::Bool(true)) => Ok(()),
        Some(v) => Err(bad(
            key,
            "true (the other setting is not implemented)",
            Some(v),
        )),
    }
}

/// A flag that must not be `true`.
fn off(o: &Map<String, Value>, key: &str) -> Result<()> {
    match o.get(key) {
        None | Some(Value::Null) | Some(Value::Bool(false)) => Ok(()),
        Some(v) => Err(bad(
            key,
            "false (the other setting is not implemented)",
            Some(v),
        )),
    }
}

fn filter(o: &Map<String, Value>, default: Filter) -> Result<Filter> {
    match o.get("resample") {
        None | Some(Value::Null) => Ok(default),
        Some(v) => v.as_u64().and_then(Filter::from_pil).ok_or_else(|| {
            bad(
                "resample",
                "1 (LANCZOS), 2 (BILINEAR) or 3 (BICUBIC)",
                Some(v),
            )
        }),
    }
}

fn triple(o: &Map<String, Value>, key: &str, default: [f32; 3]) -> Result<[f32; 3]> {
    match o.get(key) {
        None | Some(Value::Null) => Ok(default),
        Some(Value::Array(a)) if a.len() == 3 && a.iter().all(Value::is_number) => {
            let f = |i: usize| a[i].as_f64().unwrap_or_default() as f32;
            Ok([f(0), f(1), f(2)])
        }
        Some(v) => Err(bad(key, "a list of 3 numbers", Some(v))),
    }
}

fn rescale(o: &Map<String, Value>, default: Rescale) -> Result<Rescale> {
    on(o, "do_rescale")?;
    on(o, "do_normalize")?;
    on(o, "do_resize")?;
    let factor = match o.get("rescale_factor") {
        None | Some(Value::Null) => default.factor,
        Some(v) => v
            .as_f64()
            .filter(|f| *f > 0.0)
            .ok_or_else(|| bad("rescale_factor", "a positive number", Some(v)))?,
    };
    let std = triple(o, "image_std", default.std)?;
    if std.iter().any(|&s| s <= 0.0) {
        return Err(bad("image_std", "positive", o.get("image_std")));
    }
    Ok(Rescale {
        factor,
        mean: triple(o, "image_mean", default.mean)?,
        std,
    })
}

impl ImageProcessor {
    /// The processor `preprocessor_config.json`'s text describes.
    ///
    /// # Errors
    /// Not JSON, an `image_processor_type` other than the four, or a key out of
    /// range, naming the file and the key.
    pub fn from_hf_json(text: &str) -> Result<Self> {
        let v: Value = serde_json::from_str(text).map_err(|e| format!("{FILE}: not JSON: {e}"))?;
        let Value::Object(o) = v else {
            return Err(format!("{FILE}: must be a JSON object"));
        };
        let kind = o.get("image_processor_type").and_then(Value::as_str);
        let kind = kind.map(|k| k.trim_end_matches("Fast"));
        match kind {
            Some("Gemma3ImageProcessor") => {
                off(&o, "do_pan_and_scan")?;
                on(&o, "do_convert_rgb")?;
                let (h, w) = (
                    required(&o, "size", "height")?,
                    required(&o, "size", "width")?,
                );
                if h != w {
                    return Err(bad("size", "square (height = width)", o.get("size")));
                }
                Ok(Self::Gemma3(Gemma3Processor {
                    size: h,
                    filter: filter(&o, Filter::Bilinear)?,
                    rescale: rescale(&o, Rescale::HALF)?,
                    pad: pad_color(&o)?,
                }))
            }
            Some("CLIPImageProcessor") => {
                on(&o, "do_center_crop")?;
                on(&o, "do_convert_rgb")?;
                let (ch, cw) = (
                    required(&o, "crop_size", "height")?,
                    required(&o, "crop_size", "width")?,
                );
                if ch != cw {
                    return Err(bad(
                        "crop_size",
                        "square (height = width)",
                        o.get("crop_size"),
                    ));
                }
                Ok(Self::Clip(ClipProcessor {
                    shortest_edge: required(&o, "size", "shortest_edge")?,
                    crop: ch,
                    filter: filter(&o, Filter::Bicubic)?,
                    rescale: rescale(&o, Rescale::CLIP)?,
                    pad: pad_color(&o)?,
                }))
            }
            Some("Qwen2VLImageProcessor") => {
                on(&o, "do_convert_rgb")?;
                // Newer files put the bounds in `size`; older ones at the top level.
                let min_pixels = match nested(&o, "size", "shortest_edge")? {
                    Some(n) => n,
                    None => uint(&o, "min_pixels")?.unwrap_or(56 * 56),
                };
                let max_pixels = match nested(&o, "size", "longest_edge")? {
                    Some(n) => n,
                    None => uint(&o, "max_pixels")?.unwrap_or(28 * 28 * 1280),
                };
                if min_pixels > max_pixels {
                    return Err(format!(
                        "{FILE}: min_pixels ({min_pixels}) must be <= max_pixels ({max_pixels})"
                    ));
                }
                Ok(Self::QwenVl(QwenVlProcessor {
                    patch_size: uint(&o, "patch_size")?.unwrap_or(14),
                    temporal_patch_size: uint(&o, "temporal_patch_size")?.unwrap_or(2),
                    merge_size: uint(&o, "merge_size")?.unwrap_or(2),
                    min_pixels,
                    max_pixels,
                    filter: filter(&o, Filter::Bicubic)?,
                    rescale: rescale(&o, Rescale::CLIP)?,
                    mtmd: o.get(MTMD_SIZING) == Some(&Value::Bool(true)),
                }))
            }
            Some("Idefics3ImageProcessor" | "SmolVLMImageProcessor") => {
                on(&o, "do_convert_rgb")?;
                let split = match o.get("do_image_splitting") {
                    None | Some(Value::Null) => true,
                    Some(Value::Bool(b)) => *b,
                    Some(v) => return Err(bad("do_image_splitting", "a boolean", Some(v))),
                };
                Ok(Self::Idefics3(Idefics3Processor {
                    longest_edge: nested(&o, "size", "longest_edge")?.unwrap_or(4 * 364),
                    tile: nested(&o, "max_image_size", "longest_edge")?.unwrap_or(364),
                    split,
                    filter: filter(&o, Filter::Lanczos)?,
                    rescale: rescale(&o, Rescale::HALF)?,
                }))
            }
            _ => Err(bad(
                "image_processor_type",
                "one of Gemma3ImageProcessor, Qwen2VLImageProcessor, CLIPImageProcessor, \
                 Idefics3ImageProcessor, SmolVLMImageProcessor",
                o.get("image_processor_type"),
            )),
        }
    }
}

fn pad_color(o: &Map<String, Value>) -> Result<Option<[u8; 3]>> {
    match o.get(PAD_COLOR) {
        None => Ok(None),
        Some(v) => serde_json::from_value::<[u8; 3]>(v.clone())
            .map(Some)
            .map_err(|_| bad(PAD_COLOR, "three bytes", Some(v))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// google/gemma-3-4b-it's file (the keys that matter).
    const GEMMA3: &str = r#"{"do_convert_rgb": null, "do_normalize": true, "do_pan_and_scan": null,
        "do_rescale": true, "do_resize": true, "image_mean": [0.5, 0.5, 0.5],
        "image_processor_type": "Gemma3ImageProcessor", "image_seq_length": 256,
        "image_std": [0.5, 0.5, 0.5], "processor_class": "Gemma3Processor", "resample": 2,
        "rescale_factor": 0.00392156862745098, "size": {"height": 896, "width": 896}}"#;
    /// Qwen/Qwen2.5-VL-3B-Instruct's file.
    const QWEN: &str = r#"{"min_pixels": 3136, "max_pixels": 12845056, "patch_size": 14,
        "temporal_patch_size": 2, "merge_size": 2,
        "image_mean": [0.48145466, 0.4578275, 0.40821073],
        "image_std": [0.26862954, 0.26130258, 0.27577711],
        "image_processor_type": "Qwen2VLImageProcessor", "processor_class": "Qwen2_5_VLProcessor"}"#;
    /// llava-hf/llava-1.5-7b-hf's file.
    const LLAVA: &str = r#"{"crop_size": {"height": 336, "width": 336}, "do_center_crop": true,
        "do_convert_rgb": true, "do_normalize": true, "do_rescale": true, "do_resize": true,
        "image_mean": [0.48145466, 0.4578275, 0.40821073], "image_processor_type": "CLIPImageProcessor",
        "image_std": [0.26862954, 0.26130258, 0.27577711], "processor_class": "LlavaProcessor",
        "resample": 3, "rescale_factor": 0.00392156862745098, "size": {"shortest_edge": 336}}"#;
    /// HuggingFaceTB/SmolVLM2-256M-Video-Instruct's image keys.
    const SMOLVLM: &str = r#"{"do_convert_rgb": true, "do_image_splitting": true, "do_normalize": true,
        "do_pad": true, "do_rescale": true, "do_resize": true, "image_mean": [0.5, 0.5, 0.5],
        "image_processor_type": "SmolVLMImageProcessor", "image_std": [0.5, 0.5, 0.5],
        "max_image_size": {"longest_edge": 512}, "resample": 1,
        "rescale_factor": 0.00392156862745098, "size": {"longest_edge": 2048}}"#;

    #[test]
    fn the_four_families_files_read_as_their_processors() {
        let Ok(ImageProcessor::Gemma3(g)) = ImageProcessor::from_hf_json(GEMMA3) else {
            panic!("gemma3")
        };
        assert_eq!(
            (g.size, g.filter, g.rescale),
            (896, Filter::Bilinear, Rescale::HALF)
        );
        let Ok(ImageProcessor::QwenVl(q)) = ImageProcessor::from_hf_json(QWEN) else {
            panic!("qwen")
        };
        assert_eq!(
            (
                q.patch_size,
                q.temporal_patch_size,
                q.merge_size,
                q.min_pixels,
                q.max_pixels
            ),
            (14, 2, 2, 3136, 12_845_056)
        );
        assert_eq!((q.filter, q.rescale), (Filter::Bicubic, Rescale::CLIP));
        let Ok(ImageProcessor::Clip(c)) = ImageProcessor::from_hf_json(LLAVA) else {
            panic!("llava")
        };
        assert_eq!(
            (c.shortest_edge, c.crop, c.filter),
            (336, 336, Filter::Bicubic)
        );
        assert_eq!(c.rescale, Rescale::CLIP);
        let Ok(ImageProcessor::Idefics3(s)) = ImageProcessor::from_hf_json(SMOLVLM) else {
            panic!("smolvlm")
        };
        assert_eq!(
            (s.longest_edge, s.tile, s.split, s.filter),
            (2048, 512, true, Filter::Lanczos)
        );
    }

    #[test]
    fn refusals_name_the_file_the_key_and_the_value() {
        let err = |text: &str| ImageProcessor::from_hf_json(text).expect_err("refused");
        assert_eq!(
            err(r#"{"image_processor_type": "SiglipImageProcessor"}"#),
            "preprocessor_config.json: image_processor_type must be one of Gemma3ImageProcessor, \
             Qwen2VLImageProcessor, CLIPImageProcessor, Idefics3ImageProcessor, \
             SmolVLMImageProcessor (got \"SiglipImageProcessor\")"
        );
        assert_eq!(
            err(&GEMMA3.replace(r#""do_pan_and_scan": null"#, r#""do_pan_and_scan": true"#)),
            "preprocessor_config.json: do_pan_and_scan must be false (the other setting is not \
             implemented) (got true)"
        );
        assert_eq!(
            err(&LLAVA.replace(r#""resample": 3"#, r#""resample": 0"#)),
            "preprocessor_config.json: resample must be 1 (LANCZOS), 2 (BILINEAR) or 3 (BICUBIC) \
             (got 0)"
        );
        assert_eq!(
            err(&GEMMA3.replace(
                r#""size": {"height": 896, "width": 896}"#,
                r#""size": {"width": 896}"#
            )),
            "preprocessor_config.json: size.height is missing (it must be a positive integer)"
        );
        assert_eq!(
            err(&QWEN.replace(r#""min_pixels": 3136"#, r#""min_pixels": 99999999"#)),
            "preprocessor_config.json: min_pixels (99999999) must be <= max_pixels (12845056)"
        );
        assert!(err("[1]").contains("must be a JSON object"));
    }
}
