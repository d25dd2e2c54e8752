//! Tests of client-frame validation: one per rule, plus a junk-frame sweep.

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde_json::{json, Value};

use super::*;
use crate::error::ErrorKind;
use crate::request::{ChatMessage, ConstraintSpec};

const VOCAB: usize = 32_000;

fn parse(frame: &str) -> Result<ClientMessage, ApiError> {
    parse_client_message(frame, &SamplingDefaults::default(), VOCAB)
}

fn ok(v: Value) -> ClientMessage {
    parse(&v.to_string()).unwrap_or_else(|e| panic!("{v} should be valid: {e}"))
}

fn err(frame: &str) -> ApiError {
    match parse(frame) {
        Ok(msg) => panic!("{frame} should be invalid, parsed as {msg:?}"),
        Err(e) => e,
    }
}

/// Asserts `v` is rejected as `validation` with a message containing `fragment`.
#[track_caller]
fn invalid(v: Value, fragment: &str) -> ApiError {
    let e = err(&v.to_string());
    assert_eq!(e.error.kind, ErrorKind::Validation, "{}", e.error.message);
    assert!(
        e.error.message.contains(fragment),
        "message {:?} lacks {fragment:?}",
        e.error.message
    );
    e
}

/// Asserts `v` is rejected as `validation` with exactly `message`.
#[track_caller]
fn refused(v: Value, message: &str) -> ApiError {
    let e = err(&v.to_string());
    assert_eq!(e.error.kind, ErrorKind::Validation, "{}", e.error.message);
    assert_eq!(e.error.message, message);
    e
}

/// The OpenAI `param` of a validation message: its first word (as the HTTP edge's
/// `error_param` reads it), here for messages whose first word is a field path.
fn first_word(message: &str) -> &str {
    message.split_whitespace().next().unwrap_or("")
}

/// A valid raw-prompt generate frame with `extra` fields merged in.
fn generate(extra: Value) -> Value {
    let mut base = json!({"type": "generate", "id": "r1", "prompt": "hi"});
    if let (Value::Object(b), Value::Object(e)) = (&mut base, extra) {
        b.extend(e);
    }
    base
}

fn without(mut v: Value, key: &str) -> Value {
    if let Value::Object(m) = &mut v {
        m.remove(key);
    }
    v
}

fn sampling(v: Value) -> SamplingParams {
    match ok(v) {
        ClientMessage::Generate(req) => req.sampling,
        other => panic!("expected generate, got {other:?}"),
    }
}

fn input(v: Value) -> PromptInput {
    match ok(v) {
        ClientMessage::Generate(req) => req.input,
        other => panic!("expected generate, got {other:?}"),
    }
}

// --- framing, type, id ---------------------------------------------------------------

#[test]
fn malformed_json_names_the_position() {
    let e = err(r#"{"type": "generate", "id": "r1""#);
    assert_eq!(e.error.kind, ErrorKind::Validation);
    assert!(
        e.error.message.starts_with("malformed JSON: "),
        "{}",
        e.error.message
    );
    assert!(
        e.error.message.contains("line 1 column"),
        "{}",
        e.error.message
    );
    assert_eq!(e.id, None);
    let e = err("");
    assert!(
        e.error.message.contains("malformed JSON"),
        "{}",
        e.error.message
    );
}

#[test]
fn a_lone_surrogate_escape_is_explained() {
    let e = err(r#"{"type": "tokenize", "id": "t", "text": "bad \ud800 half"}"#);
    assert!(
        e.error.message.starts_with("malformed JSON: ")
            && e.error.message.ends_with(
                "(a \\uD800-\\uDFFF escape must be one half of a UTF-16 surrogate pair, \
                 followed or preceded by the other half)"
            ),
        "{}",
        e.error.message
    );
    // A surrogate pair is fine.
    let e = err(r#"{"type": "tokenize", "id": "t", "text": "\ud83d\ude00", "x": 1}"#);
    assert!(
        !e.error.message.contains("surrogate"),
        "{}",
        e.error.message
    );
}

#[test]
fn frame_must_be_an_object() {
    for frame in ["[1,2]", "\"generate\"", "5", "null", "true"] {
        let e = err(frame);
        assert_eq!(e.error.kind, ErrorKind::Validation);
        assert!(
            e.error
                .message
                .contains("frame must be a JSON object (got "),
            "{}",
            e.error.message
        );
        assert_eq!(e.id, None);
    }
}

#[test]
fn type_is_required_and_known() {
    let e = invalid(json!({"id": "r1", "prompt": "x"}), "missing field \"type\"");
    assert_eq!(e.id.as_deref(), Some("r1"));
    invalid(
        json!({"type": 5, "id": "r1"}),
        "type must be a string (got 5)",
    );
    let e = invalid(
        json!({"type": "generat", "id": "r1"}),
        "unknown message type \"generat\"",
    );
    assert_eq!(e.id.as_deref(), Some("r1"));
}

#[test]
fn id_rules() {
    let e = invalid(without(generate(json!({})), "id"), "missing field \"id\"");
    assert_eq!(e.id, None);
    invalid(generate(json!({"id": null})), "missing field \"id\"");
    let e = invalid(generate(json!({"id": 7})), "id must be a string (got 7)");
    assert_eq!(e.id, None);
    invalid(generate(json!({"id": ""})), "id must be a non-empty string");
    let long = "x".repeat(257);
    let e = invalid(
        generate(json!({"id": long})),
        "id must be at most 256 characters (got 257)",
    );
    assert_eq!(e.id, None, "an invalid id is not echoed");
    // The bound counts characters, not bytes.
    let max = "é".repeat(256);
    assert_eq!(
        ok(generate(json!({"id": max.clone()}))).id(),
        Some(max.as_str())
    );
}

#[test]
fn errors_after_the_id_carry_it() {
    let e = invalid(generate(json!({"temperature": -1})), "temperature");
    assert_eq!(e.id.as_deref(), Some("r1"));
    let frame: Value = serde_json::from_str(&e.to_frame()).expect("JSON");
    assert_eq!(
        frame,
        json!({"type": "error", "id": "r1", "error": {"type": "validation", "message": "temperature must be >= 0 (got -1)"}})
    );
}

#[test]
fn unknown_fields_are_rejected_everywhere() {
    invalid(
        generate(json!({"temprature": 0.5})),
        "unknown field \"temprature\" in generate message",
    );
    invalid(
        json!({"type": "cancel", "id": "r1", "reason": "x"}),
        "unknown field \"reason\" in cancel message",
    );
    invalid(
        json!({"type": "tokenize", "id": "t", "text": "a", "add_bos": true}),
        "unknown field \"add_bos\" in tokenize message",
    );
    invalid(
        json!({"type": "detokenize", "id": "t", "token_ids": [], "skip": 1}),
        "unknown field \"skip\" in detokenize message",
    );
    invalid(
        json!({"type": "generate", "id": "r1", "messages": [{"role": "user", "content": "x", "nam": "bob"}]}),
        "unknown field \"nam\" in messages[0]",
    );
    invalid(
        json!({"type": "generate", "id": "r1", "messages": [{"role": "user", "content": [{"type": "text", "text": "x", "cache": 1}]}]}),
        "unknown field \"cache\" in messages[0].content[0]",
    );
}

// --- generate: prompt source ---------------------------------------------------------

#[test]
fn exactly_one_of_messages_or_prompt() {
    invalid(
        generate(json!({"messages": [{"role": "user", "content": "x"}]})),
        "exactly one of messages or prompt is allowed (got both)",
    );
    invalid(
        json!({"type": "generate", "id": "r1"}),
        "exactly one of messages or prompt is required (got neither)",
    );
    invalid(
        json!({"type": "generate", "id": "r1", "prompt": null, "messages": null}),
        "(got neither)",
    );
}

#[test]
fn prompt_rules() {
    assert_eq!(
        input(generate(json!({"prompt": "Once upon"}))),
        PromptInput::Text("Once upon".into())
    );
    refused(
        generate(json!({"prompt": ""})),
        "prompt must be a non-empty string (got \"\")",
    );
    invalid(
        generate(json!({"prompt": 3})),
        "prompt must be a string or an array of token ids (got 3)",
    );
    assert_eq!(
        input(generate(json!({"prompt": [1, 31999]}))),
        PromptInput::Tokens(vec![1, 31999])
    );
    invalid(
        generate(json!({"prompt": ["a"]})),
        "prompt[0] must be an integer (got \"a\")",
    );
    invalid(
        generate(json!({"prompt": [5, 32000]})),
        "prompt[1] must be < the vocabulary size 32000 (got 32000)",
    );
    invalid(
        generate(json!({"prompt": []})),
        "prompt must be a non-empty string or a non-empty array of token ids (got [])",
    );
}

fn chat(messages: Value) -> Value {
    json!({"type": "generate", "id": "r1", "messages": messages})
}

#[test]
fn messages_rules() {
    assert_eq!(
        input(chat(
            json!([{"role": "system", "content": "Be brief."}, {"role": "user", "content": ""}])
        )),
        PromptInput::Messages(vec![
            ChatMessage {
                role: "system".into(),
                content: "Be brief.".into(),
                ..Default::default()
            },
            ChatMessage {
                role: "user".into(),
                content: String::new(),
                ..Default::default()
            },
        ])
    );
    invalid(
        chat(json!("hi")),
        "messages must be an array of messages (got \"hi\")",
    );
    invalid(chat(json!([])), "messages must be a non-empty array");
    invalid(
        chat(json!([5])),
        "messages[0] must be an object with role and content (got 5)",
    );
    invalid(
        chat(json!([{"content": "x"}])),
        "messages[0] is missing field \"role\"",
    );
    invalid(
        chat(json!([{"role": "user", "content": "x"}, {"role": 1, "content": "x"}])),
        "messages[1].role must be a string (got 1)",
    );
    invalid(
        chat(json!([{"role": "", "content": "x"}])),
        "messages[0].role must be a non-empty string",
    );
    invalid(
        chat(json!([{"role": "user"}])),
        "messages[0] is missing field \"content\"",
    );
    invalid(
        chat(json!([{"role": "user", "content": 5}])),
        "messages[0].content must be a string or an array of content parts (got 5)",
    );
    invalid(
        chat(json!([{"role": "user", "content": null}])),
        "messages[0].content must be a string or an array of content parts (got null)",
    );
}

#[test]
fn content_parts_are_concatenated() {
    assert_eq!(
        input(chat(json!([{"role": "user", "content": [
            {"type": "text", "text": "Hello, "},
            {"type": "text", "text": "world"}
        ]}]))),
        PromptInput::Messages(vec![ChatMessage {
            role: "user".into(),
            content: "Hello, world".into(),
            ..Default::default()
        }])
    );
    assert_eq!(
        input(chat(json!([{"role": "user", "content": []}]))),
        PromptInput::Messages(vec![ChatMessage {
            role: "user".into(),
            content: String::new(),
            ..Default::default()
        }])
    );
}

#[test]
fn content_part_rules() {
    invalid(
        chat(
            json!([{"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "image_url", "image_url": "x"}]}]),
        ),
        "messages[0].content[1].image_url must be an object",
    );
    invalid(
        chat(json!([{"role": "user", "content": [{"type": "image_url"}]}])),
        "messages[0].content[0] is missing field \"image_url\"",
    );
    invalid(
        chat(json!([{"role": "user", "content": [{"type": "input_audio"}]}])),
        "messages[0].content[0].type must be \"text\" or \"image_url\" (got \"input_audio\")",
    );
    invalid(
        chat(json!([{"role": "system", "content": [
            {"type": "image_url", "image_url": {"url": "data:image/png;base64,AA=="}}]}])),
        "messages[0].content[0]: image parts are allowed in user messages only (role \"system\")",
    );
    invalid(
        chat(json!([{"role": "user", "content": [
            {"type": "text", "text": "a", "image_url": {"url": "data:image/png;base64,AA=="}}]}])),
        "unknown field \"image_url\" in messages[0].content[0]",
    );
    invalid(
        chat(json!([{"role": "user", "content": [{"text": "a"}]}])),
        "messages[0].content[0] is missing field \"type\"",
    );
    invalid(
        chat(json!([{"role": "user", "content": [{"type": "text"}]}])),
        "messages[0].content[0] is missing field \"text\"",
    );
    invalid(
        chat(json!([{"role": "user", "content": [{"type": "text", "text": 1}]}])),
        "messages[0].content[0].text must be a string (got 1)",
    );
    invalid(
        chat(json!([{"role": "user", "content": ["a"]}])),
        "messages[0].content[0] must be an object",
    );
}

// --- generate: sampling --------------------------------------------------------------

#[test]
fn defaults_are_applied() {
    let s = sampling(generate(json!({})));
    let d = SamplingDefaults::default();
    assert_eq!(
        (s.temperature, s.top_k, s.top_p, s.min_p, s.max_tokens),
        (0.8, 40, 0.95, 0.05, 256)
    );
    assert_eq!(
        (d.temperature, d.top_k, d.top_p, d.min_p, d.max_tokens),
        (0.8, 40, 0.95, 0.05, 256)
    );
    assert!(s.stop.is_empty());
    // null reads as absent.
    let s2 = sampling(generate(
        json!({"temperature": null, "top_k": null, "stop": null, "max_tokens": null}),
    ));
    assert_eq!((s2.temperature, s2.top_k, s2.max_tokens), (0.8, 40, 256));
    // Configured defaults win over the built-in ones.
    let custom = SamplingDefaults {
        temperature: 0.0,
        top_k: 1,
        top_p: 1.0,
        min_p: 0.0,
        max_tokens: 7,
    };
    let frame = generate(json!({})).to_string();
    match parse_client_message(&frame, &custom, VOCAB) {
        Ok(ClientMessage::Generate(req)) => {
            let s = req.sampling;
            assert_eq!(
                (s.temperature, s.top_k, s.top_p, s.min_p, s.max_tokens),
                (0.0, 1, 1.0, 0.0, 7)
            );
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn absent_seed_is_random() {
    let seeds: std::collections::HashSet<u64> =
        (0..8).map(|_| sampling(generate(json!({}))).seed).collect();
    assert!(seeds.len() > 1, "8 random seeds were all equal");
}

#[test]
fn full_generate_example() {
    let msg = ok(json!({
        "type": "generate", "id": "r1",
        "messages": [{"role": "user", "content": "What is 2+2?"}],
        "max_tokens": 64, "temperature": 0.7, "top_k": 40, "top_p": 0.9, "min_p": 0.05,
        "seed": 1, "stop": ["\n\n"]
    }));
    assert_eq!(
        msg,
        ClientMessage::Generate(Box::new(GenerateRequest {
            client_id: "r1".into(),
            input: PromptInput::Messages(vec![ChatMessage {
                role: "user".into(),
                content: "What is 2+2?".into(),
                ..Default::default()
            }]),
            sampling: SamplingParams {
                temperature: 0.7,
                top_k: 40,
                top_p: 0.9,
                min_p: 0.05,
                seed: 1,
                max_tokens: 64,
                stop: vec!["\n\n".into()],
                ..SamplingParams::default()
            },
            plugins: vec![],
            cache: crate::request::CacheOptions::default(),
            tools: None,
            template_kwargs: Default::default(),
            adapter: None,
        }))
    );
}

#[test]
fn cache_and_cache_salt() {
    let cache = |extra: Value| match ok(generate(extra)) {
        ClientMessage::Generate(g) => g.cache,
        other => panic!("not a generate: {other:?}"),
    };
    assert_eq!(
        cache(json!({})),
        crate::request::CacheOptions {
            enabled: true,
            salt: String::new()
        }
    );
    assert!(!cache(json!({"cache": false})).enabled);
    assert_eq!(cache(json!({"cache_salt": "tenant-7"})).salt, "tenant-7");
    let msg = |extra: Value| invalid(generate(extra), "cache").error.message;
    assert_eq!(
        msg(json!({"cache": "no"})),
        "cache must be a boolean (got \"no\")"
    );
    assert_eq!(msg(json!({"cache": 0})), "cache must be a boolean (got 0)");
    assert_eq!(
        msg(json!({"cache_salt": ""})),
        "cache_salt must be 1 to 256 bytes (got 0 bytes)"
    );
    assert_eq!(
        msg(json!({"cache_salt": "x".repeat(257)})),
        "cache_salt must be 1 to 256 bytes (got 257 bytes)"
    );
    assert_eq!(
        msg(json!({"cache_salt": 5})),
        "cache_salt must be a string (got 5)"
    );
}

#[test]
fn temperature_bounds() {
    assert_eq!(
        sampling(generate(json!({"temperature": 0}))).temperature,
        0.0
    );
    assert_eq!(
        sampling(generate(json!({"temperature": 100}))).temperature,
        100.0
    );
    invalid(
        generate(json!({"temperature": -1})),
        "temperature must be >= 0 (got -1)",
    );
    invalid(
        generate(json!({"temperature": 100.5})),
        "temperature must be <= 100 (got 100.5)",
    );
    invalid(
        generate(json!({"temperature": 1e308})),
        "temperature must be <= 100 (got 1e+308)",
    );
    invalid(
        generate(json!({"temperature": "hot"})),
        "temperature must be a number (got \"hot\")",
    );
    invalid(
        generate(json!({"temperature": true})),
        "temperature must be a number (got true)",
    );
}

#[test]
fn top_k_bounds() {
    assert_eq!(sampling(generate(json!({"top_k": 0}))).top_k, 0);
    assert_eq!(sampling(generate(json!({"top_k": VOCAB}))).top_k, VOCAB);
    invalid(
        generate(json!({"top_k": -1})),
        "top_k must be >= 0 (got -1)",
    );
    invalid(
        generate(json!({"top_k": VOCAB + 1})),
        "top_k must be <= the vocabulary size 32000 (got 32001)",
    );
    invalid(
        generate(json!({"top_k": 1.5})),
        "top_k must be an integer (got 1.5)",
    );
    invalid(
        generate(json!({"top_k": 40.0})),
        "top_k must be an integer (got 40.0)",
    );
    invalid(
        generate(json!({"top_k": "40"})),
        "top_k must be an integer (got \"40\")",
    );
    let huge =
        r#"{"type":"generate","id":"r1","prompt":"x","top_k":100000000000000000000000000000}"#;
    let e = err(huge);
    assert!(
        e.error
            .message
            .contains("top_k must be <= the vocabulary size 32000 (got 1e+29)"),
        "{}",
        e.error.message
    );
    let e = err(&huge.replace(":1000", ":-1000"));
    assert!(
        e.error.message.contains("top_k must be >= 0 (got -1e+29)"),
        "{}",
        e.error.message
    );
}

#[test]
fn top_p_bounds() {
    assert_eq!(sampling(generate(json!({"top_p": 1}))).top_p, 1.0);
    assert_eq!(sampling(generate(json!({"top_p": 0.5}))).top_p, 0.5);
    invalid(
        generate(json!({"top_p": 1.5})),
        "top_p must be in (0, 1] (got 1.5)",
    );
    invalid(
        generate(json!({"top_p": 0})),
        "top_p must be in (0, 1] (got 0)",
    );
    invalid(
        generate(json!({"top_p": -0.5})),
        "top_p must be in (0, 1] (got -0.5)",
    );
    // Positive as f64 but zero as f32.
    invalid(
        generate(json!({"top_p": 1e-300})),
        "top_p must be at least 1.401298464324817e-45, the smallest positive 32-bit float \
         (got 1e-300)",
    );
    invalid(
        generate(json!({"top_p": 9e-46})),
        "top_p must be at least 1.401298464324817e-45, the smallest positive 32-bit float \
         (got 9e-46)",
    );
    invalid(
        generate(json!({"top_p": [1]})),
        "top_p must be a number (got [1])",
    );
}

#[test]
fn min_p_bounds() {
    assert_eq!(sampling(generate(json!({"min_p": 0}))).min_p, 0.0);
    assert_eq!(sampling(generate(json!({"min_p": 1}))).min_p, 1.0);
    invalid(
        generate(json!({"min_p": 1.1})),
        "min_p must be in [0, 1] (got 1.1)",
    );
    invalid(
        generate(json!({"min_p": -0.1})),
        "min_p must be in [0, 1] (got -0.1)",
    );
    invalid(
        generate(json!({"min_p": {}})),
        "min_p must be a number (got {})",
    );
}

#[test]
fn seed_bounds() {
    assert_eq!(sampling(generate(json!({"seed": 0}))).seed, 0);
    assert_eq!(sampling(generate(json!({"seed": u64::MAX}))).seed, u64::MAX);
    invalid(generate(json!({"seed": -1})), "seed must be >= 0 (got -1)");
    invalid(
        generate(json!({"seed": 1.0})),
        "seed must be an integer (got 1.0)",
    );
    invalid(
        generate(json!({"seed": "1"})),
        "seed must be an integer (got \"1\")",
    );
    let e = err(r#"{"type":"generate","id":"r1","prompt":"x","seed":18446744073709551616}"#);
    assert!(
        e.error
            .message
            .contains("seed must be <= 18446744073709551615 (got 1.8446744073709552e+19)"),
        "{}",
        e.error.message
    );
}

#[test]
fn max_tokens_bounds() {
    assert_eq!(sampling(generate(json!({"max_tokens": 1}))).max_tokens, 1);
    assert_eq!(
        sampling(generate(json!({"max_tokens": 1_000_000}))).max_tokens,
        1_000_000
    );
    invalid(
        generate(json!({"max_tokens": 0})),
        "max_tokens must be >= 1 (got 0)",
    );
    invalid(
        generate(json!({"max_tokens": -5})),
        "max_tokens must be >= 1 (got -5)",
    );
    invalid(
        generate(json!({"max_tokens": 1_000_001})),
        "max_tokens must be <= 1000000 (got 1000001)",
    );
    invalid(
        generate(json!({"max_tokens": "ten"})),
        "max_tokens must be an integer (got \"ten\")",
    );
    invalid(
        generate(json!({"max_tokens": i64::MIN})),
        "max_tokens must be >= 1 (got -9223372036854775808)",
    );
}

/// `n` in [1, 16]; `echo` a boolean, with `prompt` only, and the one way to ask for
/// `max_tokens: 0` (score the prompt without generating).
#[test]
fn choices_and_echo_bounds() {
    let p = sampling(generate(json!({})));
    assert_eq!((p.n, p.echo), (1, false));
    assert_eq!(sampling(generate(json!({"n": 16}))).n, 16);
    assert_eq!(sampling(generate(json!({"n": null}))).n, 1);
    invalid(generate(json!({"n": 0})), "n must be >= 1 (got 0)");
    invalid(generate(json!({"n": 17})), "n must be <= 16 (got 17)");
    invalid(
        generate(json!({"n": 2.0})),
        "n must be an integer (got 2.0)",
    );
    let p = sampling(generate(json!({"echo": true, "max_tokens": 0})));
    assert_eq!((p.echo, p.max_tokens), (true, 0));
    invalid(
        generate(json!({"echo": "yes"})),
        "echo must be a boolean (got \"yes\")",
    );
    invalid(
        generate(json!({"max_tokens": 0, "echo": false})),
        "max_tokens must be >= 1 (got 0); 0 is allowed only with echo: true",
    );
    let mut msgs = chat(json!([{"role": "user", "content": "hi"}]));
    msgs["echo"] = json!(true);
    invalid(msgs.clone(), "echo must be false with messages (got true)");
    msgs["echo"] = json!(false);
    msgs["n"] = json!(3);
    assert_eq!(sampling(msgs).n, 3);
}

#[test]
fn stop_rules() {
    assert_eq!(
        sampling(generate(json!({"stop": "\n"}))).stop,
        vec!["\n".to_string()]
    );
    assert_eq!(
        sampling(generate(json!({"stop": ["a", "bc"]}))).stop,
        vec!["a".to_string(), "bc".to_string()]
    );
    assert!(sampling(generate(json!({"stop": []}))).stop.is_empty());
    let sixteen: Vec<String> = (0..16).map(|i| format!("s{i}")).collect();
    assert_eq!(sampling(generate(json!({"stop": sixteen}))).stop.len(), 16);
    let seventeen: Vec<String> = (0..17).map(|i| format!("s{i}")).collect();
    invalid(
        generate(json!({"stop": seventeen})),
        "stop must have at most 16 entries (got 17)",
    );
    refused(
        generate(json!({"stop": ""})),
        "stop must be a string of 1 to 512 bytes (got \"\")",
    );
    refused(
        generate(json!({"stop": ["a", ""]})),
        "stop[1] must be a string of 1 to 512 bytes (got \"\")",
    );
    assert_eq!(
        sampling(generate(json!({"stop": "é".repeat(256)}))).stop[0].len(),
        512
    );
    invalid(
        generate(json!({"stop": ["x".repeat(513)]})),
        "stop[0] must be at most 512 bytes (got 513)",
    );
    invalid(
        generate(json!({"stop": "é".repeat(257)})),
        "stop must be at most 512 bytes (got 514)",
    );
    invalid(
        generate(json!({"stop": 5})),
        "stop must be a string or an array of strings (got 5)",
    );
    invalid(
        generate(json!({"stop": ["a", 5]})),
        "stop[1] must be a string (got 5)",
    );
}

#[test]
fn long_values_are_shortened_in_messages() {
    let e = invalid(
        generate(json!({"temperature": "x".repeat(10_000)})),
        "temperature must be a number (got \"xxx",
    );
    assert!(e.error.message.len() < 200, "{}", e.error.message);
    assert!(e.error.message.ends_with("…)"), "{}", e.error.message);
}

// --- cancel, tokenize, detokenize ----------------------------------------------------

#[test]
fn cancel() {
    assert_eq!(
        ok(json!({"type": "cancel", "id": "r1"})),
        ClientMessage::Cancel { id: "r1".into() }
    );
    invalid(json!({"type": "cancel"}), "missing field \"id\"");
}

#[test]
fn tokenize() {
    assert_eq!(
        ok(json!({"type": "tokenize", "id": "t1", "text": "hi <s>"})),
        ClientMessage::Tokenize {
            id: "t1".into(),
            text: "hi <s>".into(),
            special: false
        }
    );
    assert_eq!(
        ok(json!({"type": "tokenize", "id": "t1", "text": "", "special": true})),
        ClientMessage::Tokenize {
            id: "t1".into(),
            text: String::new(),
            special: true
        }
    );
    invalid(
        json!({"type": "tokenize", "id": "t1"}),
        "missing field \"text\"",
    );
    invalid(
        json!({"type": "tokenize", "id": "t1", "text": 5}),
        "text must be a string (got 5)",
    );
    invalid(
        json!({"type": "tokenize", "id": "t1", "text": "a", "special": "yes"}),
        "special must be a boolean (got \"yes\")",
    );
}

#[test]
fn detokenize() {
    assert_eq!(
        ok(json!({"type": "detokenize", "id": "t2", "token_ids": [0, 1, VOCAB - 1]})),
        ClientMessage::Detokenize {
            id: "t2".into(),
            token_ids: vec![0, 1, 31_999]
        }
    );
    assert_eq!(
        ok(json!({"type": "detokenize", "id": "t2", "token_ids": []})),
        ClientMessage::Detokenize {
            id: "t2".into(),
            token_ids: vec![]
        }
    );
    invalid(
        json!({"type": "detokenize", "id": "t2"}),
        "missing field \"token_ids\"",
    );
    invalid(
        json!({"type": "detokenize", "id": "t2", "token_ids": "1 2"}),
        "token_ids must be an array of integers (got \"1 2\")",
    );
    invalid(
        json!({"type": "detokenize", "id": "t2", "token_ids": [1, 2, 32000]}),
        "token_ids[2] must be < the vocabulary size 32000 (got 32000)",
    );
    invalid(
        json!({"type": "detokenize", "id": "t2", "token_ids": [1, -1]}),
        "token_ids[1] must be >= 0 (got -1)",
    );
    invalid(
        json!({"type": "detokenize", "id": "t2", "token_ids": ["a"]}),
        "token_ids[0] must be an integer (got \"a\")",
    );
    invalid(
        json!({"type": "detokenize", "id": "t2", "token_ids": [u64::MAX]}),
        "token_ids[0] must be < the vocabulary size 32000 (got 18446744073709551615)",
    );
    let e = err(r#"{"type":"detokenize","id":"t2","token_ids":[1e400]}"#);
    assert!(
        e.error.message.contains("malformed JSON"),
        "{}",
        e.error.message
    );
}

#[test]
fn configured_defaults_are_checked() {
    assert_eq!(SamplingDefaults::default().check(VOCAB), Ok(()));
    let bad = SamplingDefaults {
        temperature: -1.0,
        ..SamplingDefaults::default()
    };
    let e = bad.check(VOCAB).expect_err("negative temperature");
    assert!(
        e.message.starts_with("default temperature must be >= 0"),
        "{}",
        e.message
    );
    let bad = SamplingDefaults {
        top_k: VOCAB + 1,
        ..SamplingDefaults::default()
    };
    assert!(bad
        .check(VOCAB)
        .expect_err("top_k")
        .message
        .contains("default top_k must be <="));
    let bad = SamplingDefaults {
        max_tokens: 0,
        ..SamplingDefaults::default()
    };
    assert!(bad
        .check(VOCAB)
        .expect_err("max_tokens")
        .message
        .contains("default max_tokens must be >= 1"));
    let bad = SamplingDefaults {
        top_p: f32::NAN,
        ..SamplingDefaults::default()
    };
    assert!(bad
        .check(VOCAB)
        .expect_err("nan")
        .message
        .contains("default top_p must be a finite number"));
    let partial: SamplingDefaults =
        serde_json::from_str(r#"{"max_tokens": 9}"#).expect("partial config");
    assert_eq!(partial.max_tokens, 9);
    assert_eq!(partial.top_k, 40);
}

// --- junk ---------------------------------------------------------------------------

/// Deep nesting hits serde_json's recursion limit instead of the stack.
#[test]
fn deep_nesting_is_an_error_not_a_crash() {
    let deep = format!("{}{}", "[".repeat(100_000), "]".repeat(100_000));
    assert!(err(&deep).error.message.contains("malformed JSON"));
    let deep_field = format!(
        r#"{{"type":"generate","id":"r1","prompt":"x","stop":{}1{}}}"#,
        "[".repeat(100_000),
        "]".repeat(100_000)
    );
    assert_eq!(err(&deep_field).error.kind, ErrorKind::Validation);
}

fn random_value(rng: &mut ChaCha8Rng, depth: u32) -> Value {
    let pick = rng.random_range(0..if depth == 0 { 12 } else { 9 });
    match pick {
        0 => Value::Null,
        1 => Value::Bool(rng.random()),
        2 => json!(rng.random_range(-3i64..40_000)),
        3 => json!([i64::MIN, -1, 0, 1, u64::MAX as i64][rng.random_range(0..5)]),
        4 => json!(u64::MAX - rng.random_range(0..3)),
        5 => json!(rng.random_range(-2.0f64..2.0)),
        6 => json!([1e308, -1e308, 5e-324, 0.5, 100.0][rng.random_range(0..5)]),
        7 => {
            let samples = ["", "x", "text", "generate", "é😀", "\u{0}", "user"];
            json!(samples[rng.random_range(0..samples.len())])
        }
        8 => json!("y".repeat(rng.random_range(0..600))),
        9 | 10 => {
            let n = rng.random_range(0..4);
            Value::Array((0..n).map(|_| random_value(rng, depth - 1)).collect())
        }
        _ => {
            let keys = ["type", "text", "role", "content", "x"];
            let n = rng.random_range(0..3);
            Value::Object(
                (0..n)
                    .map(|_| {
                        (
                            keys[rng.random_range(0..keys.len())].to_string(),
                            random_value(rng, depth - 1),
                        )
                    })
                    .collect(),
            )
        }
    }
}

/// Feeds many junk frames: truncations and byte flips of valid frames, and valid
/// frames with random values in every field. Nothing may panic, every failure is a
/// `validation` error, and its error frame is valid JSON.
#[test]
fn junk_frames_never_panic() {
    let valid = [
        json!({"type": "generate", "id": "r1", "messages": [{"role": "user", "content": [{"type": "text", "text": "a"}]}],
               "max_tokens": 64, "temperature": 0.7, "top_k": 40, "top_p": 0.9, "min_p": 0.05, "seed": 1, "stop": ["\n\n"]}),
        json!({"type": "generate", "id": "r2", "prompt": "é😀", "stop": "x"}),
        json!({"type": "cancel", "id": "r1"}),
        json!({"type": "tokenize", "id": "t1", "text": "hi", "special": true}),
        json!({"type": "detokenize", "id": "t2", "token_ids": [1, 2, 3]}),
    ];
    let mut rng = ChaCha8Rng::seed_from_u64(7);
    let mut frames: Vec<String> = Vec::new();
    for v in &valid {
        let text = v.to_string();
        for (cut, _) in text.char_indices() {
            frames.push(text[..cut].to_string());
        }
        for _ in 0..300 {
            let mut bytes = text.clone().into_bytes();
            for _ in 0..rng.random_range(1..4) {
                let at = rng.random_range(0..bytes.len());
                bytes[at] = rng.random();
            }
            frames.push(String::from_utf8_lossy(&bytes).into_owned());
        }
        if let Value::Object(obj) = v {
            for key in obj.keys() {
                for _ in 0..200 {
                    let mut m = obj.clone();
                    m.insert(key.clone(), random_value(&mut rng, 3));
                    frames.push(Value::Object(m).to_string());
                }
            }
        }
    }
    for _ in 0..500 {
        frames.push(random_value(&mut rng, 3).to_string());
    }
    let defaults = SamplingDefaults::default();
    let (mut accepted, mut rejected) = (0, 0);
    for frame in &frames {
        for vocab in [0, 1, VOCAB, usize::MAX] {
            match parse_client_message(frame, &defaults, vocab) {
                Ok(_) => accepted += 1,
                Err(e) => {
                    rejected += 1;
                    assert_eq!(e.error.kind, ErrorKind::Validation, "{frame}");
                    assert!(!e.error.message.is_empty());
                    let back: Value =
                        serde_json::from_str(&e.to_frame()).expect("error frame is JSON");
                    assert_eq!(back["type"], "error");
                }
            }
        }
    }
    assert!(
        accepted > 100 && rejected > 1000,
        "accepted {accepted}, rejected {rejected}"
    );
}

/// Every client example in `docs/protocol.md` is accepted as documented.
#[test]
fn protocol_doc_client_examples_parse() {
    let doc = include_str!("../../../../docs/protocol.md");
    let mut checked = 0;
    for block in doc.split("```json\n").skip(1) {
        let Some((body, _)) = block.split_once("```") else {
            continue;
        };
        let value: Value = serde_json::from_str(body).expect("doc JSON block parses");
        let kind = value["type"].as_str().unwrap_or("");
        if value.get("$schema").is_some()
            || !["generate", "cancel", "tokenize", "detokenize"].contains(&kind)
        {
            continue;
        }
        parse(body).unwrap_or_else(|e| panic!("doc example {body} rejected: {e}"));
        checked += 1;
    }
    assert_eq!(checked, 5, "client examples in docs/protocol.md");
}

fn plugin_specs(v: Value) -> Vec<crate::request::PluginSpec> {
    match ok(v) {
        ClientMessage::Generate(req) => req.plugins,
        other => panic!("expected generate, got {other:?}"),
    }
}

#[test]
fn plugins_list_parses_names_and_config_text() {
    let specs = plugin_specs(generate(json!({"plugins": [
        {"name": "ban_words", "config": {"words": ["Paris"]}},
        {"name": "mirostat"},
        {"name": "noop", "config": null}
    ]})));
    let got: Vec<(&str, &str)> = specs
        .iter()
        .map(|s| (s.name.as_str(), s.config.as_str()))
        .collect();
    assert_eq!(
        got,
        [
            ("ban_words", r#"{"words":["Paris"]}"#),
            ("mirostat", "{}"),
            ("noop", "{}")
        ]
    );
    assert!(plugin_specs(generate(json!({"plugins": []}))).is_empty());
    assert!(plugin_specs(generate(json!({"plugins": null}))).is_empty());
}

#[test]
fn bad_plugins_lists_are_rejected_naming_the_entry() {
    invalid(
        generate(json!({"plugins": {"name": "x"}})),
        "plugins must be an array",
    );
    invalid(
        generate(json!({"plugins": ["ban_words"]})),
        "plugins[0] must be an object with \"name\"",
    );
    invalid(
        generate(json!({"plugins": [{"name": "a"}, {"config": {}}]})),
        "plugins[1].name is required",
    );
    invalid(
        generate(json!({"plugins": [{"name": ""}]})),
        "plugins[0].name must be a non-empty string (got \"\")",
    );
    invalid(
        generate(json!({"plugins": [{"name": 7}]})),
        "plugins[0].name must be a non-empty string (got 7)",
    );
    invalid(
        generate(json!({"plugins": [{"name": "a", "cfg": {}}]})),
        "unknown field \"cfg\" in plugins[0]",
    );
    let nine: Vec<Value> = (0..9).map(|_| json!({"name": "noop"})).collect();
    invalid(
        generate(json!({ "plugins": nine })),
        "plugins must have at most 8 entries (got 9)",
    );
    let big = "x".repeat(70_000);
    invalid(
        generate(json!({"plugins": [{"name": "a", "config": {"s": big}}]})),
        "plugins[0].config must be at most 65536 bytes of JSON (got 70008)",
    );
}

#[test]
fn plugins_message_has_an_optional_id() {
    assert_eq!(
        ok(json!({"type": "plugins"})),
        ClientMessage::Plugins { id: None }
    );
    assert_eq!(
        ok(json!({"type": "plugins", "id": "p"})),
        ClientMessage::Plugins {
            id: Some("p".into())
        }
    );
    invalid(
        json!({"type": "plugins", "verbose": true}),
        "unknown field \"verbose\" in plugins message",
    );
}

// --- steering: penalties, min_tokens, logit_bias, logprobs ----------------------------

#[test]
fn penalties_bounds_and_defaults() {
    let d = sampling(generate(json!({})));
    assert_eq!(
        (
            d.presence_penalty,
            d.frequency_penalty,
            d.repetition_penalty
        ),
        (0.0, 0.0, 1.0)
    );
    assert_eq!(d.repeat_last_n, Some(64));
    let s = sampling(generate(
        json!({"presence_penalty": -2, "frequency_penalty": 1.5,
        "repetition_penalty": 1.3, "repeat_last_n": -1}),
    ));
    assert_eq!(
        (
            s.presence_penalty,
            s.frequency_penalty,
            s.repetition_penalty
        ),
        (-2.0, 1.5, 1.3)
    );
    assert_eq!(s.repeat_last_n, None);
    assert_eq!(
        sampling(generate(json!({"repeat_last_n": 0}))).repeat_last_n,
        Some(0)
    );
    invalid(
        generate(json!({"presence_penalty": 2.5})),
        "presence_penalty must be in [-2, 2] (got 2.5)",
    );
    invalid(
        generate(json!({"frequency_penalty": "high"})),
        "frequency_penalty must be a number (got \"high\")",
    );
    invalid(
        generate(json!({"repetition_penalty": 0})),
        "repetition_penalty must be in (0, 10] (got 0)",
    );
    invalid(
        generate(json!({"repeat_last_n": -2})),
        "repeat_last_n must be -1 (the whole sequence), 0 (off) or a window length (got -2)",
    );
}

#[test]
fn min_tokens_is_bounded_by_max_tokens() {
    assert_eq!(
        sampling(generate(json!({"min_tokens": 8, "max_tokens": 8}))).min_tokens,
        8
    );
    invalid(
        generate(json!({"min_tokens": 9, "max_tokens": 8})),
        "min_tokens must be <= max_tokens = 8 (got 9)",
    );
}

#[test]
fn logit_bias_rules() {
    let s = sampling(generate(
        json!({"logit_bias": {"31999": 100, "5": -100, "2": 0.5}}),
    ));
    assert_eq!(s.logit_bias, vec![(2, 0.5), (5, -100.0), (31999, 100.0)]);
    // A key out of range and a value out of range name the entry alike (the `param`).
    let key = refused(
        generate(json!({"logit_bias": {"32000": 1}})),
        "logit_bias[\"32000\"] key must be a token id below the vocabulary size 32000 (got 32000)",
    );
    assert_eq!(first_word(&key.error.message), "logit_bias[\"32000\"]");
    let value = refused(
        generate(json!({"logit_bias": {"5": 101}})),
        "logit_bias[\"5\"] must be in [-100, 100] (got 101)",
    );
    assert_eq!(first_word(&value.error.message), "logit_bias[\"5\"]");
    refused(
        generate(json!({"logit_bias": {"99999999": 1}})),
        "logit_bias[\"99999999\"] key must be a token id below the vocabulary size 32000 \
         (got 99999999)",
    );
    invalid(
        generate(json!({"logit_bias": {"hello": 1}})),
        "logit_bias keys must be token ids, integers written as strings without leading zeros (got key \"hello\")",
    );
    invalid(
        generate(json!({"logit_bias": {"-1": 1}})),
        "(got key \"-1\")",
    );
    invalid(
        generate(json!({"logit_bias": {"060": 1}})),
        "without leading zeros (got key \"060\")",
    );
    invalid(
        generate(json!({"logit_bias": {"1.5": 1}})),
        "(got key \"1.5\")",
    );
    invalid(
        generate(json!({"logit_bias": {"7": 101}})),
        "logit_bias[\"7\"] must be in [-100, 100] (got 101)",
    );
    invalid(
        generate(json!({"logit_bias": {"7": null}})),
        "logit_bias[\"7\"] must be a number (got null)",
    );
    invalid(
        generate(json!({"logit_bias": [1, 2]})),
        "logit_bias must be an object mapping token ids to biases",
    );
}

#[test]
fn logprobs_and_top_logprobs() {
    assert_eq!(sampling(generate(json!({}))).logprobs, None);
    assert_eq!(
        sampling(generate(json!({"logprobs": false}))).logprobs,
        None
    );
    assert_eq!(
        sampling(generate(json!({"logprobs": true}))).logprobs,
        Some(0)
    );
    assert_eq!(
        sampling(generate(json!({"logprobs": true, "top_logprobs": 20}))).logprobs,
        Some(20)
    );
    invalid(
        generate(json!({"logprobs": true, "top_logprobs": 21})),
        "top_logprobs must be <= 20 (got 21)",
    );
    invalid(
        generate(json!({"top_logprobs": 2})),
        "top_logprobs needs logprobs: true",
    );
    invalid(
        generate(json!({"logprobs": 3})),
        "logprobs must be a boolean (got 3)",
    );
}

#[test]
fn response_format_rules() {
    assert_eq!(sampling(generate(json!({}))).constraint, None);
    assert_eq!(
        sampling(generate(json!({"response_format": {"type": "text"}}))).constraint,
        None
    );
    assert_eq!(
        sampling(generate(
            json!({"response_format": {"type": "json_object"}})
        ))
        .constraint,
        Some(ConstraintSpec::JsonObject)
    );
    let schema = json!({"type": "object"});
    assert_eq!(
        sampling(generate(json!({"response_format": {"type": "json_schema",
            "json_schema": {"name": "n", "strict": true, "schema": schema}}})))
        .constraint,
        Some(ConstraintSpec::JsonSchema(json!({"type": "object"})))
    );
    assert_eq!(
        sampling(generate(
            json!({"response_format": {"type": "regex", "regex": "a+"}})
        ))
        .constraint,
        Some(ConstraintSpec::Regex("a+".into()))
    );
    // A regex llguidance would refuse is refused here, in one line about the client's
    // text, not in llguidance's lines about the grammar it wraps the regex in.
    let e = refused(
        generate(json!({"response_format": {"type": "regex", "regex": "(abc"}})),
        "response_format.regex must be a valid regex: unclosed group (got \"(abc\")",
    );
    assert_eq!(first_word(&e.error.message), "response_format.regex");
    refused(
        generate(json!({"response_format": {"type": "regex", "regex": "a\n[b"}})),
        "response_format.regex must be a valid regex: unclosed character class \
         (got \"a\\n[b\")",
    );
    refused(
        generate(json!({"response_format": {"type": "regex", "regex": "x\\bfoo"}})),
        "response_format.regex must be a valid regex: lookarounds not supported yet; \
         WordUnicode (got \"x\\\\bfoo\")",
    );
    for rx in ["(Paris|Lyon) [0-9]{2}", "^a/b$", "\\d{3}-\\w+", "é+\n"] {
        assert_eq!(
            sampling(generate(
                json!({"response_format": {"type": "regex", "regex": rx}})
            ))
            .constraint,
            Some(ConstraintSpec::Regex(rx.into())),
            "{rx}"
        );
    }
    invalid(
        generate(json!({"response_format": {"type": "xml"}})),
        "response_format.type must be one of text, json_object, json_schema, regex, grammar (got \"xml\")",
    );
    invalid(
        generate(json!({"response_format": {"type": "json_schema", "json_schema": {"schema": 5}}})),
        "response_format.json_schema.schema must be a JSON Schema object (got 5)",
    );
    invalid(
        generate(
            json!({"response_format": {"type": "json_schema", "json_schema": {"schema": {}, "extra": 1}}}),
        ),
        "unknown field \"extra\" in response_format.json_schema",
    );
    refused(
        generate(json!({"response_format": {"type": "json_schema"}})),
        "response_format.json_schema must be an object with a \"schema\" for type json_schema \
         (got nothing)",
    );
    refused(
        generate(
            json!({"response_format": {"type": "json_schema", "json_schema": "x".repeat(100)}}),
        ),
        &format!(
            "response_format.json_schema must be an object with a \"schema\" for type \
             json_schema (got \"{}…)",
            "x".repeat(63)
        ),
    );
    refused(
        generate(json!({"response_format": {"type": "json_schema", "json_schema": null}})),
        "response_format.json_schema must be an object with a \"schema\" for type json_schema \
         (got null)",
    );
    invalid(
        generate(json!({"response_format": {"type": "grammar"}})),
        "response_format.grammar must be a non-empty string for type grammar (got nothing)",
    );
    invalid(
        generate(json!({"response_format": "json"})),
        "response_format must be an object with a \"type\" (got \"json\")",
    );
}

/// `adapter` and `lora_scale` on the WebSocket.
#[test]
fn adapter_and_lora_scale() {
    let adapter = |v: Value| match ok(v) {
        ClientMessage::Generate(req) => req.adapter,
        other => panic!("expected generate, got {other:?}"),
    };
    assert_eq!(adapter(generate(json!({}))), None);
    assert_eq!(
        adapter(generate(json!({"adapter": "a", "lora_scale": -0.25}))),
        Some(crate::request::AdapterChoice {
            name: "a".into(),
            scale: -0.25,
            field: "adapter",
        })
    );
    assert_eq!(
        adapter(generate(json!({"adapter": "a"}))).map(|a| a.scale),
        Some(1.0)
    );
    invalid(
        generate(json!({"lora_scale": 1})),
        "lora_scale needs an adapter",
    );
    invalid(
        generate(json!({"adapter": "a", "lora_scale": "x"})),
        "lora_scale must be a number",
    );
    invalid(
        generate(json!({"adapter": "a", "lora_scale": -17})),
        "lora_scale must be a number in [-16, 16] (got -17)",
    );
    invalid(
        generate(json!({"adapter": ""})),
        "adapter must be the name of a loaded LoRA adapter, 1 to 128 characters (got \"\")",
    );
    invalid(
        generate(json!({"adapter": 3})),
        "adapter must be a string (got 3)",
    );
}
