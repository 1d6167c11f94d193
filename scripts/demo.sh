#!/usr/bin/env bash
# The main job on one machine: set up .venv with the mooncake package, start a local master
# (with the embedded HTTP metadata server, no etcd) and a storage node on 127.0.0.1, run a
# short demo through mooncake.store, then stop everything.
set -euo pipefail
cd "$(dirname "$0")/.."

RPC_PORT=${RPC_PORT:-50051}
META_PORT=${META_PORT:-8080}
ADMIN_PORT=${ADMIN_PORT:-9003}
# A port already taken (another mooncake_master, most likely) would let the demo's clients
# meet that process instead and fail in confusing ways ("master closed the connection"):
# say which one is taken, before anything is built or started.
for port in "$RPC_PORT" "$META_PORT" "$ADMIN_PORT"; do
  if ! python3 -c 'import socket, sys
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("127.0.0.1", int(sys.argv[1])))' "$port" 2>/dev/null; then
    echo "[demo] port $port on 127.0.0.1 is already in use (another mooncake_master?)." >&2
    echo "[demo] Stop it, or choose free ports: RPC_PORT=... META_PORT=... ADMIN_PORT=... bash scripts/demo.sh" >&2
    exit 1
  fi
done

bash scripts/setup.sh
BIN=.venv/bin
LOGS=$(mktemp -d)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
  for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
}
trap cleanup EXIT

"$BIN/mooncake_master" --rpc_address=127.0.0.1 --rpc_port="$RPC_PORT" \
  --enable_http_metadata_server=true --http_metadata_server_host=127.0.0.1 \
  --http_metadata_server_port="$META_PORT" --metrics_host=127.0.0.1 --metrics_port="$ADMIN_PORT" \
  --default_kv_lease_ttl=5000 >"$LOGS/master.log" 2>&1 &
pids+=($!)
for _ in $(seq 100); do
  curl -sf "http://127.0.0.1:$ADMIN_PORT/health" >/dev/null && break
  sleep 0.1
done
echo "[demo] master: rpc 127.0.0.1:$RPC_PORT, metadata http://127.0.0.1:$META_PORT/metadata, admin :$ADMIN_PORT"

"$BIN/mooncake_client" --host=127.0.0.1 --global_segment_size="256 MB" --shards=2 \
  --master_server_address="127.0.0.1:$RPC_PORT" \
  --metadata_server="http://127.0.0.1:$META_PORT/metadata" >"$LOGS/node.log" 2>&1 &
pids+=($!)
for _ in $(seq 100); do
  grep -q "mooncake_client ready" "$LOGS/node.log" && break
  sleep 0.1
done
echo "[demo] storage node: $(grep -c '^shard' "$LOGS/node.log") shards mounted (256 MB)"

"$BIN/python" scripts/demo.py --master "127.0.0.1:$RPC_PORT" --metadata "http://127.0.0.1:$META_PORT/metadata"

echo "[demo] master metrics:"
curl -sf "http://127.0.0.1:$ADMIN_PORT/metrics" |
  grep -E '^master_(put_start_requests_total|get_replica_list_requests_total|total_capacity_bytes|active_clients) '
cleanup
trap - EXIT
echo "[demo] stopped master and storage node (logs in $LOGS)"
