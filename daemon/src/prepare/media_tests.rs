//! The media step against images made here: each format decodes to its pixels, equal
//! pictures share a hash, and every bound refuses naming the part, key and value.

use std::io::Cursor;

use image::{DynamicImage, ImageFormat, RgbaImage};

use super::media::MediaStep;
use crate::config::MediaConfig;
use crate::request::{ChatMessage, ImageDetail, ImageInput, ImageSource};

/// A `w × h` picture whose pixel (x, y) is (x, y, x ^ y, 255) (mod 256).
fn picture(w: u32, h: u32) -> RgbaImage {
    RgbaImage::from_fn(w, h, |x, y| {
        image::Rgba([x as u8, y as u8, (x ^ y) as u8, 255])
    })
}

fn encode(img: &RgbaImage, format: ImageFormat) -> Vec<u8> {
    let mut out = Cursor::new(Vec::new());
    let dynamic = DynamicImage::ImageRgba8(img.clone());
    let dynamic = if format == ImageFormat::Jpeg {
        DynamicImage::ImageRgb8(dynamic.to_rgb8())
    } else {
        dynamic
    };
    dynamic.write_to(&mut out, format).expect("encode");
    out.into_inner()
}

fn data(bytes: &[u8]) -> ImageSource {
    ImageSource::Data {
        media_type: "image/png".into(),
        base64: data_encoding::BASE64.encode(bytes),
    }
}

fn message(sources: Vec<ImageSource>) -> Vec<ChatMessage> {
    let images = sources
        .into_iter()
        .enumerate()
        .map(|(j, source)| ImageInput {
            at: format!("messages[0].content[{j}]"),
            offset: 0,
            source,
            detail: ImageDetail::Auto,
        })
        .collect();
    vec![ChatMessage {
        images,
        ..ChatMessage::new("user", "what is this?")
    }]
}

fn step(f: impl FnOnce(&mut MediaConfig)) -> MediaStep {
    let mut c = MediaConfig::default();
    f(&mut c);
    MediaStep::new(&c)
}

fn refusal(step: &MediaStep, sources: Vec<ImageSource>) -> String {
    step.decode_all(&message(sources))
        .expect_err("refused")
        .message
}

#[test]
fn each_format_decodes_to_its_pixels() {
    let pic = picture(37, 23);
    let s = step(|_| {});
    for format in [
        ImageFormat::Png,
        ImageFormat::WebP,
        ImageFormat::Gif,
        ImageFormat::Jpeg,
    ] {
        let got = s
            .decode_all(&message(vec![data(&encode(&pic, format))]))
            .expect("decodes");
        assert_eq!(got.len(), 1);
        let d = &got[0];
        assert_eq!((d.format, d.width, d.height), (format, 37, 23));
        assert_eq!(d.rgba.len(), 37 * 23 * 4);
        if matches!(format, ImageFormat::Png | ImageFormat::WebP) {
            // Lossless: the very pixels.
            assert_eq!(d.rgba, pic.as_raw().as_slice(), "{format:?}");
        }
    }
}

#[test]
fn equal_pictures_share_a_hash_and_different_ones_do_not() {
    let s = step(|_| {});
    let pic = picture(16, 16);
    let mut other = pic.clone();
    other.put_pixel(3, 4, image::Rgba([9, 9, 9, 255]));
    let got = s
        .decode_all(&message(vec![
            data(&encode(&pic, ImageFormat::Png)),
            data(&encode(&pic, ImageFormat::WebP)),
            data(&encode(&other, ImageFormat::Png)),
        ]))
        .expect("decodes");
    assert_eq!(
        got[0].content_hash, got[1].content_hash,
        "PNG and lossless WebP"
    );
    assert_ne!(
        got[0].content_hash, got[2].content_hash,
        "one pixel differs"
    );
    assert_eq!(got[2].at, "messages[0].content[2]");
}

#[test]
fn base64_with_line_breaks_or_without_padding_is_read() {
    let bytes = encode(&picture(5, 3), ImageFormat::Png);
    let wrapped: String = data_encoding::BASE64
        .encode(&bytes)
        .as_bytes()
        .chunks(76)
        .map(|c| format!("{}\r\n", std::str::from_utf8(c).expect("ascii")))
        .collect();
    let unpadded = data_encoding::BASE64_NOPAD.encode(&bytes);
    let s = step(|_| {});
    for base64 in [wrapped, unpadded] {
        let src = ImageSource::Data {
            media_type: String::new(),
            base64,
        };
        assert_eq!(
            s.decode_all(&message(vec![src])).expect("reads")[0].width,
            5
        );
    }
    let bad = ImageSource::Data {
        media_type: String::new(),
        base64: "iVBO!!!!".into(),
    };
    assert!(refusal(&s, vec![bad])
        .starts_with("messages[0].content[0].image_url.url: the data is not valid base64"));
}

#[test]
fn the_bounds_refuse_naming_key_and_value() {
    let png = encode(&picture(40, 30), ImageFormat::Png);
    let s = step(|c| c.max_image_bytes = 1024);
    let big = encode(&picture(200, 200), ImageFormat::Png);
    assert!(big.len() > 1024);
    assert_eq!(
        refusal(&s, vec![data(&big)]),
        format!(
            "messages[0].content[0]: the image is {} bytes, above media.max_image_bytes = 1024",
            big.len()
        )
    );
    let s = step(|c| c.max_image_pixels = 1199);
    assert_eq!(
        refusal(&s, vec![data(&png)]),
        "messages[0].content[0]: the image is 40x30 = 1200 pixels, above \
         media.max_image_pixels = 1199"
    );
    let s = step(|c| c.max_aspect_ratio = 3);
    let strip = encode(&picture(100, 25), ImageFormat::Png);
    assert_eq!(
        refusal(&s, vec![data(&strip)]),
        "messages[0].content[0]: the image's aspect ratio is 4.0 (100x25), above \
         media.max_aspect_ratio = 3"
    );
    let s = step(|c| c.max_images_per_request = 2);
    assert_eq!(
        refusal(&s, vec![data(&png), data(&png), data(&png)]),
        "messages: 3 images, above media.max_images_per_request = 2"
    );
    let s = step(|c| c.max_images_per_request = 0);
    assert_eq!(
        refusal(&s, vec![data(&png)]),
        "messages: 1 image, above media.max_images_per_request = 0"
    );
}

/// A decompression bomb: 20,000 × 20,000 black pixels compress to a few hundred
/// kilobytes; the header alone refuses it, before any pixel buffer exists.
#[test]
fn a_decompression_bomb_stops_at_its_header() {
    let (w, h) = (20_000u32, 20_000u32);
    let mut bytes = Vec::new();
    {
        let mut enc = png::Encoder::new(&mut bytes, w, h);
        enc.set_color(png::ColorType::Grayscale);
        enc.set_depth(png::BitDepth::One);
        let mut writer = enc.write_header().expect("header");
        let row = vec![0u8; (w as usize).div_ceil(8)];
        let mut stream = writer.stream_writer().expect("stream");
        for _ in 0..h {
            std::io::Write::write_all(&mut stream, &row).expect("row");
        }
        stream.finish().expect("finish");
    }
    assert!(bytes.len() < 1 << 20, "{} bytes", bytes.len());
    let s = step(|_| {});
    assert_eq!(
        refusal(&s, vec![data(&bytes)]),
        "messages[0].content[0]: the image is 20000x20000 = 400000000 pixels, above \
         media.max_image_pixels = 33554432"
    );
}

#[test]
fn truncated_lying_and_foreign_bytes_are_refused_not_panics() {
    let s = step(|_| {});
    let png = encode(&picture(64, 64), ImageFormat::Png);
    let cut = &png[..png.len() / 2];
    assert!(refusal(&s, vec![data(cut)])
        .starts_with("messages[0].content[0]: the PNG image does not decode"));
    // A header claiming 4x4 over 64x64 pixel data (IHDR patched, CRC left wrong).
    let mut lying = png.clone();
    lying[16..20].copy_from_slice(&4u32.to_be_bytes());
    lying[20..24].copy_from_slice(&4u32.to_be_bytes());
    assert!(refusal(&s, vec![data(&lying)]).starts_with("messages[0].content[0]: the PNG"));
    let jpeg = encode(&picture(64, 64), ImageFormat::Jpeg);
    let big_jpeg = encode(&picture(256, 256), ImageFormat::Jpeg);
    assert_eq!(
        refusal(&s, vec![data(&big_jpeg[..big_jpeg.len() * 4 / 5])]),
        "messages[0].content[0]: the JPEG image is truncated (no end-of-image marker near its end)"
    );
    let cut = refusal(&s, vec![data(&jpeg[..jpeg.len() / 3])]);
    assert!(
        cut.starts_with("messages[0].content[0]: the JPEG header does not decode"),
        "{cut}"
    );
    // One line, whatever the decoder wrote (it may end in a newline or quote bytes).
    assert!(
        !cut.contains(['\n', '\r']) && !cut.ends_with(' '),
        "{cut:?}"
    );
    assert_eq!(
        refusal(&s, vec![data(b"GIF89a")]),
        "messages[0].content[0]: the GIF header does not decode: Format error decoding Gif: \
         Unexpected End of File"
    );
    assert_eq!(
        refusal(&s, vec![data(b"%PDF-1.7 not an image at all")]),
        "messages[0].content[0]: the image format is not supported (PNG, JPEG, WebP or GIF; \
         got an unknown format)"
    );
    let bmp = refusal(&s, vec![data(b"BM\x3a\0\0\0\0\0\0\0\x36\0\0\0")]);
    assert!(
        bmp.starts_with("messages[0].content[0]: the image format is not supported"),
        "{bmp}"
    );
}

#[test]
fn file_urls_read_only_inside_local_dirs() {
    let root = tempfile::tempdir().expect("tempdir");
    let allowed = root.path().join("images");
    std::fs::create_dir(&allowed).expect("mkdir");
    let inside = allowed.join("a.png");
    std::fs::write(&inside, encode(&picture(8, 8), ImageFormat::Png)).expect("write");
    let outside = root.path().join("secret.png");
    std::fs::write(&outside, encode(&picture(8, 8), ImageFormat::Png)).expect("write");
    let escape = allowed.join("link.png");
    std::os::unix::fs::symlink(&outside, &escape).expect("symlink");

    let none = step(|_| {});
    assert_eq!(
        refusal(&none, vec![ImageSource::File(inside.clone())]),
        format!(
            "messages[0].content[0].image_url.url: file: URLs are refused (media.local_dirs is \
             empty; got {})",
            inside.display()
        )
    );
    let s = step(|c| c.local_dirs = vec![allowed.clone()]);
    let got = s
        .decode_all(&message(vec![ImageSource::File(inside)]))
        .expect("inside");
    assert_eq!((got[0].width, got[0].height), (8, 8));
    // Outside, escaping by a link or by `..`, missing, a directory, or anywhere else on
    // the host: one answer, so nothing is learnt about which files exist.
    for path in [
        outside,
        escape,
        allowed.join("../secret.png"),
        allowed.join("missing.png"),
        allowed.clone(),
        "/etc/passwd".into(),
        "/nonexistent/x.png".into(),
    ] {
        assert_eq!(
            refusal(&s, vec![ImageSource::File(path.clone())]),
            format!(
                "messages[0].content[0].image_url.url: {} is not a readable file inside a \
                 directory of media.local_dirs",
                path.display()
            )
        );
    }
    // A directory made after start-up counts.
    let later = root.path().join("later");
    let s = step(|c| c.local_dirs = vec![later.clone()]);
    std::fs::create_dir(&later).expect("mkdir");
    std::fs::write(
        later.join("b.png"),
        encode(&picture(3, 2), ImageFormat::Png),
    )
    .expect("write");
    let got = s
        .decode_all(&message(vec![ImageSource::File(later.join("b.png"))]))
        .expect("inside a directory made later");
    assert_eq!((got[0].width, got[0].height), (3, 2));
}

/// Images are decoded and processed one at a time in the whole process: the gate is
/// held while each is handed on, and each is handed on before the next is decoded.
#[test]
fn images_are_decoded_and_processed_one_at_a_time() {
    let s = step(|_| {});
    let png = encode(&picture(5, 4), ImageFormat::Png);
    let msgs = message(vec![data(&png), data(&png), data(&png)]);
    let mut seen = Vec::new();
    let out = s
        .decode_each(&msgs, |d| {
            assert!(s.gate_is_held(), "processing outside the gate");
            seen.push(d.width);
            d.width * d.height
        })
        .expect("decoded");
    assert_eq!(out, vec![20, 20, 20]);
    assert_eq!(seen.len(), 3);
    assert!(!s.gate_is_held());
}
