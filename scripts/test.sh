#!/usr/bin/env bash
# Runs the whole test suite: format, house-rule (scripts/tidy.py) and lint checks, unit and
# property tests, multi-process integration tests against the real binaries on 127.0.0.1, the
# Python suite through the installed package (with torch from PyPI), and a bounded fuzzing run
# of every decoder.
# Ends with a summary line per step and exits non-zero if any step failed.
set -uo pipefail
cd "$(dirname "$0")/.."

# Seconds of fuzzing in all, most of it for the targets whose sources changed (scripts/fuzz.sh).
FUZZ_SECONDS=${FUZZ_SECONDS:-300}
export CARGO_TERM_COLOR=never
results=()
failed=0

step() {
  local name=$1
  shift
  echo
  echo "=== ${name}: $* ==="
  local t0=$SECONDS
  if "$@"; then
    results+=("PASS  ${name} ($((SECONDS - t0)) s)")
  else
    results+=("FAIL  ${name} ($((SECONDS - t0)) s)")
    failed=1
  fi
}

SETUP_FUZZ=1 WITH_TORCH=${WITH_TORCH:-1} WITH_BROWSER=1 WITH_K8S_SCHEMAS=1 bash scripts/setup.sh || exit 1

# Hugetlb pages for the run, so the tests of hugetlb-backed shared segments (dataplane
# `mem::shm`) check that case rather than only the plain one; the pool is put back at the
# end. Best effort: without root, or with /proc/sys read-only, the pool stays as it is.
HUGEPAGES_WANTED=600
hugepages_before=$(cat /proc/sys/vm/nr_hugepages 2>/dev/null || echo 0)
if [ "$(id -u)" = 0 ] && [ "$hugepages_before" -lt "$HUGEPAGES_WANTED" ]; then
  if echo "$HUGEPAGES_WANTED" > /proc/sys/vm/nr_hugepages 2>/dev/null; then
    trap 'echo "$hugepages_before" > /proc/sys/vm/nr_hugepages 2>/dev/null || true' EXIT
  fi
fi
echo "hugetlb pages: $(grep HugePages_Free /proc/meminfo | awk '{print $2}') free"

step fmt cargo fmt --all -- --check
# The house rules a tool can check (docs/STYLE.md): its self-test first, so a tidy that can
# no longer fail fails here; then the tree against scripts/tidy-baseline.txt.
step tidy sh -c 'python3 scripts/tidy.py --self-test && python3 scripts/tidy.py'
step clippy cargo clippy --workspace --all-targets -- -D warnings
# Type hints of the Python modules that have them, strictly (every def annotated, no implicit
# Any returns); imports are read for their types but only these files are reported on.
step mypy .venv/bin/python -m mypy --strict --follow-imports=silent --cache-dir=/dev/null \
  python/mooncake/_tensor.py python/mooncake/_parallel.py python/mooncake/buffer_pool.py \
  python/mooncake/_pg_common.py python/mooncake/_pg_codes.py
# mooncake.pg: its public functions are annotated (the process group's torch overrides are
# not), so it is checked for what it declares; torch may be absent (WITH_TORCH), then Any.
step mypy-pg .venv/bin/python -m mypy --follow-imports=silent --cache-dir=/dev/null \
  --ignore-missing-imports --disallow-incomplete-defs --warn-return-any python/mooncake/pg.py
step build cargo build --workspace --bins
if cargo nextest --version >/dev/null 2>&1; then
  step tests cargo nextest run --workspace --no-fail-fast
else
  step tests cargo test --workspace --no-fail-fast
fi
step doctests cargo test --workspace --doc
# The loom models (docs/HACKING.md): their own target directory, since --cfg loom rebuilds
# every dependency (about 2 min cold on 2 cores).
step loom env CARGO_TARGET_DIR=target-loom RUSTFLAGS="--cfg loom" cargo test --release \
  -p mooncake-dataplane -p mooncake-client --test loom_memory_gate --test loom_copier --test loom_master_handover \
  --test loom_announce_ring
step pytest env WITH_K8S_SCHEMAS=1 .venv/bin/python -m pytest python/tests -q -p no:cacheprovider --durations=15
step fuzz bash scripts/fuzz.sh "$FUZZ_SECONDS"

echo
echo "=== summary ==="
printf '%s\n' "${results[@]}"
exit $failed
