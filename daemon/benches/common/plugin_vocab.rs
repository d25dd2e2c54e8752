//! A synthetic vocabulary for the plugin benchmarks (`#[path]`-included by
//! `plugin_overhead` and `plugin_languages`).

use inferd::sampling::wasm_plugin::{PluginSpecialTokens, PluginVocab};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

/// Random 1–8 byte tokens (lowercase letters and spaces), as a BPE vocabulary roughly
/// looks, plus "Paris" pieces so `ban_words` has matches and the ten digits (as
/// SmolLM2's tokenizer has them) so `no_digits_js` has some.
pub fn synthetic_vocab(n: usize) -> PluginVocab {
    let mut rng = ChaCha8Rng::seed_from_u64(n as u64);
    let fixed: [&[u8]; 14] = [
        b"Paris", b" Paris", b" Par", b"is", b"0", b"1", b"2", b"3", b"4", b"5", b"6", b"7", b"8",
        b"9",
    ];
    let tokens = (0..n).map(|i| {
        if let Some(t) = fixed.get(i) {
            return t.to_vec();
        }
        let len = rng.random_range(1..=8);
        (0..len)
            .map(|_| {
                let c = rng.random_range(0..27u8);
                if c == 26 {
                    b' '
                } else {
                    b'a' + c
                }
            })
            .collect()
    });
    let eos = n as u32 - 1;
    PluginVocab::new(
        tokens,
        PluginSpecialTokens {
            bos: None,
            eos: Some(eos),
            end_of_generation: vec![eos],
            control: vec![eos],
        },
    )
}
