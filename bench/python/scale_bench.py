#!/usr/bin/env python3
"""Scale: 8 client processes against 2 storage nodes and one master, ours beside upstream.

For each implementation (the package behind `import mooncake.store` in the interpreter given)
and each value size, in one run:

1. that implementation's `mooncake_master` and two of its `mooncake_client` storage nodes
   (`--global_segment_size` 1 GiB each) on free 127.0.0.1 ports, the embedded HTTP metadata
   server;
2. `--clients` (default 8) client processes without a segment of their own, started together,
   each looping for `--seconds`: put a fresh key (the value size), get one of its last 32 keys
   at random, and remove its keys older than that window (so the store never fills);
3. aggregate put and get throughput (bytes of the completed calls over the phase), put and get
   latency percentiles over every call of every client, errors, and the master's CPU time
   (user + system, from /proc/PID/stat) per 1,000 requests of any kind.

Usage:
  scale_bench.py --ours PY [--upstream PY] [--clients 8] [--seconds 10] [--sizes 4096,1048576]
                 [--master-flags "--default_kv_lease_ttl=500"] [--json out.json]
"""

import argparse
import json
import os
import random
import subprocess
import sys
import time
from pathlib import Path

# Run as a script, so this directory is on sys.path.
from store_bench import free_port, pct, stop_all, wait_port

MIB = 1 << 20
WINDOW = 32
NODE_SEGMENT = "1024 MB"


def cpu_seconds(pid):
    fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


# ---- one client process -------------------------------------------------------------------


def worker(a):
    from mooncake.store import MooncakeDistributedStore

    s = MooncakeDistributedStore()
    rc = s.setup("127.0.0.1", a.metadata, 0, 64 * MIB, "tcp", "", a.master)
    if rc != 0:
        raise SystemExit(f"setup failed: {rc}")
    value = os.urandom(a.size)
    rng = random.Random(a.id)
    # Wait for the common start, then run until the common end.
    while time.time() < a.start_at:
        time.sleep(0.001)
    end = a.start_at + a.seconds
    puts, gets, errors, calls = [], [], {}, 0
    put_bytes = get_bytes = 0
    live = []
    n = 0
    while time.time() < end:
        key = f"w{a.id}_{n}"
        n += 1
        t = time.perf_counter()
        rc = s.put(key, value)
        puts.append(time.perf_counter() - t)
        calls += 1
        if rc == 0:
            put_bytes += a.size
            live.append(key)
        else:
            errors[f"put {rc}"] = errors.get(f"put {rc}", 0) + 1
        if live:
            k = live[rng.randrange(len(live))]
            t = time.perf_counter()
            got = s.get(k)
            gets.append(time.perf_counter() - t)
            calls += 1
            if len(got) == a.size:
                get_bytes += a.size
            else:
                errors["get short"] = errors.get("get short", 0) + 1
        while len(live) > WINDOW:
            s.remove(live.pop(0), True)
            calls += 1
    for k in live:
        s.remove(k, True)
    s.close()
    print("RESULT " + json.dumps({
        "puts": puts, "gets": gets, "put_bytes": put_bytes, "get_bytes": get_bytes,
        "errors": errors, "calls": calls,
    }), flush=True)


# ---- orchestration ------------------------------------------------------------------------


def run_impl(label, py, clients, seconds, size, master_flags=()):
    bindir = Path(py).parent
    env = dict(os.environ)
    env.setdefault("MC_LOG_LEVEL", "2")
    if label == "upstream":
        env["MC_FORCE_TCP"] = "true"
    rpc, http, metrics = free_port(), free_port(), free_port()
    master = [str(bindir / "mooncake_master"), "--rpc_address=127.0.0.1", f"--rpc_port={rpc}",
              f"--metrics_port={metrics}", "--enable_http_metadata_server=true",
              "--http_metadata_server_host=127.0.0.1", f"--http_metadata_server_port={http}",
              *master_flags]
    metadata = f"http://127.0.0.1:{http}/metadata"
    procs = []
    try:
        procs.append(subprocess.Popen(master, stdout=subprocess.DEVNULL,
                                      stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL,
                                      env=env))
        if not (wait_port(rpc) and wait_port(http)):
            return {"error": "master did not start"}
        for _ in range(2):
            procs.append(subprocess.Popen(
                [str(bindir / "mooncake_client"), "--host=127.0.0.1", f"--port={free_port()}",
                 f"--global_segment_size={NODE_SEGMENT}",
                 f"--master_server_address=127.0.0.1:{rpc}", f"--metadata_server={metadata}"],
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL,
                env=env))
        time.sleep(3)  # both nodes mount their segments
        start_at = time.time() + 3.0  # every client set up by then
        ws = [subprocess.Popen(
            [py, __file__, "worker", "--master", f"127.0.0.1:{rpc}", "--metadata", metadata,
             "--id", str(i), "--size", str(size), "--seconds", str(seconds),
             "--start-at", str(start_at)],
            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env) for i in range(clients)]
        while time.time() < start_at:
            time.sleep(0.01)
        cpu0 = cpu_seconds(procs[0].pid)
        time.sleep(seconds)
        cpu1 = cpu_seconds(procs[0].pid)
        results = []
        for w in ws:
            outp, _ = w.communicate(timeout=120 + seconds)
            for line in outp.decode(errors="replace").splitlines():
                if line.startswith("RESULT "):
                    results.append(json.loads(line[len("RESULT "):]))
        if len(results) != clients:
            return {"error": f"{clients - len(results)} clients printed no result"}
        puts = sorted(x for r in results for x in r["puts"])
        gets = sorted(x for r in results for x in r["gets"])
        calls = sum(r["calls"] for r in results)
        errors = {}
        for r in results:
            for k, v in r["errors"].items():
                errors[k] = errors.get(k, 0) + v
        return {
            "put_mib_s": sum(r["put_bytes"] for r in results) / MIB / seconds,
            "get_mib_s": sum(r["get_bytes"] for r in results) / MIB / seconds,
            "put_p50_us": pct(puts, 50) * 1e6, "put_p99_us": pct(puts, 99) * 1e6,
            "get_p50_us": pct(gets, 50) * 1e6, "get_p99_us": pct(gets, 99) * 1e6,
            "calls": calls, "errors": errors,
            "master_cpu_ms_per_1000": (cpu1 - cpu0) * 1e3 / (calls / 1000) if calls else 0.0,
        }
    finally:
        stop_all(procs)


def main():
    if len(sys.argv) > 1 and sys.argv[1] == "worker":
        ap = argparse.ArgumentParser()
        ap.add_argument("worker")
        ap.add_argument("--master", required=True)
        ap.add_argument("--metadata", required=True)
        ap.add_argument("--id", type=int, required=True)
        ap.add_argument("--size", type=int, required=True)
        ap.add_argument("--seconds", type=float, required=True)
        ap.add_argument("--start-at", type=float, required=True)
        worker(ap.parse_args())
        return
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--ours", required=True)
    ap.add_argument("--upstream", default="")
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--sizes", default="4096,1048576")
    ap.add_argument("--master-flags", default="",
                    help="extra flags for both masters, space-separated")
    ap.add_argument("--json", default="")
    a = ap.parse_args()
    impls = [("ours", a.ours)] + ([("upstream", a.upstream)] if a.upstream else [])
    res = {}
    for size in [int(x) for x in a.sizes.split(",")]:
        for label, py in impls:
            print(f"{label}, {size} B values, {a.clients} clients, {a.seconds} s ...", flush=True)
            res[f"{label} {size}"] = run_impl(label, py, a.clients, a.seconds, size,
                                              a.master_flags.split())
    print(f"\n{'impl':9s} {'value':>8s} {'put MiB/s':>10s} {'get MiB/s':>10s} "
          f"{'put p50/p99 us':>16s} {'get p50/p99 us':>16s} {'calls':>8s} "
          f"{'master CPU ms/1k':>17s}  errors")
    for key, r in res.items():
        label, size = key.split()
        if "error" in r:
            print(f"{label:9s} {size:>8s}  {r['error']}")
            continue
        print(f"{label:9s} {size:>8s} {r['put_mib_s']:10.1f} {r['get_mib_s']:10.1f} "
              f"{r['put_p50_us']:7.0f}/{r['put_p99_us']:<8.0f} "
              f"{r['get_p50_us']:7.0f}/{r['get_p99_us']:<8.0f} {r['calls']:8d} "
              f"{r['master_cpu_ms_per_1000']:17.1f}  {r['errors'] or ''}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
