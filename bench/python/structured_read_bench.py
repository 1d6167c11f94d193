#!/usr/bin/env python3
"""Structured-store reads (`mooncake.structured_object_store`) by the store's fast paths,
beside the same reads by plain `get`, in the same run.

Starts a `mooncake_master` and a storage node (`mooncake_client`) from this interpreter's
venv on free 127.0.0.1 ports, and a client without a segment of its own, so every byte
crosses the data plane. One structured object holds a float32 member of `--mib` MiB
(4 KiB rows, stored in 4 chunks) and 16 small members of 64 KiB. Each phase runs `--iters`
times; latency median and p99 in ms:

- `full`: `materialize` of the big member (get_into_ranges into a fresh array);
- `slice`: `slice_member` of 64 rows (256 KiB) across a chunk boundary;
- `into`: `materialize_into` the big member, into a numpy destination;
- `small`: `materialize` of the 16 small members (one get_into each, plus the metadata).

`fast` is the store as it is; `get` is the same store with its fast paths hidden
(`batch_get_into`, `get_into`, `get_into_ranges`, `register_buffer`), so the module falls back
to a `get` of every chunk a read covers, as it does (and upstream's does) on a store without
them. With `--baseline-python PY`, the script also runs under that interpreter (another
venv, e.g. the package before a change) and its `fast` column is printed as `baseline`.

Usage:
  structured_read_bench.py [--mib 32] [--iters 30] [--baseline-python PY] [--json out.json]
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from store_bench import free_port, pct, stop_all, wait_port  # noqa: E402

MIB = 1 << 20
BIN = Path(sys.executable).parent
ROW_BYTES = 4096
HIDDEN = {"batch_get_into", "get_into", "get_into_ranges", "register_buffer",
          "unregister_buffer"}


class WithoutFastPaths:
    """A store whose fast paths are missing: reads fall back to `get`."""

    def __init__(self, store):
        self._store = store

    def __getattr__(self, name):
        if name in HIDDEN:
            raise AttributeError(name)
        return getattr(self._store, name)


def cluster(segment):
    rpc, http = free_port(), free_port()
    procs = [subprocess.Popen([
        str(BIN / "mooncake_master"), f"--rpc_port={rpc}", "--rpc_address=127.0.0.1",
        f"--metrics_port={free_port()}", "--metrics_host=127.0.0.1",
        "--enable_http_metadata_server=true", "--http_metadata_server_host=127.0.0.1",
        f"--http_metadata_server_port={http}"], stdin=subprocess.DEVNULL)]
    assert wait_port(rpc), "master did not start"
    node = subprocess.Popen([
        str(BIN / "mooncake_client"), "--host=127.0.0.1", f"--port={free_port()}",
        f"--global_segment_size={segment}", f"--master_server_address=127.0.0.1:{rpc}",
        f"--metadata_server=http://127.0.0.1:{http}/metadata"],
        stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, text=True)
    procs.append(node)
    for line in node.stdout:
        if line.strip() == "mooncake_client ready":
            break
    else:
        stop_all(procs)
        raise SystemExit("storage node exited before `ready`")
    return procs, rpc, http


def timed(fn, iters):
    fn()  # warm: first-touch of the arrays, connections
    samples = []
    for _ in range(iters):
        t0 = time.perf_counter()
        fn()
        samples.append((time.perf_counter() - t0) * 1e3)
    samples.sort()
    return {"p50_ms": round(statistics.median(samples), 3), "p99_ms": round(pct(samples, 99), 3)}


def phases(transfer, ref, grid, iters):
    import numpy as np

    rows = grid.shape[0]
    cut = transfer.read_spec(ref).select_members(["grid"]).slice_member(
        "grid", 0, rows // 4 - 32, rows // 4 + 32)
    whole = transfer.read_spec(ref).select_members(["grid"])
    small = transfer.read_spec(ref).select_members([f"s{i}" for i in range(16)])
    dest = np.empty_like(grid)
    assert np.array_equal(transfer.materialize(cut).objects["grid"],
                          grid[rows // 4 - 32: rows // 4 + 32])
    return {
        "full": timed(lambda: transfer.materialize(whole), iters),
        "slice": timed(lambda: transfer.materialize(cut), iters),
        "into": timed(lambda: transfer.materialize_into(whole, {"grid": dest}), iters),
        "small": timed(lambda: transfer.materialize(small), iters),
    }


def measure(mib, iters):
    import numpy as np

    from mooncake.store import MooncakeDistributedStore
    from mooncake.structured_object_store import MooncakeBundleTransfer, StructuredObjectPayload

    procs, rpc, http = cluster(4 * mib * MIB + 256 * MIB)
    try:
        store = MooncakeDistributedStore()
        assert store.setup("127.0.0.1", f"http://127.0.0.1:{http}/metadata", 0, 64 * MIB, "tcp",
                           "", f"127.0.0.1:{rpc}") == 0
        grid = np.random.default_rng(0).random((mib * MIB // ROW_BYTES, ROW_BYTES // 4),
                                               dtype=np.float32)
        members = {"grid": grid, **{f"s{i}": np.full(16384, i, dtype=np.float32)
                                    for i in range(16)}}
        transfer = MooncakeBundleTransfer(store, key_prefix="bench")
        ref = transfer.put_structured_object(StructuredObjectPayload(buffers=members),
                                             chunk_bytes=mib * MIB // 4)
        out = {"fast": phases(transfer, ref, grid, iters),
               "get": phases(MooncakeBundleTransfer(WithoutFastPaths(store), key_prefix="bench"),
                             ref, grid, iters)}
        store.close()
        return out
    finally:
        stop_all(procs)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--mib", type=int, default=32)
    ap.add_argument("--iters", type=int, default=30)
    ap.add_argument("--baseline-python")
    ap.add_argument("--json")
    ap.add_argument("--raw", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    result = measure(args.mib, args.iters)
    if args.raw:
        print("RESULT " + json.dumps(result))
        return
    if args.baseline_python:
        proc = subprocess.run([args.baseline_python, __file__, "--raw", f"--mib={args.mib}",
                               f"--iters={args.iters}"], capture_output=True, text=True,
                              env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"})
        line = [x for x in proc.stdout.splitlines() if x.startswith("RESULT ")]
        if not line:
            raise SystemExit("baseline run failed:\n" + proc.stderr[-3000:])
        result["baseline"] = json.loads(line[-1][len("RESULT "):])["fast"]
    result["load_avg_1m"] = os.getloadavg()[0]
    print(f"structured reads, {args.mib} MiB member in 4 chunks, {args.iters} iterations, "
          f"load {result['load_avg_1m']:.2f}")
    columns = [c for c in ("fast", "get", "baseline") if c in result]
    print(f"{'phase':8}" + "".join(f"{c + ' p50/p99 ms':>26}" for c in columns))
    for phase in ("full", "slice", "into", "small"):
        cells = [f"{result[c][phase]['p50_ms']:>12.3f} /{result[c][phase]['p99_ms']:>10.3f}"
                 for c in columns]
        print(f"{phase:8}" + "".join(f"{cell:>26}" for cell in cells))
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
