#!/usr/bin/env bash
# The main job on one machine: build, set up .venv, start a local master (with the embedded
# HTTP metadata server, no etcd) on 127.0.0.1, run a short demo against it, stop everything.
set -euo pipefail
cd "$(dirname "$0")/.."

bash scripts/setup.sh
echo "[demo] building (release)"
cargo build --release --bins --examples -q

RPC_PORT=${RPC_PORT:-50051}
META_PORT=${META_PORT:-8080}
ADMIN_PORT=${ADMIN_PORT:-9003}
LOG=$(mktemp -d)/master.log
target/release/mooncake_master --rpc_address=127.0.0.1 --rpc_port="$RPC_PORT" \
  --enable_http_metadata_server=true --http_metadata_server_host=127.0.0.1 \
  --http_metadata_server_port="$META_PORT" --metrics_host=127.0.0.1 --metrics_port="$ADMIN_PORT" \
  --default_kv_lease_ttl=5000 >"$LOG" 2>&1 &
MASTER_PID=$!
trap 'kill -TERM $MASTER_PID 2>/dev/null; wait $MASTER_PID 2>/dev/null || true' EXIT
for _ in $(seq 100); do
  curl -sf "http://127.0.0.1:$ADMIN_PORT/health" >/dev/null && break
  sleep 0.1
done
echo "[demo] master up: rpc 127.0.0.1:$RPC_PORT, metadata http://127.0.0.1:$META_PORT/metadata, admin :$ADMIN_PORT (log $LOG)"

target/release/examples/master_demo "127.0.0.1:$RPC_PORT"

echo "[demo] HTTP metadata round trip:"
curl -sf -X PUT "http://127.0.0.1:$META_PORT/metadata?key=mooncake/ram/demo" -d '{"name":"demo"}'; echo
curl -sf "http://127.0.0.1:$META_PORT/metadata?key=mooncake/ram/demo"; echo
echo "[demo] a few master metrics:"
curl -sf "http://127.0.0.1:$ADMIN_PORT/metrics" | grep -E '^master_(put_start_requests_total|remove_all_requests_total|key_count|total_capacity_bytes) '
kill -TERM $MASTER_PID
wait $MASTER_PID && echo "[demo] master stopped cleanly"
trap - EXIT
