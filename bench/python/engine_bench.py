#!/usr/bin/env python3
"""Python-level `mooncake.engine` benchmark: mooncake-rs against upstream's wheel, same script,
same run.

    python3 bench/python/engine_bench.py --ours .venv/bin/python --upstream /tmp/upvenv/bin/python

Each interpreter must import `mooncake.engine` (ours: `pip install ./python`; upstream:
`pip install mooncake-transfer-engine-non-cuda numpy`, which needs Debian's libibverbs1). For
each implementation the script starts a target process and an initiator process with that
interpreter, both on 127.0.0.1 with P2PHANDSHAKE metadata and `MC_FORCE_TCP=true` (upstream
needs it without RDMA NICs; ours only has TCP). Targets allocate a 64 MiB managed buffer;
the initiator measures

- `transfer_sync_write` / `transfer_sync_read` throughput for 64 KiB, 1 MiB and 16 MiB
  (back-to-back calls for `--seconds` each, after a warm-up), and
- 4 KiB `transfer_sync_write` / `transfer_sync_read` latency: p50 / p99 / max from the sorted
  per-call samples (`--latency-samples` calls each, `time.perf_counter_ns`).

With `--ours-tcp` ours runs a second time with `MC_TE_SAME_HOST=0`, which keeps the two
processes on loopback TCP instead of the same-host path (cross-memory attach), and the first
of ours also times a plain `memmove` of each size between two 64 MiB buffers of its own
process (same loop, same offsets): the ceiling a same-host transfer is measured against.

It prints a side-by-side table (and `--json` writes the figures). Nothing is created outside
temp dirs; the processes are stopped at the end.
"""

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time

KIB = 1024
MIB = 1024 * KIB
BUFFER_BYTES = 64 * MIB
THROUGHPUT_SIZES = [64 * KIB, 1 * MIB, 16 * MIB]
LATENCY_SIZE = 4 * KIB


# ---- the processes ----------------------------------------------------------------------

def _engine():
    from mooncake.engine import TransferEngine

    e = TransferEngine()
    rc = e.initialize("127.0.0.1", "P2PHANDSHAKE", "tcp", "")
    if rc != 0:
        raise SystemExit(f"initialize failed: {rc}")
    addr = e.allocate_managed_buffer(BUFFER_BYTES)
    if not addr:
        raise SystemExit("allocate_managed_buffer failed")
    return e, addr


def run_target():
    e, addr = _engine()
    print(json.dumps({"segment": f"127.0.0.1:{e.get_rpc_port()}", "buffer": addr}), flush=True)
    sys.stdin.read()  # serve until the driver closes our stdin
    return 0


def _throughput(e, op, seg, local, remote, size, seconds):
    n_slots = max(1, BUFFER_BYTES // size)
    for i in range(min(8, n_slots * 2)):  # warm-up
        off = (i % n_slots) * size
        if op(seg, local + off, remote + off, size) != 0:
            raise SystemExit(f"transfer of {size} bytes failed")
    done = 0
    t0 = time.perf_counter()
    deadline = t0 + seconds
    i = 0
    while True:
        off = (i % n_slots) * size
        if op(seg, local + off, remote + off, size) != 0:
            raise SystemExit(f"transfer of {size} bytes failed")
        done += size
        i += 1
        now = time.perf_counter()
        if now >= deadline and i >= 4:
            break
    return done / (now - t0), i


def _latency(e, op, seg, local, remote, size, samples):
    for _ in range(200):  # warm-up
        op(seg, local, remote, size)
    out = []
    clock = time.perf_counter_ns
    for i in range(samples):
        off = (i % 64) * size
        t = clock()
        rc = op(seg, local + off, remote + off, size)
        out.append(clock() - t)
        if rc != 0:
            raise SystemExit(f"transfer of {size} bytes failed")
    out.sort()

    def pct(p):
        return out[min(len(out) - 1, int(p / 100.0 * len(out)))] / 1000.0

    return {"p50_us": pct(50), "p99_us": pct(99), "max_us": out[-1] / 1000.0,
            "mean_us": sum(out) / len(out) / 1000.0}


def _memcpy_op():
    """A stand-in for a transfer call: memmove from a second 64 MiB buffer of this process
    (its pages touched first, as the target's are) into ours, with a transfer's signature."""
    import ctypes

    other = (ctypes.c_char * BUFFER_BYTES)()
    ctypes.memset(other, 1, BUFFER_BYTES)
    base = ctypes.addressof(other)

    def op(_seg, local, remote_off, size):
        ctypes.memmove(local, base + remote_off, size)
        return 0

    op.keep = other  # the buffer lives as long as the function
    return op


def run_initiator(segment, remote, seconds, samples, memcpy):
    e, local = _engine()
    import mooncake.engine as me

    ops = {"write": e.transfer_sync_write, "read": e.transfer_sync_read}
    res = {"module": getattr(me, "__file__", "?"), "throughput": {}, "latency": {}}
    for name, op in ops.items():
        for size in THROUGHPUT_SIZES:
            bps, n = _throughput(e, op, segment, local, remote, size, seconds)
            res["throughput"][f"{name}_{size}"] = {"bytes_per_s": bps, "ops": n}
        res["latency"][name] = _latency(e, op, segment, local, remote, LATENCY_SIZE, samples)
    if memcpy:
        op = _memcpy_op()
        for size in THROUGHPUT_SIZES:
            bps, n = _throughput(e, op, segment, local, 0, size, seconds)
            res["throughput"][f"memcpy_{size}"] = {"bytes_per_s": bps, "ops": n}
    print(json.dumps(res), flush=True)
    return 0


# ---- the driver --------------------------------------------------------------------------

def run_impl(label, python, seconds, samples, extra_env, memcpy):
    env = dict(os.environ, MC_FORCE_TCP="true", **extra_env)
    env.setdefault("MC_LOG_LEVEL", "2")
    me = os.path.abspath(__file__)
    # The target's log (upstream's glog is chatty) goes to a temp file, shown on failure.
    log = tempfile.TemporaryFile(mode="w+")
    target = subprocess.Popen([python, me, "--role", "target"], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, stderr=log, text=True, env=env)
    try:
        line = target.stdout.readline()
        if not line:
            log.seek(0)
            raise SystemExit(f"{label}: target exited with {target.wait()}:\n{log.read()[-4000:]}")
        info = json.loads(line)
        r = subprocess.run([python, me, "--role", "initiator", "--segment", info["segment"],
                            "--remote", str(info["buffer"]), "--seconds", str(seconds),
                            "--latency-samples", str(samples)] + (["--memcpy"] if memcpy else []),
                           capture_output=True, text=True, env=env, timeout=600)
        if r.returncode != 0:
            raise SystemExit(f"{label}: initiator failed ({r.returncode}):\n{r.stderr[-4000:]}")
        return json.loads(r.stdout.strip().splitlines()[-1])
    finally:
        target.stdin.close()
        try:
            target.wait(timeout=10)
        except subprocess.TimeoutExpired:
            target.kill()
            target.wait()
        log.close()


def machine_state():
    def read(path):
        try:
            with open(path) as f:
                return f.read()
        except OSError:
            return ""

    cpu = next((ln.split(":", 1)[1].strip() for ln in read("/proc/cpuinfo").splitlines()
                if ln.startswith("model name")), platform.processor())
    mem = next((ln.split(":", 1)[1].strip() for ln in read("/proc/meminfo").splitlines()
                if ln.startswith("MemTotal")), "?")
    return {"cpu": cpu, "cpus": os.cpu_count(), "mem": mem, "kernel": platform.release(),
            "loadavg": read("/proc/loadavg").strip(), "python": platform.python_version()}


def fmt_size(n):
    return f"{n // MIB} MiB" if n >= MIB else f"{n // KIB} KiB"


def table(results):
    labels = list(results)
    first, last = labels[0], labels[-1]
    memcpy = results[first]["throughput"].get(f"memcpy_{THROUGHPUT_SIZES[0]}") is not None
    rows = []
    head = (["metric"] + labels + (["memcpy", f"{first} / memcpy"] if memcpy else [])
            + ([f"{first} / {last}"] if len(labels) >= 2 else []))
    for op in ("write", "read"):
        for size in THROUGHPUT_SIZES:
            vals = [results[lb]["throughput"][f"{op}_{size}"]["bytes_per_s"] / 1e9 for lb in labels]
            row = [f"sync {op} {fmt_size(size)} (GB/s)"] + [f"{v:.2f}" for v in vals]
            if memcpy:
                m = results[first]["throughput"][f"memcpy_{size}"]["bytes_per_s"] / 1e9
                row += [f"{m:.2f}", f"{vals[0] / m:.0%}"]
            if len(vals) >= 2:
                row.append(f"{vals[0] / vals[-1]:.2f}x")
            rows.append(row)
    for op in ("write", "read"):
        for p in ("p50_us", "p99_us"):
            vals = [results[lb]["latency"][op][p] for lb in labels]
            row = [f"sync {op} 4 KiB {p[:3]} (us)"] + [f"{v:.1f}" for v in vals]
            row += ["", ""] if memcpy else []
            if len(vals) >= 2:
                row.append(f"{vals[0] / vals[-1]:.2f}x")
            rows.append(row)
    widths = [max(len(r[i]) for r in rows + [head]) for i in range(len(head))]
    lines = ["| " + " | ".join(h.ljust(w) for h, w in zip(head, widths)) + " |",
             "|" + "|".join("-" * (w + 2) for w in widths) + "|"]
    lines += ["| " + " | ".join(c.ljust(w) for c, w in zip(r, widths)) + " |" for r in rows]
    return "\n".join(lines)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--role", choices=["driver", "target", "initiator"], default="driver")
    p.add_argument("--ours", help="python of a venv with mooncake-rs installed")
    p.add_argument("--upstream", help="python of a venv with upstream's wheel installed")
    p.add_argument("--ours-tcp", action="store_true",
                   help="also ours with MC_TE_SAME_HOST=0 (loopback TCP), and a memcpy baseline")
    p.add_argument("--memcpy", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--seconds", type=float, default=2.0, help="per throughput point")
    p.add_argument("--latency-samples", type=int, default=5000)
    p.add_argument("--rounds", type=int, default=1,
                   help="alternate the implementations this many times; best round is kept")
    p.add_argument("--json", help="write the figures here")
    p.add_argument("--segment")
    p.add_argument("--remote", type=int)
    a = p.parse_args()
    if a.role == "target":
        return run_target()
    if a.role == "initiator":
        return run_initiator(a.segment, a.remote, a.seconds, a.latency_samples, a.memcpy)

    impls = [("mooncake-rs", a.ours, {}, a.ours_tcp)]
    if a.ours_tcp:
        impls.append(("mooncake-rs tcp", a.ours, {"MC_TE_SAME_HOST": "0"}, False))
    impls.append(("upstream", a.upstream, {}, False))
    impls = [i for i in impls if i[1]]
    if not impls:
        p.error("give --ours and/or --upstream")
    rounds = {lb: [] for lb, *_ in impls}
    for _ in range(a.rounds):
        for lb, py, extra_env, memcpy in impls:
            rounds[lb].append(run_impl(lb, py, a.seconds, a.latency_samples, extra_env, memcpy))
    results = {}
    for lb, rs in rounds.items():  # best round per metric
        best = json.loads(json.dumps(rs[0]))
        for r in rs[1:]:
            for k, v in r["throughput"].items():
                if v["bytes_per_s"] > best["throughput"][k]["bytes_per_s"]:
                    best["throughput"][k] = v
            for k, v in r["latency"].items():
                if v["p50_us"] < best["latency"][k]["p50_us"]:
                    best["latency"][k] = v
        results[lb] = best
    state = machine_state()
    print("command:", " ".join([os.path.basename(sys.executable)] + sys.argv))
    print("machine:", json.dumps(state))
    for lb, *_ in impls:
        print(f"{lb}: {results[lb]['module']}")
    print(table(results))
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"machine": state, "argv": sys.argv, "results": results}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
