# Sourced by scripts/build-plugins*.sh: WASI_ALLOWED, the WASI 0.2 interfaces the
# daemon links for plugins that import WASI (ALLOWED_INTERFACES in
# daemon/src/sampling/wasm_plugin/wasi.rs, which a test keeps in step with this list),
# as an extended regular expression over `package/interface` without the `wasi:`.
# shellcheck shell=bash
WASI_ALLOWED='io/(error|poll|streams)|clocks/(wall-clock|monotonic-clock)|random/(random|insecure|insecure-seed)'
WASI_ALLOWED+='|cli/(environment|exit|stdin|stdout|stderr|terminal-(input|output|stdin|stdout|stderr))'
WASI_ALLOWED+='|filesystem/(types|preopens)|sockets/(network|instance-network|tcp|tcp-create-socket|udp|udp-create-socket|ip-name-lookup)'
