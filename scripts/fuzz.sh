#!/usr/bin/env bash
# Runs every fuzz target on top of the committed seeds within TOTAL_SECONDS (default 300).
#
# The budget follows what changed: fuzz/sources.tsv names the sources each target exercises.
# A target none of whose sources (nor its own target file or seeds) changed since the base
# commit gets FUZZ_FLOOR_SECONDS (default 5: its seeds replayed, then a short run, enough to
# catch a decoder broken by something the table does not name); the targets whose sources
# changed share the rest evenly. The base is FUZZ_SINCE if set, else the newest commit at
# least a day older than HEAD (a day's work, as CI sees it on a fresh clone); with no such
# commit, or FUZZ_SINCE=all, every target counts as changed. Uncommitted edits count too.
#
# cargo-fuzz needs nightly flags; RUSTC_BOOTSTRAP lets the stable toolchain accept them, and
# `-s none` skips AddressSanitizer (the code under test is safe Rust). The build keeps
# cargo-fuzz's one codegen unit: 16 built no faster on 2 cores (217 s against 205 s from
# nothing, the crates already compile two at a time) and fuzz a little slower.
#
# Inputs may grow to MAX_LEN_BYTES (1 MiB and a frame header: the largest handshake-port
# frame, and room for a control frame's lists to reach the decoders' bounds), not libFuzzer's
# default of about 4 KiB, under which no decoder meets a large count or frame. master_model
# keeps the default: its input is a schedule of steps, and a longer one finds nothing a
# shorter one does not, only runs slower.
set -uo pipefail
cd "$(dirname "$0")/../fuzz"
TOTAL_SECONDS=${1:-300}
FLOOR_SECONDS=${FUZZ_FLOOR_SECONDS:-5}
MAX_LEN_BYTES=$((1024 * 1024 + 64))
BUILD=(-s none)

base=${FUZZ_SINCE:-}
if [ -z "$base" ]; then
  head_time=$(git log -1 --format=%ct HEAD 2>/dev/null || echo 0)
  base=$(git rev-list -1 --before="$((head_time - 86400))" HEAD 2>/dev/null || true)
fi
changed_files=
if [ -n "$base" ] && [ "$base" != all ]; then
  changed_files=$(git diff --name-only "$base" -- .. 2>/dev/null) || base=
fi
[ -n "$base" ] && [ "$base" != all ] || base=all

# changed TARGET: whether TARGET's sources changed since the base.
changed() {
  [ "$base" = all ] && return 0
  local prefixes p f
  prefixes=$(awk -F'\t' -v t="$1" '$1 == t { print $2 }' sources.tsv)
  for p in $prefixes "fuzz/fuzz_targets/$1.rs" "fuzz/seeds/$1/"; do
    for f in $changed_files; do
      case "$f" in "$p"*) return 0 ;; esac
    done
  done
  return 1
}

echo "building the fuzz targets"
mkdir -p logs
if ! RUSTC_BOOTSTRAP=1 cargo fuzz build "${BUILD[@]}" >logs/build.log 2>&1; then
  tail -40 logs/build.log
  echo "fuzz build: FAILED"
  exit 1
fi
targets=$(cargo fuzz list)
hot=() cold=()
for target in $targets; do
  if changed "$target"; then hot+=("$target"); else cold+=("$target"); fi
done
rest=$((TOTAL_SECONDS - FLOOR_SECONDS * ${#cold[@]}))
SECONDS_HOT=$FLOOR_SECONDS
[ "${#hot[@]}" -gt 0 ] && SECONDS_HOT=$((rest / ${#hot[@]}))
[ "$SECONDS_HOT" -lt "$FLOOR_SECONDS" ] && SECONDS_HOT=$FLOOR_SECONDS
echo "base $base: ${#hot[@]} targets changed (${SECONDS_HOT}s each), ${#cold[@]} did not (${FLOOR_SECONDS}s each)"

status=0
for target in $targets; do
  seconds=$FLOOR_SECONDS
  for h in "${hot[@]}"; do [ "$h" = "$target" ] && seconds=$SECONDS_HOT; done
  mkdir -p "corpus/$target"
  seeds=()
  [ -d "seeds/$target" ] && seeds=("seeds/$target")
  max_len=()
  [ "$target" != master_model ] && max_len=("-max_len=$MAX_LEN_BYTES")
  echo "fuzzing $target for ${seconds}s"
  if RUSTC_BOOTSTRAP=1 cargo fuzz run "$target" "${BUILD[@]}" "corpus/$target" "${seeds[@]}" -- \
    -max_total_time="$seconds" "${max_len[@]}" -rss_limit_mb=2048 -print_final_stats=1 \
    >"logs/$target.log" 2>&1; then
    grep -E '^(Done|stat::number_of_executed_units)' "logs/$target.log" || true
    echo "fuzz $target: ok"
  else
    tail -40 "logs/$target.log"
    echo "fuzz $target: FAILED (crash input under fuzz/artifacts/$target)"
    status=1
  fi
done
exit $status
