#!/usr/bin/env python3
"""Where a 4 KiB put's time goes beside a get's: single calls, one at a time, through
`mooncake.store`, against a master and a storage node (`--populate=false`) on loopback, the
client without a segment on the same host (so a put copies into the node's shared segment
and a get reads from it). Per round, `--ops` puts of fresh keys, then gets and `is_exist`
of the same keys; p50 and p99 of each, in microseconds.

`is_exist` is one master round trip; a get is that plus a memcpy. A put of a size the client
keeps putting is the intent published in the ring the node shares with the client, the
memcpy into a range the master reserved ahead, its provisional record there too, one master
round trip (`CommitReservedPut`, which hands out the next range) and the commit record in the
ring (`docs/recovery.md`, "A put committed after its bytes"); with `MC_STORE_RESERVED_PUT=0`
it is `PutStart`, the intent, the memcpy, the record and `PutEnd` (`bench/README.md`, "The
record in shared memory").

Usage:
  [PROBE_CPU=N] .venv/bin/python bench/python/small_put_probe.py [--rounds 8] [--ops 3000]
"""

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import store_bench  # noqa: E402  (the benches' shared helpers)

VALUE = b"x" * 4096


def latencies(fn, n):
    out = []
    for i in range(n):
        t0 = time.perf_counter()
        fn(i)
        out.append((time.perf_counter() - t0) * 1e6)
    out.sort()
    return round(statistics.median(out), 1), round(store_bench.pct(out, 99), 1)


def phase(a):
    # PROBE_CPU=N pins this client (not the master or the node) to core N.
    if os.environ.get("PROBE_CPU"):
        os.sched_setaffinity(0, {int(os.environ["PROBE_CPU"])})
    s = store_bench.setup_store(a.master, a.metadata, 0, 64 * store_bench.MIB)
    store_bench.wait_for_space(s)  # the node's segment is mounted
    # With the populator on, let it finish first (a few seconds for the node's segment),
    # unless `--wait` says otherwise (0: measure a fresh node's first seconds).
    time.sleep(a.wait if a.wait is not None else 10.0 if a.populate else 1.0)
    t0 = time.monotonic()
    for r in range(a.rounds):
        put = latencies(lambda i: s.put(f"k{r}_{i}", VALUE), a.ops)
        get = latencies(lambda i: s.get(f"k{r}_{i}"), a.ops)
        exist = latencies(lambda i: s.is_exist(f"k{r}_{i}"), a.ops)
        print(f"round {r} (at {time.monotonic() - t0:.1f} s): p50/p99 us  put {put[0]}/{put[1]}  get {get[0]}/{get[1]}  "
              f"is_exist {exist[0]}/{exist[1]}  put/get {put[0] / get[0]:.2f}",
              file=sys.stderr, flush=True)
    store_bench.out({})


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("cmd", nargs="?", default="")
    p.add_argument("name", nargs="?", default="")
    p.add_argument("--master")
    p.add_argument("--metadata")
    p.add_argument("--rounds", type=int, default=8)
    p.add_argument("--ops", type=int, default=3000)
    p.add_argument("--populate", action="store_true",
                   help="start the node with its default background populator (off: the "
                        "populator's first seconds slow small calls on this VM, bench/README.md)")
    p.add_argument("--wait", type=float, default=None,
                   help="seconds between the client's start and the first round (default 10 "
                        "with --populate, else 1)")
    a = p.parse_args()
    if a.cmd == "phase":
        phase(a)
        return
    logdir = Path(tempfile.mkdtemp(prefix="small_put_probe."))
    res = store_bench.run_impl("ours", sys.executable, logdir, phases=("probe",),
                               script=Path(__file__).resolve(), echo=True,
                               node_flags=[] if a.populate else ["--populate=false"],
                               phase_args=["--rounds", str(a.rounds), "--ops", str(a.ops)]
                               + (["--populate"] if a.populate else [])
                               + (["--wait", str(a.wait)] if a.wait is not None else []))
    if "error" in res.get("probe", {}):
        sys.exit(res["probe"]["error"])


if __name__ == "__main__":
    main()
