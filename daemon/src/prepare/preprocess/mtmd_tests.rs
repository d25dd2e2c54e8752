//! llama.cpp's geometry for the GGUF + mmproj path (`tools/mtmd/mtmd-image.cpp`):
//! `calc_size_preserved_ratio` and `img_tool::resize` with `PAD_CEIL`, worked by hand.

use super::processors::{letterbox, mtmd_size, smart_resize};
use super::rgb::rgba_without_alpha;
use super::{Filter, Image8};

/// Qwen-VL sizes (factor 28, 8 to 4096 tokens): `std::round` takes 2.5 to 3 where
/// Python's `round` takes it to 2, and a side never goes below 28.
#[test]
fn qwen_sizes_follow_llama_cpp() {
    let (min, max) = (8 * 28 * 28, 4096 * 28 * 28);
    // 70 / 28 = 2.5.
    assert_eq!(mtmd_size(140, 70, 28, min, max), (140, 84));
    assert_eq!(smart_resize(140, 70, 28, min, max), (140, 56));
    // A 2-pixel-high strip: clip.cpp keeps the height at 28 and the width as rounded;
    // transformers rounds the height to 0 and scales both up.
    assert_eq!(mtmd_size(2, 400, 28, min, max), (28, 392));
    assert_eq!(smart_resize(2, 400, 28, min, max), (28, 1120));
    // Small images grow to the minimum.
    assert_eq!(mtmd_size(23, 37, 28, min, max), (84, 112));
}

fn image(width: usize, height: usize) -> Image8 {
    let data = (0..width * height * 3)
        .map(|i| (i * 37 % 251) as u8)
        .collect();
    Image8 {
        width,
        height,
        channels: 3,
        data,
    }
}

/// 64×32 into 32×32: scaled by 0.5 to 32×16 and centred, 8 rows of pad above and below.
#[test]
fn letterbox_centres_the_scaled_image_on_the_pad_colour() {
    let img = image(64, 32);
    let out = letterbox(&img, 32, 32, Filter::Bilinear, [122, 116, 104]);
    assert_eq!((out.width, out.height, out.channels), (32, 32, 3));
    let inner = img.resize(32, 16, Filter::Bilinear);
    let row = |y: usize| &out.data[y * 32 * 3..(y + 1) * 32 * 3];
    for y in (0..8).chain(24..32) {
        assert!(row(y).chunks(3).all(|p| p == [122, 116, 104]), "row {y}");
    }
    for y in 0..16 {
        assert_eq!(
            row(8 + y),
            &inner.data[y * 32 * 3..(y + 1) * 32 * 3],
            "row {}",
            8 + y
        );
    }
    // 20×30 into 32×32: scale 32/30, 21.33 → 22 columns (ceil), offset 5.
    let out = letterbox(&image(20, 30), 32, 32, Filter::Bicubic, [0, 0, 0]);
    let first = &out.data[..32 * 3];
    assert!(first[..5 * 3].iter().all(|&b| b == 0));
    assert!(first[27 * 3..].iter().all(|&b| b == 0));
    // The target size itself is a copy.
    assert_eq!(letterbox(&img, 64, 32, Filter::Bilinear, [0, 0, 0]), img);
}

/// stb_image asked for three channels keeps a transparent pixel's colour.
#[test]
fn alpha_is_dropped_not_composited() {
    let rgba = [10, 20, 30, 0, 40, 50, 60, 255];
    assert_eq!(
        rgba_without_alpha(2, 1, &rgba).data,
        [10, 20, 30, 40, 50, 60]
    );
}
