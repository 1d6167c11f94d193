#!/usr/bin/env python3
"""What a node's background populator costs the machine's small operations, second by second.

    .venv/bin/python bench/python/populate_probe.py [--populate true|false] [--size 2147483648]
        [--seconds 15]

Starts a master and one storage node (`mooncake_client --populate=...`, a segment of
`--size` bytes) from this venv, connects a client without a segment, then each second prints
how many `is_exist` calls it made in one second (the client and the master only: the node is
not on that path), the p50 of 200 4 KiB `get`s, and the node's RSS (how far the segment is
populated). Run it with `--populate true` and `--populate false` to see the populator's
first seconds beside none (`bench/README.md`, "The house moves").
"""

import argparse
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from store_bench import free_port, wait_port  # noqa: E402

BIN = Path(sys.executable).parent


def start(a):
    rpc, meta, adm = free_port(), free_port(), free_port()
    master = subprocess.Popen(
        [str(BIN / "mooncake_master"), f"--rpc_port={rpc}", "--rpc_address=127.0.0.1",
         f"--metrics_port={adm}", "--enable_http_metadata_server=true",
         "--http_metadata_server_host=127.0.0.1", f"--http_metadata_server_port={meta}"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    if not wait_port(rpc, 30.0):
        sys.exit("the master did not start")
    t0 = time.time()
    node = subprocess.Popen(
        [str(BIN / "mooncake_client"), "--host=127.0.0.1", f"--port={free_port()}",
         f"--global_segment_size={a.size}", f"--master_server_address=127.0.0.1:{rpc}",
         f"--metadata_server=http://127.0.0.1:{meta}/metadata", f"--populate={a.populate}"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    for line in node.stdout:
        if line.strip() == "mooncake_client ready":
            break
    print(f"node ready after {time.time() - t0:.2f} s (--populate={a.populate})")
    return master, node, rpc, meta, t0


def second(store, node, t0):
    end, calls = time.time() + 1, 0
    while time.time() < end:
        store.is_exist("k")
        calls += 1
    lat = []
    for _ in range(200):
        t = time.perf_counter()
        store.get("k")
        lat.append(time.perf_counter() - t)
    lat.sort()
    with open(f"/proc/{node.pid}/status") as f:
        rss_kib = int(next(x for x in f if x.startswith("VmRSS")).split()[1])
    print(f"t={time.time() - t0:5.1f} s  is_exist {calls}/s  get 4 KiB p50 "
          f"{lat[100] * 1e6:.0f} us  node RSS {rss_kib // 1024} MiB", flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--populate", default="true", choices=["true", "false"])
    ap.add_argument("--size", default="2147483648")
    ap.add_argument("--seconds", type=int, default=15)
    a = ap.parse_args()
    master, node, rpc, meta, t0 = start(a)
    from mooncake.store import MooncakeDistributedStore
    store = MooncakeDistributedStore()
    try:
        rc = store.setup("127.0.0.1", f"http://127.0.0.1:{meta}/metadata", 0, 16 << 20, "tcp",
                         "", f"127.0.0.1:{rpc}")
        if rc != 0:
            sys.exit(f"setup failed: {rc}")
        store.put("k", b"x" * 4096)
        for _ in range(a.seconds):
            second(store, node, t0)
    finally:
        store.close()
        for p in (node, master):
            p.terminate()
            p.wait()


if __name__ == "__main__":
    main()
