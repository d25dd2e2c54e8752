//! The loaders against damaged files: truncations, flipped bytes and extreme counts and
//! lengths in a GGUF header and tensor infos, a corrupted safetensors header, and
//! `config.json` values of every wrong kind. Every case must end in `Ok` or one clear
//! line (≤ 600 characters, no control characters), never a panic or a hang; the GGUF
//! cases also build the tokenizer from what loaded. Deterministic (xorshift), bounded to
//! about 40 s of work.

use std::path::Path;
use std::time::{Duration, Instant};

use candle_core::Device;

use crate::model::{load, LoadOptions, MatrixPolicy};
use crate::test_support::{fixtures_dir, workspace_root};

const BUDGET: Duration = Duration::from_secs(40);
const MAX_MESSAGE: usize = 600;

struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
}

/// Loads `path`; panics (failing the test) on a panic inside or a bad message.
fn try_load(path: &Path, case: &str) -> bool {
    let opts = LoadOptions {
        device: Device::Cpu,
        matrices: MatrixPolicy::default(),
    };
    let r = std::panic::catch_unwind(|| match load(path, &opts) {
        Ok(m) => {
            if !m.metadata.is_empty() {
                // What the model loader accepted, the tokenizer must judge calmly too.
                let _ = crate::tokenizer::TextTokenizer::from_gguf(&m.metadata);
            }
            Ok(())
        }
        Err(e) => Err(e.to_string()),
    });
    match r {
        Err(_) => panic!("{case}: the loader panicked"),
        Ok(Ok(())) => true,
        Ok(Err(msg)) => {
            assert!(
                msg.chars().count() <= MAX_MESSAGE,
                "{case}: message of {} chars: {}",
                msg.len(),
                &msg[..200.min(msg.len())]
            );
            assert!(
                !msg.chars().any(char::is_control),
                "{case}: control characters in {msg:?}"
            );
            false
        }
    }
}

#[test]
fn damaged_gguf_files_are_refused_with_one_line() {
    let good =
        std::fs::read(workspace_root().join("daemon/tests/fixtures/tiny-gguf/qwen3_moe.gguf"))
            .expect("tiny gguf");
    let dir = tempfile::tempdir().expect("tmp");
    let path = dir.path().join("m.gguf");
    let started = Instant::now();
    let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
    // The header: magic, counts, metadata (1024 tokens, merges, template) and tensor
    // infos sit in the first ~60 KB.
    let header = good.len().min(64 * 1024);
    let run = |bytes: &[u8], case: &str| -> bool {
        std::fs::write(&path, bytes).expect("write");
        try_load(&path, case)
    };
    for cut in (0..header)
        .step_by(997)
        .chain([good.len() - 1, good.len() / 2])
    {
        assert!(
            !run(&good[..cut], &format!("truncated at {cut}")),
            "a file truncated at {cut} loaded"
        );
    }
    let (mut cases, mut refused) = (0usize, 0usize);
    while started.elapsed() < BUDGET / 2 && cases < 900 {
        let mut b = good.clone();
        let at = rng.below(header);
        match rng.below(3) {
            0 => b[at] ^= 1 << rng.below(8),
            1 => {
                // An extreme count or length: all ones, or just past the file.
                let v: u64 = if rng.below(2) == 0 {
                    u64::MAX
                } else {
                    good.len() as u64 + 1
                };
                let at = at & !7;
                b[at..at + 8].copy_from_slice(&v.to_le_bytes());
            }
            _ => b[at] = rng.next() as u8,
        }
        cases += 1;
        refused += usize::from(!run(&b, &format!("byte {at} changed")));
    }
    eprintln!(
        "{cases} damaged GGUF files, {refused} refused, the rest loaded (a changed byte in \
         a token's text or a weight is a valid file)"
    );
    assert!(cases >= 100, "only {cases} cases ran");
}

#[test]
fn damaged_hf_directories_are_refused_with_one_line() {
    let src = fixtures_dir().join("tiny-models/qwen3_moe");
    let config: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(src.join("config.json")).expect("cfg"))
            .expect("json");
    let weights = std::fs::read(src.join("model.safetensors")).expect("weights");
    let dir = tempfile::tempdir().expect("tmp");
    let d = dir.path();
    let started = Instant::now();
    std::fs::write(d.join("model.safetensors"), &weights).expect("w");
    // Every key: removed, or given a value of each wrong kind.
    let obj = config.as_object().expect("object");
    let wrong = [
        serde_json::json!("text"),
        serde_json::json!(-1),
        serde_json::json!(0),
        serde_json::json!(1e30),
        serde_json::json!(u64::MAX),
        serde_json::json!([1, 2]),
        serde_json::json!({"a": 1}),
    ];
    for key in obj.keys() {
        let mut c = config.clone();
        c.as_object_mut().expect("o").remove(key);
        std::fs::write(d.join("config.json"), c.to_string()).expect("w");
        try_load(d, &format!("config.json without {key}"));
        for v in &wrong {
            let mut c = config.clone();
            c[key] = v.clone();
            std::fs::write(d.join("config.json"), c.to_string()).expect("w");
            try_load(d, &format!("config.json {key} = {v}"));
        }
    }
    std::fs::write(d.join("config.json"), "{not json").expect("w");
    assert!(!try_load(d, "config.json not JSON"));
    std::fs::write(d.join("config.json"), config.to_string()).expect("w");
    assert!(try_load(d, "the undamaged directory"));
    // The safetensors header (8-byte length, JSON) and its tensors.
    let mut rng = Rng(42);
    let head = 8 + u64::from_le_bytes(weights[..8].try_into().expect("8")) as usize;
    for cut in (0..head + 64).step_by(61) {
        std::fs::write(d.join("model.safetensors"), &weights[..cut]).expect("w");
        assert!(!try_load(d, &format!("safetensors truncated at {cut}")));
    }
    while started.elapsed() < BUDGET / 2 {
        let mut b = weights.clone();
        let at = rng.below(head);
        b[at] = rng.next() as u8;
        std::fs::write(d.join("model.safetensors"), &b).expect("w");
        try_load(d, &format!("safetensors byte {at} changed"));
    }
    // A sharded index naming a missing shard or a path outside the directory.
    std::fs::write(d.join("model.safetensors"), &weights).expect("w");
    for shard in ["missing.safetensors", "../escape.safetensors"] {
        let idx = serde_json::json!({"weight_map": {"model.norm.weight": shard}});
        std::fs::write(d.join("model.safetensors.index.json"), idx.to_string()).expect("w");
        assert!(!try_load(d, &format!("index naming {shard}")));
    }
}

/// A tensor name whose length field is corrupted swallows a large part of the file into
/// the name (the case that once put up to 12 MB of raw bytes into the start-up error):
/// the message stays one short escaped line.
#[test]
fn corrupted_tensor_name_length_gives_a_short_message() {
    let mut b = std::fs::read(workspace_root().join("daemon/tests/fixtures/tiny-gguf/llama.gguf"))
        .expect("tiny gguf");
    let name = b"token_embd.weight";
    // The tensor infos come after the metadata; the name's length precedes it.
    let at = b
        .windows(name.len() + 8)
        .position(|w| w[..8] == (name.len() as u64).to_le_bytes() && &w[8..] == name)
        .expect("tensor info");
    for len in [100_000u64, b.len() as u64 - at as u64 - 9] {
        b[at..at + 8].copy_from_slice(&len.to_le_bytes());
        let dir = tempfile::tempdir().expect("tmp");
        let path = dir.path().join("m.gguf");
        std::fs::write(&path, &b).expect("write");
        assert!(!try_load(&path, &format!("tensor name length {len}")));
    }
}
