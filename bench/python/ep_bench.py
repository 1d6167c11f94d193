"""Mooncake EP dispatch+combine against the same operation in plain torch over Gloo
all_to_all, side by side in one run, on one host; also Mooncake EP over its TCP links.

    .venv/bin/python bench/python/ep_bench.py [--ranks 2] [--tokens 128] [--hidden 2048]
        [--experts 32] [--topk 8] [--iters 200] [--warmup 20]

It spawns the ranks on 127.0.0.1; every rank joins a Mooncake Backend group (the EP
``Buffer``'s group) and a Gloo group (the baseline's). Each iteration is one dispatch of
``--tokens`` random bf16 tokens per rank, routed to ``--topk`` distinct random experts, an
identity "expert" (the received rows are the expert outputs; for the fp8 row a ready bf16
tensor), and one combine with random weights. The baseline does the same in torch ops over Gloo: ``all_to_all_single`` of the
per-expert counts, of the rows and of the token indices, scatter into ``[L, N, H]``; for
combine one ``all_to_all_single`` of the rows back and an ``index_add_`` with the weights.
The "TCP" row is a second EP ``Buffer`` whose ranks claim different host ids, so every pair
writes over the cross-host TCP links (loopback here) instead of shared memory.
All produce the same outputs (checked once before timing). Per iteration a barrier on the
Gloo group precedes the timed section; times on rank 0; tokens/s = ranks * tokens / p50.
The "dispatch bf16" and "dispatch fp8" rows time ``dispatch`` alone (no combine) on the
shared-memory buffer, the two interleaved iteration by iteration so that both see the same
load; the last line is their p50 ratio (fp8 moves half the bytes per row, plus its scales,
and quantises on the sender).
"""

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import time


def pct(xs, p):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(p / 100 * (len(xs) - 1))))]


class TorchEP:
    """Dispatch/combine in plain torch over ``all_to_all_single`` (the baseline)."""

    def __init__(self, group, rank, ranks, t_max, hidden, experts):
        self.g, self.rank, self.R = group, rank, ranks
        self.T, self.H, self.E = t_max, hidden, experts
        self.L = experts // ranks

    def dispatch(self, x, topk):
        import torch
        import torch.distributed as dist

        R, L, E, H = self.R, self.L, self.E, self.H
        tokens, k = topk.shape
        t_idx = torch.arange(tokens).repeat_interleave(k)
        e_idx = topk.flatten()
        key = torch.unique(e_idx[e_idx >= 0] * tokens + t_idx[e_idx >= 0])  # sorted by (e, t)
        e_of, t_of = key // tokens, key % tokens
        counts = torch.bincount(e_of, minlength=E)
        recv_counts = torch.empty_like(counts)
        dist.all_to_all_single(recv_counts, counts, group=self.g)
        send_split = counts.view(R, L).sum(1).tolist()
        rc = recv_counts.view(R, L)  # [source, local expert]
        recv_split = rc.sum(1).tolist()
        rows = torch.empty(sum(recv_split), H, dtype=x.dtype)
        dist.all_to_all_single(rows, x.index_select(0, t_of), recv_split, send_split,
                               group=self.g)
        ids = torch.empty(sum(recv_split), dtype=torch.int64)
        dist.all_to_all_single(ids, t_of, recv_split, send_split, group=self.g)
        # received order: source-major, then local expert, then token; target row of each:
        # expert l, begin[l, s] + i, begin = exclusive prefix over sources
        begin = torch.cumsum(rc, 0) - rc  # [R, L]
        l_of = torch.repeat_interleave(torch.arange(L).repeat(R), rc.flatten())
        first = torch.repeat_interleave((torch.cumsum(rc.flatten(), 0) - rc.flatten()),
                                        rc.flatten())
        i_of = torch.arange(len(l_of)) - first
        s_of = torch.repeat_interleave(torch.arange(R).repeat_interleave(L), rc.flatten())
        dst = l_of * (R * self.T) + begin[s_of, l_of] + i_of
        n = R * self.T
        recv_x = torch.zeros(L * n, H, dtype=x.dtype)
        recv_x[dst] = rows
        src_info = torch.full((L * n,), -1, dtype=torch.int32)
        src_info[dst] = ids.to(torch.int32)
        handle = (dst, send_split, recv_split, e_of, t_of, tokens)
        return recv_x.view(L, n, H), rc.sum(0).to(torch.int32), src_info.view(L, n), handle

    def combine(self, y, topk, weights, handle):
        import torch
        import torch.distributed as dist

        dst, send_split, recv_split, e_of, t_of, tokens = handle
        back = torch.empty(sum(send_split), self.H, dtype=y.dtype)
        dist.all_to_all_single(back, y.reshape(-1, self.H).index_select(0, dst), send_split,
                               recv_split, group=self.g)
        # weight of pair (e, t): sum over k with topk[t, k] == e
        w = (weights[t_of] * (topk[t_of] == e_of[:, None])).sum(1)
        out = torch.zeros(tokens, self.H, dtype=torch.float32)
        out.index_add_(0, t_of, back.float() * w[:, None])
        return out.to(torch.bfloat16)


def worker(rank, world, port, a):
    import torch
    import torch.distributed as dist

    from mooncake import mooncake_ep_buffer, pg
    from mooncake.mooncake_ep_buffer import Buffer

    torch.set_num_threads(1)
    active = torch.ones(world, dtype=torch.int32)
    dist.init_process_group("mooncake", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world, pg_options=pg.MooncakeBackendOptions(active))
    gloo = dist.new_group(backend="gloo")
    T, H, E, K = a.tokens, a.hidden, a.experts, a.topk
    buf = Buffer(dist.group.WORLD, Buffer.get_ep_buffer_size_hint(T, H, world, E))
    # every rank on its own "host": the EP buffer links its ranks over TCP
    same_host = mooncake_ep_buffer._host_id
    mooncake_ep_buffer._host_id = lambda: f"ep-bench-host-{rank}"
    buf_tcp = Buffer(dist.group.WORLD, Buffer.get_ep_buffer_size_hint(T, H, world, E))
    mooncake_ep_buffer._host_id = same_host
    base = TorchEP(gloo, rank, world, T, H, E)
    g = torch.Generator().manual_seed(rank)
    x = torch.randn(T, H, generator=g).to(torch.bfloat16)
    topk = torch.stack([torch.randperm(E, generator=g)[:K] for _ in range(T)])
    w = torch.rand(T, K, generator=g)

    y_fp8 = torch.zeros(E // world, world * T, H, dtype=torch.bfloat16)

    def mooncake(fp8, buf=buf):
        recv_x, count, handle, _, _ = buf.dispatch(x, topk, active, T, E, 10_000_000,
                                                   use_fp8=fp8)
        # identity expert; for fp8 a ready bf16 output (dequantising [L, N, H] in torch
        # would cost more than the whole exchange and is the expert's business)
        y = recv_x if not fp8 else y_fp8
        return buf.combine(y, topk, w, active, 10_000_000, handle)[0], count

    def baseline():
        recv_x, count, _, handle = base.dispatch(x, topk)
        return base.combine(recv_x, topk, w, handle), count

    # same answers before timing
    (mo, mc), (bo, bc) = mooncake(False), baseline()
    assert torch.equal(mc, bc), "recv_count differs"
    assert torch.allclose(mo.float(), bo.float(), rtol=2e-2, atol=2e-2), "combine differs"
    to, tc = mooncake(False, buf_tcp)
    assert torch.equal(tc, mc) and torch.equal(to, mo), "TCP path differs"

    def dispatch_only(fp8):
        return buf.dispatch(x, topk, active, T, E, 10_000_000, use_fp8=fp8)

    res = {}
    # dispatch alone, bf16 and fp8 interleaved iteration by iteration (same load on both)
    pair = {"dispatch bf16": [], "dispatch fp8": []}
    for i in range(a.warmup + a.iters):
        for name, fp8 in (("dispatch bf16", False), ("dispatch fp8", True)):
            dist.barrier(group=gloo)
            t0 = time.perf_counter()
            dispatch_only(fp8)
            if i >= a.warmup:
                pair[name].append(time.perf_counter() - t0)
    res.update(pair)
    for name, fn in (("mooncake EP bf16", lambda: mooncake(False)),
                     ("torch+gloo bf16", baseline),
                     ("mooncake EP fp8", lambda: mooncake(True)),
                     ("mooncake EP TCP", lambda: mooncake(False, buf_tcp))):
        for _ in range(a.warmup):
            fn()
        xs = []
        for _ in range(a.iters):
            dist.barrier(group=gloo)
            t0 = time.perf_counter()
            fn()
            xs.append(time.perf_counter() - t0)
        res[name] = xs
    dist.barrier(group=gloo)
    if rank == 0:
        print("RESULT " + json.dumps(res), flush=True)
    sys.stdout.flush()
    os._exit(0)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--hidden", type=int, default=2048)
    ap.add_argument("--experts", type=int, default=32)
    ap.add_argument("--topk", type=int, default=8)
    ap.add_argument("--iters", type=int, default=200)
    ap.add_argument("--warmup", type=int, default=20)
    ap.add_argument("--worker", nargs=3, type=int, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.worker:
        worker(*a.worker, a)
        return
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    args = [f"--{k}={v}" for k, v in vars(a).items() if k != "worker"]
    procs = [subprocess.Popen([sys.executable, __file__, "--worker", str(r), str(a.ranks),
                               str(port)] + args, stdout=subprocess.PIPE, text=True)
             for r in range(a.ranks)]
    outs = [p.communicate()[0] for p in procs]
    if any(p.returncode != 0 for p in procs):
        raise SystemExit("a rank failed")
    line = [x for x in outs[0].splitlines() if x.startswith("RESULT ")][0]
    res = json.loads(line[len("RESULT "):])
    print(f"host: {os.cpu_count()} CPUs, load {os.getloadavg()[0]:.1f}; {a.ranks} ranks, "
          f"{a.tokens} tokens/rank, hidden {a.hidden}, {a.experts} experts, top-{a.topk}; "
          f"{a.iters} iterations; dispatch+combine time on rank 0")
    print(f"{'path':<18} {'p50':>10} {'p99':>10} {'tokens/s (p50)':>16}")
    p50 = {}
    for name, xs in res.items():
        p50[name] = statistics.median(xs)
        tps = a.ranks * a.tokens / p50[name]
        print(f"{name:<18} {p50[name] * 1e3:>7.2f} ms {pct(xs, 99) * 1e3:>7.2f} ms "
              f"{tps:>16,.0f}")
    print(f"speed-up bf16 (p50): "
          f"{p50['torch+gloo bf16'] / p50['mooncake EP bf16']:.2f}x")
    print(f"dispatch alone, fp8 / bf16 time (p50): "
          f"{p50['dispatch fp8'] / p50['dispatch bf16']:.2f}")


if __name__ == "__main__":
    main()
