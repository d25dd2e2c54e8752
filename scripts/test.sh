#!/usr/bin/env bash
# Runs every test: fetches the model, then unit and end-to-end tests over the whole
# workspace, then the lint gates (rustfmt, clippy with warnings as errors).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
scripts/fetch-model.sh
cargo build --workspace --bins
cargo test --workspace --no-fail-fast
cargo fmt --all -- --check
cargo clippy --workspace --all-targets -- -D warnings
