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
