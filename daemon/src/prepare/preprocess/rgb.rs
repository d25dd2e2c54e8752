//! transformers' `convert_to_rgb` (`image_transforms.py`): an image that is not RGB is
//! converted to RGBA and alpha-composited over opaque white, then its alpha dropped.
//! Pillow's `ImagingAlphaComposite` arithmetic (`src/libImaging/AlphaComposite.c`,
//! 7 fractional bits, divisions by 255 as `((a >> 8) + a) >> 8`), to the bit.

use super::resample::Image8;

/// `((a >> 8) + a) >> 8`: Pillow's `SHIFTFORDIV255`.
fn div255(a: u32) -> u32 {
    ((a >> 8) + a) >> 8
}

/// One channel of `src` (alpha `a`, not 0) over opaque white.
fn over_white(c: u8, a: u8) -> u8 {
    const BITS: u32 = 7;
    let (c, a) = (u32::from(c), u32::from(a));
    let outa255 = a * 255 + 255 * (255 - a);
    let coef1 = a * 255 * 255 * (1 << BITS) / outa255;
    let coef2 = 255 * (1 << BITS) - coef1;
    let tmp = c * coef1 + 255 * coef2;
    (div255(tmp + (0x80 << BITS)) >> BITS) as u8
}

/// RGBA bytes (`height × width × 4`) as transformers' `convert_to_rgb` leaves them:
/// RGB over white.
pub fn rgba_over_white(width: usize, height: usize, rgba: &[u8]) -> Image8 {
    let mut data = Vec::with_capacity(width * height * 3);
    for p in rgba.chunks_exact(4) {
        let a = p[3];
        if a == 0 {
            data.extend_from_slice(&[255, 255, 255]);
        } else {
            data.extend(p[..3].iter().map(|&c| over_white(c, a)));
        }
    }
    Image8 {
        width,
        height,
        channels: 3,
        data,
    }
}

/// RGBA bytes with the alpha dropped, as llama.cpp reads an image (stb_image asked for
/// three channels keeps a transparent pixel's colour).
pub fn rgba_without_alpha(width: usize, height: usize, rgba: &[u8]) -> Image8 {
    let data = rgba
        .chunks_exact(4)
        .flat_map(|p| [p[0], p[1], p[2]])
        .collect();
    Image8 {
        width,
        height,
        channels: 3,
        data,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn opaque_pixels_keep_their_values_and_clear_ones_turn_white() {
        for c in 0..=255u8 {
            assert_eq!(over_white(c, 255), c);
        }
        let img = rgba_over_white(2, 1, &[10, 20, 30, 0, 0, 0, 0, 128]);
        // (0 * 128 + 255 * 127) / 255 over white, rounded as Pillow does.
        assert_eq!(img.data, [255, 255, 255, 127, 127, 127]);
    }
}
