//! Helpers shared by the bench binaries (`mod common;` in each).

use std::path::PathBuf;

/// `var` parsed as a number, or `default` when unset or unparsable.
pub fn size(var: &str, default: usize) -> usize {
    std::env::var(var)
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(default)
}

/// The default model: `INFERD_TEST_MODEL` or `models/SmolLM2-135M-Instruct.Q4_1.gguf`.
pub fn model_path() -> PathBuf {
    std::env::var("INFERD_TEST_MODEL")
        .map(PathBuf::from)
        .unwrap_or_else(|_| {
            PathBuf::from(env!("CARGO_MANIFEST_DIR"))
                .join("../models/SmolLM2-135M-Instruct.Q4_1.gguf")
        })
}
