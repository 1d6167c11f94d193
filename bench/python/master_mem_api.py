#!/usr/bin/env python3
"""The master's memory per object, filled through the Python API (`mooncake.store`), ours
and upstream's wheel side by side in one run.

`master_mem` (Rust, `bench/README.md`) fills a master over its RPC directly; this is what a
user sees: for each implementation, its `mooncake_master` and a storage node
(`mooncake_client`, 4 GiB segment) on free loopback ports, then one client process without a
segment that `put_batch`es 40-byte keys (hex, unique) with 64-byte values, 1,024 a call.
At each checkpoint it reads the master's `VmRSS` (`/proc`, the master found by its RPC port),
reports the growth over the empty master divided by the objects held, checks that a sample
of the earliest keys is still held (an evicting master would make the figure a lie), and
times 5,000 single `is_exist` and 2,000 `get` calls on random held keys, one at a time.

Usage:
  master_mem_api.py [--ours PY] [--upstream PY] [--counts 100000,1000000,10000000]
      [--upstream-counts 100000,1000000] [--json out.json]
  <venv>/bin/python master_mem_api.py phase fill --master H:P --metadata URL --counts ...
"""

import argparse
import json
import os
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import store_bench  # noqa: E402  (the benches' shared helpers)

KEY_BYTES = 40
VALUE = b"v" * 64
BATCH = 1024
NODE_SEGMENT = 4096 * store_bench.MIB
EXIST_CALLS = 5000
GET_CALLS = 2000
HELD_SAMPLE = 1000


def key(i):
    return f"{i:0{KEY_BYTES}x}"


def master_pid(rpc_port):
    """The pid of the process whose command line holds `--rpc_port=<rpc_port>`."""
    flag = f"--rpc_port={rpc_port}".encode()
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            argv = (d / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if flag in argv:
            return int(d.name)
    raise RuntimeError(f"no process with {flag.decode()}")


def rss_bytes(pid):
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"no VmRSS for {pid}")


def latencies_us(fn, keys):
    lat = []
    for k in keys:
        t0 = time.perf_counter()
        fn(k)
        lat.append((time.perf_counter() - t0) * 1e6)
    lat.sort()
    return {"p50": round(statistics.median(lat), 1), "p99": round(store_bench.pct(lat, 99), 1)}


def fill_to(store, held, target):
    """Puts keys `held..target`; the count held."""
    while held < target:
        n = min(BATCH, target - held)
        keys = [key(i) for i in range(held, held + n)]
        rc = store.put_batch(keys, [VALUE] * n)
        if rc != 0:
            raise RuntimeError(f"put_batch at {held}: {rc}")
        held += n
    return held


def phase_fill(a):
    store = store_bench.setup_store(a.master, a.metadata, 0, 64 * store_bench.MIB)
    pid = master_pid(int(a.master.rsplit(":", 1)[1]))
    # The node has mounted and the master's allocator for it exists before the baseline.
    time.sleep(2.0)
    base = rss_bytes(pid)
    rows, held, rng = [], 0, random.Random(1)
    for target in [int(c) for c in a.counts.split(",")]:
        t0 = time.monotonic()
        held = fill_to(store, held, target)
        fill_s = time.monotonic() - t0
        rss = rss_bytes(pid)
        sample = [key(i) for i in range(min(HELD_SAMPLE, held))]
        missing = sum(1 for r in store.batch_is_exist(sample) if r != 1)
        probe = [key(rng.randrange(held)) for _ in range(EXIST_CALLS)]
        row = {
            "objects": held,
            "rss_growth_mib": round((rss - base) / 2**20, 1),
            "bytes_per_object": round((rss - base) / held, 1),
            "earliest_missing": missing,
            "fill_items_s": round((target - (rows[-1]["objects"] if rows else 0)) / fill_s),
            "is_exist_us": latencies_us(store.is_exist, probe),
            "get_us": latencies_us(store.get, probe[:GET_CALLS]),
        }
        print(json.dumps(row), file=sys.stderr, flush=True)
        rows.append(row)
    store_bench.out({"base_rss_mib": round(base / 2**20, 1), "rows": rows})


def run_side(label, py, counts, logdir):
    store_bench.NODE_SEGMENT = NODE_SEGMENT
    # Our node without its background populator: it would fault 4 GiB in beside the fill
    # (bench/README.md, "The house moves"); upstream's node has no such flag.
    node_flags = ["--populate=false"] if label == "ours" else []
    res = store_bench.run_impl(label, py, logdir / label, phases=("fill",),
                               script=Path(__file__).resolve(), echo=True,
                               node_flags=node_flags, phase_args=["--counts", counts])
    return res.get("fill", res)


def compare(a):
    logdir = Path(tempfile.mkdtemp(prefix="master_mem_api."))
    sides = [("ours", a.ours, a.counts)]
    if a.upstream:
        sides.append(("upstream", a.upstream, a.upstream_counts))
    results = {}
    for label, py, counts in sides:
        print(f"# {label}: filling to {counts} ({py})", flush=True)
        results[label] = run_side(label, py, counts, logdir)
    print(f"\n# master RSS growth per object, 40-byte keys, 64-byte values; logs in {logdir}")
    print("| side | objects | RSS growth | bytes/object | is_exist p50/p99 µs | get p50/p99 µs "
          "| fill items/s | earliest missing |")
    print("|---|---|---|---|---|---|---|---|")
    for label, res in results.items():
        if "rows" not in res:
            print(f"| {label} | error: {res.get('error')} |")
            continue
        for r in res["rows"]:
            print(f"| {label} | {r['objects']:,} | {r['rss_growth_mib']} MiB | "
                  f"{r['bytes_per_object']} | {r['is_exist_us']['p50']} / {r['is_exist_us']['p99']} | "
                  f"{r['get_us']['p50']} / {r['get_us']['p99']} | {r['fill_items_s']:,} | "
                  f"{r['earliest_missing']} |")
    if a.json:
        Path(a.json).write_text(json.dumps(results, indent=1))


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="cmd")
    ph = sub.add_parser("phase")
    ph.add_argument("name", choices=["fill"])
    ph.add_argument("--master", required=True)
    ph.add_argument("--metadata", required=True)
    ph.add_argument("--counts", required=True)
    p.add_argument("--ours", default=str(store_bench.REPO / ".venv" / "bin" / "python"))
    p.add_argument("--upstream", default="", help="python of the venv with upstream's wheel")
    p.add_argument("--counts", default="100000,1000000,10000000")
    p.add_argument("--upstream-counts", default="100000,1000000")
    p.add_argument("--json", default="")
    a = p.parse_args()
    if a.cmd == "phase":
        phase_fill(a)
    else:
        compare(a)


if __name__ == "__main__":
    main()
