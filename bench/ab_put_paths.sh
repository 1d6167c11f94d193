#!/bin/bash
# A/B of put (or, with OP=get, get) service time over TCP, RDMA (software verbs model) and
# same-host memcpy for two builds.
#
#   bench/ab_put_paths.sh RUNS DIR_A DIR_B
#   CONFIGS="shm:4096 shm:65536" bench/ab_put_paths.sh RUNS DIR_A DIR_B
#   OP=get bench/ab_put_paths.sh RUNS DIR_A DIR_B      # gets instead of puts
#
# CONFIGS lists path:value_size pairs (path tcp, rdma or shm; default: TCP and RDMA at 4 KiB
# and 64 KiB). shm is the TCP protocol with same-host memcpy on (MC_STORE_SHM=1): the bench's
# local node shares its segment, so puts copy into it.
#
# DIR_A and DIR_B each hold release builds of mooncake_bench, mooncake_master and
# mooncake_client (copied from target/release of the two versions). Runs are interleaved;
# each prints: run dir protocol value_size p50_us p99_us achieved_ops errors.
set -euo pipefail
runs=$1
dirs=("$2" "$3")
for r in $(seq 1 "$runs"); do
  for cfg in ${CONFIGS:-tcp:4096 rdma:4096 rdma:65536 tcp:65536}; do
    path=${cfg%%:*}
    size=${cfg##*:}
    protocol=$path shm=0
    if [ "$path" = shm ]; then protocol=tcp shm=1; fi
    set -- "$path" "$size"
    for d in "${dirs[@]}"; do
      fabric=$(mktemp -d /dev/shm/mc-ab-fabric.XXXX)
      out=$(MOONCAKE_RDMA_SIM=$fabric MC_STORE_SHM=$shm "$d/mooncake_bench" --local --op "${OP:-put}" \
        --rate 2000 --seconds 10 --threads 2 --pin --value_size "$size" --protocol "$protocol" \
        2>/dev/null)
      rm -rf "$fabric"
      svc=$(grep '^service' <<<"$out")
      p50=$(sed -E 's/.*p50=([0-9]+).*/\1/' <<<"$svc")
      p99=$(sed -E 's/.* p99=([0-9]+).*/\1/' <<<"$svc")
      issued=$(grep '^issued' <<<"$out" | sed -E 's/.*achieved ([0-9]+) ops.*, ([0-9]+) errors.*/\1 \2/')
      echo "$r $d $1 $2 $p50 $p99 $issued"
    done
  done
done
