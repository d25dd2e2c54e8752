//! The SentencePiece (`llama`) GGUF path on a tiny hand-made vocabulary, no model file needed:
//! llama.cpp's SPM defaults, the space prefix after special tokens, byte fallback and decoding.
//! Expected ids were worked out by hand from llama.cpp's `llm_tokenizer_spm_session`.

use candle_core::quantized::gguf_file::Value;

use super::*;

/// (text, score, token type) by id.
const VOCAB: &[(&str, f32, i32)] = &[
    ("<unk>", 0.0, 2),  // 0
    ("<s>", 0.0, 3),    // 1
    ("</s>", 0.0, 3),   // 2
    ("<0x0A>", 0.0, 6), // 3
    ("<0xC3>", 0.0, 6), // 4
    ("<0xA9>", 0.0, 6), // 5
    ("▁", -1.0, 1),     // 6
    ("a", -2.0, 1),     // 7
    ("b", -2.0, 1),     // 8
    ("▁a", -0.5, 1),    // 9
    ("ab", -3.0, 1),    // 10
    ("▁ab", -0.1, 1),   // 11
    ("<u>", 0.0, 4),    // 12
    ("▁b", -0.7, 1),    // 13
];

/// Metadata with only the required keys (llama.cpp's SPM defaults apply to the rest).
fn metadata() -> Metadata {
    let mut md = Metadata::new();
    let s = |v: &str| Value::String(v.to_string());
    md.insert(gguf::KEY_MODEL.into(), s("llama"));
    md.insert(
        gguf::KEY_TOKENS.into(),
        Value::Array(VOCAB.iter().map(|t| s(t.0)).collect()),
    );
    md.insert(
        spm::KEY_SCORES.into(),
        Value::Array(VOCAB.iter().map(|t| Value::F32(t.1)).collect()),
    );
    md.insert(
        gguf::KEY_TOKEN_TYPE.into(),
        Value::Array(VOCAB.iter().map(|t| Value::I32(t.2)).collect()),
    );
    md
}

fn tokenizer(md: &Metadata) -> TextTokenizer {
    TextTokenizer::from_gguf(md).expect("tiny SPM tokenizer")
}

#[test]
fn llama_cpp_spm_defaults() {
    let t = tokenizer(&metadata());
    assert_eq!((t.bos_token_id(), t.eos_token_id()), (Some(1), Some(2)));
    assert!(t.add_bos() && !t.add_eos());
    assert_eq!(t.eog_token_ids(), &[2]);
    assert_eq!(t.encode_prompt("ab").expect("encode"), vec![1, 11]);
    assert_eq!(t.encode_prompt("").expect("encode"), vec![1]);
}

#[test]
fn space_prefix_starts_the_text_and_follows_special_tokens() {
    let t = tokenizer(&metadata());
    // "▁ab": ▁a (-0.5) merges before ab (-3), then ▁a + b = ▁ab (-0.1).
    assert_eq!(t.encode("ab", true).expect("encode"), vec![11]);
    // "▁a▁b": ▁a and ▁b.
    assert_eq!(t.encode("a b", true).expect("encode"), vec![9, 13]);
    // A control token, then "▁ab" again.
    assert_eq!(t.encode("<s>ab", true).expect("encode"), vec![1, 11]);
    // A user-defined token is split out even without parse_special; the text after it gets
    // the prefix too ("▁a", <u>, "▁b").
    assert_eq!(t.encode("a<u>b", false).expect("encode"), vec![9, 12, 13]);
    // Without add_space_prefix: "a▁b" is a, ▁b.
    let mut md = metadata();
    md.insert(spm::KEY_ADD_SPACE_PREFIX.into(), Value::Bool(false));
    let t = tokenizer(&md);
    assert_eq!(t.encode("a b", true).expect("encode"), vec![7, 13]);
    assert_eq!(t.decode(&[7, 13]), "a b");
}

#[test]
fn byte_fallback_and_decoding() {
    let t = tokenizer(&metadata());
    // "\n" and "é" are not tokens: <0x0A>, then <0xC3><0xA9>.
    let ids = t.encode("a\né", true).expect("encode");
    assert_eq!(ids, vec![9, 3, 4, 5]);
    assert_eq!(t.token_bytes(3), b"\n");
    assert_eq!(t.token_bytes(4), [0xC3]);
    assert_eq!(t.token_bytes(9), b" a");
    // llama_detokenize drops the prefix space of the first token...
    assert_eq!(t.decode(&ids), "a\né");
    assert_eq!(t.decode(&[9, 13]), "a b");
    // ...but not after a BOS (remove_space is consumed by the first token).
    assert_eq!(t.decode(&[1, 9, 13]), " a b");
    assert!(t.token_bytes(1).is_empty());
    assert_eq!(t.token_piece(1), b"<s>");
    assert_eq!(t.token_bytes(12), b"<u>");
    // A character with no token and no byte token is an error, not a panic.
    let err = t.encode("ü", true).expect_err("no byte token");
    assert!(matches!(err, TokenizerError::Encode { .. }), "{err}");
}

#[test]
fn bad_spm_metadata_is_refused() {
    let mut md = metadata();
    md.insert(spm::KEY_SCORES.into(), Value::Array(vec![Value::F32(0.0)]));
    let err = TextTokenizer::from_gguf(&md).expect_err("short scores");
    assert_eq!(
        err.to_string(),
        "GGUF metadata key `tokenizer.ggml.scores` = \"1 entries\" is invalid: expected one \
         per token (14 tokens)"
    );
    let mut md = metadata();
    let mut scores: Vec<Value> = VOCAB.iter().map(|t| Value::F32(t.1)).collect();
    scores[7] = Value::F32(f32::NAN);
    md.insert(spm::KEY_SCORES.into(), Value::Array(scores));
    let err = TextTokenizer::from_gguf(&md).expect_err("NaN score");
    assert!(
        err.to_string().contains("tokenizer.ggml.scores[7]"),
        "{err}"
    );
    let mut md = metadata();
    let mut types: Vec<Value> = VOCAB.iter().map(|t| Value::I32(t.2)).collect();
    types[7] = Value::I32(6); // "a" as a byte token
    md.insert(gguf::KEY_TOKEN_TYPE.into(), Value::Array(types));
    let err = TextTokenizer::from_gguf(&md).expect_err("bad byte token");
    assert!(
        err.to_string().contains("tokenizer.ggml.tokens[7]"),
        "{err}"
    );
    let mut md = metadata();
    md.insert(spm::KEY_ADD_EOS.into(), Value::Bool(true));
    md.insert(gguf::KEY_EOS.into(), Value::U32(99));
    let err = TextTokenizer::from_gguf(&md).expect_err("eos out of range");
    assert!(
        err.to_string().contains("tokenizer.ggml.eos_token_id"),
        "{err}"
    );
}
