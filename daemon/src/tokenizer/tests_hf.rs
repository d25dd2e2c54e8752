//! Hugging Face directory tokenizers against transformers' outputs for the tiny models
//! (`../shared/fixtures/tiny-models/*/reference.json`), and the errors for bad files.

use crate::request::ChatMessage;
use std::path::{Path, PathBuf};

use serde_json::Value as Json;

use super::tests::{ids, messages};
use super::*;
use crate::test_support::{fixture_json, fixtures_dir};

const ARCHS: [&str; 7] = [
    "gemma3",
    "llama",
    "mistral",
    "phi3",
    "qwen2",
    "qwen3",
    "qwen3_moe",
];

fn dir(arch: &str) -> PathBuf {
    fixtures_dir().join("tiny-models").join(arch)
}

#[test]
fn tiny_models_match_transformers() {
    let mut cases = 0;
    let mut chats = 0;
    for arch in ARCHS {
        let t = TextTokenizer::from_hf_dir(&dir(arch)).expect("tokenizer from directory");
        let reference = fixture_json(&format!("tiny-models/{arch}/reference.json"));
        for case in reference["tokenizer_cases"].as_array().expect("cases") {
            let text = case["text"].as_str().expect("text");
            assert_eq!(case["add_special_tokens"], false);
            let got = t.encode(text, true).expect("encode");
            assert_eq!(got, ids(&case["input_ids"]), "{arch} {text:?}");
            // transformers decodes with skip_special_tokens=False: the pieces.
            let pieces: Vec<u8> = got
                .iter()
                .flat_map(|&id| t.token_piece(id).to_vec())
                .collect();
            let decoded = case["decoded"].as_str().expect("decoded");
            assert_eq!(String::from_utf8_lossy(&pieces), decoded, "{arch}");
            // decode() drops the special tokens.
            let without: Vec<u32> = got.iter().copied().filter(|&i| !t.is_control(i)).collect();
            assert_eq!(t.decode(&got), t.decode(&without));
            if !got.iter().any(|&i| t.is_control(i)) {
                assert_eq!(t.decode(&got), decoded, "{arch} {text:?}");
            }
            cases += 1;
        }
        for chat in reference["chat"].as_array().expect("chat") {
            assert_eq!(chat["add_generation_prompt"], true);
            let (rendered, got) = t.encode_chat(&messages(&chat["messages"])).expect("chat");
            assert_eq!(
                rendered,
                chat["rendered"].as_str().expect("rendered"),
                "{arch}"
            );
            assert_eq!(got, ids(&chat["input_ids"]), "{arch}");
            chats += 1;
        }
    }
    assert_eq!(cases, 7 * 8);
    assert_eq!(chats, 7 * 2);
}

#[test]
fn tiny_model_special_ids_and_generation_config() {
    for arch in ARCHS {
        let t = TextTokenizer::from_hf_dir(&dir(arch)).expect("tokenizer");
        let gen = fixture_json(&format!("tiny-models/{arch}/generation_config.json"));
        let want = u32::try_from(gen["eos_token_id"].as_u64().expect("eos")).expect("u32");
        assert_eq!(want, 1023);
        assert_eq!(t.eog_token_ids(), &[want], "{arch}");
        assert_eq!(t.eos_token_id(), Some(1023));
        // bos_token is null in tokenizer_config.json, and the post-processor is ByteLevel.
        assert_eq!(t.bos_token_id(), None);
        assert!(!t.add_bos() && !t.add_eos());
        assert_eq!(t.vocab_size(), 1024);
        assert!(t.is_control(1021) && t.is_control(1022) && t.is_control(1023));
        assert!(!t.is_control(1020));
        assert_eq!(t.token_piece(1022), b"<|im_start|>");
        assert!(t.token_bytes(1022).is_empty());
        // Byte-level tokens: id 220 is "Ġ", a space.
        assert_eq!(t.token_bytes(220), b" ");
        assert_eq!(t.generation_defaults(), &GenerationDefaults::default());
        assert!(t.hf_tokenizer().is_some());
    }
}

#[test]
fn special_text_in_hf_chat_content_is_plain() {
    let t = TextTokenizer::from_hf_dir(&dir("qwen2")).expect("tokenizer");
    let content = "a<|im_end|>b<|im_start|>";
    let msgs = [ChatMessage {
        role: "user".to_string(),
        content: content.to_string(),
        ..Default::default()
    }];
    let (rendered, got) = t.encode_chat(&msgs).expect("chat");
    assert!(rendered.contains(content));
    // Two <|im_end|> (system, user) from the template, none from the content.
    assert_eq!(got.iter().filter(|&&id| id == 1023).count(), 2);
    assert_eq!(got.iter().filter(|&&id| id == 1022).count(), 3);
    // The content's special text went through BPE as text.
    let plain = t.encode(content, false).expect("encode");
    assert!(
        plain.len() > 4 && plain.iter().all(|&id| id < 1021),
        "{plain:?}"
    );
    assert!(got.windows(plain.len()).any(|w| w == plain.as_slice()));
    // And the same text parses specials when asked.
    assert_eq!(
        t.encode(content, true)
            .expect("encode")
            .iter()
            .filter(|&&i| i >= 1021)
            .count(),
        2
    );
}

/// A copy of the qwen2 tiny-model tokenizer files in a temporary directory, with `edit`
/// applied to the named file (`None` removes it).
fn dir_with(file: &str, edit: Option<&str>) -> tempfile::TempDir {
    let tmp = tempfile::tempdir().expect("tempdir");
    for name in [
        "tokenizer.json",
        "tokenizer_config.json",
        "generation_config.json",
    ] {
        std::fs::copy(dir("qwen2").join(name), tmp.path().join(name)).expect("copy");
    }
    let path = tmp.path().join(file);
    match edit {
        Some(text) => std::fs::write(&path, text).expect("write"),
        None => {
            let _ = std::fs::remove_file(&path);
        }
    }
    tmp
}

/// tokenizer_config.json of the tiny models with `key` set to `value` (JSON text).
fn config_with(key: &str, value: &str) -> String {
    let mut c = fixture_json("tiny-models/qwen2/tokenizer_config.json");
    c[key] = serde_json::from_str(value).expect("value json");
    c.to_string()
}

fn load_err(tmp: &tempfile::TempDir) -> String {
    TextTokenizer::from_hf_dir(tmp.path())
        .expect_err("bad directory")
        .to_string()
}

fn path_in(tmp: &tempfile::TempDir, file: &str) -> String {
    Path::new(tmp.path()).join(file).display().to_string()
}

#[test]
fn bad_files_give_one_clear_error() {
    let tmp = dir_with("tokenizer.json", None);
    let msg = load_err(&tmp);
    assert!(
        msg.starts_with(&format!("{}: cannot read", path_in(&tmp, "tokenizer.json"))),
        "{msg}"
    );

    let tmp = dir_with("tokenizer_config.json", Some("{\"chat_template\": "));
    let msg = load_err(&tmp);
    assert!(
        msg.starts_with(&format!(
            "{}: not valid JSON",
            path_in(&tmp, "tokenizer_config.json")
        )),
        "{msg}"
    );

    let tmp = dir_with("generation_config.json", Some("[1, 2]"));
    assert_eq!(
        load_err(&tmp),
        format!(
            "{}: expected a JSON object, found array",
            path_in(&tmp, "generation_config.json")
        )
    );

    let tmp = dir_with(
        "generation_config.json",
        Some(r#"{"eos_token_id": [1023, 5000]}"#),
    );
    assert_eq!(
        load_err(&tmp),
        format!(
            "{}: key `eos_token_id[1]`: token id 5000 is beyond the vocabulary (1024 tokens)",
            path_in(&tmp, "generation_config.json")
        )
    );

    let tmp = dir_with("generation_config.json", Some(r#"{"temperature": "hot"}"#));
    assert_eq!(
        load_err(&tmp),
        format!(
            "{}: key `temperature`: expected a number, found string \"hot\"",
            path_in(&tmp, "generation_config.json")
        )
    );

    let tmp = dir_with(
        "tokenizer_config.json",
        Some(&config_with(
            "chat_template",
            r#""{% for m in messages %}""#,
        )),
    );
    let msg = load_err(&tmp);
    assert!(
        msg.starts_with(&format!(
            "{}: key `chat_template`: does not compile:",
            path_in(&tmp, "tokenizer_config.json")
        )),
        "{msg}"
    );

    let tmp = dir_with(
        "tokenizer_config.json",
        Some(&config_with("eos_token", "7")),
    );
    assert_eq!(
        load_err(&tmp),
        format!(
            "{}: key `eos_token`: expected a string or an object with `content`, found number 7",
            path_in(&tmp, "tokenizer_config.json")
        )
    );

    let tmp = dir_with(
        "tokenizer_config.json",
        Some(&config_with("eos_token", r#"{"content": "<|nope|>"}"#)),
    );
    assert_eq!(
        load_err(&tmp),
        format!(
            "{}: key `eos_token`: \"<|nope|>\" is not a token of tokenizer.json",
            path_in(&tmp, "tokenizer_config.json")
        )
    );

    let tmp = dir_with(
        "tokenizer_config.json",
        Some(&config_with(
            "added_tokens_decoder",
            r#"{"4096": {"content": "x"}}"#,
        )),
    );
    assert_eq!(
        load_err(&tmp),
        format!(
            "{}: key `added_tokens_decoder.4096`: token id 4096 is beyond the vocabulary \
             (1024 tokens)",
            path_in(&tmp, "tokenizer_config.json")
        )
    );

    let tmp = dir_with(
        "tokenizer_config.json",
        Some(&config_with(
            "added_tokens_decoder",
            r#"{"1023": {"content": "<|im_stop|>", "special": true}}"#,
        )),
    );
    assert_eq!(
        load_err(&tmp),
        format!(
            "{}: key `added_tokens_decoder.1023.content`: \"<|im_stop|>\" differs from token \
             1023 of tokenizer.json, \"<|im_end|>\"",
            path_in(&tmp, "tokenizer_config.json")
        )
    );

    let tmp = dir_with(
        "tokenizer_config.json",
        Some(&config_with("add_bos_token", "\"yes\"")),
    );
    assert_eq!(
        load_err(&tmp),
        format!(
            "{}: key `add_bos_token`: expected a boolean, found string \"yes\"",
            path_in(&tmp, "tokenizer_config.json")
        )
    );

    let tmp = dir_with(
        "tokenizer_config.json",
        Some(&config_with("add_bos_token", "true")),
    );
    assert_eq!(
        load_err(&tmp),
        format!(
            "{}: key `bos_token`: missing, but BOS is to be added (add_bos_token or the \
             post-processor)",
            path_in(&tmp, "tokenizer_config.json")
        )
    );

    let tmp = dir_with("tokenizer.json", Some(r#"{"model": {"type": "Nope"}}"#));
    let msg = load_err(&tmp);
    assert!(
        msg.starts_with(&format!(
            "{}: not a tokenizer the `tokenizers` crate can load:",
            path_in(&tmp, "tokenizer.json")
        )),
        "{msg}"
    );
}

#[test]
fn optional_files_and_template_sources() {
    // No tokenizer_config.json and no generation_config.json: no template, no EOS.
    let tmp = dir_with("tokenizer_config.json", None);
    std::fs::remove_file(tmp.path().join("generation_config.json")).expect("rm");
    let t = TextTokenizer::from_hf_dir(tmp.path()).expect("tokenizer");
    assert!(t.chat_template().is_none() && t.eog_token_ids().is_empty());
    assert_eq!(t.eos_token_id(), None);
    // The template from chat_template.jinja when the config has none; BOS/EOS objects.
    let mut c = fixture_json("tiny-models/qwen2/tokenizer_config.json");
    let template = c["chat_template"].take();
    c["eos_token"] = serde_json::json!({"content": "<|im_end|>", "__type": "AddedToken"});
    c["bos_token"] = serde_json::json!("<|endoftext|>");
    let tmp = dir_with("tokenizer_config.json", Some(&c.to_string()));
    std::fs::write(
        tmp.path().join("chat_template.jinja"),
        template.as_str().expect("template"),
    )
    .expect("write");
    std::fs::write(
        tmp.path().join("generation_config.json"),
        r#"{"eos_token_id": [1023, 1021], "temperature": 0.6, "top_p": 0.9, "top_k": 20,
            "do_sample": true, "repetition_penalty": 1.05}"#,
    )
    .expect("write");
    let t = TextTokenizer::from_hf_dir(tmp.path()).expect("tokenizer");
    assert_eq!(t.eog_token_ids(), &[1021, 1023]);
    assert_eq!(t.bos_token_id(), Some(1021));
    assert_eq!(t.eos_token_id(), Some(1023));
    let d = t.generation_defaults();
    assert_eq!(
        (d.temperature, d.top_p, d.top_k, d.min_p, d.do_sample),
        (Some(0.6), Some(0.9), Some(20), None, Some(true))
    );
    assert_eq!(d.repetition_penalty, Some(1.05));
    let reference = fixture_json("tiny-models/qwen2/reference.json");
    let chat = &reference["chat"][1];
    let (rendered, got) = t.encode_chat(&messages(&chat["messages"])).expect("chat");
    assert_eq!(rendered, chat["rendered"].as_str().expect("rendered"));
    assert_eq!(got, ids(&chat["input_ids"]));
}

#[test]
fn added_tokens_decoder_can_make_a_token_special() {
    // <|im_end|> not special in tokenizer.json but special in the config: it is a control
    // token, and its text in content stays plain.
    let mut tj = fixture_json("tiny-models/qwen2/tokenizer.json");
    for t in tj["added_tokens"].as_array_mut().expect("added") {
        if t["content"] == "<|im_end|>" {
            t["special"] = Json::Bool(false);
        }
    }
    let tmp = dir_with("tokenizer.json", Some(&tj.to_string()));
    let t = TextTokenizer::from_hf_dir(tmp.path()).expect("tokenizer");
    assert!(t.is_control(1023));
    assert!(!t
        .encode("x<|im_end|>", false)
        .expect("encode")
        .contains(&1023));
    assert!(t
        .encode("x<|im_end|>", true)
        .expect("encode")
        .contains(&1023));
    // Without the config entry it is a user-defined token, matched even without specials.
    let mut c = fixture_json("tiny-models/qwen2/tokenizer_config.json");
    c["added_tokens_decoder"]
        .as_object_mut()
        .expect("decoder")
        .remove("1023");
    std::fs::write(tmp.path().join("tokenizer_config.json"), c.to_string()).expect("write");
    let t = TextTokenizer::from_hf_dir(tmp.path()).expect("tokenizer");
    assert_eq!(t.token_type(1023), Some(TokenType::UserDefined));
    assert!(t
        .encode("x<|im_end|>", false)
        .expect("encode")
        .contains(&1023));
    assert_eq!(t.token_bytes(1023), b"<|im_end|>");
}

/// A SentencePiece-style tokenizer.json: Metaspace pre-tokenizer with `prepend_scheme: first`
/// (position-dependent), byte fallback, and a special token with `lstrip`.
const METASPACE_TOKENIZER: &str = r#"{
  "version": "1.0", "truncation": null, "padding": null,
  "added_tokens": [
    {"id": 0, "content": "<s>", "single_word": false, "lstrip": false, "rstrip": false,
     "normalized": false, "special": true},
    {"id": 1, "content": "<mask>", "single_word": false, "lstrip": true, "rstrip": false,
     "normalized": false, "special": true}
  ],
  "normalizer": null,
  "pre_tokenizer": {"type": "Metaspace", "replacement": "▁", "prepend_scheme": "first",
                    "split": false},
  "post_processor": {"type": "TemplateProcessing",
    "single": [{"SpecialToken": {"id": "<s>", "type_id": 0}},
               {"Sequence": {"id": "A", "type_id": 0}}],
    "pair": [{"Sequence": {"id": "A", "type_id": 0}}, {"Sequence": {"id": "B", "type_id": 1}}],
    "special_tokens": {"<s>": {"id": "<s>", "ids": [0], "tokens": ["<s>"]}}},
  "decoder": {"type": "Sequence", "decoders": [{"type": "ByteFallback"},
    {"type": "Metaspace", "replacement": "▁", "prepend_scheme": "first", "split": false}]},
  "model": {"type": "BPE", "dropout": null, "unk_token": null,
    "continuing_subword_prefix": null, "end_of_word_suffix": null, "fuse_unk": false,
    "byte_fallback": true, "ignore_merges": false,
    "vocab": {"<s>": 0, "<mask>": 1, "<0x0A>": 2, "▁": 3, "a": 4, "b": 5, "▁a": 6, "ab": 7,
              "▁ab": 8, "▁b": 9},
    "merges": [["▁", "a"], ["a", "b"], ["▁a", "b"], ["▁", "b"]]}
}"#;

/// Our partition + per-fragment encoding gives the ids `tokenizers` gives for the whole
/// string (when no special text sits in content), and decodes like it.
fn assert_same_as_tokenizers(dir: &Path, texts: &[&str]) {
    let ours = TextTokenizer::from_hf_dir(dir).expect("tokenizer");
    let native = tokenizers::Tokenizer::from_file(dir.join("tokenizer.json")).expect("native");
    for text in texts {
        let want = native.encode(*text, false).expect("native encode");
        let got = ours.encode(text, true).expect("encode");
        assert_eq!(got, want.get_ids(), "{text:?}");
        let decoded = native.decode(&got, true).expect("native decode");
        assert_eq!(ours.decode(&got), decoded, "{text:?}");
    }
}

#[test]
fn fragments_encode_like_the_whole_string() {
    assert_same_as_tokenizers(
        &dir("qwen2"),
        &[
            "<|im_start|>user\nHi there<|im_end|>\n<|im_start|>assistant\n",
            "x<|im_end|><|im_start|> y  z\t<|endoftext|>",
            "<|im_end|>",
            "  two  spaces\tand\ttabs\n\nnewlines",
        ],
    );
    let tmp = tempfile::tempdir().expect("tempdir");
    std::fs::write(tmp.path().join("tokenizer.json"), METASPACE_TOKENIZER).expect("write");
    let texts = [
        "ab",
        "a b",
        "<s>ab",
        "ab<s>ab",
        "a <mask> b",
        "a\nb",
        " <s> a",
        "ba ab",
    ];
    assert_same_as_tokenizers(tmp.path(), &texts);
    let t = TextTokenizer::from_hf_dir(tmp.path()).expect("tokenizer");
    // "ab<s>ab": the ▁ is prepended to the first piece only (prepend_scheme first).
    assert_eq!(t.encode("ab<s>ab", true).expect("encode"), vec![8, 0, 7]);
    // lstrip: the space before <mask> is swallowed.
    assert_eq!(t.encode("a <mask> b", true).expect("encode"), vec![6, 1, 9]);
    // Byte fallback decodes to the byte; the first token loses its ▁ (Metaspace decoder).
    assert_eq!(t.token_bytes(2), b"\n");
    assert_eq!(t.token_bytes(6), b" a");
    assert_eq!(t.decode(&[6, 2, 5]), "a\nb");
    // No tokenizer_config.json: BOS from the post-processor cannot be named, so not added.
    assert_eq!((t.bos_token_id(), t.add_bos()), (None, false));
    // With a config naming <s> as BOS, the TemplateProcessing single template adds it.
    std::fs::write(
        tmp.path().join("tokenizer_config.json"),
        r#"{"bos_token": "<s>", "chat_template": "{{ bos_token }}{{ messages[0].content }}"}"#,
    )
    .expect("write");
    let t = TextTokenizer::from_hf_dir(tmp.path()).expect("tokenizer");
    assert_eq!((t.bos_token_id(), t.add_bos()), (Some(0), true));
    assert_eq!(t.encode_prompt("ab").expect("encode"), vec![0, 8]);
    let msgs = [ChatMessage {
        role: "user".to_string(),
        content: "ab<s>".to_string(),
        ..Default::default()
    }];
    // BOS once, from the template; "<s>" typed in content is text, not token 0. Its
    // characters have no tokens (and no byte tokens here), so `tokenizers` drops them.
    let (rendered, got) = t.encode_chat(&msgs).expect("chat");
    assert_eq!(rendered, "<s>ab<s>");
    assert_eq!(got, vec![0, 7]);
}

/// `chat_template.jinja` takes priority over tokenizer_config.json's `chat_template`, as
/// in transformers (`test_chat_template_file_priority`), and a broken one is an error even
/// when the config has a good template.
#[test]
fn chat_template_jinja_overrides_the_config_template() {
    let c = fixture_json("tiny-models/qwen2/tokenizer_config.json");
    let tmp = dir_with("tokenizer_config.json", Some(&c.to_string()));
    std::fs::write(
        tmp.path().join("chat_template.jinja"),
        "FILE{% for m in messages %}[{{ m.content }}]{% endfor %}",
    )
    .expect("write");
    let t = TextTokenizer::from_hf_dir(tmp.path()).expect("tokenizer");
    let (rendered, _) = t
        .encode_chat(&messages(
            &serde_json::json!([{"role": "user", "content": "hi"}]),
        ))
        .expect("chat");
    assert_eq!(rendered, "FILE[hi]");
    std::fs::write(
        tmp.path().join("chat_template.jinja"),
        "{% for m in messages %}",
    )
    .expect("write");
    assert!(TextTokenizer::from_hf_dir(tmp.path()).is_err());
}
