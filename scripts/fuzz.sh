#!/usr/bin/env bash
# Runs every fuzz target on top of the committed seeds, sharing TOTAL_SECONDS (default 480)
# evenly between them (at least 10 s each).
# cargo-fuzz needs nightly flags; RUSTC_BOOTSTRAP lets the stable toolchain accept them, and
# `-s none` skips AddressSanitizer (the code under test is safe Rust).
#
# Inputs may grow to MAX_LEN_BYTES (1 MiB and a frame header: the largest handshake-port
# frame, and room for a control frame's lists to reach the decoders' bounds), not libFuzzer's
# default of about 4 KiB, under which no decoder meets a large count or frame. master_model
# keeps the default: its input is a schedule of steps, and a longer one finds nothing a
# shorter one does not, only runs slower.
set -uo pipefail
cd "$(dirname "$0")/../fuzz"
TOTAL_SECONDS=${1:-480}
MAX_LEN_BYTES=$((1024 * 1024 + 64))
targets=$(cargo fuzz list)
count=$(echo "$targets" | wc -w)
SECONDS_EACH=$((TOTAL_SECONDS / count))
[ "$SECONDS_EACH" -lt 10 ] && SECONDS_EACH=10
status=0
mkdir -p logs
for target in $targets; do
  mkdir -p "corpus/$target"
  seeds=()
  [ -d "seeds/$target" ] && seeds=("seeds/$target")
  max_len=()
  [ "$target" != master_model ] && max_len=("-max_len=$MAX_LEN_BYTES")
  echo "fuzzing $target for ${SECONDS_EACH}s"
  if RUSTC_BOOTSTRAP=1 cargo fuzz run "$target" -s none "corpus/$target" "${seeds[@]}" -- \
    -max_total_time="$SECONDS_EACH" "${max_len[@]}" -rss_limit_mb=2048 -print_final_stats=1 \
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
