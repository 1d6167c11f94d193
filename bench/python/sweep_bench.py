#!/usr/bin/env python3
"""Store throughput against value size and latency percentiles, ours against upstream's wheel
in the same run, as data for `plots.py` (`bench/plots.sh` runs both).

For each implementation, `store_bench.run_impl` starts that venv's master and a separate
storage node on free 127.0.0.1 ports (the same layout as `store_bench.py`); this script's
`phase sweep` then runs in a client without a segment (every replica on the node) and, for
each value size, puts `n` fresh keys one by one and gets them back, timing every call. From
the samples: throughput (bytes / summed call time) and the latency at fine percentiles
(p0 to p99.99, exact, from the sorted samples: nothing is lost to bucketing).

Usage:
  sweep_bench.py compare --ours PY [--upstream PY] [--runs N] --json out.json
  <venv>/bin/python sweep_bench.py phase sweep --master H:P --metadata URL

Progress goes to stderr, one line per implementation, run and size.
"""

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import store_bench as sb  # noqa: E402  (shares the cluster runner and helpers)

KIB, MIB = 1024, 1024 * 1024
SIZES = [4 * KIB, 64 * KIB, 256 * KIB, 1 * MIB, 4 * MIB, 16 * MIB]
# Bytes each size moves at most (per direction), and the sample count bounds.
BUDGET = int(float(os.environ.get("SWEEP_BUDGET_MIB", "384")) * MIB)
OPS_MIN, OPS_MAX = 24, int(os.environ.get("SWEEP_OPS_MAX", "2000"))
PERCENTILES = [0, 10, 25, 50, 75, 90, 95, 99, 99.5, 99.9, 99.99]


def ops_for(size):
    return max(OPS_MIN, min(OPS_MAX, BUDGET // size))


def summarize(lat_ns, size):
    lat_ns.sort()
    total = sum(lat_ns) / 1e9
    return {
        "ops": len(lat_ns),
        "mib_s": len(lat_ns) * size / MIB / total if total > 0 else 0.0,
        "pct_us": {str(p): sb.pct(lat_ns, p) / 1e3 for p in PERCENTILES},
    }


def phase_sweep(a):
    s = sb.setup_store(a.master, a.metadata, 0, 64 * MIB)
    sb.wait_for_space(s)
    out = {}
    for size in SIZES:
        n = ops_for(size)
        value = os.urandom(size)
        keys = [f"sweep_{size}_{i}" for i in range(n)]
        for i in range(8):  # warm the connections and this size's path
            s.put(f"warm_{size}_{i}", value)
            s.get(f"warm_{size}_{i}")
        put, get = [], []
        for k in keys:
            t = time.perf_counter_ns()
            rc = s.put(k, value)
            put.append(time.perf_counter_ns() - t)
            if rc != 0:
                raise SystemExit(f"put of {size} bytes failed: {rc}")
        for k in keys:
            t = time.perf_counter_ns()
            v = s.get(k)
            get.append(time.perf_counter_ns() - t)
            if len(v) != size:
                raise SystemExit(f"get of {size} bytes returned {len(v)}")
        out[str(size)] = {"put": summarize(put, size), "get": summarize(get, size)}
        sb.remove_keys(s, keys + [f"warm_{size}_{i}" for i in range(8)])
        print(f"  size {size}: {n} puts and gets", file=sys.stderr, flush=True)
    s.close()
    sb.out(out)


def median_run(runs, label):
    """Per size and direction: the median over runs of throughput and of each percentile."""
    per = [r[label] for r in runs if isinstance(r.get(label), dict) and "error" not in r[label]]
    if not per:
        return None
    res = {}
    for size in per[0]:
        res[size] = {}
        for d in ("put", "get"):
            xs = [p[size][d] for p in per if size in p]
            res[size][d] = {
                "ops": sum(x["ops"] for x in xs),
                "mib_s": statistics.median(x["mib_s"] for x in xs),
                "pct_us": {q: statistics.median(x["pct_us"][q] for x in xs)
                           for q in xs[0]["pct_us"]},
            }
    return res


def compare(a):
    impls = [("ours", a.ours)] + ([("upstream", a.upstream)] if a.upstream else [])
    logroot = Path(tempfile.mkdtemp(prefix="sweep_bench_"))
    runs = []
    for i in range(a.runs):
        run = {}
        order = impls if i % 2 == 0 else impls[::-1]
        for label, py in order:
            print(f"run {i + 1}/{a.runs}: {label} ({py})", file=sys.stderr, flush=True)
            res = sb.run_impl(label, py, logroot / f"run{i + 1}" / label, phases=("sweep",),
                              script=Path(__file__).resolve(), echo=True)
            run[label] = res.get("sweep", res)
        runs.append(run)
    result = {
        "sizes": SIZES,
        "runs": len(runs),
        "machine": f"{os.cpu_count()} cpus, load {os.getloadavg()[0]:.1f}",
        "ours": median_run(runs, "ours"),
        "upstream": median_run(runs, "upstream"),
        "raw": runs,
    }
    Path(a.json).write_text(json.dumps(result, indent=1))
    print(f"# logs in {logroot}; results in {a.json}", file=sys.stderr)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("compare")
    c.add_argument("--ours", required=True)
    c.add_argument("--upstream", default="")
    c.add_argument("--runs", type=int, default=1)
    c.add_argument("--json", required=True)
    p = sub.add_parser("phase")
    p.add_argument("which", choices=["sweep"])
    p.add_argument("--master", default="")
    p.add_argument("--metadata", default="")
    a = ap.parse_args()
    if a.cmd == "compare":
        compare(a)
    else:
        phase_sweep(a)


if __name__ == "__main__":
    main()
