"""One rank of a Mooncake PG group whose ranks pretend to be on different hosts (spawned by
test_pg_tcp.py; not collected by pytest).

usage: pg_tcp_worker.py SCENARIO RANK WORLD PORT      (as pg_worker.py)

``PG_HOST_IDS`` is a comma-separated host id per rank (e.g. "a,a,b"); this rank sets
``MC_PG_HOST_ID`` to its entry before torch builds the group, so ranks with different ids
link over TCP while equal ids share memory. The scenarios are pg_worker.py's, which check
every result against values computed in the process.
"""

import os
import sys

RANK = int(sys.argv[2])
os.environ["MC_PG_HOST_ID"] = "tcp-test-host-" + os.environ["PG_HOST_IDS"].split(",")[RANK]
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import pg_worker  # noqa: E402  (parses the same argv)
from pg_worker import OPS, check, dist, expected, inp, pg, same, torch  # noqa: E402


def one_of_each(dtype, n):
    """broadcast, all_gather (list, into tensor), all_to_all (list, single), gather, scatter,
    reduce and reduce_scatter_tensor of n elements, each checked."""
    rank, world = pg_worker.RANK, pg_worker.WORLD
    t = inp(rank, n, dtype)
    dist.broadcast(t, src=world - 1)
    same(t, inp(world - 1, n, dtype), f"broadcast {dtype} n={n}")
    outs = [torch.zeros(n, dtype=dtype) for _ in range(world)]
    dist.all_gather(outs, inp(rank, n, dtype))
    for r in range(world):
        same(outs[r], inp(r, n, dtype), f"all_gather {dtype} n={n} from {r}")
    flat = torch.zeros(world * n, dtype=dtype)
    dist.all_gather_into_tensor(flat, inp(rank, n, dtype))
    same(flat, torch.cat([inp(r, n, dtype) for r in range(world)]), f"all_gather_into_tensor n={n}")
    ins = [inp(rank * world + j, n, dtype) for j in range(world)]
    outs = [torch.zeros(n, dtype=dtype) for _ in range(world)]
    dist.all_to_all(outs, ins)
    for r in range(world):
        same(outs[r], inp(r * world + rank, n, dtype), f"all_to_all {dtype} n={n} from {r}")
    single = torch.zeros(world * n, dtype=dtype)
    dist.all_to_all_single(single, torch.cat(ins))
    same(single, torch.cat([inp(r * world + rank, n, dtype) for r in range(world)]),
         f"all_to_all_single {dtype} n={n}")
    for root in (0, world - 1):
        lst = [torch.zeros(n, dtype=dtype) for _ in range(world)] if rank == root else None
        dist.gather(inp(rank, n, dtype), gather_list=lst, dst=root)
        if rank == root:
            for r in range(world):
                same(lst[r], inp(r, n, dtype), f"gather to {root} n={n} from {r}")
        out = torch.zeros(n, dtype=dtype)
        src = [inp(10 + j, n, dtype) for j in range(world)] if rank == root else None
        dist.scatter(out, scatter_list=src, src=root)
        same(out, inp(10 + rank, n, dtype), f"scatter from {root} n={n}")
        t = inp(rank, n, dtype)
        dist.reduce(t, dst=root, op=dist.ReduceOp.SUM)
        same(t, expected("sum", n, dtype) if rank == root else inp(rank, n, dtype),
             f"reduce to {root} n={n}")
    full = torch.cat([inp(rank + 100 * j, n, dtype) for j in range(world)])
    out = torch.zeros(n, dtype=dtype)
    dist.reduce_scatter_tensor(out, full, op=dist.ReduceOp.SUM)
    want = sum(inp(r + 100 * rank, n, torch.int64) for r in range(world))
    same(out, want.to(dtype), f"reduce_scatter_tensor {dtype} n={n}")
    outs = torch.zeros(n, dtype=dtype)
    dist.reduce_scatter(outs, [inp(rank + 100 * j, n, dtype) for j in range(world)])
    same(outs, want.to(dtype), f"reduce_scatter (list) {dtype} n={n}")


def scenario_tcp_ops():
    """Every op over the links, at one-phase, two-phase and multi-chunk sizes; lighter than
    pg_worker's dtype matrix (the reduction kernels are the same on both paths; the transport
    is what is under test here)."""
    active = torch.zeros(pg_worker.WORLD, dtype=torch.int32)
    pg_worker.init(pg.MooncakeBackendOptions(active))
    check(active.tolist() == [1] * pg_worker.WORLD, f"active_ranks at init: {active.tolist()}")
    for dtype in (torch.float32, torch.int32, torch.bfloat16):
        for name in ("sum", "max", "avg") if dtype != torch.int32 else ("sum", "min", "product"):
            for n in (37, 40_000):
                t = inp(pg_worker.RANK, n, dtype)
                dist.all_reduce(t, op=OPS[name])
                same(t, expected(name, n, dtype), f"all_reduce {name} {dtype} n={n}", 1e-6)
    light = os.environ.get("PG_TCP_LIGHT") == "1"  # multi-chunk sizes covered elsewhere
    if not light:
        pg_worker.large_ops()
    one_of_each(torch.int32, 5)
    one_of_each(torch.float32, 300_001 if light else 1_200_001)  # 1_200_001: several chunks
    dist.barrier()
    check(True, "barrier")
    pg_worker.async_and_p2p()
    pg_worker.subgroup()
    check(pg.sync_after_failure(dist.group.WORLD).status == pg.SyncAfterFailureStatus.NoPending,
          "no failure seen")
    dist.barrier()
    dist.destroy_process_group()


def scenario_sigstop():
    """The last rank stops (SIGSTOP): its sockets stay open, only its heartbeats cease. The
    others' all_reduce completes once the collective timeout (2 s) has passed without a frame
    from it, and names it. The test SIGKILLs the stopped rank afterwards."""
    import signal
    import time

    rank, world = pg_worker.RANK, pg_worker.WORLD
    pg.set_collective_timeout_us(2_000_000)
    active = torch.zeros(world, dtype=torch.int32)
    pg_worker.init(pg.MooncakeBackendOptions(active))
    victim = world - 1
    t = torch.ones(100)
    dist.all_reduce(t)
    same(t, torch.full((100,), float(world)), "all_reduce before the stop")
    if rank == victim:
        pg_worker.wait_marks([f"sigstop/entering/{r}" for r in range(world - 1)],
                             "the others to enter the all_reduce")
        print(f"STOP_AT {time.time():.6f}", flush=True)
        os.kill(os.getpid(), signal.SIGSTOP)
        time.sleep(60)  # stopped here; the test SIGKILLs it (not a wait for a condition)
    t = torch.full((100,), float(rank + 1))
    pg_worker.mark(f"sigstop/entering/{rank}")
    start = time.monotonic()
    w = dist.all_reduce(t, async_op=True)
    check(w.wait() is True, "wait does not raise for a silent peer")
    took = time.monotonic() - start
    print(f"TOOK {took:.3f}", flush=True)
    check(1.5 < took < 2.0 + 3.0, f"completed after the heartbeat timeout ({took:.3f}s)")
    hint = pg.get_failed_ranks_hint(w)
    check(hint.tolist() == [int(r == victim) for r in range(world)], f"hint {hint.tolist()}")
    same(t, torch.full((100,), float(sum(range(1, world)))), "sum excludes the silent rank")
    check(active.tolist() == [int(r != victim) for r in range(world)], f"active {active.tolist()}")


pg_worker.SCENARIOS["tcp_ops"] = scenario_tcp_ops
pg_worker.SCENARIOS["sigstop"] = scenario_sigstop

if __name__ == "__main__":
    pg_worker.SCENARIOS[pg_worker.SCENARIO]()
    print(f"OK {pg_worker.SCENARIO} {pg_worker.CHECKS}", flush=True)
    sys.stdout.flush()
    os._exit(0)
