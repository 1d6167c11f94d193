#!/usr/bin/env python3
"""`setup_dummy` cost: put / get latency of a dummy client (through a standalone
`mooncake_client`, `docs/dummy-client.md`) beside a real client set up with no segment of its
own against the same master and the same `mooncake_client`, same run.

    .venv/bin/python bench/python/dummy_bench.py [--samples 2000] [--json out.json]

Starts `mooncake_master` and `mooncake_client` (the console scripts next to the interpreter)
on free loopback ports; for 4 KiB and 1 MiB values measures `put` (fresh keys), `get`, and
zero-copy `put_from` / `get_into` (at most 256 MiB of objects per size, so nothing is
evicted from the 1 GiB segment) from `alloc_from_mem_pool` memory (dummy) or a registered
buffer (real client): p50 / p99 in µs from sorted per-call samples (`time.perf_counter_ns`).
"""

import argparse
import ctypes
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from store_bench import free_port  # the benches' shared helper

BIN = Path(sys.executable).parent
SIZES = [4 * 1024, 1024 * 1024]


def start(args, ready):
    p = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    if ready is None:
        return p
    for line in p.stdout:
        if line.strip() == ready:
            return p
    raise SystemExit(f"{args[0]} did not start")


def pct(xs, q):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))] / 1000.0


def measure(store, size, samples, tag, ptr_of):
    # Every sample keeps its object until the end: stay well below the segment (no eviction).
    samples = min(samples, (256 << 20) // size)
    value = os.urandom(size)
    out = {}
    t = []
    for i in range(samples):
        a = time.perf_counter_ns()
        assert store.put(f"{tag}/{size}/{i}", value) == 0
        t.append(time.perf_counter_ns() - a)
    out["put"] = t
    t = []
    for i in range(samples):
        a = time.perf_counter_ns()
        got = store.get(f"{tag}/{size}/{i}")
        assert len(got) == size, (tag, size, i, len(got), store.get_size(f"{tag}/{size}/{i}"))
        t.append(time.perf_counter_ns() - a)
    out["get"] = t
    src, dst = ptr_of(size), ptr_of(size)
    ctypes.memmove(src, value, size)
    t = []
    for i in range(samples):
        a = time.perf_counter_ns()
        assert store.put_from(f"{tag}/zc/{size}/{i}", src, size) == 0
        t.append(time.perf_counter_ns() - a)
    out["put_from"] = t
    t = []
    for i in range(samples):
        a = time.perf_counter_ns()
        assert store.get_into(f"{tag}/zc/{size}/{i}", dst, size) == size
        t.append(time.perf_counter_ns() - a)
    out["get_into"] = t
    store.remove_by_regex(f"^{tag}/", True)
    return {k: (pct(v, 0.5), pct(v, 0.99)) for k, v in out.items()}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--samples", type=int, default=2000)
    ap.add_argument("--json")
    a = ap.parse_args()
    from mooncake.store import MooncakeDistributedStore

    rpc, http, port = free_port(), free_port(), free_port()
    master = start([str(BIN / "mooncake_master"), f"--rpc_port={rpc}", "--rpc_address=127.0.0.1",
                    "--enable_http_metadata_server=true",
                    "--http_metadata_server_host=127.0.0.1",
                    f"--http_metadata_server_port={http}", "--default_kv_lease_ttl=0",
                    f"--metrics_port={free_port()}"], None)
    time.sleep(1.0)
    node = start([str(BIN / "mooncake_client"), "--host=127.0.0.1", f"--port={port}",
                  "--global_segment_size=1GB", f"--master_server_address=127.0.0.1:{rpc}",
                  f"--metadata_server=http://127.0.0.1:{http}/metadata"],
                 "mooncake_client ready")
    results = {}
    try:
        dummy = MooncakeDistributedStore()
        assert dummy.setup_dummy(256 << 20, 64 << 20, f"127.0.0.1:{port}") == 0
        real = MooncakeDistributedStore()
        assert real.setup("127.0.0.1", f"http://127.0.0.1:{http}/metadata", 0, 64 << 20,
                          "tcp", "", f"127.0.0.1:{rpc}") == 0
        keep = []

        def registered(n):
            b = (ctypes.c_char * n)()
            keep.append(b)
            assert real.register_buffer(ctypes.addressof(b), n) == 0
            return ctypes.addressof(b)

        for size in SIZES:
            results[f"dummy {size}"] = measure(dummy, size, a.samples, "d",
                                               dummy.alloc_from_mem_pool)
            results[f"real {size}"] = measure(real, size, a.samples, "r", registered)
        dummy.close()
        real.close()
    finally:
        for p in (node, master):
            p.terminate()
            p.wait(timeout=15)
    print(f"{'client size':<16}" + "".join(f"{op:>22}" for op in
                                            ("put", "get", "put_from", "get_into")))
    print(f"{'':<16}" + "   p50 / p99 (µs)     " * 4)
    for name, r in results.items():
        print(f"{name:<16}" + "".join(f"{r[op][0]:>11.1f} /{r[op][1]:>8.1f} "
                                      for op in ("put", "get", "put_from", "get_into")))
    if a.json:
        Path(a.json).write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
