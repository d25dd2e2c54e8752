#!/usr/bin/env bash
# Fetches the default model, builds the bundled Wasm plugins into target/plugins, and
# starts the daemon on it (release build), with the default config. Extra arguments go
# to `inferd serve` (e.g. --listen 127.0.0.1:9000; a non-loopback address also needs
# server.api_key, see docs/http-api.md).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
scripts/fetch-model.sh
scripts/build-plugins.sh --no-python-js
cargo build --release -p inferd -p inferd-cli
exec "${CARGO_TARGET_DIR:-target}/release/inferd" serve --config configs/inferd.toml "$@"
