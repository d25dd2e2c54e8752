#!/usr/bin/env bash
# Builds the Debian package of the service with cargo-deb:
# target/debian/inferd_<version>-1_<arch>.deb, and prints its path last. docs/install.md says how to install, configure, upgrade and
# remove it; tests/tests/deb_package.rs checks what this script makes.
#
#   /usr/bin/inferd, /usr/bin/inferd-cli          the release binaries
#   /lib/systemd/system/inferd.service            configs/inferd.service with ExecStart at
#                                                 /usr/bin/inferd, the package's system user
#                                                 inferd instead of DynamicUser=, and the
#                                                 plugins directory taken from the config
#   /etc/inferd/inferd.toml (a conffile)          configs/inferd.toml with absolute paths:
#                                                 the model under /var/lib/inferd/models/,
#                                                 the plugins under /usr/lib/inferd/plugins/
#   /usr/lib/inferd/plugins/*.wasm                the bundled plugins (Rust and C)
#   /usr/share/doc/inferd/                        README.md, install.md, copyright
#   postinst, prerm, postrm                       configs/deb/: the user, /var/lib/inferd,
#                                                 enable and start (when the model is there)
#
# The model is not in the package: the config names it (docs/install.md says why).
# Installs cargo-deb (cargo install, a few minutes once) when missing.
#
#   scripts/package-deb.sh [--profile PROFILE]
#
# --profile dev packages the test build instead (target/debug; written to
# target/debian-dev/, staged in target/deb-dev/): what scripts/test.sh checks, so that
# the test command does not add a release build to CI. The package's contents are the
# same but for the binaries.
# Env: CARGO_TARGET_DIR (default: <repo>/target).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
CARGO_DEB_VERSION=3.8.0
profile=release
case "${1:-}" in
"") ;;
--profile)
    profile=${2:?usage: $0 [--profile PROFILE]}
    ;;
*)
    echo "usage: $0 [--profile PROFILE]" >&2
    exit 2
    ;;
esac
target="${CARGO_TARGET_DIR:-$root/target}"
if [[ $profile == dev ]]; then profile_dir=debug; else profile_dir=$profile; fi
# cargo-deb takes the assets' "target/release/" from the target directory it is given.
# Another profile's binaries are linked into a release/ directory of their own
# (cargo-deb refuses to package a dev profile itself).
if [[ $profile == release ]]; then
    out="$target/debian"
    deb_target="$target"
else
    out="$target/debian-$profile"
    deb_target="$target/deb-$profile"
fi
staging="$deb_target/release/deb-staging"
export PATH="$HOME/.cargo/bin:$PATH"

die() {
    echo "package-deb: error: $*" >&2
    exit 1
}
note() { echo "package-deb: $*" >&2; }

command -v dpkg-deb >/dev/null || die "dpkg-deb not found (a Debian or Ubuntu machine is needed)"
if ! cargo deb --version >/dev/null 2>&1; then
    note "installing cargo-deb $CARGO_DEB_VERSION"
    cargo install --locked "cargo-deb@$CARGO_DEB_VERSION"
fi

note "building the bundled plugins (Rust and C)"
scripts/build-plugins.sh --no-python-js
note "building the binaries (profile $profile)"
cargo build --profile "$profile" -p inferd -p inferd-cli

# Replaces the line that is exactly $2 with $3 (nothing when $3 is absent) in file $1;
# dies when that line is not there once, so a change to the source files cannot slip
# through unnoticed.
replace_line() {
    local file=$1 old=$2 new=${3-}
    [[ $(grep -cxF -- "$old" "$file") -eq 1 ]] || die "$file: expected exactly one line '$old'"
    awk -v old="$old" -v new="$new" -v drop="${3+keep}" \
        '$0 == old { if (drop == "keep") print new; next } { print }' "$file" >"$file.tmp"
    mv "$file.tmp" "$file"
}

rm -rf "$staging"
mkdir -p "$staging/plugins"
cp configs/inferd.toml "$staging/inferd.toml"
replace_line "$staging/inferd.toml" 'path = "models/SmolLM2-135M-Instruct.Q4_1.gguf"' \
    'path = "/var/lib/inferd/models/SmolLM2-135M-Instruct.Q4_1.gguf"'
replace_line "$staging/inferd.toml" 'dir = "target/plugins"' 'dir = "/usr/lib/inferd/plugins"'

{
    echo "# systemd unit of the inferd Debian package (made by scripts/package-deb.sh from"
    echo "# configs/inferd.service). The config is /etc/inferd/inferd.toml; the model, the"
    echo "# prefix store and the plugin compile cache live under /var/lib/inferd"
    echo "# (/usr/share/doc/inferd/install.md)."
    sed '1,/^$/d' configs/inferd.service
} >"$staging/inferd.service"
replace_line "$staging/inferd.service" \
    'ExecStart=/usr/local/bin/inferd serve --config /etc/inferd/inferd.toml' \
    'ExecStart=/usr/bin/inferd serve --config /etc/inferd/inferd.toml'
replace_line "$staging/inferd.service" 'Description=inferd LLM inference daemon' \
    'Description=inferd LLM inference daemon\nDocumentation=file:///usr/share/doc/inferd/install.md'
replace_line "$staging/inferd.service" 'DynamicUser=yes'
replace_line "$staging/inferd.service" 'Environment=INFERD__PLUGINS__DIR=/var/lib/inferd/plugins'

# The bundled plugins: exactly those build-plugins.sh put into target/plugins.
cp target/plugins/*.wasm "$staging/plugins/"
[[ -f $staging/plugins/min_tokens.wasm ]] || die "the C plugin min_tokens was not built"

cat >"$staging/copyright" <<EOF
Format: https://www.debian.org/doc/packaging-manuals/copyright-format/1.0/
Upstream-Name: inferd

Files: *
Copyright: the inferd developers
License: $(cargo metadata --no-deps --format-version 1 |
    python3 -c 'import json,sys; print(next(p["license"] for p in json.load(sys.stdin)["packages"] if p["name"] == "inferd"))')
EOF

note "packaging (cargo deb)"
if [[ $profile != release ]]; then
    for bin in inferd inferd-cli; do
        ln -f "$target/$profile_dir/$bin" "$deb_target/release/$bin"
    done
fi
mkdir -p "$out"
fast=()
[[ $profile == release ]] || fast=(--fast) # quicker compression for the test package
deb=$(CARGO_TARGET_DIR="$deb_target" cargo deb -p inferd --no-build "${fast[@]}" --output "$out/" | tail -n 1)
[[ -f $deb ]] || die "cargo deb did not name its output (got: $deb)"
note "$(dpkg-deb --field "$deb" Package Version Architecture | tr '\n' ' ')($(stat -c %s "$deb") bytes)"
echo "$deb"
