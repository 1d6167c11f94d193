#!/usr/bin/env python3
"""Where a same-host 4 MiB put spends its time: page faults in fresh segment memory.

For each node configuration, in one run, next to a plain memcpy measured in the same process:

- `populate`: a storage node with default settings: an ordinary shared segment (4 KiB pages)
  whose head the node populates before it reports ready and the rest after, as transparent
  hugepages where the kernel collapses them (`--populate`, the default);
- `nopopulate`: the same with `--populate=false` (the default before the populator: pages
  are faulted in by the puts that first write them);
- `eager`: `--populate=eager` (the populator walks whatever else runs; by default it takes a
  chunk only while a CPU is free for it, and its lead populates ahead of puts that reach it);
- `prefault`: `--prefault` (the node populates every page before it reports ready);
- `hugepages+prefault`: `MC_STORE_USE_HUGEPAGE=1 --prefault` (2 MiB hugetlb pages; only when
  the pool has enough free pages: `echo 600 > /proc/sys/vm/nr_hugepages` as root).

Each configuration starts a master and a node (1 GiB segment) on 127.0.0.1 and, as soon as
the node prints ready, a client without a segment of its own, which puts 48 fresh 4 MiB keys
into never-used segment memory (`first`: a fresh node's first puts), then 6 batches of
`batch_put_from` 8 x 4 MiB (`batch`, fresh keys, the next 192 MiB of the segment), 16 more
back to back (`fill`, to 896 MiB: past the head a node's start populates, so the puts meet
its background walk or run past it), removes them all, and puts 48 more, which the
allocator places in the ranges just freed (`reuse`).
Two memcpy baselines: `memcpy`, 4 MiB between the same two buffers (hot in the cache), and
`spread`, 4 MiB into 48 different already-faulted destinations in turn, as the puts write
(192 MiB: the destination is not in the cache). The client reaches the node's segment through
the same-host shared mapping (memcpy, no TCP). Reported per phase: the median put time as
MiB/s (a batch: its 32 MiB over its time), the put / memcpy ratio, p90 and p99, the client's
and node's minor page faults per 4 MiB (from getrusage and /proc/PID/stat), and the client
process's CPU time per 4 MiB (every thread, the copy helpers of `MC_STORE_COPY_THREADS`
included; getrusage). Per configuration also: how long the node took from its start to ready,
and the node's memory once its populator is done (or 20 s passed): RSS (anonymous + shared
pages it maps) and how much shared memory the system gained, against the segment's size.

A VM whose hypervisor takes back the guest's free memory (virtio-balloon free page
reporting: `/sys/module/page_reporting/parameters/page_reporting_order` exists and is at
most 10) backs each page again on its next first touch, at 0.3-1.1 GB/s on this project's VM,
below any put; the run prints the setting. `echo 11 > ...page_reporting_order` as root stops
the reporting (the order is above the largest block), so that once touched the guest's
memory stays backed, as on bare metal.

Usage: .venv/bin/python bench/python/put_fault_bench.py [--rounds 3] [--json out.json]
       [--configs populate,nopopulate,prefault]
"""

import argparse
import ctypes
import json
import os
import resource
import statistics
import re
import subprocess
import sys
import tempfile
import time

# Run as a script, so this directory is on sys.path.
from store_bench import free_port, stop_all, wait_port

MIB = 1 << 20
VALUE = 4 * MIB
KEYS = 48
SEGMENT = "1024 MB"
SEGMENT_BYTES = 1024 * MIB
BATCH = 8
BATCHES = 6
# Batches right after `batch`, to 896 MiB of the 1 GiB segment: past what a start's head
# covers on this VM, so that the puts meet the background walk (or run past it).
FILL_BATCHES = 16
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


def status_kib(pid, field):
    for line in open(f"/proc/{pid}/status"):
        if line.startswith(field + ":"):
            return int(line.split()[1])
    return 0


def shmem_kib():
    for line in open("/proc/meminfo"):
        if line.startswith("Shmem:"):
            return int(line.split()[1])
    return 0


def start_node(config, env, rpc, meta, log):
    """The node in `config`, its log to the file `log`; returns (process, its shard log line,
    seconds from start to ready)."""
    extra = []
    if "prefault" in config:
        extra.append("--prefault")
    if config == "nopopulate":
        extra.append("--populate=false")
    if config == "eager":
        extra.append("--populate=eager")
    node_port = free_port()
    t0 = time.perf_counter()
    node = subprocess.Popen(
        [f"{BIN}/mooncake_client", "--host=127.0.0.1", f"--port={node_port}",
         f"--global_segment_size={SEGMENT}", f"--master_server_address=127.0.0.1:{rpc}",
         f"--metadata_server={meta}", *extra],
        stdout=subprocess.PIPE, stderr=log, stdin=subprocess.DEVNULL, env=env)
    backing = ""
    for line in node.stdout:
        text = line.decode(errors="replace").strip()
        if text.startswith("shard "):
            backing = text
        if text == "mooncake_client ready":
            break
    return node, backing, time.perf_counter() - t0


def timed(node_pid, calls, per_call_bytes, fn):
    """Runs `fn(i)` for i in range(calls), each timed; the phase's figures."""
    u0 = resource.getrusage(resource.RUSAGE_SELF)
    n0 = minflt(node_pid)
    ts = []
    for i in range(calls):
        t = time.perf_counter()
        fn(i)
        ts.append(time.perf_counter() - t)
    u1 = resource.getrusage(resource.RUSAGE_SELF)
    n1 = minflt(node_pid)
    cpu = (u1.ru_utime + u1.ru_stime) - (u0.ru_utime + u0.ru_stime)
    per_4m = calls * per_call_bytes / VALUE
    ts.sort()
    return {
        "mib_s": per_call_bytes / MIB / statistics.median(ts),
        "p90_ms": ts[int(len(ts) * 0.9)] * 1e3,
        "p99_ms": ts[int(len(ts) * 0.99)] * 1e3,
        "client_faults_per_put": (u1.ru_minflt - u0.ru_minflt) / per_4m,
        "node_faults_per_put": (n1 - n0) / per_4m,
        "client_cpu_ms_per_put": cpu * 1e3 / per_4m,
    }


def memory_after_populate(node_pid, shmem_before_kib):
    """Waits until the node maps its whole segment (or 20 s); its memory figures in MiB."""
    seg_kib = SEGMENT_BYTES // 1024
    deadline = time.time() + 20
    while time.time() < deadline and status_kib(node_pid, "RssShmem") < seg_kib:
        time.sleep(0.1)
    return {
        "rss_mib": status_kib(node_pid, "VmRSS") / 1024,
        "rss_anon_mib": status_kib(node_pid, "RssAnon") / 1024,
        "rss_shmem_mib": status_kib(node_pid, "RssShmem") / 1024,
        "system_shmem_growth_mib": (shmem_kib() - shmem_before_kib) / 1024,
    }


def one(config):
    """Master + node in `config`, then the first, batch and reuse phases; a dict of figures."""
    from mooncake.store import MooncakeDistributedStore
    from store_bench import Registered

    env = dict(os.environ, MC_LOG_LEVEL="2")
    if "hugepages" in config:
        env["MC_STORE_USE_HUGEPAGE"] = "1"
    rpc, http, metrics = free_port(), free_port(), free_port()
    procs = []
    log = tempfile.TemporaryFile()
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
        shmem_before = shmem_kib()
        # The node logs at info, for its populator's lines.
        node_env = dict(env, RUST_LOG="info")
        node, backing, ready_s = start_node(config, node_env, rpc, meta, log)
        procs.append(node)
        store = MooncakeDistributedStore()
        rc = store.setup("127.0.0.1", meta, 0, 64 * MIB, "tcp", "", f"127.0.0.1:{rpc}")
        if rc != 0:
            raise RuntimeError(f"setup returned {rc}")
        value = os.urandom(VALUE)
        buf = Registered(store, BATCH * VALUE)
        ptrs = [buf.ptr + j * VALUE for j in range(BATCH)]

        def put(prefix):
            def call(i):
                if store.put(f"{prefix}{i}", value) != 0:
                    raise RuntimeError("put failed")
            return call

        def batch(i):
            keys = [f"b{i}_{j}" for j in range(BATCH)]
            if store.batch_put_from(keys, ptrs, [VALUE] * BATCH) != [0] * BATCH:
                raise RuntimeError("batch_put_from failed")

        out = {"node": backing, "ready_s": ready_s}
        out["first"] = timed(node.pid, KEYS, VALUE, put("c"))
        out["batch"] = timed(node.pid, BATCHES, BATCH * VALUE, batch)
        out["fill"] = timed(node.pid, FILL_BATCHES, BATCH * VALUE,
                            lambda i: batch(BATCHES + i))
        for i in range(KEYS):
            store.remove(f"c{i}")
        for i in range(BATCHES + FILL_BATCHES):
            for j in range(BATCH):
                store.remove(f"b{i}_{j}")
        out["reuse"] = timed(node.pid, KEYS, VALUE, put("r"))
        out["memory"] = memory_after_populate(node.pid, shmem_before)
        out["memcpy_mib_s"] = memcpy_mib_s()
        out["memcpy_spread_mib_s"] = memcpy_spread_mib_s()
        out["populator"] = populator_log(log)
        store.close()
        return out
    finally:
        stop_all(procs)


PHASES = ("first", "batch", "fill", "reuse")


def populator_log(log):
    """What the node's log says its populator did: the head populated before ready (MiB),
    and once the walk ended, the chunks its lead populated and those puts touched first
    (`None` for what the log does not say: an older build, or the populator off)."""
    log.seek(0)
    text = log.read().decode(errors="replace")
    head = re.search(r"(\d+) bytes of the segment populated before ready", text)
    lead = re.search(r"(\d+) chunks populated by the lead ahead of puts, (\d+) overtaken by "
                     r"them, (\d+) lead back-offs", text)
    return {
        "head_mib": int(head.group(1)) / MIB if head else None,
        "lead_chunks": int(lead.group(1)) if lead else None,
        "overtaken_chunks": int(lead.group(2)) if lead else None,
        "lead_backoffs": int(lead.group(3)) if lead else None,
    }


def report(configs, runs):
    print(f"\n{'config':20s} {'phase':6s} {'put MiB/s':>10s} {'memcpy':>8s} {'ratio':>6s} "
          f"{'spread':>7s} {'ratio':>6s} {'p90 ms':>7s} {'p99 ms':>7s} "
          f"{'faults/4MiB (client, node)':>27s} {'client CPU ms/4MiB':>19s}")
    for c in configs:
        med = lambda f: statistics.median(f(x) for x in runs[c])
        for ph in PHASES:
            put = med(lambda x: x[ph]["mib_s"])
            mc = med(lambda x: x["memcpy_mib_s"])
            ratio = med(lambda x: x[ph]["mib_s"] / x["memcpy_mib_s"])
            sp = med(lambda x: x["memcpy_spread_mib_s"])
            sratio = med(lambda x: x[ph]["mib_s"] / x["memcpy_spread_mib_s"])
            print(f"{c:20s} {ph:6s} {put:10.0f} {mc:8.0f} {ratio:6.0%} {sp:7.0f} {sratio:6.0%} "
                  f"{med(lambda x: x[ph]['p90_ms']):7.2f} {med(lambda x: x[ph]['p99_ms']):7.2f} "
                  f"{med(lambda x: x[ph]['client_faults_per_put']):>14.0f}, "
                  f"{med(lambda x: x[ph]['node_faults_per_put']):<11.0f} "
                  f"{med(lambda x: x[ph]['client_cpu_ms_per_put']):19.3f}")
    print(f"\n{'config':20s} {'start to ready s':>17s} {'node RSS MiB':>13s} {'of it shared':>13s} "
          f"{'anon':>6s} {'system shmem growth MiB':>24s} {'head MiB (per round)':>21s}"
          f"   (segment {SEGMENT_BYTES // MIB} MiB)")
    for c in configs:
        med = lambda f: statistics.median(f(x) for x in runs[c])
        m = lambda k: med(lambda x: x["memory"][k])
        heads = " ".join("-" if x["populator"]["head_mib"] is None
                         else f"{x['populator']['head_mib']:.0f}" for x in runs[c])
        print(f"{c:20s} {med(lambda x: x['ready_s']):17.3f} {m('rss_mib'):13.0f} "
              f"{m('rss_shmem_mib'):13.0f} {m('rss_anon_mib'):6.0f} "
              f"{m('system_shmem_growth_mib'):24.0f} {heads:>21s}")


def page_reporting():
    """How this machine's hypervisor takes back free guest memory, as far as the guest says."""
    try:
        order = int(open("/sys/module/page_reporting/parameters/page_reporting_order").read())
    except (OSError, ValueError):
        return "none (no page_reporting module)"
    if order > 10:
        return f"off (order {order}: freed memory stays backed)"
    return f"on, order {order} (freed memory is backed again on first touch)"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--json", default="")
    ap.add_argument("--configs", default="populate,nopopulate,prefault")
    args = ap.parse_args()
    configs = args.configs.split(",")
    if free_hugepages() >= HUGEPAGES_NEEDED:
        configs.append("hugepages+prefault")
    else:
        print(f"(hugepages+prefault skipped: {free_hugepages()} free hugepages, need "
              f"{HUGEPAGES_NEEDED}; as root: echo 600 > /proc/sys/vm/nr_hugepages)")
    print(f"free page reporting: {page_reporting()}")
    runs = {c: [] for c in configs}
    for r in range(args.rounds):
        for c in configs:
            res = one(c)
            runs[c].append(res)
            pop = res["populator"]
            head = "" if pop["head_mib"] is None else f" (head {pop['head_mib']:.0f} MiB)"
            print(f"round {r + 1} {c}: ready in {res['ready_s']:.2f} s{head}, " + ", ".join(
                f"{ph} {res[ph]['mib_s']:.0f} MiB/s ({res[ph]['mib_s'] / res['memcpy_mib_s']:.0%}"
                f" of memcpy {res['memcpy_mib_s']:.0f}), faults/4MiB client "
                f"{res[ph]['client_faults_per_put']:.0f} node {res[ph]['node_faults_per_put']:.0f}"
                for ph in PHASES), flush=True)
    report(configs, runs)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(runs, f, indent=1)


if __name__ == "__main__":
    main()
