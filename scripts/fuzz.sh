#!/usr/bin/env bash
# Runs every fuzz target for SECONDS each (default 60) on top of the committed seeds.
# cargo-fuzz needs nightly flags; RUSTC_BOOTSTRAP lets the stable toolchain accept them, and
# `-s none` skips AddressSanitizer (the code under test is safe Rust).
set -uo pipefail
cd "$(dirname "$0")/../fuzz"
SECONDS_EACH=${1:-60}
status=0
mkdir -p logs
for target in $(cargo fuzz list); do
  mkdir -p "corpus/$target"
  seeds=()
  [ -d "seeds/$target" ] && seeds=("seeds/$target")
  echo "fuzzing $target for ${SECONDS_EACH}s"
  if RUSTC_BOOTSTRAP=1 cargo fuzz run "$target" -s none "corpus/$target" "${seeds[@]}" -- \
    -max_total_time="$SECONDS_EACH" -rss_limit_mb=2048 -print_final_stats=1 >"logs/$target.log" 2>&1; then
    grep -E '^(Done|stat::number_of_executed_units)' "logs/$target.log" || true
    echo "fuzz $target: ok"
  else
    tail -40 "logs/$target.log"
    echo "fuzz $target: FAILED (crash input under fuzz/artifacts/$target)"
    status=1
  fi
done
exit $status
