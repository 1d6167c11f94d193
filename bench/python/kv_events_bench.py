#!/usr/bin/env python3
"""What KV-cache events (`docs/kv-events.md`) cost the put path: the same puts through
`mooncake.store` against two masters started side by side in the same run, one with
`--enable_kv_events` (and a live subscriber draining the socket, as a router would) and one
without. Rounds alternate between the two so that the machine's drift hits both alike.

The subscriber is a process of its own, and the storage nodes run without the background
populator (its first seconds slow every process on a VM), so that the two sides differ only
by the events. Each round, against each master: `--ops` single puts of 4 KiB values (latency per call),
then `--batches` put_batch calls of 128 x 4 KiB (items/s), then a remove_all (every object
announced removed on the events side). Keys are decimal hashes, as a KV connector names
blocks. Reported: median and p99 of the single-put latency, the median batch throughput,
both per side, and on / off.

Usage (the venv holding the installed package, pyzmq and msgpack):
  .venv/bin/python bench/python/kv_events_bench.py [--rounds 5] [--ops 2000] [--batches 20]
      [--subscriber decode|count]
"""

import argparse
import multiprocessing
import os
import random
import statistics
import subprocess
import sys
import time
from pathlib import Path

from store_bench import free_port, wait_port  # the benches' shared helpers

KIB = 1024
MIB = 1024 * KIB
VALUE = b"k" * (4 * KIB)
BATCH = 128


def wait_for_port(port, timeout=20.0):
    if not wait_port(port, timeout):
        raise RuntimeError(f"nothing listens on {port}")


def script(name):
    return [str(Path(sys.executable).parent / name)]


class Side:
    """A master (events on or off), a storage node and a store client."""

    def __init__(self, events, decode=True):
        from mooncake.store import MooncakeDistributedStore

        self.name = "on" if events else "off"
        rpc, http, metrics = free_port(), free_port(), free_port()
        args = script("mooncake_master") + [
            f"--rpc_port={rpc}", "--rpc_address=127.0.0.1", f"--metrics_port={metrics}",
            "--metrics_host=127.0.0.1", "--enable_http_metadata_server=true",
            "--http_metadata_server_host=127.0.0.1", f"--http_metadata_server_port={http}",
        ]
        self.sub = None
        if events:
            endpoint = f"tcp://127.0.0.1:{free_port()}"
            args += ["--enable_kv_events", f"--kv_events_bind_endpoint={endpoint}"]
        env = dict(os.environ, MC_LOG_LEVEL="2")
        self.procs = [subprocess.Popen(args, stdin=subprocess.DEVNULL, env=env,
                                       stdout=subprocess.DEVNULL)]
        wait_for_port(rpc)
        metadata = f"http://127.0.0.1:{http}/metadata"
        node = script("mooncake_client") + [
            "--host=127.0.0.1", f"--port={free_port()}", f"--global_segment_size={512 * MIB}",
            f"--master_server_address=127.0.0.1:{rpc}", f"--metadata_server={metadata}",
            # Not the populator: on a VM that backs memory on first touch it slows every
            # process's small operations while it runs (bench/README.md, "The house moves").
            "--populate=false",
        ]
        self.procs.append(subprocess.Popen(node, stdin=subprocess.DEVNULL,
                                           stdout=subprocess.DEVNULL))
        time.sleep(1.0)
        self.store = MooncakeDistributedStore()
        rc = self.store.setup("localhost", metadata, 0, 64 * MIB, "tcp", "",
                              f"127.0.0.1:{rpc}")
        assert rc == 0, rc
        if events:
            self.sub = Drain(endpoint, decode)
        self.put_us = []
        self.batch_items_s = []

    def round(self, rng, ops, batches):
        s = self.store
        for _ in range(ops):
            key = str(rng.randrange(2**64))
            t0 = time.perf_counter()
            rc = s.put(key, VALUE)
            self.put_us.append((time.perf_counter() - t0) * 1e6)
            assert rc == 0, rc
        for _ in range(batches):
            keys = [str(rng.randrange(2**64)) for _ in range(BATCH)]
            t0 = time.perf_counter()
            rc = s.put_batch(keys, [VALUE] * BATCH)
            self.batch_items_s.append(BATCH / (time.perf_counter() - t0))
            assert rc == 0, rc
        s.remove_all()

    def close(self):
        self.store.close()
        if self.sub:
            self.sub.close()
        for p in reversed(self.procs):
            p.terminate()
            p.wait()


def drain(endpoint, decode, ready, stop, events):
    """The subscriber's process: reads (and with `decode`, decodes and counts the events of)
    every batch until told to stop; without `decode` it counts batches."""
    import msgpack
    import zmq

    ctx = zmq.Context()
    sock = ctx.socket(zmq.SUB)
    sock.setsockopt(zmq.SUBSCRIBE, b"")
    sock.setsockopt(zmq.RCVTIMEO, 100)
    sock.connect(endpoint)
    ready.set()
    while not stop.is_set():
        try:
            _, _, payload = sock.recv_multipart()
        except zmq.Again:
            continue
        n = len(msgpack.unpackb(payload)[1]) if decode else 1
        with events.get_lock():
            events.value += n
    sock.close(linger=0)
    ctx.term()


class Drain:
    """A subscriber that reads and decodes every batch, as a router does: in a process of its
    own, as a router is (a thread of this one would take the GIL from the puts it measures)."""

    def __init__(self, endpoint, decode):
        ctx = multiprocessing.get_context("spawn")
        self.stop = ctx.Event()
        ready = ctx.Event()
        self.counter = ctx.Value("q", 0)
        self.proc = ctx.Process(target=drain, args=(endpoint, decode, ready, self.stop, self.counter),
                                daemon=True)
        self.proc.start()
        if not ready.wait(30):
            raise RuntimeError("the subscriber process did not start")

    @property
    def events(self):
        return self.counter.value

    def close(self):
        self.stop.set()
        self.proc.join(10)


def p99(xs):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(len(xs) * 0.99))]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--ops", type=int, default=2000)
    ap.add_argument("--batches", type=int, default=20)
    ap.add_argument("--subscriber", choices=["decode", "count"], default="decode",
                    help="decode every batch as a router does (default), or only count the "
                    "batches: on a 2-core machine the decoding is CPU the puts lose, not "
                    "publishing's cost")
    a = ap.parse_args()
    sides = [Side(False), Side(True, a.subscriber == "decode")]
    try:
        rng = random.Random(1)
        for s in sides:  # warm-up: connections, the node's memory
            s.round(rng, 200, 4)
            s.put_us.clear()
            s.batch_items_s.clear()
        for r in range(a.rounds):
            for s in sides if r % 2 == 0 else reversed(sides):
                s.round(rng, a.ops, a.batches)
        time.sleep(0.5)
        print(f"load average: {os.getloadavg()[0]:.2f}; rounds={a.rounds} ops={a.ops} "
              f"batches={a.batches}x{BATCH}; {'events' if a.subscriber == 'decode' else 'batches'} received: {sides[1].sub.events}")
        print("| events | put 4 KiB p50 (µs) | p99 (µs) | put_batch 128 x 4 KiB (items/s, median) |")
        print("|---|---|---|---|")
        row = {}
        for s in sides:
            row[s.name] = (statistics.median(s.put_us), p99(s.put_us),
                           statistics.median(s.batch_items_s))
            p50, tail, items = row[s.name]
            print(f"| {s.name} | {p50:.0f} | {tail:.0f} | {items:,.0f} |")
        on, off = row["on"], row["off"]
        print(f"| on / off | {on[0] / off[0]:.3f} | {on[1] / off[1]:.3f} | "
              f"{on[2] / off[2]:.3f} |")
    finally:
        for s in sides:
            s.close()


if __name__ == "__main__":
    main()
