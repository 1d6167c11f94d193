#!/usr/bin/env python3
"""Where a same-host 4 MiB put spends its time: page faults in fresh segment memory.

For each node configuration, in one run, next to a plain memcpy measured in the same process:

- `default`: a storage node with an ordinary shared segment (4 KiB pages, not prefaulted);
- `prefault`: the same with `--prefault` (the node touches every page at start-up);
- `hugepages+prefault`: `MC_STORE_USE_HUGEPAGE=1 --prefault` (2 MiB hugetlb pages; only when
  the pool has enough free pages: `echo 600 > /proc/sys/vm/nr_hugepages` as root).

Each configuration starts a master and a node (1 GiB segment) on 127.0.0.1 and a client
without a segment of its own, which puts 48 fresh 4 MiB keys into never-used segment memory
(`cold`), removes them, and puts 48 more, which the allocator places in the ranges just
freed (`reuse`). Two memcpy baselines: `memcpy`, 4 MiB between the same two buffers (hot in
the cache), and `spread`, 4 MiB into 48 different already-faulted destinations in turn, as the
puts write (192 MiB: the destination is not in the cache). The client reaches the node's segment through the same-host shared mapping
(memcpy, no TCP). Reported per phase: the median put time as MiB/s, the put / memcpy ratio,
p90 and p99 (of 48 puts, so the slowest), the client's and node's minor page faults per put (from getrusage and /proc/PID/stat), and the
client process's CPU time per put (every thread, the copy helpers of `MC_STORE_COPY_THREADS`
included; getrusage).

Usage: .venv/bin/python bench/python/put_fault_bench.py [--rounds 3] [--json out.json]
"""

import argparse
import ctypes
import json
import os
import resource
import statistics
import subprocess
import sys
import time

# Run as a script, so this directory is on sys.path.
from store_bench import free_port, stop_all, wait_port

MIB = 1 << 20
VALUE = 4 * MIB
KEYS = 48
SEGMENT = "1024 MB"
HUGEPAGES_NEEDED = 512 + 16
BIN = os.path.dirname(sys.executable)


def minflt(pid):
    return int(open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[7])


def free_hugepages():
    for line in open("/proc/meminfo"):
        if line.startswith("HugePages_Free:"):
            return int(line.split()[1])
    return 0


def memcpy_mib_s():
    a, b = bytearray(VALUE), bytearray(VALUE)
    ca = (ctypes.c_char * VALUE).from_buffer(a)
    cb = (ctypes.c_char * VALUE).from_buffer(b)
    for _ in range(5):
        ctypes.memmove(ca, cb, VALUE)
    ts = []
    for _ in range(50):
        t = time.perf_counter()
        ctypes.memmove(ca, cb, VALUE)
        ts.append(time.perf_counter() - t)
    return VALUE / MIB / statistics.median(ts)


def memcpy_spread_mib_s():
    """memcpy of 4 MiB into 48 different (already faulted) 4 MiB destinations in turn, as the
    puts do: the destination is not in the cache, unlike the hot memcpy's."""
    src = bytearray(os.urandom(VALUE))
    dst = bytearray(VALUE * KEYS)
    cs = (ctypes.c_char * VALUE).from_buffer(src)
    base = ctypes.addressof((ctypes.c_char * len(dst)).from_buffer(dst))
    ts = []
    for r in range(3):
        for i in range(KEYS):
            t = time.perf_counter()
            ctypes.memmove(base + i * VALUE, cs, VALUE)
            ts.append(time.perf_counter() - t)
    return VALUE / MIB / statistics.median(ts)


def one(config):
    """Master + node in `config`, then the cold and reuse phases; a dict of figures."""
    from mooncake.store import MooncakeDistributedStore

    env = dict(os.environ, MC_LOG_LEVEL="2")
    extra = []
    if "prefault" in config:
        extra.append("--prefault")
    if "hugepages" in config:
        env["MC_STORE_USE_HUGEPAGE"] = "1"
    rpc, http, metrics, node_port = free_port(), free_port(), free_port(), free_port()
    procs = []
    try:
        procs.append(subprocess.Popen(
            [f"{BIN}/mooncake_master", "--rpc_address=127.0.0.1", f"--rpc_port={rpc}",
             f"--metrics_port={metrics}", "--enable_http_metadata_server=true",
             "--http_metadata_server_host=127.0.0.1", f"--http_metadata_server_port={http}"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL,
            env=env))
        if not (wait_port(rpc) and wait_port(http)):
            raise RuntimeError("master did not start")
        meta = f"http://127.0.0.1:{http}/metadata"
        node = subprocess.Popen(
            [f"{BIN}/mooncake_client", "--host=127.0.0.1", f"--port={node_port}",
             f"--global_segment_size={SEGMENT}", f"--master_server_address=127.0.0.1:{rpc}",
             f"--metadata_server={meta}", *extra],
            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL, env=env)
        procs.append(node)
        backing = ""
        for line in node.stdout:
            text = line.decode(errors="replace").strip()
            if text.startswith("shard "):
                backing = text
            if text == "mooncake_client ready":
                break
        store = MooncakeDistributedStore()
        rc = store.setup("127.0.0.1", meta, 0, 64 * MIB, "tcp", "", f"127.0.0.1:{rpc}")
        if rc != 0:
            raise RuntimeError(f"setup returned {rc}")
        value = os.urandom(VALUE)
        out = {"node": backing}
        for phase, prefix in (("cold", "c"), ("reuse", "r")):
            u0 = resource.getrusage(resource.RUSAGE_SELF)
            c0 = u0.ru_minflt
            n0 = minflt(node.pid)
            ts = []
            for i in range(KEYS):
                t = time.perf_counter()
                rc = store.put(f"{prefix}{i}", value)
                ts.append(time.perf_counter() - t)
                if rc != 0:
                    raise RuntimeError(f"put returned {rc}")
            u1 = resource.getrusage(resource.RUSAGE_SELF)
            c1 = u1.ru_minflt
            n1 = minflt(node.pid)
            cpu = (u1.ru_utime + u1.ru_stime) - (u0.ru_utime + u0.ru_stime)
            ts.sort()
            out[phase] = {
                "mib_s": VALUE / MIB / statistics.median(ts),
                "p90_ms": ts[int(len(ts) * 0.9)] * 1e3,
                "p99_ms": ts[int(len(ts) * 0.99)] * 1e3,
                "client_faults_per_put": (c1 - c0) / KEYS,
                "node_faults_per_put": (n1 - n0) / KEYS,
                "client_cpu_ms_per_put": cpu * 1e3 / KEYS,
            }
            if phase == "cold":
                for i in range(KEYS):
                    store.remove(f"c{i}")
        out["memcpy_mib_s"] = memcpy_mib_s()
        out["memcpy_spread_mib_s"] = memcpy_spread_mib_s()
        store.close()
        return out
    finally:
        stop_all(procs)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--json", default="")
    args = ap.parse_args()
    configs = ["default", "prefault"]
    if free_hugepages() >= HUGEPAGES_NEEDED:
        configs.append("hugepages+prefault")
    else:
        print(f"(hugepages+prefault skipped: {free_hugepages()} free hugepages, need "
              f"{HUGEPAGES_NEEDED}; as root: echo 600 > /proc/sys/vm/nr_hugepages)")
    runs = {c: [] for c in configs}
    for r in range(args.rounds):
        for c in configs:
            res = one(c)
            runs[c].append(res)
            print(f"round {r + 1} {c}: " + ", ".join(
                f"{ph} {res[ph]['mib_s']:.0f} MiB/s ({res[ph]['mib_s'] / res['memcpy_mib_s']:.0%}"
                f" of memcpy {res['memcpy_mib_s']:.0f}), faults/put client "
                f"{res[ph]['client_faults_per_put']:.0f} node {res[ph]['node_faults_per_put']:.0f}"
                for ph in ("cold", "reuse")), flush=True)
    print(f"\n{'config':20s} {'phase':6s} {'put MiB/s':>10s} {'memcpy':>8s} {'ratio':>6s} "
          f"{'spread':>7s} {'ratio':>6s} {'p90 ms':>7s} {'p99 ms':>7s} {'faults/put (client, node)':>26s} "
          f"{'client CPU ms/put':>18s}")
    for c in configs:
        for ph in ("cold", "reuse"):
            med = lambda f: statistics.median(f(x) for x in runs[c])
            put = med(lambda x: x[ph]["mib_s"])
            mc = med(lambda x: x["memcpy_mib_s"])
            ratio = med(lambda x: x[ph]["mib_s"] / x["memcpy_mib_s"])
            sp = med(lambda x: x["memcpy_spread_mib_s"])
            sratio = med(lambda x: x[ph]["mib_s"] / x["memcpy_spread_mib_s"])
            print(f"{c:20s} {ph:6s} {put:10.0f} {mc:8.0f} {ratio:6.0%} {sp:7.0f} {sratio:6.0%} "
                  f"{med(lambda x: x[ph]['p90_ms']):7.2f} {med(lambda x: x[ph]['p99_ms']):7.2f} "
                  f"{med(lambda x: x[ph]['client_faults_per_put']):>13.0f}, "
                  f"{med(lambda x: x[ph]['node_faults_per_put']):.0f} "
                  f"{med(lambda x: x[ph]['client_cpu_ms_per_put']):18.3f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(runs, f, indent=1)


if __name__ == "__main__":
    main()
