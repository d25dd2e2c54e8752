//! [`Vocab`]: the vocabulary as the stages after preparation see it (the sampling
//! chain's grammar and reasoning gate, the plugins' `host` interface, the post-step's
//! token bytes and end-of-generation test), so none of them holds the tokenizer.
//! `tokenizer::TextTokenizer` implements it.

/// Token ids to bytes and the special ids, read-only.
pub trait Vocab: Send + Sync {
    /// Number of tokens (ids are `0..vocab_size`).
    fn vocab_size(&self) -> usize;

    /// Bytes of token `id` as it appears in generated text (llama.cpp
    /// `token_to_piece` with `special = false`): control, unknown and out-of-range
    /// ids give an empty slice. A token may hold part of a UTF-8 sequence.
    fn token_bytes(&self, id: u32) -> &[u8];

    /// Like [`Vocab::token_bytes`], but control and unknown tokens give their text
    /// (`token_to_piece` with `special = true`).
    fn token_piece(&self, id: u32) -> &[u8];

    /// Whether `id` is a control token; false when out of range.
    fn is_control(&self, id: u32) -> bool;

    /// The BOS id, if the model has one.
    fn bos_token_id(&self) -> Option<u32>;

    /// The EOS id, if the model has one.
    fn eos_token_id(&self) -> Option<u32>;

    /// End-of-generation ids, sorted and unique.
    fn eog_token_ids(&self) -> &[u32];

    /// Whether generating `id` ends generation.
    fn is_eog(&self, id: u32) -> bool {
        self.eog_token_ids().binary_search(&id).is_ok()
    }
}
