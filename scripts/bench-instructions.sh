#!/usr/bin/env bash
# Deterministic A/B of the cost of one decode token between two commits, counted in
# executed instructions (valgrind --tool=callgrind) instead of wall-clock time, which
# moves by tens of percent between rounds on a shared VM. Builds each commit's daemon in
# release mode (in a temporary git worktree under WORK, one CARGO_TARGET_DIR shared by
# both builds in turn; a binary already built for that commit hash is reused), then, for
# each side, starts it under callgrind with its own commit's configs/inferd.toml,
# model.threads = 1 (no busy-waiting compute threads), its own port and a fresh prefix
# store, no plugins, and sends greedy raw-prompt requests to /v1/completions (streamed,
# "cache": false, no bias, penalties, logprobs, constraints or tools). After a warm-up
# request the counters are zeroed, then each repetition sends a SHORT and a LONG request
# and dumps the counters after each (callgrind_control --dump), so every request is
# counted alone, start-up excluded. Per decode token:
#     (Ir(LONG request) - Ir(SHORT request)) / (LONG - SHORT)
# (both requests prefill the same prompt, so prefill and the first token cancel). Every
# request must return exactly max_tokens tokens (finish_reason "length"), else the run
# fails. The counts are also split by where the instructions are spent (self cost per
# function; model = the inclusive cost of the model's forward pass (FORWARD_FN), of which
# the model's own code (inferd::model, inferd-kernels, candle, half); the rest = the
# sampling, scheduler, model runner, detokenizer and server modules, the async runtime
# (actix, tokio, hyper, serde, ...), and std/libc/other crates called outside the
# forward pass). Prints a markdown table and writes WORK/instructions_ab.json.
#
# Valgrind hides AVX-512/VNNI from CPUID, so the kernels take their AVX2 paths under it:
# the absolute counts are those of an AVX2 machine; the A/B is like for like.
#
#   scripts/bench-instructions.sh BASE [NEW=HEAD]
#
# Environment:
#   CARGO_TARGET_DIR  build directory (default: this checkout's target/)
#   WORK              outputs, worktrees and binaries (default: $CARGO_TARGET_DIR/bench/instructions)
#   SHORT, LONG       max_tokens of the two requests (default 8 and 72)
#   REPS              SHORT/LONG pairs per daemon (default 2; the spread shows repeatability)
#   PROMPT            the raw prompt (default: the opening of a long essay, which does not
#                     end by EOS within LONG tokens on the default model)
#   MODEL             GGUF file (default: models/SmolLM2-135M-Instruct.Q4_1.gguf, fetched
#                     with scripts/fetch-model.sh when missing)
#   REBUILD=1         build even when WORK/bin already holds a binary of that commit
#   KEEP_WORKTREES=1  leave the worktrees under WORK (default: removed after each build)
#   BASE_ARGS, NEW_ARGS  extra `inferd serve` arguments for that side's daemon (split on
#                     spaces), e.g. NEW_ARGS="--lora-modules a=FILE" with BASE = NEW to
#                     count what adapters that are loaded but unused cost
#   BASE_ENV, NEW_ENV extra environment for that side's daemon (NAME=VALUE, split on
#                     spaces), e.g. NEW_ENV="INFERD__KV_EVENTS__ENABLED=true
#                     INFERD__KV_EVENTS__ENDPOINT=tcp://127.0.0.1:0 ..." to count what
#                     publishing KV-cache events costs
#   CACHE_SALTED=1    requests use the prefix cache, each under a cache_salt of its own:
#                     every block a request completes is new (registered, written to the
#                     disk tier, and with [kv_events] published), none is a hit
#   SUBSCRIBE=1       attach tests/python/kv_events_subscriber.py (target/pyenv's python)
#                     to a side whose daemon publishes KV-cache events, for its whole run
#   FORWARD_FN        the model's forward pass, whose inclusive cost is the "model" part
#                     (default inferd::model::transformer::Model::forward_batch)
#   ANALYZE_ONLY=1    no build and no runs: only the tables from the dumps already in WORK
# valgrind (Debian package) is installed with apt-get when missing (sudo when not root).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
usage="usage: scripts/bench-instructions.sh BASE [NEW=HEAD]"
base=${1:?$usage}
new=${2:-HEAD}
target=${CARGO_TARGET_DIR:-$root/target}
work=${WORK:-$target/bench/instructions}
short=${SHORT:-8}
long=${LONG:-72}
reps=${REPS:-2}
prompt=${PROMPT:-"The following is a long and detailed essay about the history of the Roman Empire, from the founding of the city to the fall of Constantinople. It covers politics, the army, trade, religion and daily life.

Chapter 1."}
model=${MODEL:-$root/models/SmolLM2-135M-Instruct.Q4_1.gguf}
[[ $long -gt $short ]] || { echo "bench-instructions: LONG ($long) must exceed SHORT ($short)" >&2; exit 2; }
mkdir -p "$work/bin"
work="$(cd "$work" && pwd)"

as_root() {
    if [[ $(id -u) -eq 0 ]]; then "$@"; else sudo "$@"; fi
}
if ! command -v valgrind >/dev/null || ! command -v callgrind_control >/dev/null; then
    echo "bench-instructions: installing valgrind" >&2
    as_root apt-get update -qq
    as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq valgrind
fi
for tool in python3; do
    command -v "$tool" >/dev/null || { echo "bench-instructions: needs $tool" >&2; exit 1; }
done
if [[ ! -f $model ]]; then
    scripts/fetch-model.sh >/dev/null
fi

# 1. Binaries, one per commit hash.
base_rev=$(git rev-parse --verify "$base^{commit}")
new_rev=$(git rev-parse --verify "$new^{commit}")
build() { # side rev
    local side=$1 rev=$2 wt="$work/wt-$1"
    local bin="$work/bin/inferd-$rev"
    if [[ -x $bin && -f $bin.toml && ${REBUILD:-0} != 1 ]]; then
        echo "bench-instructions: $side ${rev:0:10}: reusing $bin" >&2
        return
    fi
    echo "bench-instructions: $side ${rev:0:10}: building (release)" >&2
    if [[ $(git -C "$wt" rev-parse HEAD 2>/dev/null) != "$rev" ]]; then
        git worktree remove --force "$wt" 2>/dev/null || rm -rf "$wt"
        git worktree add --detach "$wt" "$rev" >/dev/null
    fi
    (cd "$wt" && CARGO_TARGET_DIR="$target" cargo build --release -q -p inferd)
    cp "$target/release/inferd" "$bin.tmp" && mv "$bin.tmp" "$bin"
    cp "$wt/configs/inferd.toml" "$bin.toml"
    if [[ ${KEEP_WORKTREES:-0} != 1 ]]; then
        git worktree remove --force "$wt"
    fi
}
if [[ ${ANALYZE_ONLY:-0} != 1 ]]; then
    build base "$base_rev"
    build new "$new_rev"
fi

# 2. One daemon per side under callgrind.
pid=""
cleanup() {
    if [[ -n $pid ]] && kill -0 "$pid" 2>/dev/null; then
        kill -TERM "$pid" 2>/dev/null || true
        sleep 5
        kill -0 "$pid" 2>/dev/null && kill -KILL "$pid" 2>/dev/null || true
    fi
}
trap cleanup EXIT

request() { # url max_tokens out.json
    python3 - "$1" "$2" "$3" "$prompt" <<'PY'
import json, os, sys, urllib.request
url, max_tokens, out, prompt = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
body = {"prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "stream": True,
        "stream_options": {"include_usage": True}, "cache": False}
if os.environ.get("CACHE_SALTED") == "1":
    body["cache"] = True
    body["cache_salt"] = os.path.basename(out)
req = urllib.request.Request(url + "/v1/completions", json.dumps(body).encode(),
                             {"Content-Type": "application/json"})
text, finish, usage = "", None, None
with urllib.request.urlopen(req, timeout=3600) as r:
    for line in r:
        line = line.decode().strip()
        if not line.startswith("data: ") or line == "data: [DONE]":
            continue
        chunk = json.loads(line[6:])
        for c in chunk.get("choices", []):
            text += c.get("text") or ""
            finish = c.get("finish_reason") or finish
        usage = chunk.get("usage") or usage
got = (usage or {}).get("completion_tokens")
json.dump({"max_tokens": max_tokens, "completion_tokens": got, "finish_reason": finish,
           "usage": usage, "text": text}, open(out, "w"), indent=1)
if got != max_tokens or finish != "length":
    sys.exit(f"bench-instructions: asked {max_tokens} tokens, got {got} "
             f"(finish_reason {finish}): choose a PROMPT that does not end")
PY
}

# Waits until callgrind has written dump number $2 of out file $1.
wait_dump() {
    local i
    for i in $(seq 1 600); do
        if [[ -s $1.$2 ]] && grep -q '^totals:' "$1.$2"; then return; fi
        sleep 0.5
    done
    echo "bench-instructions: callgrind dump $1.$2 did not appear" >&2
    exit 1
}

run_side() { # side rev
    local side=$1 rev=$2 dir="$work/$1"
    rm -rf "$dir"
    mkdir -p "$dir/store"
    local cg="$dir/callgrind.out"
    local extra_var="${side^^}_ARGS" env_var="${side^^}_ENV"
    local -a extra=() side_env=()
    read -r -a extra <<<"${!extra_var:-}"
    read -r -a side_env <<<"${!env_var:-}"
    echo "bench-instructions: $side ${rev:0:10}: starting under callgrind ${extra[*]}" >&2
    # Run from $dir so that no target/plugins is found; the plugins dir does not exist.
    (cd "$dir" && exec env INFERD__MODEL__THREADS=1 INFERD__MODEL__DEVICE=cpu \
        INFERD__PREFIX_STORE__PATH="$dir/store" INFERD__PLUGINS__DIR="$dir/no-plugins" \
        "${side_env[@]}" \
        valgrind --tool=callgrind --callgrind-out-file="$cg" \
        "$work/bin/inferd-$rev" serve --config "$work/bin/inferd-$rev.toml" \
        --model "$model" --listen 127.0.0.1:0 "${extra[@]}" >"$dir/daemon.out" 2>"$dir/daemon.err") &
    pid=$!
    local addr="" i
    for i in $(seq 1 1200); do
        addr=$(sed -n 's#^inferd: listening on ws://\([^/]*\)/v1/ws.*#\1#p' "$dir/daemon.out" 2>/dev/null | head -n1 || true)
        [[ -n $addr ]] && break
        kill -0 "$pid" 2>/dev/null || { cat "$dir/daemon.err" >&2; exit 1; }
        sleep 0.5
    done
    [[ -n $addr ]] || { echo "bench-instructions: $side did not start" >&2; exit 1; }
    local url="http://$addr" sub_pid=""
    local events
    events=$(sed -n 's#^inferd: kv events on \(tcp://[^ ]*\) replay \(tcp://[^ ]*\)$#\1 \2#p' "$dir/daemon.out" | head -n1)
    if [[ ${SUBSCRIBE:-0} == 1 && -n $events ]]; then
        read -r -a events <<<"$events"
        # It reads until its stdin (a FIFO held open here) closes, then prints a summary.
        mkfifo "$dir/subscriber.in"
        "$root/target/pyenv/bin/python" "$root/tests/python/kv_events_subscriber.py" \
            collect "${events[0]}" "${events[1]}" kv-events <"$dir/subscriber.in" \
            >"$dir/subscriber.out" &
        sub_pid=$!
        exec {sub_fd}>"$dir/subscriber.in"
        echo "bench-instructions: $side: a KV-event subscriber is attached" >&2
    fi
    request "$url" "$short" "$dir/warmup.json"
    callgrind_control --zero "$pid" >/dev/null
    local n=0 r len
    for r in $(seq 1 "$reps"); do
        for len in short long; do
            local t=$short
            [[ $len == long ]] && t=$long
            request "$url" "$t" "$dir/$len-$r.json"
            sleep 2 # the request's tail (log line, freeing the sequence) in this dump
            callgrind_control --dump="$len-$r" "$pid" >/dev/null
            n=$((n + 1))
            wait_dump "$cg" "$n"
            cp "$cg.$n" "$dir/$len-$r.callgrind"
        done
        echo "bench-instructions: $side: repetition $r of $reps done" >&2
    done
    kill -TERM "$pid"
    wait "$pid" || true
    pid=""
    if [[ -n $sub_pid ]]; then
        exec {sub_fd}>&-
        wait "$sub_pid" || true
        python3 -c 'import json, sys; s = json.loads(open(sys.argv[1]).read().splitlines()[-1]); print("bench-instructions: the subscriber decoded %d messages, %d events" % (len(s["seqs"]), len(s["events"])), file=sys.stderr)' "$dir/subscriber.out" || true
    fi
    # The same greedy text on both sides is a check that they did the same work.
    cp "$dir/long-1.json" "$work/$side-long.json"
}
if [[ ${ANALYZE_ONLY:-0} != 1 ]]; then
    run_side base "$base_rev"
    run_side new "$new_rev"
fi

# 3. Per-token counts, split by group, table and JSON. The callgrind files are read here
# (self cost per function, and the inclusive cost of the model's forward pass from its
# call edges); callgrind_annotate is not used (valgrind 3.19's counts the cost of a call
# still running at the dump, "calls=0", as the caller's own).
python3 - "$work" "$base" "$base_rev" "$new" "$new_rev" "$short" "$long" "$reps" \
    "${FORWARD_FN:-inferd::model::transformer::Model::forward_batch}" <<'PY'
import collections, json, re, statistics, sys
work, base, base_rev, new, new_rev = sys.argv[1:6]
short, long_, reps = int(sys.argv[6]), int(sys.argv[7]), int(sys.argv[8])
forward_fn = sys.argv[9]
dt = long_ - short

def parse(path):
    """Self Ir per function name, and Ir of call edges (caller, callee)."""
    names = {"fl": {}, "fn": {}, "ob": {}}
    kinds = {"fl": "fl", "fi": "fl", "fe": "fl", "cfl": "fl", "cfi": "fl",
             "fn": "fn", "cfn": "fn", "ob": "ob", "cob": "ob"}
    comp = re.compile(r"^(fl|fi|fe|fn|ob|cfl|cfi|cob|cfn)=\((\d+)\)(?: (.*))?$")
    selfc, calls = collections.Counter(), collections.Counter()
    fn = cfn = None
    after_call = False
    for line in open(path):
        c = line[:1]
        if c.isdigit() or c in "+-*":
            parts = line.split()
            v = int(parts[1]) if len(parts) > 1 else 0
            if after_call:
                calls[(fn, cfn)] += v
                after_call = False
            else:
                selfc[fn] += v
        elif line.startswith("calls="):
            after_call = True
        else:
            m = comp.match(line.rstrip("\n"))
            if m:
                k, i, n = m.groups()
                table = names[kinds[k]]
                if n is not None:
                    table[i] = n
                if k == "fn":
                    fn = table[i]
                elif k == "cfn":
                    cfn = table[i]
    return selfc, calls

INFERD_MODULES = {"model": "model", "sampling": "sampling", "scheduler": "scheduler",
                  "model_runner": "model_runner", "detokenizer": "detokenizer",
                  "server": "server", "api": "server", "request": "server",
                  "tokenizer": "tokenizer", "prefix_store": "prefix_store"}
RUNTIME = re.compile(r"^(actix|tokio|hyper|h2|http|mio|bytes|futures|serde|tracing|parking_lot|"
                     r"crossbeam|async|want|httparse|socket2|slab|sled|memchr|itoa|ryu)")
STD = re.compile(r"^(std|core|alloc|compiler_builtins|__rustc|hashbrown|<unknown>)")

def group(name):
    """Crate (and for inferd the module) of the first path in a demangled name."""
    m = re.match(r"^[<\[&*( ]*(?:mut |const |dyn )?([A-Za-z_][A-Za-z0-9_]*)(?:::([A-Za-z_][A-Za-z0-9_]*))?", name)
    if not m or "::" not in name:
        return "libc"  # C symbols: malloc, free, memcpy, memset, expf, ...
    crate, module = m.group(1), m.group(2)
    if crate == "inferd":
        return INFERD_MODULES.get(module, "inferd_other")
    if crate in ("inferd_kernels", "half") or crate.startswith("candle") or crate.startswith("gemm"):
        return "model"
    if RUNTIME.match(crate):
        return "runtime"
    if STD.match(crate):
        return "std"
    return "deps"

def measure(path):
    selfc, calls = parse(path)
    total = sum(selfc.values())
    g = collections.Counter()
    for name, v in selfc.items():
        g[group(name)] += v
    has_fwd = forward_fn in selfc or any(callee == forward_fn for _, callee in calls)
    fwd = selfc.get(forward_fn, 0) + sum(v for (caller, _), v in calls.items() if caller == forward_fn)
    return {"total": total, "self_by_function": selfc, "groups": g,
            "forward": fwd if has_fwd else None}

res = {}
for side in ("base", "new"):
    per_rep = []
    for r in range(1, reps + 1):
        s, l = measure(f"{work}/{side}/short-{r}.callgrind"), measure(f"{work}/{side}/long-{r}.callgrind")
        per = lambda a, b: (b - a) / dt
        x = {"short_total": s["total"], "long_total": l["total"],
             "per_token": per(s["total"], l["total"]),
             "groups": {k: per(s["groups"].get(k, 0), l["groups"].get(k, 0))
                        for k in set(s["groups"]) | set(l["groups"])},
             "functions": {k: per(s["self_by_function"].get(k, 0), l["self_by_function"].get(k, 0))
                           for k in set(s["self_by_function"]) | set(l["self_by_function"])}}
        if s["forward"] is not None and l["forward"] is not None:
            x["forward"] = per(s["forward"], l["forward"])
        per_rep.append(x)
    res[side] = per_rep

med = statistics.median
OUTSIDE = ["sampling", "scheduler", "model_runner", "detokenizer", "server", "tokenizer",
           "prefix_store", "inferd_other", "runtime"]
summary = {"base": base, "base_rev": base_rev, "new": new, "new_rev": new_rev,
           "short_tokens": short, "long_tokens": long_, "reps": reps, "forward_fn": forward_fn,
           "note": "instructions (Ir) counted by valgrind callgrind (every thread); valgrind hides "
                   "AVX-512/VNNI from CPUID, so the kernels ran their AVX2 paths; model.threads = 1; "
                   "per token = (Ir(long request) - Ir(short request)) / (long - short)",
           "sides": {}}
for side in ("base", "new"):
    reps_ = res[side]
    pts = [x["per_token"] for x in reps_]
    s = {"per_token_each_rep": pts, "per_token": med(pts),
         "rel_spread": (max(pts) - min(pts)) / med(pts),
         "short_request_totals": [x["short_total"] for x in reps_],
         "long_request_totals": [x["long_total"] for x in reps_],
         "self_groups_per_token": {g: med([x["groups"].get(g, 0) for x in reps_])
                                   for g in set().union(*(x["groups"] for x in reps_))}}
    if all("forward" in x for x in reps_):
        fw = med([x["forward"] for x in reps_])
        sg = s["self_groups_per_token"]
        s["forward_per_token"] = fw
        s["outside_forward_per_token"] = s["per_token"] - fw
        # Inside the forward pass: model code, plus std/libc it calls (malloc, memset, expf).
        s["forward_std_libc_per_token"] = fw - sg.get("model", 0)
        # Outside it: inferd's other modules and the runtime by self cost, the rest (std,
        # libc and other crates called from outside the forward pass) as the remainder.
        s["outside_std_libc_per_token"] = s["outside_forward_per_token"] - sum(
            sg.get(g, 0) for g in OUTSIDE)
    summary["sides"][side] = s
b, n = summary["sides"]["base"], summary["sides"]["new"]
summary["ratio_new_over_base"] = n["per_token"] / b["per_token"]
split = "forward_per_token" in b and "forward_per_token" in n
if split:
    summary["ratio_forward"] = n["forward_per_token"] / b["forward_per_token"]
    summary["ratio_outside_forward"] = n["outside_forward_per_token"] / b["outside_forward_per_token"]
fnames = set()
for side in ("base", "new"):
    for x in res[side]:
        fnames |= set(x["functions"])
changes = []
for name in fnames:
    fb = med([x["functions"].get(name, 0) for x in res["base"]])
    fnw = med([x["functions"].get(name, 0) for x in res["new"]])
    if abs(fnw - fb) >= 1:
        changes.append({"function": name, "base": fb, "new": fnw, "delta": fnw - fb})
changes.sort(key=lambda e: -abs(e["delta"]))
summary["largest_self_cost_changes_per_token"] = changes[:40]
try:
    summary["same_text"] = (json.load(open(f"{work}/base-long.json"))["text"]
                            == json.load(open(f"{work}/new-long.json"))["text"])
except (OSError, ValueError, KeyError):
    summary["same_text"] = None

def f0(x):
    return f"{x:,.0f}"

def ratio(a, c, digits=4):
    return f"{c / a:.{digits}f}" if abs(a) >= 1 else "-"

print()
print(f"Instructions per decode token, {base} ({base_rev[:10]}) vs {new} ({new_rev[:10]}): "
      f"callgrind Ir, AVX2 kernel paths (valgrind hides AVX-512), 1 model thread, "
      f"greedy /v1/completions stream, max_tokens {short} vs {long_}, median of {reps} pairs")
print()
print("| per decode token | base | new | new/base |")
print("|---|---:|---:|---:|")
print(f"| **total** | **{f0(b['per_token'])}** | **{f0(n['per_token'])}** | "
      f"**{summary['ratio_new_over_base']:.4f}** |")
bs, ns = b["self_groups_per_token"], n["self_groups_per_token"]
if split:
    print(f"| model forward ({forward_fn.rsplit('::', 2)[-2]}::{forward_fn.rsplit('::', 1)[-1]}, inclusive) | "
          f"{f0(b['forward_per_token'])} | {f0(n['forward_per_token'])} | {ratio(b['forward_per_token'], n['forward_per_token'])} |")
    print(f"| &nbsp;&nbsp;model code (kernels, model, candle) | {f0(bs.get('model', 0))} | {f0(ns.get('model', 0))} | "
          f"{ratio(bs.get('model', 0), ns.get('model', 0))} |")
    print(f"| &nbsp;&nbsp;std/libc called by it | {f0(b['forward_std_libc_per_token'])} | "
          f"{f0(n['forward_std_libc_per_token'])} | {ratio(b['forward_std_libc_per_token'], n['forward_std_libc_per_token'], 3)} |")
    print(f"| everything else (total - forward) | {f0(b['outside_forward_per_token'])} | "
          f"{f0(n['outside_forward_per_token'])} | {ratio(b['outside_forward_per_token'], n['outside_forward_per_token'], 3)} |")
    rows = [(g, bs.get(g, 0), ns.get(g, 0)) for g in OUTSIDE]
    rows.append(("std, libc, other crates (rest)", b["outside_std_libc_per_token"], n["outside_std_libc_per_token"]))
else:
    print("| (forward function not found: self cost by group only) | | | |")
    rows = [(g, bs.get(g, 0), ns.get(g, 0)) for g in ["model"] + OUTSIDE + ["deps", "std", "libc"]]
for g, vb, vn in rows:
    if abs(vb) >= 1 or abs(vn) >= 1:
        label = g if g.endswith("(rest)") else f"{g} (self)"
        print(f"| &nbsp;&nbsp;{label} | {f0(vb)} | {f0(vn)} | {ratio(vb, vn, 3)} |")
print()
for side in ("base", "new"):
    s = summary["sides"][side]
    print(f"{side}: per token in each pair {', '.join(f0(x) for x in s['per_token_each_rep'])} "
          f"(spread {100 * s['rel_spread']:.4f} %); whole requests: short "
          f"{', '.join(f0(x) for x in s['short_request_totals'])}, long "
          f"{', '.join(f0(x) for x in s['long_request_totals'])}")
print(f"same greedy text on both sides: {summary['same_text']}")
print()
print("largest per-token changes of self cost by function (new - base):")
for e in changes[:12]:
    print(f"  {e['delta']:+12,.0f}  ({f0(e['base'])} -> {f0(e['new'])})  {e['function'][:140]}")
json.dump(summary, open(f"{work}/instructions_ab.json", "w"), indent=1)
print(f"\nwritten: {work}/instructions_ab.json")
PY
