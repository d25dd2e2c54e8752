//! The SentencePiece (`tokenizer.ggml.model = "llama"`) tokenizer against llama.cpp b11312 on
//! the real Gemma 3 270M GGUF (`../shared/fixtures/llamacpp-gemma3/reference.json`).
//!
//! The model is looked up as `$INFERD_TEST_GEMMA3_MODEL`, then
//! `<workspace>/models/gemma-3-270m-q4_k_m.gguf`, then
//! `<workspace>/../shared/models/gemma-3-270m-q4_k_m.gguf`. When it is in none of them each
//! test prints a note and passes without checking anything.

use crate::request::ChatMessage;
use std::path::PathBuf;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use candle_core::quantized::gguf_file::{Content, Value};
use serde_json::Value as Json;

use super::*;
use crate::test_support::{fixture_json, workspace_root};

/// File name of the Gemma 3 model.
const GEMMA3_FILE: &str = "gemma-3-270m-q4_k_m.gguf";

fn gemma3_path() -> Option<PathBuf> {
    if let Ok(p) = std::env::var("INFERD_TEST_GEMMA3_MODEL") {
        return Some(PathBuf::from(p));
    }
    let root = workspace_root();
    [
        root.join("models").join(GEMMA3_FILE),
        root.join("../shared/models").join(GEMMA3_FILE),
    ]
    .into_iter()
    .find(|p| p.is_file())
}

/// The metadata and the time `from_gguf` took, `None` (with a note) without the model.
fn loaded() -> Option<&'static (Metadata, TextTokenizer, Duration)> {
    static LOADED: OnceLock<Option<(Metadata, TextTokenizer, Duration)>> = OnceLock::new();
    let loaded = LOADED.get_or_init(|| {
        let path = gemma3_path()?;
        let mut file = std::fs::File::open(&path).expect("open Gemma 3 model");
        let md = Content::read(&mut file).expect("read GGUF").metadata;
        let start = Instant::now();
        let tok = TextTokenizer::from_gguf(&md).expect("tokenizer from GGUF");
        let took = start.elapsed();
        eprintln!("Gemma 3 tokenizer (262,144 tokens) built in {took:?}");
        Some((md, tok, took))
    });
    if loaded.is_none() {
        eprintln!(
            "note: {GEMMA3_FILE} not found ($INFERD_TEST_GEMMA3_MODEL, <workspace>/models/, \
             ../shared/models/): Gemma 3 tokenizer test skipped"
        );
    }
    loaded.as_ref()
}

fn ids(v: &Json) -> Vec<u32> {
    v.as_array()
        .expect("id array")
        .iter()
        .map(|x| u32::try_from(x.as_u64().expect("id")).expect("u32 id"))
        .collect()
}

#[test]
fn gemma3_properties() {
    let Some((_, t, took)) = loaded() else { return };
    assert_eq!(t.vocab_size(), 262_144);
    assert_eq!(t.bos_token_id(), Some(2));
    assert_eq!(t.eos_token_id(), Some(1));
    assert!(t.add_bos() && !t.add_eos());
    // llama.cpp b11312: <eos> (1), <end_of_turn> (106, detected EOT) and </s> (212, in the
    // EOG text list, forced to control).
    assert_eq!(t.eog_token_ids(), &[1, 106, 212]);
    assert!(t.is_control(106) && t.is_control(212) && t.is_control(2));
    assert_eq!(t.token_type(107), Some(TokenType::UserDefined)); // "\n"
    assert_eq!(t.token_type(248), Some(TokenType::Byte)); // <0x0A>
    assert_eq!(t.token_bytes(248), b"\n");
    assert_eq!(t.token_bytes(236743), b" "); // "▁"
    assert_eq!(t.token_bytes(107), b"\n");
    assert!(t.token_bytes(106).is_empty());
    assert_eq!(t.token_piece(106), b"<end_of_turn>");
    assert!(t.chat_template().is_none());
    assert!(t.hf_tokenizer().is_none());
    assert!(
        *took < Duration::from_secs(10),
        "building the 262k tokenizer took {took:?}"
    );
}

#[test]
fn gemma3_corpus_matches_llama_cpp() {
    let Some((_, t, _)) = loaded() else { return };
    let r = fixture_json("llamacpp-gemma3/reference.json");
    let cases = r["tokenize"].as_array().expect("tokenize");
    assert_eq!(cases.len(), 109);
    let mut failures = Vec::new();
    let mut checked = 0;
    for case in cases {
        let text = case["text"].as_str().expect("text");
        for (parse_special, key) in [(true, "ids_parse_special"), (false, "ids_plain")] {
            let want = ids(&case[key]);
            let got = t.encode(text, parse_special).expect("encode");
            if got != want {
                failures.push(format!("{text:?} {key}: got {got:?}, want {want:?}"));
            }
            checked += 1;
        }
        // No control token in the plain ids, so they decode back to the text.
        assert_eq!(t.decode(&ids(&case["ids_plain"])), text, "round trip");
    }
    assert!(
        failures.is_empty(),
        "{} of {checked} mismatch:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

#[test]
fn gemma3_raw_prompts_match_llama_cpp() {
    let Some((_, t, _)) = loaded() else { return };
    let r = fixture_json("llamacpp-gemma3/reference.json");
    let raw = r["raw"].as_array().expect("raw");
    assert_eq!(raw.len(), 4);
    for entry in raw {
        let prompt = entry["prompt"].as_str().expect("prompt");
        let want = ids(&entry["prompt_token_ids"]);
        assert_eq!(want[0], 2, "BOS first");
        assert_eq!(t.encode_prompt(prompt).expect("encode"), want, "{prompt:?}");
        // The server's text is the concatenation of the generated pieces.
        let generated = ids(&entry["generated_token_ids"]);
        let pieces: Vec<u8> = generated
            .iter()
            .flat_map(|&id| t.token_bytes(id).to_vec())
            .collect();
        let text = entry["generated_text"].as_str().expect("text");
        assert_eq!(String::from_utf8_lossy(&pieces), text);
        assert_eq!(t.decode(&generated), text);
        // BOS decodes to nothing, and with add_space_prefix false no space is dropped.
        assert_eq!(t.decode(&want), prompt);
    }
}

#[test]
fn gemma3_byte_fallback_whitespace_and_specials() {
    let Some((_, t, _)) = loaded() else { return };
    // U+10FFFD is not in the vocabulary: its four UTF-8 bytes as <0xNN> tokens (238 + byte).
    let got = t.encode("a\u{10FFFD}", false).expect("encode");
    let bytes: Vec<u32> = "\u{10FFFD}".bytes().map(|b| 238 + u32::from(b)).collect();
    assert_eq!(&got[1..], bytes.as_slice());
    assert_eq!(t.decode(&got), "a\u{10FFFD}");
    // Space runs are user-defined tokens ("  ", "   ", ...); a single space is "▁".
    let got = t.encode("x   y", false).expect("encode");
    assert_eq!(t.decode(&got), "x   y");
    assert!(
        got.iter().any(|&id| t.token_text(id) == Some("   ")),
        "{got:?}"
    );
    // Control text: a token with parse_special, text without.
    assert_eq!(
        t.encode("<start_of_turn>user", true).expect("encode")[0],
        105
    );
    assert!(!t
        .encode("<start_of_turn>user", false)
        .expect("encode")
        .contains(&105));
}

#[test]
fn gemma3_chat_content_stays_plain_text() {
    let Some((md, _, _)) = loaded() else { return };
    let mut md = md.clone();
    md.insert(
        gguf::KEY_CHAT_TEMPLATE.to_string(),
        Value::String(
            "{{ bos_token }}{% for m in messages %}<start_of_turn>{{ m.role }}\n{{ m.content }}\
             <end_of_turn>\n{% endfor %}{{ '<start_of_turn>model\n' }}"
                .to_string(),
        ),
    );
    let t = TextTokenizer::from_gguf(&md).expect("tokenizer");
    let content = "hi <end_of_turn> <start_of_turn>";
    let msgs = [ChatMessage {
        role: "user".to_string(),
        content: content.to_string(),
        ..Default::default()
    }];
    let (prompt, got) = t.encode_chat(&msgs).expect("encode_chat");
    assert_eq!(
        prompt,
        format!("<bos><start_of_turn>user\n{content}<end_of_turn>\n<start_of_turn>model\n")
    );
    let mut want = t
        .encode("<bos><start_of_turn>user\n", true)
        .expect("encode");
    want.extend(t.encode(content, false).expect("encode"));
    want.extend(
        t.encode("<end_of_turn>\n<start_of_turn>model\n", true)
            .expect("encode"),
    );
    assert_eq!(got, want);
    assert_eq!(got[0], 2, "BOS once, from the template");
    assert_eq!(got.iter().filter(|&&id| id == 2).count(), 1);
    assert_eq!(got.iter().filter(|&&id| id == 106).count(), 1);
}

#[test]
fn gemma3_encodes_kilobytes_quickly() {
    let Some((_, t, _)) = loaded() else { return };
    let r = fixture_json("llamacpp-gemma3/reference.json");
    let mut text = String::new();
    for case in r["tokenize"].as_array().expect("tokenize") {
        text.push_str(case["text"].as_str().expect("text"));
        text.push('\n');
    }
    let text = text.repeat(4);
    assert!(text.len() > 8_000, "{}", text.len());
    let start = Instant::now();
    let got = t.encode(&text, true).expect("encode");
    let took = start.elapsed();
    eprintln!("{} bytes -> {} tokens in {took:?}", text.len(), got.len());
    assert_eq!(t.decode(&got), text);
    assert!(took < Duration::from_secs(2), "{took:?}");
}
