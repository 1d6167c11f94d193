#!/usr/bin/env python3
"""Side-by-side benchmark of `mooncake.store`: ours against upstream's wheel, same run.

The SAME measurement code (`phase remote`, `phase local`) runs under each implementation's
interpreter; only the package behind `import mooncake.store` differs. For each run and each
implementation this script:

1. starts that implementation's `mooncake_master` (from the interpreter's venv `bin/`) on free
   127.0.0.1 ports with the embedded HTTP metadata server;
2. starts a SEPARATE storage node, that venv's `mooncake_client`, holding the data
   (`--global_segment_size`, same flags for both implementations);
3. `phase remote`: a client with `global_segment_size=0` (so every replica is on the node)
   measures put/get 4 KiB latency, put/get 4 MiB throughput, batch_put_from/batch_get_into of
   8 x 4 MiB from/into registered buffers, single `is_exist` calls/s and `batch_is_exist` of
   1000 keys (items/s);
4. `phase local`: a client WITH its own segment puts 4 MiB objects with `preferred_segment` =
   its own hostname and measures `get` (and `get_into`) of them, next to single-thread memcpy
   (`ctypes.memmove` of 4 MiB between two warm buffers) measured in the same process.

Besides, once per run, `phase stream` measures one plain loopback TCP stream (two processes,
4 MiB `sendall` / `recv_into`) as the physical limit of a remote transfer; if
`target/release/tcp_transport_bench` exists its plain stream is reported too.

Usage:
  store_bench.py compare --ours PY --upstream PY [--runs 3] [--json out.json]
  <venv>/bin/python store_bench.py phase remote|local --master H:P --metadata URL
  <venv>/bin/python store_bench.py phase stream

Each figure is reported as the median over the runs (per metric).
"""

import argparse
import ctypes
import json
import mmap
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

KIB = 1024
MIB = 1024 * 1024
SMALL = 4 * KIB
LARGE = 4 * MIB
BATCH = 8
NODE_SEGMENT = 2048 * MIB
# Seconds each throughput loop runs (plus a cap on the bytes it writes).
SECS = float(os.environ.get("STORE_BENCH_SECS", "1.0"))
SMALL_OPS = int(os.environ.get("STORE_BENCH_SMALL_OPS", "2000"))
EXIST_KEYS = 1000
# Batches of 8 x 4 MiB written once to fault the node's memory in (512 MiB); the 4 MiB passes
# write at most this much.
WARM_BATCHES = 16
LOCAL_KEYS = 16
# Longer than both masters' default read lease (ours 10 s, upstream's 5 s).
LEASE_WAIT_S = 10.5

REPO = Path(__file__).resolve().parents[2]


# ---- helpers ------------------------------------------------------------------------------


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_port(port, timeout=30.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                return True
        except OSError:
            time.sleep(0.05)
    return False


def stop_all(procs):
    """Terminates the processes still running, last started first (SIGKILL after 10 s)."""
    for p in reversed(procs):
        if p.poll() is None:
            p.terminate()
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()


def pct(sorted_vals, p):
    if not sorted_vals:
        return float("nan")
    i = min(len(sorted_vals) - 1, max(0, int(round(p / 100.0 * (len(sorted_vals) - 1)))))
    return sorted_vals[i]


def mib_s(nbytes, secs):
    return nbytes / MIB / secs if secs > 0 else 0.0


def out(result):
    print("RESULT " + json.dumps(result), flush=True)


def setup_store(master, metadata, segment, local_buffer):
    from mooncake.store import MooncakeDistributedStore

    s = MooncakeDistributedStore()
    rc = s.setup("127.0.0.1", metadata, segment, local_buffer, "tcp", "", master)
    if rc != 0:
        raise SystemExit(f"setup failed: {rc}")
    return s


def wait_for_space(s, timeout=30.0):
    """The node mounts its segment shortly after it starts: retry a put until it lands."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if s.put("bench_ready", b"x") == 0 and s.get("bench_ready") == b"x":
            return
        time.sleep(0.1)
    raise SystemExit("the storage node never accepted a put")


def remove_keys(s, keys):
    for k in keys:
        s.remove(k, True)


class Registered:
    """A zeroed, page-aligned-enough ctypes buffer registered with the store."""

    def __init__(self, store, size):
        self.buf = (ctypes.c_char * size)()
        self.ptr = ctypes.addressof(self.buf)
        self.size = size
        ctypes.memset(self.ptr, 0x5A, size)
        rc = store.register_buffer(self.ptr, size)
        if rc != 0:
            raise SystemExit(f"register_buffer failed: {rc}")


def throughput(fn, nbytes_per_call, secs=SECS, max_calls=None, warm=1):
    """Calls `fn(i)` until `secs` pass (or `max_calls`); MiB/s. `fn` returns False on failure."""
    for i in range(warm):
        if fn(-1 - i) is False:
            return {"mib_s": 0.0, "calls": 0, "failed": True}
    calls, t0 = 0, time.perf_counter()
    while True:
        if fn(calls) is False:
            return {"mib_s": 0.0, "calls": calls, "failed": True}
        calls += 1
        el = time.perf_counter() - t0
        if el >= secs or (max_calls is not None and calls >= max_calls):
            break
    return {"mib_s": mib_s(calls * nbytes_per_call, el), "calls": calls, "secs": el}


# ---- phases -------------------------------------------------------------------------------


def phase_remote(a):
    s = setup_store(a.master, a.metadata, 0, 256 * MIB)
    wait_for_space(s)
    r = {}

    # 4 KiB latency: put fresh keys, then get them.
    small = os.urandom(SMALL)
    keys = [f"small_{i}" for i in range(SMALL_OPS)]
    for i in range(50):  # warm connections
        s.put(f"warm_{i}", small)
        s.get(f"warm_{i}")
    lat = []
    for k in keys:
        t = time.perf_counter_ns()
        rc = s.put(k, small)
        lat.append(time.perf_counter_ns() - t)
        if rc != 0:
            raise SystemExit(f"put 4 KiB failed: {rc}")
    lat.sort()
    r["put_4k_p50_us"], r["put_4k_p99_us"] = pct(lat, 50) / 1e3, pct(lat, 99) / 1e3
    lat = []
    for k in keys:
        t = time.perf_counter_ns()
        v = s.get(k)
        lat.append(time.perf_counter_ns() - t)
        if len(v) != SMALL:
            raise SystemExit("get 4 KiB failed")
    lat.sort()
    r["get_4k_p50_us"], r["get_4k_p99_us"] = pct(lat, 50) / 1e3, pct(lat, 99) / 1e3

    # Metadata-only calls.
    n = len(keys)
    t = throughput(lambda i: s.is_exist(keys[i % n]) == 1, 1)
    r["is_exist_per_s"] = t["calls"] / t["secs"] if t.get("secs") else 0.0
    some = [keys[i % n] for i in range(EXIST_KEYS)]
    t = throughput(lambda i: len(s.batch_is_exist(some)) == EXIST_KEYS, 1)
    r["batch_is_exist_items_per_s"] = t["calls"] * EXIST_KEYS / t["secs"] if t.get("secs") else 0.0
    remove_keys(s, keys)

    # Touch the node's memory once (a VM faults fresh pages in at a few hundred MiB/s, which
    # would measure the host rather than the store): 512 MiB of fresh keys, timed as the "cold"
    # figure, then removed so that the passes below reuse the same, now resident, memory.
    buf = Registered(s, BATCH * LARGE)
    ptrs = [buf.ptr + j * LARGE for j in range(BATCH)]
    sizes = [LARGE] * BATCH
    cold = []

    def cold_put(i):
        ks = [f"cold_{i}_{j}" for j in range(BATCH)]
        cold.extend(ks)
        return s.batch_put_from(ks, ptrs, sizes) == [0] * BATCH

    r["batch_put_from_8x4m_cold"] = throughput(cold_put, BATCH * LARGE, secs=1e9,
                                                max_calls=WARM_BATCHES, warm=0)
    remove_keys(s, cold)

    # 4 MiB put / get through bytes objects.
    big = os.urandom(LARGE)
    big_keys = [f"big_{i}" for i in range(WARM_BATCHES * BATCH - 2)]
    written = []

    def put_big(i):
        k = big_keys[i] if i >= 0 else f"big_warm_{-i}"
        written.append(k)
        return s.put(k, big) == 0

    r["put_4m"] = throughput(put_big, LARGE, max_calls=len(big_keys))
    readable = [k for k in written if not k.startswith("big_warm")] or written
    r["get_4m"] = throughput(lambda i: len(s.get(readable[i % len(readable)])) == LARGE, LARGE)
    remove_keys(s, written)
    # The gets above took read leases; a (forced) remove parks a leased object's buffers until
    # its lease ends, so without this wait the batch pass below would write into memory no
    # pass has touched yet and measure page faults (see put_fault_bench.py), not the store.
    time.sleep(LEASE_WAIT_S)

    # batch_put_from / batch_get_into: 8 x 4 MiB, registered buffers.
    bkeys = []

    def batch_put(i):
        ks = [f"bp_{i}_{j}" for j in range(BATCH)]
        bkeys.extend(ks)
        return s.batch_put_from(ks, ptrs, sizes) == [0] * BATCH

    r["batch_put_from_8x4m"] = throughput(batch_put, BATCH * LARGE, max_calls=WARM_BATCHES - 1)
    remove_keys(s, bkeys)
    gkeys = [f"bg_{j}" for j in range(BATCH)]
    if s.batch_put_from(gkeys, ptrs, sizes) != [0] * BATCH:
        raise SystemExit("batch_put_from for the get pass failed")
    r["batch_get_into_8x4m"] = throughput(
        lambda i: s.batch_get_into(gkeys, ptrs, sizes) == [LARGE] * BATCH, BATCH * LARGE
    )
    remove_keys(s, gkeys)
    s.unregister_buffer(buf.ptr)
    s.close()
    out(r)


def phase_local(a):
    from mooncake.store import ReplicateConfig

    s = setup_store(a.master, a.metadata, 1024 * MIB, 64 * MIB)
    me = s.get_hostname()
    cfg = ReplicateConfig()
    cfg.preferred_segment = me
    big = os.urandom(LARGE)
    keys = [f"local_{i}" for i in range(LOCAL_KEYS)]
    for k in keys:
        rc = s.put(k, big, cfg)
        if rc != 0:
            raise SystemExit(f"local put failed: {rc}")
    r = {"hostname": me}
    try:
        descs = s.get_replica_desc(keys[0])
        eps = [d.get_memory_descriptor().buffer_descriptor.transport_endpoint for d in descs]
        r["replica_endpoints"] = eps
    except Exception as e:  # noqa: BLE001  (informational only)
        r["replica_endpoints"] = repr(e)
    n = len(keys)
    r["local_get_4m"] = throughput(lambda i: len(s.get(keys[i % n])) == LARGE, LARGE)
    buf = Registered(s, LARGE)
    r["local_get_into_4m"] = throughput(
        lambda i: s.get_into(keys[i % n], buf.ptr, LARGE) == LARGE, LARGE
    )
    # Single-thread memcpy in the same process with the same access pattern as the gets: the
    # source cycles over LOCAL_KEYS x 4 MiB (more than the last-level cache), the destination
    # is one resident 4 MiB buffer; both are anonymous mappings advised for transparent
    # hugepages, as a store segment is, so page size does not favour either side.
    src_mm = mmap.mmap(-1, LOCAL_KEYS * LARGE)
    dst_mm = mmap.mmap(-1, LARGE)
    for m in (src_mm, dst_mm):
        if hasattr(mmap, "MADV_HUGEPAGE"):
            m.madvise(mmap.MADV_HUGEPAGE)
        m.write(b"\x01" * len(m))
    sp = ctypes.addressof(ctypes.c_char.from_buffer(src_mm))
    dp = ctypes.addressof(ctypes.c_char.from_buffer(dst_mm))
    r["memcpy_4m"] = throughput(
        lambda i: ctypes.memmove(dp, sp + (i % LOCAL_KEYS) * LARGE, LARGE) and True, LARGE)
    s.unregister_buffer(buf.ptr)
    remove_keys(s, keys)
    s.close()
    out(r)


def phase_stream(_a):
    """One plain loopback TCP stream: a child process sends 4 MiB blocks, we receive."""
    lsock = socket.socket()
    lsock.bind(("127.0.0.1", 0))
    lsock.listen(1)
    port = lsock.getsockname()[1]
    code = (
        "import socket,sys,time\n"
        "s=socket.create_connection(('127.0.0.1',int(sys.argv[1])))\n"
        f"b=bytearray({LARGE}); mv=memoryview(b)\n"
        "end=time.monotonic()+float(sys.argv[2])\n"
        "try:\n"
        "  while time.monotonic()<end: s.sendall(mv)\n"
        "except OSError: pass\n"
        "s.close()\n"
    )
    child = subprocess.Popen([sys.executable, "-c", code, str(port), str(SECS + 1.0)])
    conn, _ = lsock.accept()
    buf = bytearray(LARGE)
    mv = memoryview(buf)
    # Warm up for 0.3 s, then measure for SECS.
    total, t0, warm_end = 0, time.perf_counter(), None
    while True:
        n = conn.recv_into(mv)
        if n == 0:
            break
        now = time.perf_counter()
        if warm_end is None:
            if now - t0 >= 0.3:
                warm_end, total = now, 0
            continue
        total += n
        if now - warm_end >= SECS:
            break
    el = time.perf_counter() - warm_end if warm_end else 0
    conn.close()
    lsock.close()
    child.wait()
    out({"stream_mib_s": mib_s(total, el)})


# ---- orchestration ------------------------------------------------------------------------


def run_phase(py, phase, env, logdir, extra=(), script=None, echo=False):
    """Runs one phase in a fresh client process; its stderr goes to a log file, or to ours
    with `echo` (progress lines)."""
    args = [py, str(script or Path(__file__).resolve()), "phase", phase, *extra]
    with open(logdir / f"{phase}.stderr", "ab") as err:
        p = subprocess.run(args, stdout=subprocess.PIPE, stderr=None if echo else err, env=env,
                           timeout=600)
    for line in p.stdout.decode(errors="replace").splitlines()[::-1]:
        if line.startswith("RESULT "):
            return json.loads(line[len("RESULT "):])
    return {"error": f"phase {phase} exited {p.returncode}; see {logdir}/{phase}.stderr"}


def run_impl(label, py, logdir, phases=("remote", "local"), script=None, echo=False,
             node_flags=(), phase_args=()):
    """Master + storage node of the implementation behind `py` (the node given `node_flags`
    besides), then `phases` of `script` (default: this file's remote and local phases), each
    in a fresh client process given `phase_args` besides where the master is."""
    bindir = Path(py).parent
    env = dict(os.environ)
    env.setdefault("MC_LOG_LEVEL", "2")
    if label == "upstream":
        env["MC_FORCE_TCP"] = "true"
    rpc, http, metrics, node_port = free_port(), free_port(), free_port(), free_port()
    master_cmd = [
        str(bindir / "mooncake_master"),
        "--rpc_address=127.0.0.1",
        f"--rpc_port={rpc}",
        f"--metrics_port={metrics}",
        "--enable_http_metadata_server=true",
        "--http_metadata_server_host=127.0.0.1",
        f"--http_metadata_server_port={http}",
    ]
    metadata = f"http://127.0.0.1:{http}/metadata"
    node_cmd = [
        str(bindir / "mooncake_client"),
        "--host=127.0.0.1",
        f"--port={node_port}",
        f"--global_segment_size={NODE_SEGMENT}",
        f"--master_server_address=127.0.0.1:{rpc}",
        f"--metadata_server={metadata}",
        *node_flags,
    ]
    logdir.mkdir(parents=True, exist_ok=True)
    procs = []
    try:
        with open(logdir / "master.log", "ab") as ml:
            procs.append(subprocess.Popen(master_cmd, stdout=ml, stderr=ml, env=env,
                                          stdin=subprocess.DEVNULL))
        if not wait_port(rpc) or not wait_port(http):
            return {"error": f"master did not start; see {logdir}/master.log"}
        with open(logdir / "node.log", "ab") as nl:
            procs.append(subprocess.Popen(node_cmd, stdout=nl, stderr=nl, env=env,
                                          stdin=subprocess.DEVNULL))
        where = ["--master", f"127.0.0.1:{rpc}", "--metadata", metadata, *phase_args]
        res = {"commands": {"master": " ".join(master_cmd), "node": " ".join(node_cmd)}}
        for ph in phases:
            res[ph] = run_phase(py, ph, env, logdir, where, script, echo)
        return res
    finally:
        stop_all(procs)


def rust_plain_stream():
    """The plain stream of bench/src/bin/tcp_transport_bench (tput pass, 4 MiB), if built."""
    exe = REPO / "target" / "release" / "tcp_transport_bench"
    if not exe.exists():
        return None
    try:
        p = subprocess.run(
            [str(exe), "--secs", "1", "--runs", "1", "--lanes", "1", "--sizes", str(LARGE),
             "--backends", "plain"],
            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, timeout=120, text=True,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    found = {}
    for line in p.stdout.splitlines():
        f = line.split()
        if "plain" in f and "tput" in f and "GB/s" in f:
            op = "read" if "read" in f else "write"
            found[op] = float(f[f.index("GB/s") - 1]) * 1e9 / MIB
    return found or None


METRICS = [
    # (label, path, unit, better, target kind, target factor)
    ("put 4 KiB p50", ("remote", "put_4k_p50_us"), "us", "lower", "third", None),
    ("put 4 KiB p99", ("remote", "put_4k_p99_us"), "us", "lower", None, None),
    ("get 4 KiB p50", ("remote", "get_4k_p50_us"), "us", "lower", "third", None),
    ("get 4 KiB p99", ("remote", "get_4k_p99_us"), "us", "lower", None, None),
    ("batch_put_from 8x4 MiB, cold node", ("remote", "batch_put_from_8x4m_cold", "mib_s"),
     "MiB/s", "higher", None, None),
    ("put 4 MiB", ("remote", "put_4m", "mib_s"), "MiB/s", "higher", "4x+stream", None),
    ("get 4 MiB", ("remote", "get_4m", "mib_s"), "MiB/s", "higher", "4x+stream", None),
    ("batch_put_from 8x4 MiB", ("remote", "batch_put_from_8x4m", "mib_s"), "MiB/s", "higher",
     "4x+stream", None),
    ("batch_get_into 8x4 MiB", ("remote", "batch_get_into_8x4m", "mib_s"), "MiB/s", "higher",
     "4x+stream", None),
    ("is_exist", ("remote", "is_exist_per_s"), "calls/s", "higher", "4x", None),
    ("batch_is_exist(1000)", ("remote", "batch_is_exist_items_per_s"), "items/s", "higher", "2x",
     None),
    ("local get 4 MiB", ("local", "local_get_4m", "mib_s"), "MiB/s", "higher", "memcpy", None),
    ("local get_into 4 MiB", ("local", "local_get_into_4m", "mib_s"), "MiB/s", "higher", None,
     None),
    ("memcpy 4 MiB (same process)", ("local", "memcpy_4m", "mib_s"), "MiB/s", "higher", None, None),
]


def dig(d, path):
    for p in path:
        if not isinstance(d, dict) or p not in d:
            return None
        d = d[p]
    return d if isinstance(d, (int, float)) else None


def median_of(runs, label, path):
    vals = [dig(r.get(label, {}), path) for r in runs]
    vals = [v for v in vals if v is not None and v > 0]
    return statistics.median(vals) if vals else None


def fmt(v):
    if v is None:
        return "n/a"
    if v >= 100000:
        return f"{v / 1e6:.2f}M"
    if v >= 100:
        return f"{v:.0f}"
    return f"{v:.1f}"


def verdict(kind, ours, up, stream, memcpy):
    if kind is None or ours is None:
        return ""
    checks = []
    if kind == "third" and up:
        checks.append(("<=1/3 up", ours <= up / 3))
    if kind in ("4x", "4x+stream") and up:
        checks.append((">=4x up", ours >= 4 * up))
    if kind == "2x" and up:
        checks.append((">=2x up", ours >= 2 * up))
    if kind == "4x+stream" and stream:
        checks.append((f">=60% stream ({ours / stream * 100:.0f}%)", ours >= 0.6 * stream))
    if kind == "memcpy" and memcpy:
        checks.append((f">=70% memcpy ({ours / memcpy * 100:.0f}%)", ours >= 0.7 * memcpy))
    return ", ".join(f"{name} {'OK' if ok else 'MISS'}" for name, ok in checks)


def compare(a):
    impls = [("ours", a.ours)]
    if a.upstream:
        impls.append(("upstream", a.upstream))
    logroot = Path(a.logdir or tempfile.mkdtemp(prefix="store_bench_"))
    runs = []
    for i in range(a.runs):
        run = {}
        # Alternate the order so neither side always runs on a warmer (or busier) machine.
        order = impls if i % 2 == 0 else impls[::-1]
        for label, py in order:
            print(f"run {i + 1}/{a.runs}: {label} ({py})", file=sys.stderr, flush=True)
            run[label] = run_impl(label, py, logroot / f"run{i + 1}" / label)
        print(f"run {i + 1}/{a.runs}: plain loopback stream", file=sys.stderr, flush=True)
        run["stream"] = run_phase(a.ours, "stream", dict(os.environ), logroot / f"run{i + 1}")
        run["rust_plain"] = rust_plain_stream()
        runs.append(run)

    stream = median_of(runs, "stream", ("stream_mib_s",))
    rust = [r["rust_plain"] for r in runs if r.get("rust_plain")]
    rust_read = statistics.median([x["read"] for x in rust if "read" in x]) if rust else None
    # The limit is the faster of the two plain streams measured (so the target is not eased
    # by a slow Python loop).
    limit = max(v for v in (stream, rust_read, 0.0) if v is not None) or None
    memcpy_ours = median_of(runs, "ours", ("local", "memcpy_4m", "mib_s"))

    print()
    print(f"# mooncake.store: ours vs upstream, median of {a.runs} run(s); logs in {logroot}")
    print(f"# plain loopback TCP stream, 4 MiB blocks: python {fmt(stream)} MiB/s, "
          f"rust {fmt(rust_read)} MiB/s -> limit {fmt(limit)} MiB/s")
    hdr = f"| {'metric':<30} | {'unit':<7} | {'ours':>9} | {'upstream':>9} | {'ours/up':>8} | targets"
    print(hdr)
    print("|" + "---|" * 6)
    table = []
    for name, path, unit, better, kind, _ in METRICS:
        o = median_of(runs, "ours", path)
        u = median_of(runs, "upstream", path)
        memcpy = memcpy_ours if path[0] == "local" else None
        if o is not None and u:
            ratio = (u / o) if better == "lower" else (o / u)
            rtxt = f"{ratio:.2f}x"
        else:
            rtxt = "n/a"
        v = verdict(kind, o, u, limit, memcpy)
        table.append({"metric": name, "unit": unit, "ours": o, "upstream": u, "ratio": rtxt,
                      "targets": v})
        print(f"| {name:<30} | {unit:<7} | {fmt(o):>9} | {fmt(u):>9} | {rtxt:>8} | {v}")
    errors = [(i, lbl, r[lbl][ph]["error"]) for i, r in enumerate(runs) for lbl in ("ours", "upstream")
              if isinstance(r.get(lbl), dict) for ph in ("remote", "local")
              if isinstance(r[lbl].get(ph), dict) and "error" in r[lbl][ph]]
    for i, lbl, e in errors:
        print(f"# run {i + 1} {lbl}: {e}")
    if a.json:
        Path(a.json).write_text(json.dumps({"runs": runs, "table": table, "stream": stream,
                                            "rust_plain_read": rust_read, "limit": limit},
                                           indent=1))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("compare")
    c.add_argument("--ours", required=True, help="python of the venv with our package")
    c.add_argument("--upstream", default="", help="python of the venv with upstream's wheel")
    c.add_argument("--runs", type=int, default=3)
    c.add_argument("--json", default="")
    c.add_argument("--logdir", default="")
    p = sub.add_parser("phase")
    p.add_argument("which", choices=["remote", "local", "stream"])
    p.add_argument("--master", default="")
    p.add_argument("--metadata", default="")
    a = ap.parse_args()
    if a.cmd == "compare":
        compare(a)
    else:
        {"remote": phase_remote, "local": phase_local, "stream": phase_stream}[a.which](a)


if __name__ == "__main__":
    main()
