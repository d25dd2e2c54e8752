#!/usr/bin/env bash
# Same-run A/B of the serving benchmark between two commits: builds each in release mode
# (BASE in a temporary git worktree, sharing this checkout's target dir for the
# dependencies), then runs inferd-bench on the default model alternating base and new
# for ROUNDS rounds, each daemon with its own commit's configs/inferd.toml. Prints the
# medians and the median of the paired ratios new/base, and writes
# target/bench/ab_summary.json.
#
#   scripts/bench-ab.sh BASE [NEW=HEAD] [ROUNDS=14]
#
# With BASE_FEATURES set, BASE and NEW are one commit built two ways instead: base with
# `--no-default-features --features "$BASE_FEATURES"` (e.g. BASE_FEATURES="" for glibc's
# malloc instead of jemalloc), new with the defaults:
#
#   BASE_FEATURES= scripts/bench-ab.sh HEAD HEAD 8
#
# Extra inferd-bench flags: BENCH_ARGS (default "--no-peer --concurrency 1,16 --max-tokens 128").
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
base=${1:?usage: scripts/bench-ab.sh BASE [NEW] [ROUNDS]}
new=${2:-HEAD}
rounds=${3:-14}
args=${BENCH_ARGS:---no-peer --concurrency 1,16 --max-tokens 128}
out="$root/target/bench/ab"
mkdir -p "$out"
scripts/fetch-model.sh >/dev/null
for side in base new; do
    rev=$base
    [[ $side == new ]] && rev=$new
    wt="$out/wt-$side"
    git worktree remove --force "$wt" 2>/dev/null || rm -rf "$wt"
    git worktree add --detach "$wt" "$rev" >/dev/null
    features=()
    if [[ $side == base && -n ${BASE_FEATURES+set} ]]; then
        features=(--no-default-features --features "$BASE_FEATURES")
    fi
    (cd "$wt" && CARGO_TARGET_DIR="$root/target" cargo build --release -q -p inferd "${features[@]}")
    cp "$root/target/release/inferd" "$out/inferd-$side"
    cp "$wt/configs/inferd.toml" "$out/inferd-$side.toml"
    git worktree remove --force "$wt"
done
cargo build --release -q -p inferd-bench
for r in $(seq 1 "$rounds"); do
    for side in base new; do
        # shellcheck disable=SC2086
        target/release/inferd-bench --bin "$out/inferd-$side" --config "$out/inferd-$side.toml" \
            $args --out "$out/$side-$r.json" >"$out/$side-$r.log" 2>&1
    done
    echo "bench-ab: round $r of $rounds done"
done
python3 - "$out" "$rounds" "$base" "$new" <<'PY'
import json, statistics, sys
out, rounds, base, new = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
rows = []
for r in range(1, rounds + 1):
    m = {}
    for side in ("base", "new"):
        j = json.load(open(f"{out}/{side}-{r}.json"))
        j = j[0] if isinstance(j, list) else j  # one object per model file
        d = j["inferd"]
        c = {x["n"]: x for x in d["concurrency"]}
        m[side] = {
            "prefill": d["prefill"]["tok_per_s"],
            "decode": d["decode"]["tok_per_s"],
            "aggregate_max_concurrency": c[max(c)]["aggregate_tok_per_s"],
            "other_cpu_busy": j["other_cpu_busy"]["before_inferd"],
        }
    rows.append(m)
summary = {"base": base, "new": new, "rounds": rows, "metrics": {}}
print(f"{'metric':<28} {'base median':>12} {'new median':>12} {'paired ratio':>13}")
for k in ("prefill", "decode", "aggregate_max_concurrency"):
    b = statistics.median(x["base"][k] for x in rows)
    n = statistics.median(x["new"][k] for x in rows)
    ratio = statistics.median(x["new"][k] / x["base"][k] for x in rows)
    summary["metrics"][k] = {"base_median": b, "new_median": n, "median_paired_ratio": ratio}
    print(f"{k:<28} {b:>12.1f} {n:>12.1f} {ratio:>13.3f}")
json.dump(summary, open(f"{out}/../ab_summary.json", "w"), indent=1)
print(f"written: {out}/../ab_summary.json")
PY
