#!/usr/bin/env bash
# The master's memory curve: RSS against objects held (to 10 million, 40-byte keys, 64-byte
# values), lookup latency at each count, and the plot bench/plots/master_memory.png.
#
#   bash bench/master_mem.sh                    # ours, from target/release
#   BASE_DIR=/path/to/other/release bash bench/master_mem.sh   # and another master beside it
#
# OBJECTS (default 10000000) and POINTS (master_mem's --points) change the sizes. BASE_DIR is
# a directory holding another build's `mooncake_master` (main's, for an A/B): this build's
# `master_mem` is copied next to it and run there, one master at a time (a 10 M run of the
# old index takes about 5 GiB). Python with matplotlib: OURS_PY (default .venv/bin/python).
set -euo pipefail
repo="$(cd "$(dirname "$0")/.." && pwd)"
rel="${CARGO_TARGET_DIR:-$repo/target}/release"
py="${OURS_PY:-$repo/.venv/bin/python}"
out="$repo/bench/plots"
objects="${OBJECTS:-10000000}"
points=()
[[ -n "${POINTS:-}" ]] && points=(--points "$POINTS")
(cd "$repo" && cargo build --release -q -p mooncake-bench --bin master_mem \
  -p mooncake-controlplane --bin mooncake_master)
mkdir -p "$out"
"$rel/master_mem" --objects "$objects" "${points[@]}" --json "$out/master_mem.json"
args=("this build=$out/master_mem.json")
if [[ -n "${BASE_DIR:-}" ]]; then
  cp "$rel/master_mem" "$BASE_DIR/master_mem"
  "$BASE_DIR/master_mem" --objects "$objects" "${points[@]}" --json "$out/master_mem_base.json"
  args+=("base=$out/master_mem_base.json")
fi
"$py" -c "import matplotlib" 2>/dev/null || "$py" -m pip install -q --disable-pip-version-check matplotlib
"$py" "$repo/bench/python/master_mem_plot.py" "$out/master_memory.png" "${args[@]}"
