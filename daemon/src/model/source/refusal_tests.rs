//! What loading says about a path that is not a model: a file that is not GGUF, one
//! too short for the magic, a header cut short, and the directory of a GGUF file.

use crate::model::{load, LoadOptions, MatrixPolicy};
use crate::test_support::workspace_root;

fn refusal(path: &std::path::Path) -> String {
    let opts = LoadOptions {
        device: candle_core::Device::Cpu,
        matrices: MatrixPolicy::default(),
    };
    match load(path, &opts) {
        Ok(_) => panic!("{} loaded", path.display()),
        Err(e) => e.to_string(),
    }
}

#[test]
fn a_file_that_is_not_gguf_is_shown_by_its_first_bytes() {
    let dir = tempfile::tempdir().expect("tmp");
    let p = dir.path().join("README.md");
    std::fs::write(&p, "# inferd\n\ninferd is a daemon").expect("write");
    assert_eq!(
        refusal(&p),
        format!(
            "model file {} is not a valid GGUF file: it starts with \"# inferd\\n\\ninferd\" \
             where a GGUF file starts with \"GGUF\"",
            p.display()
        )
    );
}

#[test]
fn an_empty_file_and_a_cut_header_say_so() {
    let dir = tempfile::tempdir().expect("tmp");
    let empty = dir.path().join("empty.gguf");
    std::fs::write(&empty, b"").expect("write");
    assert_eq!(
        refusal(&empty),
        format!(
            "model file {} is not a valid GGUF file: the file is 0 bytes long; a GGUF file \
             starts with the 4-byte magic \"GGUF\"",
            empty.display()
        )
    );
    let good =
        std::fs::read(workspace_root().join("daemon/tests/fixtures/tiny-gguf/qwen3_moe.gguf"))
            .expect("tiny gguf");
    let cut = dir.path().join("cut.gguf");
    std::fs::write(&cut, &good[..6]).expect("write");
    let msg = refusal(&cut);
    assert!(
        msg.starts_with(&format!(
            "model file {} is not a valid GGUF file: the file (6 bytes) ends inside its \
             header: truncated, or still being copied? (",
            cut.display()
        )),
        "{msg}"
    );
}

#[test]
fn the_directory_of_a_gguf_file_names_the_file() {
    let dir = tempfile::tempdir().expect("tmp");
    std::fs::write(dir.path().join("b.gguf"), b"GGUF").expect("write");
    std::fs::write(dir.path().join("a.gguf"), b"GGUF").expect("write");
    assert_eq!(
        refusal(dir.path()),
        format!(
            "configuration error: model.path: {} is a directory without config.json, so not \
             a Hugging Face model directory; it holds the GGUF file \"a.gguf\": give that \
             file's path",
            dir.path().display()
        )
    );
    // Without a GGUF file in it, the missing config.json is the message.
    let empty = tempfile::tempdir().expect("tmp");
    assert!(
        refusal(empty.path()).contains("config.json"),
        "{}",
        refusal(empty.path())
    );
}
