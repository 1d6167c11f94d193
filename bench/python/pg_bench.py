"""Mooncake PG against Gloo, side by side in one run, on one host.

    .venv/bin/python bench/python/pg_bench.py [--worlds 2,4] [--backends mooncake-cpu,gloo]
        [--small-iters 2000] [--large-iters 10] [--ops all|all_reduce:4,all_reduce:64,...]

Backend ``mooncake-tcp`` is ``mooncake-cpu`` with every rank given its own host id
(``MC_PG_HOST_ID``), so all bytes go over the TCP links (loopback) instead of shared memory:
``--backends mooncake-cpu,mooncake-tcp,gloo`` puts the three side by side.

Backend ``tcp-floor`` is not a backend: plain sockets between every pair of ranks, each op's
bandwidth-optimal bytes sent straight from and received straight into the tensors, all of a
rank's transfers at once, no framing or failure handling (``tcp_floor.py``): what the
kernel's copies of those bytes cost on the machine, the reference to read ``mooncake-tcp``
and Gloo against (not a strict bound: see ``tcp_floor.py``):
``--backends mooncake-tcp,tcp-floor,gloo``.

``--netns`` (root, iproute2) runs each rank in a network namespace of its own, every one with
a veth into a bridge in a switch namespace (the topology of ``tests/tests/netns_cluster.rs``),
so the TCP links and Gloo cross veth pairs instead of loopback; ``mooncake-cpu`` still shares
memory (one kernel, one /dev/shm). Rank r listens on 10.213.N.(10 + r) (``pg.set_host_ip``,
``GLOO_SOCKET_IFNAME``); the namespaces are deleted at the end.

For each group size and backend it spawns the ranks on 127.0.0.1 and times, on rank 0:
all_reduce of 4 KiB (per-op latency: p50 and p99 over --small-iters ops), all_reduce of
64 MiB, all_gather_into_tensor with a 64 MiB output, and all_to_all_single of 64 MiB per rank
(each op's time: median and p99 over --large-iters ops). float32 throughout; each timed op
is preceded by warm-up ops. Prints one table (times in microseconds / milliseconds) and the
speed-up of each backend over the last one (Gloo by default) per row, then the CPU time one
op costs all ranks together (process CPU time of every rank over the timed ops, divided by
their number: what the op takes from the machine, less sensitive to other load than the
wall-clock times), and the load average at the start and the end.
"""

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import time

MIB = 1 << 20


def pct(xs, p):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(p / 100 * (len(xs) - 1))))]


OPS = ("all_reduce 4 KiB", "all_reduce 64 MiB", "all_gather 64 MiB", "all_to_all 64 MiB")


def worker(backend, rank, world, port, small_iters, large_iters, ops):
    import torch
    import torch.distributed as dist

    floor = backend == "tcp-floor"
    if floor:
        backend = "gloo"  # rendezvous and barriers only; the ops run on tcp_floor's sockets
    if backend == "mooncake-tcp":
        os.environ["MC_PG_HOST_ID"] = f"bench-host-{rank}"  # every rank "on its own host"
        backend = "mooncake-cpu"
    ip = os.environ.get("PG_BENCH_IP", "127.0.0.1")  # this rank's address (--netns)
    if backend.startswith("mooncake"):
        from mooncake import pg  # (registers the backends)
        pg.set_host_ip(ip)
    torch.set_num_threads(1)
    master = os.environ.get("PG_BENCH_MASTER", "127.0.0.1")
    dist.init_process_group(backend, init_method=f"tcp://{master}:{port}", rank=rank,
                            world_size=world)
    res = {}
    ops_of = dist
    if floor:
        sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
        from tcp_floor import Floor

        ops_of = Floor(dist, ip)

    cpu = {}

    def timed(fn, iters, warm):
        for _ in range(warm):
            fn()
        dist.barrier()
        out = []
        c0 = time.process_time()  # this process, all threads
        for _ in range(iters):
            t0 = time.perf_counter()
            fn()
            out.append(time.perf_counter() - t0)
        cpu[len(cpu)] = (time.process_time() - c0) / iters
        return out

    if OPS[0] in ops:
        small = torch.ones(1024)  # 4 KiB
        res[OPS[0]] = timed(lambda: ops_of.all_reduce(small), small_iters, 100)
    if OPS[1] in ops:
        big = torch.ones(64 * MIB // 4)
        res[OPS[1]] = timed(lambda: ops_of.all_reduce(big), large_iters, 2)
    if OPS[2] in ops:
        out = torch.empty(64 * MIB // 4)
        inp = torch.ones(64 * MIB // 4 // world)
        res[OPS[2]] = timed(lambda: ops_of.all_gather_into_tensor(out, inp), large_iters, 2)
    if OPS[3] in ops:
        a2a_in = torch.ones(64 * MIB // 4)
        a2a_out = torch.empty(64 * MIB // 4)
        res[OPS[3]] = timed(lambda: ops_of.all_to_all_single(a2a_out, a2a_in), large_iters, 2)
    dist.barrier()
    if floor:
        ops_of.close()
    print("CPU " + json.dumps([cpu[i] for i in range(len(cpu))]), flush=True)
    if rank == 0:
        print("RESULT " + json.dumps(res), flush=True)
    dist.destroy_process_group()


class Netns:
    """One namespace per rank, each with a veth into a bridge of a switch namespace."""

    def __init__(self, world):
        tag = f"mcpgb{os.getpid()}"
        self.sw, self.ns = f"{tag}-sw", [f"{tag}-r{r}" for r in range(world)]
        self.net = f"10.213.{os.getpid() % 200 + 20}"
        self.addr = [f"{self.net}.{10 + r}" for r in range(world)]
        self.ip("netns", "add", self.sw)
        self.ip("-n", self.sw, "link", "add", "br0", "type", "bridge")
        self.ip("-n", self.sw, "link", "set", "br0", "up")
        for r, ns in enumerate(self.ns):
            self.ip("netns", "add", ns)
            port = f"p{r}"
            self.ip("-n", self.sw, "link", "add", port, "type", "veth", "peer", "name", "eth0",
                    "netns", ns)
            self.ip("-n", self.sw, "link", "set", port, "master", "br0")
            self.ip("-n", self.sw, "link", "set", port, "up")
            self.ip("-n", ns, "addr", "add", f"{self.addr[r]}/24", "dev", "eth0")
            self.ip("-n", ns, "link", "set", "eth0", "up")
            self.ip("-n", ns, "link", "set", "lo", "up")

    @staticmethod
    def ip(*args):
        subprocess.run(["ip", *args], check=True)

    def close(self):
        for ns in self.ns + [self.sw]:
            subprocess.run(["ip", "netns", "del", ns], check=False)


def run(backend, world, small_iters, large_iters, ops, netns=None):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]

    def spawn(r):
        cmd = [sys.executable, __file__, "--worker", backend, str(r), str(world), str(port),
               str(small_iters), str(large_iters), ",".join(ops)]
        if netns is None:
            return subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
        env = dict(os.environ, PG_BENCH_IP=netns.addr[r], PG_BENCH_MASTER=netns.addr[0],
                   GLOO_SOCKET_IFNAME="eth0")
        return subprocess.Popen(["ip", "netns", "exec", netns.ns[r], *cmd],
                                stdout=subprocess.PIPE, text=True, env=env)

    procs = [spawn(r) for r in range(world)]
    outs = [p.communicate()[0] for p in procs]
    for p in procs:
        if p.returncode != 0:
            raise SystemExit(f"{backend} x{world}: a rank failed")
    line = [x for x in outs[0].splitlines() if x.startswith("RESULT ")][0]
    res = json.loads(line[len("RESULT "):])
    cpu = [0.0] * len(res)
    for out in outs:
        line = [x for x in out.splitlines() if x.startswith("CPU ")][0]
        for i, c in enumerate(json.loads(line[len("CPU "):])):
            cpu[i] += c
    return res, dict(zip(res, cpu))


def main():
    if len(sys.argv) > 1 and sys.argv[1] == "--worker":
        b, r, w, port, si, li, ops = sys.argv[2:9]
        worker(b, int(r), int(w), int(port), int(si), int(li), ops.split(","))
        return
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--worlds", default="2,4")
    ap.add_argument("--backends", default="mooncake-cpu,gloo")
    ap.add_argument("--small-iters", type=int, default=2000)
    ap.add_argument("--large-iters", type=int, default=10)
    ap.add_argument("--ops", default="all",
                    help="comma-separated subset of: " + ", ".join(
                        o.split()[0] + ":" + o.split()[1] for o in OPS)
                    + " (e.g. all_to_all:64); default all")
    ap.add_argument("--netns", action="store_true",
                    help="each rank in a network namespace of its own, linked by veth pairs "
                    "through a bridge (root)")
    a = ap.parse_args()
    if a.ops == "all":
        ops = list(OPS)
    else:
        ops = [o for o in OPS if o.split()[0] + ":" + o.split()[1] in a.ops.split(",")]
        if not ops:
            raise SystemExit(f"--ops {a.ops}: no such op")
    backends = a.backends.split(",")
    print(f"host: {os.cpu_count()} CPUs; float32; times on rank 0; "
          f"{'veth between network namespaces' if a.netns else 'loopback'}; "
          f"load average {' '.join(f'{x:.1f}' for x in os.getloadavg())}")
    hdr = f"{'ranks':>5} {'op':<18}" + "".join(
        f" {b + ' p50':>18} {b + ' p99':>18}" for b in backends) + "  speed-up (p50)"
    print(hdr)
    cpu_rows = []
    for world in [int(x) for x in a.worlds.split(",")]:
        results, cpus = {}, {}
        netns = Netns(world) if a.netns else None
        try:
            for b in backends:
                results[b], cpus[b] = run(b, world, a.small_iters, a.large_iters, ops, netns)
        finally:
            if netns is not None:
                netns.close()
        cpu_rows.append((world, cpus))
        for op in results[backends[0]]:
            small = "4 KiB" in op
            unit, scale = ("us", 1e6) if small else ("ms", 1e3)
            row = f"{world:>5} {op:<18}"
            p50s = []
            for b in backends:
                xs = results[b][op]
                p50 = statistics.median(xs) * scale
                p50s.append(p50)
                row += f" {p50:>15.1f} {unit} {pct(xs, 99) * scale:>15.1f} {unit}"
            if len(p50s) >= 2:
                row += "  " + " ".join(f"{p50s[-1] / x:.2f}x" for x in p50s[:-1])
            print(row, flush=True)
    print("CPU time per op, all ranks' processes together (all threads; time.process_time):")
    for world, cpus in cpu_rows:
        for op in cpus[backends[0]]:
            small = "4 KiB" in op
            unit, scale = ("us", 1e6) if small else ("ms", 1e3)
            print(f"{world:>5} {op:<18}" + "".join(
                f" {b + ' cpu':>18} {cpus[b][op] * scale:>10.1f} {unit}" for b in backends))
    print(f"load average at the end: {' '.join(f'{x:.1f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()
