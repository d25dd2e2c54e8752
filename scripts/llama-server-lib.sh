# Sourced by scripts/quant-parity.sh and scripts/lora-gguf.sh: the one llama-server a
# reference run keeps at a time (its pid and log), stopped by stop_server and by the
# scripts' exit trap (cleanup).
server_pid=""
server_log=""
stop_server() {
    if [ -n "$server_pid" ]; then
        kill "$server_pid" 2>/dev/null || true
        wait "$server_pid" 2>/dev/null || true
        server_pid=""
    fi
}
cleanup() {
    stop_server
    if [ -n "$server_log" ]; then rm -f "$server_log"; fi
}
