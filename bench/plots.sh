#!/usr/bin/env bash
# Regenerates the benchmark plots in bench/plots/ with one command: the store sweep (value sizes
# 4 KiB to 16 MiB, ours and upstream's wheel in the same run), then the PNGs and the Markdown
# table that bench/README.md shows.
#
#   bash bench/plots.sh                 # RUNS=1 by default; RUNS=3 for medians of three
#
# OURS_PY (default .venv/bin/python, with our package installed) and UPSTREAM_PY (default
# /tmp/upvenv/bin/python; created with pip when missing, needs Debian's libibverbs1) as in
# bench/python/store_side_by_side.sh. matplotlib is installed into our venv when missing.
# Progress is printed per implementation and value size; a run takes about 2 minutes.
set -euo pipefail
repo="$(cd "$(dirname "$0")/.." && pwd)"
ours="${OURS_PY:-$repo/.venv/bin/python}"
upstream="${UPSTREAM_PY:-/tmp/upvenv/bin/python}"
out="$repo/bench/plots"

"$ours" -c "import mooncake.store" 2>/dev/null ||
  { echo "$ours cannot import mooncake.store: bash scripts/setup.sh first" >&2; exit 2; }
"$ours" -c "import matplotlib" 2>/dev/null ||
  "$ours" -m pip install -q --disable-pip-version-check matplotlib
if [[ ! -x "$upstream" ]] || ! MC_FORCE_TCP=true "$upstream" -c "import mooncake.store" 2>/dev/null; then
  tmp="$(mktemp -d -t plots_upvenv.XXXXXX)"
  echo "creating upstream venv in $tmp/venv" >&2
  python3 -m venv "$tmp/venv"
  "$tmp/venv/bin/pip" install -q mooncake-transfer-engine-non-cuda numpy
  upstream="$tmp/venv/bin/python"
fi

mkdir -p "$out"
echo "# sweep: ours $ours, upstream $upstream, runs ${RUNS:-1}" >&2
"$ours" "$repo/bench/python/sweep_bench.py" compare --ours "$ours" --upstream "$upstream" \
  --runs "${RUNS:-1}" --json "$out/sweep.json"
"$ours" "$repo/bench/python/plots.py" "$out/sweep.json" "$out" | tee "$out/table.md"
