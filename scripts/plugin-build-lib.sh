# Sourced by scripts/build-plugins*.sh after they set SCRIPT_NAME: what the three build
# scripts share.
# - WASI_ALLOWED: the WASI 0.2 interfaces the daemon links for plugins that import WASI
#   (ALLOWED_INTERFACES in daemon/src/sampling/wasm_plugin/wasi.rs, which a test keeps in
#   step with this list), as an extended regular expression over `package/interface`
#   without the `wasi:`.
# - die, note: messages on stderr prefixed with SCRIPT_NAME; as_root: sudo when not root.
# shellcheck shell=bash
WASI_ALLOWED='io/(error|poll|streams)|clocks/(wall-clock|monotonic-clock)|random/(random|insecure|insecure-seed)'
WASI_ALLOWED+='|cli/(environment|exit|stdin|stdout|stderr|terminal-(input|output|stdin|stdout|stderr))'
WASI_ALLOWED+='|filesystem/(types|preopens)|sockets/(network|instance-network|tcp|tcp-create-socket|udp|udp-create-socket|ip-name-lookup)'

die() {
    echo "$SCRIPT_NAME: error: $*" >&2
    exit 1
}
note() { echo "$SCRIPT_NAME: $*" >&2; }

# Runs a command as root: directly when root, else with sudo.
as_root() {
    if [[ $(id -u) -eq 0 ]]; then
        "$@"
    else
        command -v sudo >/dev/null || die "need root or sudo to run: $*"
        sudo "$@"
    fi
}
