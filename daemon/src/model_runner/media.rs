//! Images in a step: each prompt image is encoded by the vision tower the first time a
//! step computes one of its placeholder tokens, and its rows replace those tokens'
//! embeddings ([`crate::model::SeqMedia`]).

use std::time::{Duration, Instant};

use crate::error::InferError;
use crate::model::vision::VisionPixels;
use crate::model::SeqMedia;
use crate::model::Tower as VisionTower;
use crate::request::{PixelLayout, PromptImage};

use super::BatchItem;

/// What [`encode_pending`] did.
#[derive(Debug, Default)]
pub struct Encoded {
    /// Per item: the error that fails its sequence (its image could not be encoded);
    /// empty when no item has images.
    pub failed: Vec<Option<InferError>>,
    /// Images encoded.
    pub images: usize,
    /// Time the tower took.
    pub time: Duration,
}

/// Encodes the images of `items` not encoded yet. An image that fails fails its own
/// item only: the step's other sequences run on.
pub fn encode_pending(tower: Option<&VisionTower>, items: &[BatchItem]) -> Encoded {
    if items.iter().all(|i| i.images.is_empty()) {
        // Text only: no per-item list (`failed` empty means none failed).
        return Encoded::default();
    }
    let t0 = Instant::now();
    let mut out = Encoded {
        failed: vec![None; items.len()],
        ..Encoded::default()
    };
    for (i, item) in items.iter().enumerate() {
        let (start, end) = (item.start_pos, item.start_pos + item.tokens.len());
        for im in &item.images {
            // An image whose tokens this step does not compute (the prefix cache
            // held them, or they were computed earlier) is not encoded.
            if im.features.get().is_some() || !im.overlaps(start, end) {
                continue;
            }
            let rows = match tower {
                None => Err(InferError::internal(
                    "a prompt has images but the model has no vision tower",
                )),
                Some(t) => encode(t, im).map_err(|e| {
                    InferError::internal(format!(
                        "the vision tower failed: {}",
                        crate::model::candle_error_message(&e)
                    ))
                }),
            };
            match rows {
                Ok(rows) => {
                    let _ = im.features.set(rows);
                    out.images += 1;
                }
                Err(e) => {
                    tracing::warn!(seq = %item.seq, error = %e.message, "image encoding failed");
                    out.failed[i] = Some(e);
                }
            }
        }
    }
    out.time = t0.elapsed();
    out
}

fn encode(tower: &VisionTower, im: &PromptImage) -> candle_core::Result<Vec<f32>> {
    let px = match im.layout {
        PixelLayout::Frames {
            frames,
            height,
            width,
        } => VisionPixels::Frames {
            data: &im.pixels,
            frames,
            height,
            width,
        },
        PixelLayout::Patches { grid_thw, .. } => VisionPixels::Patches {
            data: &im.pixels,
            grid_thw,
        },
    };
    let t = tower.encode(px)?;
    let (rows, width) = t.dims2()?;
    if rows != im.tokens() || width != tower.out_dim() {
        candle_core::bail!(
            "the tower gave {rows} rows of {width} for {} placeholder tokens of {}",
            im.tokens(),
            tower.out_dim()
        );
    }
    t.to_dtype(candle_core::DType::F32)?
        .flatten_all()?
        .to_vec1::<f32>()
}

/// The rows, bidirectional ranges and (with `mrope`, a Qwen2-VL decoder) multimodal
/// RoPE positions of `item`'s images in its step (`None`: it has none), their features
/// already encoded ([`encode_pending`]).
pub fn seq_media(item: &BatchItem, mrope: bool) -> Option<SeqMedia<'_>> {
    if item.images.is_empty() {
        return None;
    }
    let (start, end) = (item.start_pos, item.start_pos + item.tokens.len());
    let mut m = SeqMedia::default();
    for im in &item.images {
        let Some(f) = im.features.get() else {
            continue;
        };
        let width = f.len() / im.tokens().max(1);
        for (pos, row, k) in im.rows_in(start, end) {
            m.rows
                .push((pos - start, &f[row * width..(row + k) * width]));
        }
        if im.bidirectional {
            m.bidirectional.extend(im.runs.iter().cloned());
        }
    }
    m.bidirectional.sort_by_key(|r| r.start);
    if mrope {
        m.mrope = (start..end)
            .map(|p| crate::request::media::mrope_position(&item.images, p))
            .collect();
    }
    Some(m)
}
