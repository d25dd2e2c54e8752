//! Paths to the real model and the shared fixtures, for tests.
//!
//! Lookup order for the default model: `$INFERD_TEST_MODEL`, `<workspace>/models/`, then
//! `<workspace>/../shared/models/`. Tests fail (never skip) when it is missing: run
//! `scripts/fetch-model.sh` first.

use std::path::PathBuf;

/// File name of the default model.
pub const DEFAULT_MODEL_FILE: &str = "SmolLM2-135M-Instruct.Q4_1.gguf";

/// The workspace root (the directory holding the top-level `Cargo.toml`).
pub fn workspace_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("."))
}

/// Path of the default GGUF model.
///
/// # Panics
/// When the model is in none of the places above.
pub fn default_model_path() -> PathBuf {
    if let Ok(p) = std::env::var("INFERD_TEST_MODEL") {
        return PathBuf::from(p);
    }
    let root = workspace_root();
    let candidates = [
        root.join("models").join(DEFAULT_MODEL_FILE),
        root.join("../shared/models").join(DEFAULT_MODEL_FILE),
    ];
    for c in &candidates {
        if c.is_file() {
            return c.clone();
        }
    }
    panic!("default model not found in {candidates:?}: run scripts/fetch-model.sh");
}

/// `../shared/fixtures` next to the workspace.
///
/// # Panics
/// When the directory is missing.
pub fn fixtures_dir() -> PathBuf {
    let candidates = [
        std::env::var("INFERD_FIXTURES").map(PathBuf::from).ok(),
        Some(workspace_root().join("../shared/fixtures")),
    ];
    for c in candidates.into_iter().flatten() {
        if c.is_dir() {
            return c;
        }
    }
    panic!("fixtures not found: expected ../shared/fixtures beside the workspace");
}

/// Reads and parses a JSON fixture relative to [`fixtures_dir`].
///
/// # Panics
/// When the file is missing or not JSON.
pub fn fixture_json(rel: &str) -> serde_json::Value {
    let path = fixtures_dir().join(rel);
    let text = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("reading fixture {}: {e}", path.display()));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("parsing {}: {e}", path.display()))
}
