#!/usr/bin/env bash
# Side-by-side benchmark of mooncake.store: ours vs upstream's wheel, in the same run.
#
#   bench/python/store_side_by_side.sh [OURS_PYTHON [UPSTREAM_PYTHON]] [-- extra store_bench.py args]
#
# OURS_PYTHON     (or $OURS_PY)     python of the venv with our package installed
#                                   (default: <repo>/.venv/bin/python; install with
#                                   `.venv/bin/pip install ./python`).
# UPSTREAM_PYTHON (or $UPSTREAM_PY) python of a venv with `mooncake-transfer-engine-non-cuda`
#                                   and numpy (default: /tmp/upvenv/bin/python). When it does
#                                   not exist, a venv is created under a temp dir with pip
#                                   (needs Debian's libibverbs1 for the wheel to import).
# RUNS (env, default 3), JSON (env, default /tmp/store_bench.json),
# STORE_BENCH_SECS (env, seconds per throughput loop, default 1.0).
#
# Each implementation gets its own master and its own storage node (that venv's
# mooncake_master / mooncake_client); see store_bench.py for what is measured.
set -euo pipefail

here="$(cd "$(dirname "$0")" && pwd)"
repo="$(cd "$here/../.." && pwd)"

extra=()
pos=()
while (($#)); do
    if [[ "$1" == "--" ]]; then
        shift
        extra=("$@")
        break
    fi
    pos+=("$1")
    shift
done

ours="${pos[0]:-${OURS_PY:-$repo/.venv/bin/python}}"
upstream="${pos[1]:-${UPSTREAM_PY:-/tmp/upvenv/bin/python}}"
runs="${RUNS:-3}"
json="${JSON:-/tmp/store_bench.json}"

if [[ ! -x "$ours" ]]; then
    echo "our interpreter $ours not found: python3 -m venv .venv && .venv/bin/pip install ./python" >&2
    exit 2
fi
if ! "$ours" -c "import mooncake.store" 2>/dev/null; then
    echo "$ours cannot import mooncake.store: run $(dirname "$ours")/pip install $repo/python" >&2
    exit 2
fi

if [[ ! -x "$upstream" ]] || ! MC_FORCE_TCP=true "$upstream" -c "import mooncake.store" 2>/dev/null; then
    if ! ldconfig -p 2>/dev/null | grep -q libibverbs.so.1; then
        echo "upstream's wheel needs libibverbs1 (apt-get install -y libibverbs1)" >&2
    fi
    tmp="$(mktemp -d -t store_upvenv.XXXXXX)"
    echo "creating upstream venv in $tmp/venv" >&2
    python3 -m venv "$tmp/venv"
    "$tmp/venv/bin/pip" install -q mooncake-transfer-engine-non-cuda numpy
    upstream="$tmp/venv/bin/python"
fi

echo "# machine: $(nproc) cpus, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)," \
     "$(free -g | awk '/Mem:/{print $2}') GiB RAM, kernel $(uname -r), load $(cut -d' ' -f1-3 /proc/loadavg)" >&2
echo "# ours: $("$ours" -c 'import mooncake._native as n; print("mooncake-rs", n.__version__)')" >&2
echo "# upstream: $("$upstream" -m pip show mooncake-transfer-engine-non-cuda 2>/dev/null | awk '/^Version/{print "mooncake-transfer-engine-non-cuda", $2}')" >&2

exec "$ours" "$here/store_bench.py" compare --ours "$ours" --upstream "$upstream" \
    --runs "$runs" --json "$json" "${extra[@]}"
