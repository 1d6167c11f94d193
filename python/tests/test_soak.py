"""Concurrency soak: a real master, a real storage node (`mooncake_client`), 64 threads
sharing one `MooncakeDistributedStore` in this process and three more client processes with
8 threads each, all doing random mixed operations (put, upsert, get, get_buffer, is_exist,
batch_is_exist, put_batch, upsert_batch, get_batch, batch_put_from, batch_get_into, get_size, remove,
batch_remove, remove_by_regex) on one key space about twice the cluster's capacity, so
eviction runs all along. The workload itself is in `soak_worker.py`.

Bounded by `MC_SOAK_SECONDS` (default 60). Fails on: a return code outside
`soak_worker.EXPECTED`, a read that is not exactly some version written for its key, a thread
or process not done `JOIN_SLACK` seconds after the deadline (deadlock), a process that
crashed, and resident memory of the master, the node or a client growing by more than
`rss_bound(start)` between the end of the warm-up and the end of the run.
"""

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

from conftest import MIB, Master, Node
from soak_worker import EXPECTED, Stats, run_threads

SECONDS = float(os.environ.get("MC_SOAK_SECONDS", "60"))
THREADS = 64
PROCESSES = 3
PROCESS_THREADS = 8
NODE_SEGMENT = 96 * MIB
WORKER_SEGMENT = 16 * MIB  # the first extra process contributes memory too
# Average value ~82 KiB: 2500 keys are ~200 MiB, about twice the 112 MiB of segments.
KEYS = 2500
JOIN_SLACK = 60.0
HERE = Path(__file__).resolve().parent


def rss(pid):
    """VmRSS of `pid` in bytes, or None if it is gone."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def rss_bound(start):
    """Allowed growth after warm-up: generous (allocator slack, thread stacks touched late),
    but far below what a per-operation leak over a minute of ~10^5 operations would add."""
    return 64 * MIB + start // 4


def test_concurrency_soak():
    from mooncake.store import MooncakeDistributedStore

    master = Master()
    node = None
    workers = []
    store = None
    try:
        node = Node(master, NODE_SEGMENT, shards=2)
        store = MooncakeDistributedStore()
        assert store.setup("127.0.0.1", master.metadata, 0, 128 * MIB, "tcp", "",
                           master.addr) == 0
        for i in range(PROCESSES):
            args = {
                "master": master.addr,
                "metadata": master.metadata,
                "segment": WORKER_SEGMENT if i == 0 else 0,
                "local_buffer": 64 * MIB,
                "threads": PROCESS_THREADS,
                "seconds": SECONDS,
                "keys": KEYS,
                "seed": 100 + i,
                "join_slack": JOIN_SLACK,
            }
            w = subprocess.Popen([sys.executable, str(HERE / "soak_worker.py"), json.dumps(args)],
                                 stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                                 cwd=HERE)
            workers.append(w)
        for w in workers:
            line = w.stdout.readline().strip()
            assert line == "ready", f"soak worker did not set up: {line!r}"
        for w in workers:
            w.stdin.write("go\n")
            w.stdin.flush()

        pids = {"master": master.proc.pid, "node": node.proc.pid, "client": os.getpid()}
        pids.update({f"worker{i}": w.pid for i, w in enumerate(workers)})
        samples = {}

        def sampler():
            warm = min(15.0, SECONDS / 4)
            time.sleep(warm)  # the schedule is the subject: RSS after warm-up vs at the end
            samples["start"] = {n: rss(p) for n, p in pids.items()}
            time.sleep(max(0.0, SECONDS - warm - 2))
            samples["end"] = {n: rss(p) for n, p in pids.items()}

        t_sampler = threading.Thread(target=sampler, daemon=True)
        t_sampler.start()
        t0 = time.monotonic()
        stats, hung = run_threads(store, THREADS, SECONDS, KEYS, 1, JOIN_SLACK)
        took = time.monotonic() - t0
        t_sampler.join(timeout=JOIN_SLACK)

        outs = []
        for i, w in enumerate(workers):
            line = read_line(w, t0 + SECONDS + JOIN_SLACK)
            assert line is not None, f"soak worker {i} did not finish: deadlock? ({w.poll()})"
            outs.append(json.loads(line))
        # Every process is done: the workers may close (one of them serves a segment).
        for i, w in enumerate(workers):
            out, _ = w.communicate("close\n", timeout=30)
            assert w.returncode == 0, f"soak worker {i} exited with {w.returncode}"
            assert json.loads(out.strip().splitlines()[-1]) == {"close_rc": 0}
        assert master.proc.poll() is None, "mooncake_master died during the soak"
        assert node.proc.poll() is None, "mooncake_client died during the soak"

        total = Stats()
        total.merge(stats)
        for o in outs:
            total.merge(Stats.from_json(o["stats"]))
            hung += o["hung"]
        n_ops = sum(total.ops.values())
        print(f"\nsoak: {SECONDS:.0f} s, {THREADS} threads + {PROCESSES}x{PROCESS_THREADS} "
              f"threads in other processes, {KEYS} keys; {n_ops} operations "
              f"({n_ops / took:.0f}/s); wall {took:.1f} s")
        print("  per op: " + ", ".join(f"{k} {v}" for k, v in sorted(total.ops.items())))
        print("  slowest: " + ", ".join(f"{k} {v * 1000:.0f} ms"
                                        for k, v in sorted(total.slowest.items())))
        print(f"  reads: {total.reads['ok']} verified, {total.reads['miss']} misses, "
              f"{total.bad_data_count} wrong")
        print("  non-zero codes: " + ", ".join(
            f"{k} {EXPECTED.get(int(k.split(':')[1]), 'UNEXPECTED')} x{v}"
            for k, v in sorted(total.codes.items())))
        for n in pids:
            s, e = samples["start"].get(n), samples["end"].get(n)
            print(f"  rss {n}: {s / MIB:.1f} MiB after warm-up -> {e / MIB:.1f} MiB at the end "
                  f"({(e - s) / MIB:+.1f} MiB)")

        assert not hung, f"threads still running {JOIN_SLACK} s after the deadline: {hung}"
        assert total.unexpected_count == 0, (
            f"{total.unexpected_count} unexpected results, first: {total.unexpected}")
        assert total.bad_data_count == 0, (
            f"{total.bad_data_count} reads returned wrong bytes, first: {total.bad_data}")
        assert total.reads["ok"] > 0 and total.ops.get("put", 0) > 0
        assert master_evicted(master) > 0, "the key space never filled the cluster"
        for n in pids:
            s, e = samples["start"][n], samples["end"][n]
            assert s and e, f"no RSS sample of {n}"
            assert e - s <= rss_bound(s), (
                f"{n} grew from {s / MIB:.1f} to {e / MIB:.1f} MiB after warm-up")
    finally:
        for w in workers:
            if w.poll() is None:
                w.kill()
                w.wait()
        if store is not None:
            store.close()
        if node is not None:
            node.stop()
        assert master.stop() == 0, "mooncake_master should exit 0 on SIGTERM"


def read_line(proc, deadline):
    """The next stdout line of `proc`, or None if it does not come by `deadline`
    (time.monotonic()) or the process ends first."""
    got = []
    t = threading.Thread(target=lambda: got.append(proc.stdout.readline()), daemon=True)
    t.start()
    t.join(timeout=max(1.0, deadline - time.monotonic()))
    return got[0].strip() if got and got[0] else None


def master_evicted(master):
    """Objects evicted so far, from the master's /metrics page."""
    import urllib.request

    page = urllib.request.urlopen(
        f"http://127.0.0.1:{master.metrics_port}/metrics", timeout=10).read().decode()
    total = 0.0
    for line in page.splitlines():
        if line.startswith("master_evicted_key_count "):
            total += float(line.split()[-1])
    return total
