//! Images in chat messages, as the edge validated them (not decoded yet: decoding,
//! its bounds and preprocessing happen in `prepare/`).

use std::path::PathBuf;

/// Where an image's bytes come from. The daemon never fetches a URL: `http(s)` is
/// refused at the edge.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ImageSource {
    /// A `data:` URL (RFC 2397): its media type as given (`image/png`, possibly empty)
    /// and its base64 payload, not decoded yet.
    Data {
        /// The media type before `;base64`.
        media_type: String,
        /// The base64 text after the comma.
        base64: String,
    },
    /// A `file:` URL's path, read only inside a directory of `media.local_dirs`.
    File(PathBuf),
}

/// OpenAI's `image_url.detail`. Accepted and recorded; the models served here have a
/// fixed processing per model (their image processor's), as vLLM and llama.cpp do.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ImageDetail {
    /// `"auto"` (the default).
    #[default]
    Auto,
    /// `"low"`.
    Low,
    /// `"high"`.
    High,
}

/// One image part of a message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ImageInput {
    /// The part's path in the request (`messages[0].content[1]`): every later error
    /// about the image names it.
    pub at: String,
    /// Byte offset in the message's `content` text where the image sits (the text
    /// parts before it, concatenated).
    pub offset: usize,
    /// Its bytes' source.
    pub source: ImageSource,
    /// `detail`.
    pub detail: ImageDetail,
}

/// The form of an image's pixel values (`prepare::preprocess`'s output).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PixelLayout {
    /// `(frames, 3, height, width)`: one frame, or Idefics3's tiles then the global image.
    Frames {
        /// Frames (tiles).
        frames: usize,
        /// Pixels per column.
        height: usize,
        /// Pixels per row.
        width: usize,
    },
    /// Qwen2-VL's patch rows and their grid `[t, h, w]` in patches.
    Patches {
        /// `[t, h, w]`.
        grid_thw: [usize; 3],
        /// Patches merged per side into one token (`spatial_merge_size`).
        merge: usize,
    },
}

/// An image placed in a prompt: what the vision tower reads, and the prompt positions
/// whose embeddings its output rows replace.
#[derive(Debug)]
pub struct PromptImage {
    /// SHA-256 of its decoded pixels (`prepare::media`): enters the prefix cache's hash
    /// of every block holding one of its tokens.
    pub hash: [u8; 32],
    /// The processor's pixel values.
    pub pixels: Vec<f32>,
    /// Their form.
    pub layout: PixelLayout,
    /// Prompt positions of its placeholder tokens, in the order of the tower's rows
    /// (sorted, disjoint runs).
    pub runs: Vec<std::ops::Range<usize>>,
    /// Whether each run attends bidirectionally (Gemma 3).
    pub bidirectional: bool,
    /// The tower's output `(tokens, n_embd)` f32, set by the model runner on first use
    /// (a prompt prefilled in several chunks encodes the image once).
    pub features: std::sync::OnceLock<Vec<f32>>,
}

/// Equal images in equal places (the pixels are the hash's).
impl PartialEq for PromptImage {
    fn eq(&self, o: &Self) -> bool {
        self.hash == o.hash
            && self.runs == o.runs
            && self.layout == o.layout
            && self.bidirectional == o.bidirectional
    }
}

impl Eq for PromptImage {}

impl PromptImage {
    /// Placeholder tokens (the tower's output rows).
    pub fn tokens(&self) -> usize {
        self.runs.iter().map(|r| r.len()).sum()
    }

    /// Where the image's rows fall in positions `start .. end`: `(position, first
    /// feature row, rows)` per run that overlaps them.
    pub fn rows_in(&self, start: usize, end: usize) -> Vec<(usize, usize, usize)> {
        let mut out = Vec::new();
        let mut row = 0;
        for r in &self.runs {
            let (a, b) = (r.start.max(start), r.end.min(end));
            if a < b {
                out.push((a, row + (a - r.start), b - a));
            }
            row += r.len();
        }
        out
    }

    /// The merged token grid `(t, h, w)` of a Qwen2-VL image.
    fn merged_grid(&self) -> Option<(usize, usize, usize)> {
        match self.layout {
            PixelLayout::Patches { grid_thw, merge } => {
                let m = merge.max(1);
                Some((grid_thw[0], grid_thw[1] / m, grid_thw[2] / m))
            }
            PixelLayout::Frames { .. } => None,
        }
    }

    /// Whether any of its placeholder tokens lies in positions `start .. end`.
    pub fn overlaps(&self, start: usize, end: usize) -> bool {
        self.runs.iter().any(|r| r.start < end && r.end > start)
    }
}

/// Content hashes of the images with placeholder tokens in positions `start .. end`,
/// in prompt order: what a prefix-cache block over those positions is keyed by.
pub fn block_images(
    images: &[std::sync::Arc<PromptImage>],
    start: usize,
    end: usize,
) -> Vec<[u8; 32]> {
    images
        .iter()
        .filter(|im| im.overlaps(start, end))
        .map(|im| im.hash)
        .collect()
}

/// Qwen2-VL's multimodal RoPE position `[t, h, w]` of sequence position `p`
/// (transformers 5.24.0 `Qwen2_5_VLModel.get_rope_index`): text before the first image
/// at `[p, p, p]`; an image's tokens at `base + [0, row, col]` over its merged grid,
/// `base` its first token's text position; text after an image continues from `base +
/// max(rows, cols)` rather than from its token count. Images must be in prompt order.
pub fn mrope_position(images: &[std::sync::Arc<PromptImage>], p: usize) -> [u32; 3] {
    let mut delta: i64 = 0;
    for im in images {
        let (Some((_, lh, lw)), Some(run)) = (im.merged_grid(), im.runs.first()) else {
            continue;
        };
        if p < run.start {
            break;
        }
        let n = im.tokens();
        let base = run.start as i64 + delta;
        if p < run.start + n && lw > 0 {
            let o = p - run.start;
            let rem = o % (lh * lw).max(1);
            let at = |d: usize| (base + d as i64).max(0) as u32;
            return [at(0), at(rem / lw), at(rem % lw)];
        }
        delta += lh.max(lw) as i64 - n as i64;
    }
    let q = (p as i64 + delta).max(0) as u32;
    [q, q, q]
}

/// The end of a prefill chunk `start .. end` moved off the inside of an image's run: back
/// to the run's start when the chunk begins before it, otherwise on to its end (a run
/// is computed in one step: its rows attend to each other in Gemma 3, and the tower's
/// rows land together).
pub fn chunk_end(images: &[std::sync::Arc<PromptImage>], start: usize, end: usize) -> usize {
    for im in images {
        for r in &im.runs {
            if r.start < end && end < r.end {
                return if r.start > start { r.start } else { r.end };
            }
        }
    }
    end
}

#[cfg(test)]
mod tests {
    use super::*;

    fn image(runs: Vec<std::ops::Range<usize>>) -> PromptImage {
        PromptImage {
            hash: [0; 32],
            pixels: Vec::new(),
            layout: PixelLayout::Frames {
                frames: 1,
                height: 1,
                width: 1,
            },
            runs,
            bidirectional: false,
            features: std::sync::OnceLock::new(),
        }
    }

    #[test]
    fn rows_and_chunk_ends_follow_the_runs() {
        let im = image(vec![3..7, 10..12]);
        assert_eq!(im.tokens(), 6);
        assert_eq!(im.rows_in(0, 20), vec![(3, 0, 4), (10, 4, 2)]);
        assert_eq!(im.rows_in(5, 11), vec![(5, 2, 2), (10, 4, 1)]);
        assert!(im.rows_in(7, 10).is_empty());
        assert!(im.overlaps(6, 8) && !im.overlaps(7, 10));
        let ims = [std::sync::Arc::new(im)];
        // Inside a run that starts after the chunk: back to its start.
        assert_eq!(chunk_end(&ims, 0, 5), 3);
        // Inside a run the chunk starts in or at: on to its end.
        assert_eq!(chunk_end(&ims, 3, 5), 7);
        assert_eq!(chunk_end(&ims, 4, 6), 7);
        // Between runs, or at a run's edge: unchanged.
        assert_eq!(chunk_end(&ims, 0, 8), 8);
        assert_eq!(chunk_end(&ims, 0, 10), 10);
        assert_eq!(chunk_end(&ims, 0, 7), 7);
    }
}
