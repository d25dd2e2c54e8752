//! Preprocessing against Pillow 13.0.0 and transformers 5.24.0's image processors
//! (their PIL backends), on the fixtures `scripts/make-vision-fixtures.py` recorded in
//! `daemon/tests/fixtures/vision/`: resized bytes and composited pixels equal to the
//! byte, `pixel_values` equal to the bit (the goal is within 1/255).

use std::path::PathBuf;

use serde_json::Value;

use super::rgb::rgba_over_white;
use super::{
    ClipProcessor, Filter, Gemma3Processor, Image8, PixelValues, QwenVlProcessor, Rescale,
};

fn dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/vision")
}

fn fixture(name: &str) -> Value {
    let text = std::fs::read_to_string(dir().join(name)).expect("fixture");
    serde_json::from_str(&text).expect("json")
}

/// The image as the media step leaves it (RGBA), through `convert_to_rgb`.
fn rgb(name: &str) -> Image8 {
    let img = image::open(dir().join("images").join(name))
        .expect("decode")
        .into_rgba8();
    let (w, h) = (img.width() as usize, img.height() as usize);
    rgba_over_white(w, h, img.as_raw())
}

fn filter(case: &Value) -> Filter {
    let n = case["resample_pil_value"]
        .as_u64()
        .or_else(|| case["kwargs"]["resample_pil_value"].as_u64())
        .expect("resample");
    Filter::from_pil(n).expect("a filter we implement")
}

/// A JSON array of numbers, each through `f`.
fn list<T>(v: &Value, f: impl Fn(f64) -> T) -> Vec<T> {
    v.as_array()
        .expect("array")
        .iter()
        .map(|x| f(x.as_f64().expect("number")))
        .collect()
}

fn floats(v: &Value) -> Vec<f32> {
    list(v, |x| x as f32)
}

fn bytes(v: &Value) -> Vec<u8> {
    list(v, |x| x as u8)
}

fn dims(v: &Value) -> Vec<usize> {
    list(v, |x| x as usize)
}

/// Asserts equal values, reporting the largest difference.
fn assert_same(what: &str, got: &PixelValues, want_shape: &[usize], want: &[f32]) {
    assert_eq!(
        got.shape.iter().product::<usize>(),
        want_shape.iter().product::<usize>(),
        "{what}"
    );
    let worst = got
        .data
        .iter()
        .zip(want)
        .map(|(a, b)| (a - b).abs())
        .fold(0f32, f32::max);
    assert_eq!(got.data.len(), want.len(), "{what}");
    assert!(worst == 0.0, "{what}: largest difference {worst}");
}

#[test]
fn resize_equals_pillow_to_the_byte() {
    let f = fixture("pil_resize.json");
    let cases = f["resize_cases"].as_array().expect("cases");
    assert!(cases.len() >= 20);
    for case in cases {
        let name = case["image"].as_str().expect("image");
        let out = dims(&case["output_wh"]);
        let got = rgb(name).resize(out[0], out[1], filter(case));
        assert_eq!(
            got.data,
            bytes(&case["values"]),
            "{name} → {out:?} {}",
            case["resample"]
        );
    }
}

#[test]
fn convert_to_rgb_equals_pillows_composite_over_white() {
    let f = fixture("pil_resize.json");
    let case = &f["convert_rgb"];
    assert_eq!(rgb("alpha_40x40.png").data, bytes(&case["values"]));
}

#[test]
fn gemma3_pixel_values_equal_transformers() {
    let f = fixture("gemma3.json");
    for case in f["cases"].as_array().expect("cases") {
        let name = case["image"].as_str().expect("image");
        let size = dims(&case["resized_hw"])[0];
        let p = Gemma3Processor {
            size,
            filter: filter(case),
            rescale: Rescale::HALF,
            pad: None,
        };
        let got = p.process(&rgb(name));
        assert_same(
            name,
            &got,
            &dims(&case["pixel_values_shape"]),
            &floats(&case["pixel_values"]),
        );
    }
}

#[test]
fn llava_clip_pixel_values_equal_transformers() {
    let f = fixture("llava.json");
    for case in f["cases"].as_array().expect("cases") {
        let name = case["image"].as_str().expect("image");
        let k = &case["kwargs"];
        let p = ClipProcessor {
            shortest_edge: k["size"]["shortest_edge"].as_u64().expect("edge") as usize,
            crop: k["crop_size"]["height"].as_u64().expect("crop") as usize,
            filter: filter(case),
            rescale: Rescale::CLIP,
            pad: None,
        };
        let img = rgb(name);
        let resized = dims(&case["resized_hw"]);
        assert_eq!(
            p.resized(img.width, img.height),
            (resized[1], resized[0]),
            "{name}"
        );
        let got = p.process(&img);
        assert_same(
            name,
            &got,
            &dims(&case["pixel_values_shape"]),
            &floats(&case["pixel_values"]),
        );
    }
}

#[test]
fn qwen_vl_patches_and_grid_equal_transformers() {
    let f = fixture("qwen2_5_vl.json");
    for row in f["smart_resize_table"].as_array().expect("table") {
        let hw = dims(&row["input_hw"]);
        let got = super::smart_resize(
            hw[0],
            hw[1],
            row["factor"].as_u64().expect("factor") as usize,
            row["min_pixels"].as_u64().expect("min") as usize,
            row["max_pixels"].as_u64().expect("max") as usize,
        );
        let want = dims(&row["smart_resize_hw"]);
        assert_eq!(got, (want[0], want[1]), "smart_resize {hw:?}");
    }
    for case in f["cases"].as_array().expect("cases") {
        let name = case["image"].as_str().expect("image");
        let k = &case["kwargs"];
        let n = |key: &str| k[key].as_u64().expect(key) as usize;
        let p = QwenVlProcessor {
            patch_size: n("patch_size"),
            temporal_patch_size: n("temporal_patch_size"),
            merge_size: n("merge_size"),
            min_pixels: n("min_pixels"),
            max_pixels: n("max_pixels"),
            filter: filter(case),
            rescale: Rescale::CLIP,
            mtmd: false,
        };
        let (got, grid) = p.process(&rgb(name));
        assert_eq!(grid.to_vec(), dims(&case["image_grid_thw"][0]), "{name}");
        assert_eq!(got.shape, dims(&case["pixel_values_shape"]), "{name}");
        assert_same(
            name,
            &got,
            &dims(&case["pixel_values_shape"]),
            &floats(&case["pixel_values"]),
        );
    }
}

#[test]
fn idefics3_tiles_and_global_image_equal_transformers() {
    use super::idefics3::{resized_size, tiled_size, Idefics3Processor};
    let f = fixture("idefics3.json");
    let cases = f["cases"].as_array().expect("cases");
    assert!(cases.iter().any(|c| c["rows"] != 0) && cases.iter().any(|c| c["rows"] == 0));
    for case in cases {
        let name = case["image"].as_str().expect("image");
        let k = &case["kwargs"];
        let p = Idefics3Processor {
            longest_edge: k["size"]["longest_edge"].as_u64().expect("edge") as usize,
            tile: k["max_image_size"]["longest_edge"].as_u64().expect("tile") as usize,
            split: k["do_image_splitting"].as_bool().expect("split"),
            filter: filter(case),
            rescale: Rescale::HALF,
        };
        let input = dims(&case["input_hw"]);
        let resized = resized_size(input[0], input[1], p.longest_edge);
        let pair = |key: &str| {
            let d = dims(&case[key]);
            (d[0], d[1])
        };
        assert_eq!(resized, pair("resized_hw"), "{name}");
        let tiled = tiled_size(resized.0, resized.1, p.tile);
        assert_eq!(tiled, pair("split_resized_hw"), "{name}");
        let got = p.process(&rgb(name));
        let n = |key: &str| case[key].as_u64().expect(key) as usize;
        assert_eq!((got.rows, got.cols), (n("rows"), n("cols")), "{name}");
        assert_eq!(got.frames.len(), n("num_tiles"), "{name}");
        let want = floats(&case["pixel_values"]);
        let frame = 3 * p.tile * p.tile;
        for (i, fr) in got.frames.iter().enumerate() {
            assert_same(
                &format!("{name} frame {i}"),
                fr,
                &[3, p.tile, p.tile],
                &want[i * frame..(i + 1) * frame],
            );
        }
    }
}

/// The tiny vision-language models of `daemon/tests/fixtures/vlm/` (made by
/// `scripts/make-vlm-fixtures.py`): each directory's own `preprocessor_config.json`,
/// read by [`super::ImageProcessor::from_hf_json`], gives the `pixel_values` its
/// reference recorded for the single-image prompts.
#[test]
fn each_tiny_vlm_directorys_processor_gives_its_reference_pixel_values() {
    use super::ImageProcessor;
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/vlm");
    for family in ["gemma3", "qwen2_5_vl", "llava", "smolvlm"] {
        let dir = root.join(family);
        let text = std::fs::read_to_string(dir.join("preprocessor_config.json")).expect("config");
        let processor = ImageProcessor::from_hf_json(&text).expect("a processor we implement");
        let reference: Value = serde_json::from_str(
            &std::fs::read_to_string(dir.join("reference.json")).expect("reference"),
        )
        .expect("json");
        let cases = reference["cases"].as_array().expect("cases");
        let mut checked = 0;
        for case in cases
            .iter()
            .filter(|c| c["images"].as_array().is_some_and(|i| i.len() == 1))
        {
            let image = case["images"][0].as_str().expect("image name");
            let name = image.rsplit('/').next().unwrap_or(image);
            let img = rgb(name);
            let frames: Vec<PixelValues> = match &processor {
                ImageProcessor::Gemma3(p) => vec![p.process(&img)],
                ImageProcessor::Clip(p) => vec![p.process(&img)],
                ImageProcessor::QwenVl(p) => vec![p.process(&img).0],
                ImageProcessor::Idefics3(p) => p.process(&img).frames,
            };
            let want = floats(&case["pixel_values"]["values"]);
            let got: Vec<f32> = frames.iter().flat_map(|f| f.data.iter().copied()).collect();
            let shape = vec![got.len()];
            let joined = PixelValues {
                shape: shape.clone(),
                data: got,
            };
            assert_same(&format!("{family} {name}"), &joined, &shape, &want);
            checked += 1;
        }
        assert_eq!(checked, 2, "{family}: two single-image cases");
    }
}
