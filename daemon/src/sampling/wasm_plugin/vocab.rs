//! The vocabulary as plugins see it through the `host` interface.

use super::bindings::SpecialTokenIds;
use crate::request::Vocab;

/// The vocabulary as plugins see it through the `host` interface.
#[derive(Debug, Clone)]
pub struct PluginVocab {
    /// Concatenated bytes of every token in id order.
    pub(super) bytes: Vec<u8>,
    /// `vocab_size + 1` offsets into `bytes`.
    pub(super) offsets: Vec<u32>,
    pub(super) special: SpecialTokenIds,
}

impl PluginVocab {
    /// The vocabulary of `tok`: each token's llama.cpp piece (`token_to_piece` with
    /// `special = true`: control tokens give their text), and its special ids.
    pub fn from_vocab(tok: &dyn Vocab) -> Self {
        let n = tok.vocab_size() as u32;
        let pieces = (0..n).map(|id| tok.token_piece(id).to_vec());
        let control = (0..n).filter(|&id| tok.is_control(id)).collect();
        Self::new(
            pieces,
            SpecialTokenIds {
                bos: tok.bos_token_id(),
                eos: tok.eos_token_id(),
                end_of_generation: tok.eog_token_ids().to_vec(),
                control,
            },
        )
    }

    /// A vocabulary from explicit token bytes (id order) and special ids (benchmarks and
    /// tests use synthetic ones).
    ///
    /// # Panics
    /// When the total byte length exceeds `u32::MAX`.
    pub fn new(tokens: impl IntoIterator<Item = Vec<u8>>, special: SpecialTokenIds) -> Self {
        let mut bytes = Vec::new();
        let mut offsets = vec![0u32];
        for t in tokens {
            bytes.extend_from_slice(&t);
            offsets.push(u32::try_from(bytes.len()).expect("vocabulary bytes fit in u32"));
        }
        Self {
            bytes,
            offsets,
            special,
        }
    }

    /// Number of tokens.
    pub fn len(&self) -> usize {
        self.offsets.len() - 1
    }

    /// Whether the vocabulary is empty.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub(super) fn token(&self, id: u32) -> Option<&[u8]> {
        let i = id as usize;
        let (a, b) = (*self.offsets.get(i)?, *self.offsets.get(i + 1)?);
        Some(&self.bytes[a as usize..b as usize])
    }
}
