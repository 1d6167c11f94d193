#!/usr/bin/env python3
"""How long a leader's death keeps store clients from working: the time from SIGKILL of the
HA leader to the moment *every* client has completed a put and a get again, per run, for 1,
10 and 100 clients, with the dead leader's address refusing connections (a process gone) or
silently dropping packets (a deleted pod's IP), measured the same way against our master and
the original's.

Per case: one etcd, three masters with `--enable_ha` (ours: `--ha_lease_ttl_sec=2`, the
original: `--enable_oplog`), each in its own network namespace behind a veth pair, and
clients in worker processes on the host (each client a `MooncakeDistributedStore`
contributing a 16 MiB segment, so every client is also an owner that re-reports to the new
leader), each looping put(4 KiB) + get of a fresh key and checking the bytes. A run: wait
until every client succeeded in the last 0.5 s, find the leader through etcd's `master_view`
key; for `silent`, take its namespace's end of the veth down (the host keeps routing to it,
with a pinned neighbour entry, so every packet is dropped and nothing answers); SIGKILL it;
wait until every client has a put+get that *started* after the kill and succeeded; start a
fresh standby. Reported per case over `--runs` runs: p50, p99 and max of the per-run time to
the last client back, and the median over runs of the per-run median client.

Needs root (`ip netns`, veth), Debian's etcd-server, and for `--impl upstream` the original's
wheel in `--upstream-venv` (default /tmp/upstream-venv).

Usage:
  .venv/bin/python bench/python/failover_bench.py [--impl ours|upstream] [--clients 1,10,100]
      [--modes refuse,silent] [--runs 10] [--give-up 60]
"""

import argparse
import base64
import collections
import json
import multiprocessing as mp
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

from store_bench import free_port, wait_port  # the benches' shared helpers

KIB = 1024
MIB = 1024 * KIB
VALUE_BYTES = 4 * KIB
ETCD_BIN = "/usr/bin/etcd"
CLUSTER = "failover_bench"
CLIENTS_PER_WORKER = 25
# Operations per client kept to explain the slowest client of a run.
TRAIL_OPS = 4096


class Etcd:
    # The address etcd advertises to its clients: on the host's loopback device, so that it
    # is the host's from every namespace too (a namespace routes it through its veth). The
    # original's etcd client replaces the endpoint it was given with the advertised client
    # URLs; advertised as 127.0.0.1, that named each namespace's own loopback, and its masters
    # lost etcd as soon as they started.
    ADVERTISE = "10.232.254.1"

    def __init__(self):
        self.dir = Path(tempfile.mkdtemp(prefix="mooncake-failover-etcd-"))
        self.port, peer = free_port(), free_port()
        subprocess.run(["ip", "addr", "add", f"{self.ADVERTISE}/32", "dev", "lo"],
                       stderr=subprocess.DEVNULL)
        client = f"http://{self.ADVERTISE}:{self.port}"
        peer_url = f"http://127.0.0.1:{peer}"
        # Every address, so that masters in their namespaces reach it through their veth.
        self.proc = subprocess.Popen(
            [ETCD_BIN, "--data-dir", str(self.dir / "data"), "--name", "default",
             "--listen-client-urls", f"http://0.0.0.0:{self.port}",
             "--advertise-client-urls", client,
             "--listen-peer-urls", peer_url, "--initial-advertise-peer-urls", peer_url,
             "--initial-cluster", f"default={peer_url}"],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        if not wait_port(self.port, 20.0):
            raise RuntimeError("etcd did not start")

    @property
    def addr(self):
        return f"127.0.0.1:{self.port}"

    def leader(self):
        """The address in the cluster's master_view key, or None."""
        key = f"mooncake-store/{CLUSTER}/master_view".encode()
        body = json.dumps({"key": base64.b64encode(key).decode()}).encode()
        req = urllib.request.Request(f"http://{self.addr}/v3/kv/range", data=body)
        try:
            with urllib.request.urlopen(req, timeout=1) as r:
                kvs = json.loads(r.read()).get("kvs", [])
        except OSError:
            return None
        return base64.b64decode(kvs[0]["value"]).decode().strip() if kvs else None

    def stop(self):
        self.proc.kill()
        self.proc.wait()
        shutil.rmtree(self.dir, ignore_errors=True)
        subprocess.run(["ip", "addr", "del", f"{self.ADVERTISE}/32", "dev", "lo"],
                       stderr=subprocess.DEVNULL)


def ip(*args):
    subprocess.run(["ip", *args], check=True, stdout=subprocess.DEVNULL)


class Netns:
    """A network namespace joined to the host by a veth pair: host end 10.232.<n>.1, namespace
    end 10.232.<n>.2. `silence` makes the namespace's address drop every packet."""

    def __init__(self, n):
        tag = f"{os.getpid() % 10000}x{n}"
        self.ns, self.host_if, self.ns_if = f"mfb{tag}", f"mfh{tag}", f"mfn{tag}"
        self.host_addr, self.ns_addr = f"10.232.{n}.1", f"10.232.{n}.2"
        ip("netns", "add", self.ns)
        ip("link", "add", self.host_if, "type", "veth", "peer", "name", self.ns_if)
        ip("link", "set", self.ns_if, "netns", self.ns)
        ip("addr", "add", f"{self.host_addr}/30", "dev", self.host_if)
        ip("link", "set", self.host_if, "up")
        # The default route through the host (which forwards) lets the masters probe each
        # other across namespaces, as masters on different hosts do.
        for cmd in (["addr", "add", f"{self.ns_addr}/30", "dev", self.ns_if],
                    ["link", "set", self.ns_if, "up"], ["link", "set", "lo", "up"],
                    ["route", "add", "default", "via", self.host_addr]):
            ip("netns", "exec", self.ns, "ip", *cmd)

    def silence(self):
        mac = subprocess.run(["ip", "netns", "exec", self.ns, "cat",
                              f"/sys/class/net/{self.ns_if}/address"],
                             check=True, capture_output=True, text=True).stdout.strip()
        ip("neigh", "replace", self.ns_addr, "lladdr", mac, "dev", self.host_if,
           "nud", "permanent")
        ip("netns", "exec", self.ns, "ip", "link", "set", self.ns_if, "down")

    def delete(self):
        subprocess.run(["ip", "link", "del", self.host_if], stderr=subprocess.DEVNULL)
        subprocess.run(["ip", "netns", "del", self.ns], stderr=subprocess.DEVNULL)


class Masters:
    """Three HA masters of one implementation, each in its own network namespace (so that its
    address can be made silent); replaces the one killed."""

    def __init__(self, impl, bindir, etcd):
        self.impl, self.bindir, self.etcd = impl, bindir, etcd
        self.procs = {}  # "addr:port" -> (Popen, Netns)
        self.dead = []  # namespaces of killed masters
        self.next_net = 1
        self.logdir = Path(tempfile.mkdtemp(prefix="mooncake-failover-masters-"))
        for _ in range(3):
            self.start()

    def start(self):
        net = Netns(self.next_net)
        self.next_net = self.next_net % 250 + 1
        port = 20000 + self.next_net
        args = ["ip", "netns", "exec", net.ns, str(self.bindir / "mooncake_master"),
                f"--rpc_port={port}", f"--rpc_address={net.ns_addr}",
                f"--metrics_port={port + 1000}", "--enable_ha=true",
                f"--etcd_endpoints={Etcd.ADVERTISE}:{self.etcd.port}", f"--cluster_id={CLUSTER}"]
        if self.impl == "ours":
            args += [f"--metrics_host={net.ns_addr}", "--ha_lease_ttl_sec=2"]
        else:
            args += ["--enable_oplog=true"]
        log = open(self.logdir / f"master-{net.ns}.log", "wb")
        addr = f"{net.ns_addr}:{port}"
        env = dict(os.environ, MC_LOG_LEVEL="0")  # elections and serving in the log
        self.procs[addr] = (subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=log,
                                             stderr=subprocess.STDOUT, env=env), net)

    def net_of(self, addr):
        return self.procs[addr][1]

    def kill(self, addr):
        """SIGKILL; the namespace stays (its kernel refuses connections, or with `silence`
        drops them) until `reap`."""
        p, net = self.procs.pop(addr)
        p.send_signal(signal.SIGKILL)
        p.wait()
        self.dead.append(net)

    def reap(self):
        for net in self.dead:
            net.delete()
        self.dead = []

    def stop(self):
        for p, net in self.procs.values():
            p.kill()
            p.wait()
            net.delete()
        self.reap()


def worker(conn, first, count, etcd_addr, foreign_prefix):
    """Runs `count` clients; answers the parent's commands on `conn`. `foreign_prefix`: the
    parent's venv when this worker runs in another (spawn hands the parent's `sys.path` on,
    which would import the parent's `mooncake`)."""
    if foreign_prefix:
        import site
        sys.path[:] = [p for p in sys.path if not p.startswith(foreign_prefix)]
        for d in site.getsitepackages():  # this interpreter's own venv
            site.addsitedir(d)
    os.environ["MC_STORE_CLUSTER_ID"] = CLUSTER
    # The failed calls of a failover are counted, not logged one by one.
    os.environ.setdefault("MC_LOG_LEVEL", "3")
    from mooncake.store import MooncakeDistributedStore
    stores = []
    for i in range(count):
        # A leader may publish its key before it serves (the original's does): retry a while.
        deadline = time.monotonic() + 30
        while True:
            s = MooncakeDistributedStore()
            rc = s.setup("127.0.0.1", "P2PHANDSHAKE", 16 * MIB, 16 * MIB, "tcp", "",
                         f"etcd://{etcd_addr}")
            if rc == 0 or time.monotonic() > deadline:
                break
            time.sleep(0.5)
        if rc != 0:
            conn.send(("error", f"client {first + i}: setup returned {rc}"))
            return
        stores.append(s)
    # Per client: (start, end) of each put+get that succeeded, and failures seen.
    done = [[] for _ in stores]
    failed = [0] * len(stores)
    stop = threading.Event()

    # Per client: the last operations, (start, end of put, end of get, put's code, get's
    # bytes right), to say where the slowest client's time went.
    trail = [collections.deque(maxlen=TRAIL_OPS) for _ in stores]

    def loop(ci, store):
        value = bytes([ci % 251]) * VALUE_BYTES
        n = 0
        while not stop.is_set():
            key = f"fo-{first + ci}-{n}"
            n += 1
            started = time.monotonic()
            rc, put_end, got = None, None, False
            try:
                rc = store.put(key, value)
                put_end = time.monotonic()
                got = rc == 0 and store.get(key) == value
            except Exception:
                pass
            ok = got
            end = time.monotonic()
            if ok:
                done[ci].append((started, end))
                # Keeps the segments from filling (a full pool after a failover waits for
                # the re-reported objects' read leases, which is not what is measured here).
                removed = store.remove(key, force=True)
                trail[ci].append((started, put_end, end, rc, got, removed, time.monotonic()))
            else:
                trail[ci].append((started, put_end, end, rc, got, None, end))
                failed[ci] += 1
                time.sleep(0.01)

    threads = [threading.Thread(target=loop, args=(ci, s), daemon=True)
               for ci, s in enumerate(stores)]
    for t in threads:
        t.start()
    conn.send(("ready", count))
    while True:
        cmd, arg = conn.recv()
        if cmd == "recent":  # every client succeeded since `arg`?
            conn.send(all(d and d[-1][1] >= arg for d in done))
        elif cmd == "back":  # per client: end of the first put+get started after `arg`
            conn.send([next((e for s, e in d if s >= arg), None) for d in done])
        elif cmd == "trail":  # a client's operations that ended within [arg[1], arg[2]]
            ci, since, until = arg
            conn.send([t for t in trail[ci - first] if since <= t[6] <= until])
        elif cmd == "stop":
            stop.set()
            for t in threads:
                t.join(timeout=5)
            conn.send(sum(failed))
            return


def percentile(values, p):
    s = sorted(values)
    return s[min(len(s) - 1, int(round(p / 100 * (len(s) - 1))))]


def ask_all(pipes, cmd, arg=None):
    for p in pipes:
        p.send((cmd, arg))
    return [p.recv() for p in pipes]


def run_case(impl, bindir, clients, mode, runs, give_up):
    forward = Path("/proc/sys/net/ipv4/ip_forward")
    was = forward.read_text()
    forward.write_text("1")
    try:
        return run_cluster(impl, bindir, clients, mode, runs, give_up)
    finally:
        forward.write_text(was)


def run_cluster(impl, bindir, clients, mode, runs, give_up):
    etcd = Etcd()
    masters = Masters(impl, bindir, etcd)
    deadline = time.monotonic() + 30
    while etcd.leader() is None and time.monotonic() < deadline:
        time.sleep(0.1)
    if impl == "upstream":
        time.sleep(3)  # its leader publishes the key a moment before it serves
    ctx = mp.get_context("spawn")
    pipes, procs = [], []
    for first in range(0, clients, CLIENTS_PER_WORKER):
        a, b = ctx.Pipe()
        n = min(CLIENTS_PER_WORKER, clients - first)
        p = ctx.Process(target=worker, args=(b, first, n, etcd.addr, sys.prefix if impl == "upstream" else None), daemon=True)
        p.start()
        pipes.append(a)
        procs.append(p)
    results = []
    try:
        for msg in [p.recv() for p in pipes]:
            if msg[0] == "error":
                raise RuntimeError(msg[1])
        for run in range(runs):
            settle = time.monotonic() + 60
            while not all(ask_all(pipes, "recent", time.monotonic() - 0.5)):
                if time.monotonic() > settle:
                    raise RuntimeError("clients did not all succeed before a kill")
                time.sleep(0.1)
            leader = etcd.leader()
            if mode == "silent":
                masters.net_of(leader).silence()
            killed = time.monotonic()
            killed_wall = time.time()
            masters.kill(leader)
            back = wait_back(pipes, killed, give_up)
            masters.reap()
            masters.start()
            ends = [b - killed for b in back if b is not None]
            explain_slowest(pipes, back, killed)
            last = max(ends) if len(ends) == clients else None
            results.append((last, statistics.median(ends) if ends else None))
            shown = f"{last * 1000:.0f} ms" if last is not None else f"> {give_up} s"
            at = time.strftime("%H:%M:%S", time.gmtime(killed_wall)) + f"{killed_wall % 1:.3f}"[1:]
            print(f"  {impl} {mode} {clients} clients run {run} (kill at {at} UTC, masters' "
                  f"logs in {masters.logdir}): every client back after {shown} (median client "
                  f"{results[-1][1] * 1000 if ends else 0:.0f} ms)", flush=True)
            time.sleep(1.0)
        failed = sum(ask_all(pipes, "stop"))
    finally:
        for p in procs:
            p.join(timeout=10)
            if p.is_alive():
                p.kill()
        masters.stop()
        etcd.stop()
    return results, failed


def explain_slowest(pipes, back, killed):
    """Prints the slowest client's operations around the kill: which call held it up."""
    known = [(b, ci) for ci, b in enumerate(back) if b is not None]
    if not known:
        return
    back_at, ci = max(known)
    pipe = pipes[ci // CLIENTS_PER_WORKER]
    pipe.send(("trail", (ci, killed - 0.2, back_at + 0.1)))
    for started, put_end, end, rc, got, removed, last in pipe.recv():
        put_ms = f"{(put_end - killed) * 1000:+.0f}" if put_end is not None else "raised"
        then = (f", remove ended {(last - killed) * 1000:+.0f} ms (code {removed})"
                if removed is not None else "")
        print(f"    slowest client {ci}: op from {(started - killed) * 1000:+.0f} ms, put ended "
              f"{put_ms} ms (code {rc}), get ended {(end - killed) * 1000:+.0f} ms "
              f"({'ok' if got else 'failed'}){then}", flush=True)


def wait_back(pipes, killed, give_up):
    until = killed + give_up
    while True:
        back = [b for part in ask_all(pipes, "back", killed) for b in part]
        if all(b is not None for b in back) or time.monotonic() > until:
            return back
        time.sleep(0.05)


def summary(impl, clients, mode, results, failed, give_up):
    lasts = [r[0] if r[0] is not None else float("inf") for r in results]
    medians = [r[1] for r in results if r[1] is not None]
    fmt = lambda v: f"> {give_up * 1000:.0f}" if v == float("inf") else f"{v * 1000:.0f}"
    return (f"| {impl} | {mode} | {clients} | {len(results)} | {fmt(percentile(lasts, 50))} | "
            f"{fmt(percentile(lasts, 99))} | {fmt(max(lasts))} | "
            f"{statistics.median(medians) * 1000:.0f} | {failed} |")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--impl", choices=["ours", "upstream"], default="ours")
    ap.add_argument("--clients", default="1,10,100")
    ap.add_argument("--modes", default="refuse,silent")
    ap.add_argument("--runs", type=int, default=10)
    ap.add_argument("--give-up", type=float, default=60.0,
                    help="seconds after a kill to stop waiting for the clients")
    ap.add_argument("--upstream-venv", default="/tmp/upstream-venv")
    ap.add_argument("--bindir", help="where our mooncake_master is (default: this venv's bin)")
    args = ap.parse_args()
    if not os.path.exists(ETCD_BIN):
        sys.exit(f"{ETCD_BIN} not found (install Debian's etcd-server)")
    if args.impl == "ours":
        bindir = Path(args.bindir) if args.bindir else Path(sys.executable).parent
    else:
        # The clients run in the original's venv, with its package.
        bindir = Path(args.upstream_venv) / "bin"
        mp.set_executable(str(bindir / "python"))
    rows = []
    for mode in args.modes.split(","):
        for clients in [int(c) for c in args.clients.split(",")]:
            results, failed = run_case(args.impl, bindir, clients, mode, args.runs,
                                       args.give_up)
            rows.append(summary(args.impl, clients, mode, results, failed, args.give_up))
    print("\n| impl | dead address | clients | runs | last client back p50 ms | p99 ms | "
          "max ms | median client ms | failed ops |")
    print("|---|---|---|---|---|---|---|---|---|")
    print("\n".join(rows))


if __name__ == "__main__":
    main()
