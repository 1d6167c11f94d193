#!/usr/bin/env python3
"""The disk tier (`docs/tiering.md`), measured beside its baselines in the same run.

Every phase starts its own `mooncake_master` and storage node (`mooncake_client`) from the
interpreter's venv on free 127.0.0.1 ports, and a client process without a segment of its own,
so every byte crosses the data plane as in production. The disk directory is `--dir` (default:
a fresh directory under /var/tmp, which is on the machine's disk; /tmp or /dev/shm may be
memory).

1. `read`: 4 MiB objects made disk-only (their memory copies moved to disk), then read with
   `get` one after another (the client is on the node's host, so it reads the node's files
   itself), and again by a client with same-host sharing off (`MC_STORE_SHM=0`: through the
   node's disk listener and loopback TCP, as a reader on another host); beside them, the same
   files read with O_DIRECT sequentially by this process (the device's rate through the same filesystem, no mooncake in between), once
   before the gets and once after (a VM's disk caches on its host, out of the guest's reach:
   the first pass warms it for both).
   `read-own`: the same, read by a store from its own disk (`setup(...,
   enable_ssd_offload=True)`), so no network between the file and the reader.
2. `offload`: 4 MiB puts into a node with room for all of them, tier off against eager offload
   on (the node writes every object to disk in the background): put throughput, same run.
3. `working-set`: a pool of 64 MiB and 256 MiB of 1 MiB objects (4x DRAM); every object read
   back and checked; get latency p50/p99 of memory hits beside disk hits.
4. `replay`: a multi-turn chat replay in the shape of the original's benchmark: conversations
   whose every turn re-reads its whole prefix (blocks of 256 KiB) and appends new blocks, over
   a pool too small for the working set; hit rate per round with and without the tier. With
   `--plot DIR`, `tier_replay_hit_rate.png` is written there.

Usage:
  tier_bench.py [--phases read,read-own,offload,working-set,replay] [--dir DIR] [--json out.json]
                [--plot DIR] [--offload-rounds N]
"""

import argparse
import hashlib
import json
import mmap
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from store_bench import free_port, pct, stop_all, wait_port

MIB = 1 << 20
NO_SPACE = -200
BIN = Path(sys.executable).parent


def value_of(key, size):
    seed = hashlib.sha256(key.encode()).digest()
    return (seed * (size // len(seed) + 1))[:size]


class Cluster:
    """A master and one storage node; with `disk`, both with the tier on."""

    def __init__(self, segment, disk=None, master_flags=(), node_flags=()):
        self.procs = []
        self.rpc = free_port()
        self.http = free_port()
        flags = ["--enable_offload=true"] if disk else []
        self.procs.append(subprocess.Popen([
            str(BIN / "mooncake_master"), f"--rpc_port={self.rpc}", "--rpc_address=127.0.0.1",
            f"--metrics_port={free_port()}", "--metrics_host=127.0.0.1",
            "--enable_http_metadata_server=true", "--http_metadata_server_host=127.0.0.1",
            f"--http_metadata_server_port={self.http}", "--default_kv_lease_ttl=200",
            *flags, *master_flags], stdin=subprocess.DEVNULL))
        assert wait_port(self.rpc), "master did not start"
        env = dict(os.environ)
        self.node_metrics = free_port()
        if segment is None:  # a master alone
            self.segment = None
            return
        node = [str(BIN / "mooncake_client"), "--host=127.0.0.1", f"--port={free_port()}",
                f"--metrics_port={self.node_metrics}",
                f"--global_segment_size={segment}", f"--master_server_address={self.addr}",
                f"--metadata_server={self.metadata}",
                # Not the background populator: on a VM that backs memory on first touch it
                # slows every process while it runs, and each round starts a fresh node
                # (bench/README.md, "The house moves").
                "--populate=false", *node_flags]
        if disk:
            env["MOONCAKE_OFFLOAD_FILE_STORAGE_PATH"] = str(disk)
            node.append("--enable_offload=true")
        p = subprocess.Popen(node, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, text=True,
                             env=env)
        self.procs.append(p)
        for line in p.stdout:
            if line.strip() == "mooncake_client ready":
                break
        else:
            raise SystemExit("storage node exited before `ready`")
        self.segment = None

    @property
    def addr(self):
        return f"127.0.0.1:{self.rpc}"

    @property
    def metadata(self):
        return f"http://127.0.0.1:{self.http}/metadata"

    def client(self):
        from mooncake.store import MooncakeDistributedStore

        s = MooncakeDistributedStore()
        assert s.setup("127.0.0.1", self.metadata, 0, 64 * MIB, "tcp", "", self.addr) == 0
        return s

    def disk_metric(self, name):
        """The node's `mooncake_disk_<name>` (summed over its disks), 0 without a tier."""
        import urllib.request

        url = f"http://127.0.0.1:{self.node_metrics}/metrics"
        with urllib.request.urlopen(url, timeout=5) as r:
            text = r.read().decode()
        full = f"mooncake_disk_{name}"
        return sum(float(line.split()[-1]) for line in text.splitlines()
                   if line.startswith(full + "{"))

    def stop(self):
        stop_all(self.procs)


def put_retrying(s, key, value, timeout=60.0):
    deadline = time.monotonic() + timeout
    while True:
        rc = s.put(key, value)
        if rc != NO_SPACE or time.monotonic() > deadline:
            return rc
        time.sleep(0.01)


def kinds(s, key):
    return ["disk" if r.is_local_disk_replica() else "memory" for r in s.get_replica_desc(key)]


def wait_for(pred, timeout):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return True
        time.sleep(0.05)
    return pred()


def odirect_read(files):
    """Reads `files` whole with O_DIRECT into one aligned buffer; MiB/s."""
    buf = mmap.mmap(-1, 8 * MIB)
    total = 0
    t = time.perf_counter()
    for f in files:
        fd = os.open(f, os.O_RDONLY | os.O_DIRECT)
        try:
            while True:
                n = os.readv(fd, [buf])
                total += n
                if n < len(buf):
                    break
        finally:
            os.close(fd)
    return total / MIB / (time.perf_counter() - t)


def drop_page_cache():
    try:
        subprocess.run(["sync"], check=False)
        Path("/proc/sys/vm/drop_caches").write_text("3\n")
        return True
    except OSError:
        return False


class Registered:
    """A page-aligned buffer (an anonymous mapping, as the baseline's) registered with the
    store: block-aligned memory is what the disk tier reads into in place."""

    def __init__(self, store, size):
        import ctypes

        self.map = mmap.mmap(-1, size)
        self.ptr = ctypes.addressof(ctypes.c_char.from_buffer(self.map))
        assert store.register_buffer(self.ptr, size) == 0


def disk_only_files(s, seg, keys, d):
    """Puts a 4 MiB object per key, waits for each one's disk copy on segment `seg`, moves
    it off memory (the disk copy is then its only one) and returns the object files in `d`."""
    for k in keys:
        assert put_retrying(s, k, value_of(k, 4 * MIB)) == 0
    assert wait_for(lambda: all("disk" in kinds(s, k) for k in keys), 60)
    time.sleep(0.6)  # the read leases of the replica lists above
    for k in keys:
        _, rc = s.create_move_task(k, seg, seg + "/disk")
        assert rc in (0, -708), rc
    assert wait_for(lambda: all(kinds(s, k) == ["disk"] for k in keys), 60)
    return sorted(str(p) for p in Path(d).rglob("*.mco"))


def phase_read(d, n=48, rounds=3):
    """Disk-only 4 MiB objects through `get`, `get_into` and `get` through the listener,
    each pass between two O_DIRECT passes over the same files."""
    c = Cluster("256MB", disk=d)
    try:
        s = c.client()
        keys = [f"r{i}" for i in range(n)]
        files = disk_only_files(s, f"127.0.0.1:{c.procs[1].args[2].split('=')[1]}", keys, d)
        # The same `get`s by a client with same-host sharing off: every read goes through
        # the node's disk listener and loopback TCP (the path of a reader on another host).
        os.environ["MC_STORE_SHM"] = "0"
        try:
            s2 = c.client()
        finally:
            del os.environ["MC_STORE_SHM"]
        buf = Registered(s, 4 * MIB)
        # `get` (a new bytes object per call) and `get_into` a registered buffer reused for
        # every call, as the O_DIRECT baseline reuses its buffer.
        paths = {"get": lambda k: len(s.get(k)),
                 "get_into": lambda k: s.get_into(k, buf.ptr, 4 * MIB),
                 "listener": lambda k: len(s2.get(k))}
        # The VM's disk has a cache of its own on the host, which the guest's drop_caches
        # does not reach, and its rate drifts: so the files are read with O_DIRECT once
        # before anything (warming the host alike for all), then every pass of a path lies
        # between two O_DIRECT passes and is compared with their mean.
        drop_page_cache()
        plain_first = odirect_read(files)
        drop_page_cache()
        plain = [odirect_read(files)]
        got = {name: {"mib_s": [], "ratio": [], "lat": []} for name in paths}
        served_before = c.disk_metric("reads_total")
        for _ in range(rounds):
            for name, read in paths.items():
                drop_page_cache()
                mib_s, lat = timed_reads(keys, read)
                drop_page_cache()
                plain.append(odirect_read(files))
                g = got[name]
                g["mib_s"].append(round(mib_s, 1))
                g["ratio"].append(round(mib_s / ((plain[-2] + plain[-1]) / 2), 3))
                g["lat"] += lat
        served = c.disk_metric("reads_total") - served_before
        s2.close()
        s.close()
        out = {"objects": n, "rounds": rounds, "odirect_first_mib_s": round(plain_first, 1),
               "odirect_mib_s": [round(p, 1) for p in plain],
               "listener_reads": served, "page_cache_dropped": True}
        for name, g in got.items():
            g["lat"].sort()
            out[name] = {"mib_s": g["mib_s"], "ratio": g["ratio"],
                         "ratio_median": statistics.median(g["ratio"]),
                         "p50_ms": round(pct(g["lat"], 50) * 1e3, 2),
                         "p99_ms": round(pct(g["lat"], 99) * 1e3, 2)}
        return out
    finally:
        c.stop()


def phase_read_own(d, n=48):
    """A store reading its own disk: a Python process with `enable_ssd_offload=True` whose
    objects went to its disk (the original's usual setup: each inference process offloads its
    own segment to a local SSD), `get_into` a registered buffer, beside O_DIRECT reads of the
    same files."""
    c = Cluster(None, disk=d)
    from mooncake.store import MooncakeDistributedStore

    s = MooncakeDistributedStore()
    try:
        assert s.setup("127.0.0.1", c.metadata, 256 * MIB, 64 * MIB, "tcp", "", c.addr,
                       enable_ssd_offload=True, ssd_offload_path=str(d)) == 0
        keys = [f"o{i}" for i in range(n)]
        files = disk_only_files(s, s.get_hostname(), keys, d)
        drop_page_cache()
        plain_first = odirect_read(files)
        drop_page_cache()
        buf = Registered(s, 4 * MIB)
        into, lat = timed_reads(keys, lambda k: s.get_into(k, buf.ptr, 4 * MIB))
        drop_page_cache()
        plain = odirect_read(files)
        return {"objects": n, "get_into_mib_s": round(into, 1), "odirect_mib_s": round(plain, 1),
                "odirect_first_mib_s": round(plain_first, 1), "ratio": round(into / plain, 3),
                "get_into_p50_ms": round(pct(lat, 50) * 1e3, 2),
                "get_into_p99_ms": round(pct(lat, 99) * 1e3, 2)}
    finally:
        s.close()
        c.stop()


def timed_reads(keys, read):
    """Reads every key of 4 MiB with `read` (which returns the bytes read); MiB/s and the
    sorted latencies."""
    lat = []
    t = time.perf_counter()
    for k in keys:
        t0 = time.perf_counter()
        got = read(k)
        lat.append(time.perf_counter() - t0)
        assert got == 4 * MIB, (k, got)
    mib_s = len(keys) * 4 / (time.perf_counter() - t)
    lat.sort()
    return mib_s, lat


def cpu_seconds(pid):
    """CPU seconds (user + system) of process `pid`, and of its threads named `disk-io-*`."""
    tick = os.sysconf("SC_CLK_TCK")

    def of(stat):
        f = Path(stat).read_text().rsplit(")", 1)[1].split()
        return (int(f[11]) + int(f[12])) / tick

    workers = 0.0
    for t in Path(f"/proc/{pid}/task").iterdir():
        try:
            if (t / "comm").read_text().startswith("disk-io-"):
                workers += of(t / "stat")
        except OSError:
            pass
    return of(f"/proc/{pid}/stat"), workers


def phase_offload(d, n=192, rounds=3):
    """4 MiB put throughput, tier off vs eager offload on, same sizes, same run: `rounds`
    of each, interleaved (off, on, off, on, ...), so a slow spell of the machine lands on
    both; medians and every round. Beside them: the node's CPU seconds during the puts (all
    threads, and its disk workers'), and for each eager round objects on disk when the last
    put returned and seconds from then until all were."""
    out = {"tier_off_rounds": [], "eager_offload_rounds": [], "on_disk_at_end": [],
           "caught_up_s": [], "tier_off_node_cpu_s": [], "eager_offload_node_cpu_s": [],
           "disk_workers_cpu_s": []}
    for _ in range(rounds):
        for label, disk in [("tier_off", None), ("eager_offload", d)]:
            c = Cluster("1024MB", disk=disk)
            try:
                s = c.client()
                v = os.urandom(4 * MIB)
                node = c.procs[1].pid
                cpu0 = cpu_seconds(node)
                t = time.perf_counter()
                for i in range(n):
                    assert s.put(f"o{i}", v) == 0
                secs = time.perf_counter() - t
                cpu1 = cpu_seconds(node)
                out[f"{label}_rounds"].append(round(n * 4 / secs, 1))
                # The node's CPU seconds while the puts ran: all threads, and its disk
                # workers' (what offload took from the puts).
                out[f"{label}_node_cpu_s"].append(round(cpu1[0] - cpu0[0], 3))
                if disk:
                    out["disk_workers_cpu_s"].append(round(cpu1[1] - cpu0[1], 3))
                    # How far offload kept up: objects on disk when the last put returned,
                    # and how long after it the last one reached the disk.
                    out["on_disk_at_end"].append(c.disk_metric("writes_total"))
                    while c.disk_metric("writes_total") < n and \
                            time.perf_counter() - t - secs < 60:
                        time.sleep(0.01)
                    out["caught_up_s"].append(round(time.perf_counter() - t - secs, 2))
                    out["direct_writes"] = c.disk_metric("direct_writes_total")
                s.close()
            finally:
                c.stop()
            shutil.rmtree(d, ignore_errors=True)
            os.makedirs(d, exist_ok=True)
    out["tier_off"] = statistics.median(out["tier_off_rounds"])
    out["eager_offload"] = statistics.median(out["eager_offload_rounds"])
    out["ratio"] = round(out["eager_offload"] / out["tier_off"], 3)
    out["ratio_rounds"] = [round(e / o, 3) for o, e in
                           zip(out["tier_off_rounds"], out["eager_offload_rounds"])]
    return out


def phase_working_set(d, n=256):
    """64 MiB pool, 256 x 1 MiB: every object back byte-exact; memory vs disk hit latency."""
    c = Cluster("64MB", disk=d)
    try:
        s = c.client()
        keys = [f"w{i}" for i in range(n)]
        for k in keys:
            assert put_retrying(s, k, value_of(k, MIB)) == 0, k
        time.sleep(0.3)
        mem, disk, wrong = [], [], 0
        for k in keys:
            where = kinds(s, k)
            t = time.perf_counter()
            v = s.get(k)
            dt = time.perf_counter() - t
            wrong += v != value_of(k, MIB)
            (mem if "memory" in where else disk).append(dt)
        mem.sort()
        disk.sort()
        s.close()

        def row(xs):
            return {"n": len(xs), "p50_ms": round(pct(xs, 50) * 1e3, 3) if xs else None,
                    "p99_ms": round(pct(xs, 99) * 1e3, 3) if xs else None}

        return {"objects": n, "wrong": wrong, "memory_hits": row(mem), "disk_hits": row(disk)}
    finally:
        c.stop()


def replay(c, rounds=8, convs=24, block=256 * 1024, new_blocks=6):
    """Each round, every conversation reads its prefix blocks (hit = every block present) and
    appends `new_blocks` blocks. Returns the hit rate per round (from round 2)."""
    s = c.client()
    lengths = [0] * convs
    rates = []
    for r in range(rounds):
        hits = 0
        for cv in range(convs):
            if r > 0:
                keys = [f"c{cv}_b{b}" for b in range(lengths[cv])]
                if all(s.is_exist(k) == 1 for k in keys) and \
                        all(len(s.get(k)) == block for k in keys):
                    hits += 1
            for b in range(lengths[cv], lengths[cv] + new_blocks):
                put_retrying(s, f"c{cv}_b{b}", value_of(f"c{cv}_b{b}", block), timeout=10)
            lengths[cv] += new_blocks
        if r > 0:
            rates.append(round(hits / convs, 3))
    s.close()
    return rates


def phase_replay(d):
    out = {}
    for label, disk in [("without_tier", None), ("with_tier", d)]:
        c = Cluster("48MB", disk=disk)
        try:
            out[label] = replay(c)
        finally:
            c.stop()
    return out


def plot(result, out_dir):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    r = result["replay"]
    fig, ax = plt.subplots(figsize=(6, 3.5))
    for label, style in [("with_tier", "-o"), ("without_tier", "--s")]:
        ys = r[label]
        ax.plot(range(2, len(ys) + 2), [100 * y for y in ys], style, label=label.replace("_", " "))
    ax.set_xlabel("round")
    ax.set_ylabel("prefix hit rate (%)")
    ax.set_ylim(0, 105)
    ax.set_title("multi-turn replay, 48 MB pool")
    ax.legend()
    fig.tight_layout()
    Path(out_dir).mkdir(parents=True, exist_ok=True)
    fig.savefig(Path(out_dir) / "tier_replay_hit_rate.png", dpi=110)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--phases", default="read,read-own,offload,working-set,replay")
    ap.add_argument("--dir", default=None)
    ap.add_argument("--json", default=None)
    ap.add_argument("--plot", default=None)
    ap.add_argument("--offload-rounds", type=int, default=3)
    a = ap.parse_args()
    base = Path(a.dir or tempfile.mkdtemp(prefix="mooncake-tier-", dir="/var/tmp"))
    result = {}
    phases = {"read": phase_read, "read-own": phase_read_own, "offload": lambda d: phase_offload(d, rounds=a.offload_rounds),
              "working-set": phase_working_set,
              "replay": phase_replay}
    try:
        for name in a.phases.split(","):
            d = base / name
            shutil.rmtree(d, ignore_errors=True)
            d.mkdir(parents=True)
            print(f"== {name}", flush=True)
            result[name] = phases[name](d)
            print(json.dumps(result[name]), flush=True)
    finally:
        if not a.dir:
            shutil.rmtree(base, ignore_errors=True)
    if a.json:
        Path(a.json).write_text(json.dumps(result, indent=1))
    if a.plot and "replay" in result:
        plot(result, a.plot)


if __name__ == "__main__":
    main()
