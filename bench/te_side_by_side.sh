#!/usr/bin/env bash
# transfer_engine_bench side by side: ours, upstream's wheel, and one plain loopback TCP stream
# (the physical limit), in the same run, on 127.0.0.1 only.
#
#   bash bench/te_side_by_side.sh [UPSTREAM_VENV]   (default /tmp/upvenv; skipped if missing)
#   SIZES="1048576 16777216" bash bench/te_side_by_side.sh ...   (block sizes; default 64 KiB, 1 MiB)
#
# Upstream: `python3 -m venv V && V/bin/pip install mooncake-transfer-engine-non-cuda`
# (needs Debian's libibverbs1). Both run P2PHANDSHAKE metadata, TCP, batch 16, 2 threads.
set -euo pipefail
cd "$(dirname "$0")/.."
UP=${1:-/tmp/upvenv}
SECS=${SECS:-5}
SIZES=${SIZES:-65536 1048576}
cargo build --release -q -p mooncake-bench --bin transfer_engine_bench --bin tcp_transport_bench
OURS=target/release/transfer_engine_bench
BUF=$((512 << 20))
LOG=$(mktemp -d)

run_pair() { # impl target_cmd initiator_cmd_prefix -> prints throughput for each (op, size)
  local impl=$1 bin=$2 envs=$3 port=$4
  env $envs "$bin" --mode=target --protocol=tcp --metadata_server=P2PHANDSHAKE \
    --local_server_name="127.0.0.1:$port" --buffer_size=$BUF >"$LOG/$impl-target.log" 2>&1 &
  local tpid=$!
  local seg=""
  for _ in $(seq 100); do
    sleep 0.1
    if [ "$impl" = ours ]; then
      seg=$(grep -o 'segment_id=[^ ]*' "$LOG/$impl-target.log" | cut -d= -f2 || true)
    else
      seg=$(grep -o 'listening on [0-9.:]*' "$LOG/$impl-target.log" | awk '{print $3}' || true)
    fi
    [ -n "$seg" ] && break
  done
  for size in $SIZES; do
    for op in write read; do
      local out
      out=$(env $envs "$bin" --mode=initiator --protocol=tcp --metadata_server=P2PHANDSHAKE \
        --local_server_name="127.0.0.1:$((port + 1))" --segment_id="$seg" --operation=$op \
        --block_size=$size --batch_size=16 --threads=2 --duration="$SECS" --buffer_size=$BUF 2>&1 |
        grep -o 'throughput [0-9.]* GB/s' | awk '{print $2}' || true)
      echo "$impl $op $size ${out:-n/a}"
    done
  done
  kill -TERM $tpid 2>/dev/null || true
  for _ in $(seq 20); do kill -0 $tpid 2>/dev/null || break; sleep 0.1; done
  kill -KILL $tpid 2>/dev/null || true # upstream's target does not always stop on SIGTERM
  wait $tpid 2>/dev/null || true
}

{
  run_pair ours "$OURS" "" 12345
  if [ -x "$UP/bin/transfer_engine_bench" ]; then
    run_pair upstream "$UP/bin/transfer_engine_bench" "MC_FORCE_TCP=true" 12355
  fi
} | tee "$LOG/results.txt"

echo "--- plain loopback stream (physical limit) ---"
target/release/tcp_transport_bench --secs 1 --runs 3 --sizes "${SIZES// /,}" --backends plain 2>&1 |
  tee "$LOG/plain.txt" | grep -E 'plain' || true

python3 - "$LOG/results.txt" "$LOG/plain.txt" $SIZES <<'PY'
import re, sys
res = {}
for line in open(sys.argv[1]):
    impl, op, size, v = line.split()
    res[(impl, op, int(size))] = None if v == "n/a" else float(v)
# The limit is the best plain-stream pass (one request at a time, or pipelined) per size and
# direction: the most a single loopback TCP stream moved here.
plain = {}
unit = {"KiB": 1024, "MiB": 1 << 20}
for line in open(sys.argv[2]):
    m = re.search(r"(\d+)(KiB|MiB)\s+(read|write)\s+(lat|tput)\s+plain\s+([\d.]+) GB/s", line)
    if m:
        key = (m.group(3), int(m.group(1)) * unit[m.group(2)])
        plain[key] = max(plain.get(key, 0.0), float(m.group(5)))
print(f"\n{'op':6} {'block':>8} {'ours GB/s':>10} {'upstream':>9} {'x upstream':>10} {'plain':>7} {'% plain':>8}")
for op in ("write", "read"):
    for size in map(int, sys.argv[3:]):
        o, u = res.get(("ours", op, size)), res.get(("upstream", op, size))
        p = plain.get((op, size))
        ratio = f"{o / u:.2f}x" if o and u else "-"
        pct = f"{100 * o / p:.0f}%" if o and p else "-"
        print(f"{op:6} {size:>8} {o or 0:>10.2f} {u or 0:>9.2f} {ratio:>10} {p or 0:>7.2f} {pct:>8}")
PY
echo "(logs in $LOG)"
