"""One rank of a Mooncake PG test group (spawned by test_pg.py; not collected by pytest).

usage: pg_worker.py SCENARIO RANK WORLD PORT

Each scenario runs many checks in one process group so that torch's import and the group's
set-up are paid once. Inputs are deterministic functions of the rank, so every rank computes
the expected result itself. A failed check raises; the exit code says it all, and the last
line on stdout is "OK <scenario> <checks>" on success.
"""

import datetime
import os
import signal
import sys
import time

import torch
import torch.distributed as dist

from mooncake import pg
from polling import wait_until  # noqa: E402  (beside this script)

SCENARIO, RANK, WORLD, PORT = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
CHECKS = 0

INT_DTYPES = [torch.int8, torch.uint8, torch.int16, torch.uint16, torch.int32, torch.uint32,
              torch.int64, torch.uint64]
FLOAT_DTYPES = [torch.float16, torch.bfloat16, torch.float32, torch.float64]
OPS = {"sum": dist.ReduceOp.SUM, "product": dist.ReduceOp.PRODUCT, "min": dist.ReduceOp.MIN,
       "max": dist.ReduceOp.MAX, "avg": dist.ReduceOp.AVG}


def check(cond, what):
    global CHECKS
    CHECKS += 1
    if not cond:
        raise AssertionError(f"rank {RANK}: {what}")


def same(got, want, what, tol=0.0):
    if got.dtype in (torch.float16, torch.bfloat16):
        tol = max(tol, 2e-2)
    if tol:
        ok = torch.allclose(got.double(), want.double(), rtol=tol, atol=tol)
    else:
        ok = torch.equal(got, want)
    if not ok:
        bad = (got.double() - want.double()).abs().argmax().item() if got.numel() else 0
        raise AssertionError(
            f"rank {RANK}: {what}: got {got.flatten()[bad].item()} want "
            f"{want.flatten()[bad].item()} at {bad} (numel {got.numel()})")
    check(True, what)


def inp(r, n, dtype):
    """Rank r's input: small values so sums and products fit every dtype."""
    base = (torch.arange(n, dtype=torch.int64) % 3) + r + 1  # 1..(3 + world)
    if dtype == torch.bool:
        return ((torch.arange(n) + r) % 3 == 0)
    return base.to(dtype)


def expected(op, n, dtype):
    xs = [inp(r, n, dtype) for r in range(WORLD)]
    if dtype == torch.bool:
        st = torch.stack(xs)
        if op in ("sum", "max"):
            return st.any(0)
        return st.all(0)
    if dtype in INT_DTYPES:
        st = torch.stack([x.to(torch.int64) for x in xs])
    else:
        st = torch.stack([x.to(torch.float64) for x in xs])
    out = {"sum": lambda: st.sum(0), "product": lambda: st.prod(0),
           "min": lambda: st.min(0).values, "max": lambda: st.max(0).values,
           "avg": lambda: st.mean(0)}[op]()
    if dtype in INT_DTYPES:
        # Wrapping arithmetic: reduce modulo 2^bits like the native fold.
        bits = torch.iinfo(dtype).bits
        out = out & ((1 << bits) - 1) if bits < 64 else out
        return out.to(torch.int64).to(dtype) if dtype != torch.uint64 else out.to(dtype)
    return out.to(dtype)


def init(options=None):
    # PG_EXTERNAL_STORE: the test process hosts the rendezvous store, so that it outlives any
    # rank (rank 0 too, which otherwise hosts it).
    where = {"init_method": f"tcp://127.0.0.1:{PORT}"}
    if os.environ.get("PG_EXTERNAL_STORE"):
        where = {"store": dist.TCPStore("127.0.0.1", PORT, WORLD, is_master=False,
                                        timeout=datetime.timedelta(seconds=60))}
    dist.init_process_group(
        backend=os.environ.get("PG_BACKEND", "mooncake-cpu"),
        rank=RANK,
        world_size=WORLD,
        pg_options=options,
        timeout=datetime.timedelta(seconds=60),
        **where,
    )


def mark(key):
    """Sets `key` in the group's rendezvous store: a flag another rank can wait for."""
    dist.distributed_c10d._get_default_store().set(key, "1")


def wait_marks(keys, what, timeout_s=60):
    """Waits until every key in `keys` is set in the rendezvous store (see `mark`)."""
    store = dist.distributed_c10d._get_default_store()
    wait_until(lambda: all(store.check([k]) for k in keys), timeout_s, what)


def all_reduce_matrix():
    for dtype in INT_DTYPES + FLOAT_DTYPES + [torch.bool]:
        for name, op in OPS.items():
            if name == "avg" and dtype not in FLOAT_DTYPES:
                t = inp(RANK, 5, dtype)
                try:
                    dist.all_reduce(t, op=op)
                except RuntimeError as e:
                    check("AVG" in str(e), f"AVG on {dtype} error names AVG: {e}")
                    continue
                raise AssertionError(f"AVG on {dtype} did not fail")
            # one-phase and two-phase (40k x 8 B > 64 KiB); fewer sizes at 4 ranks (2 cores)
            for n in ((1, 37, 40_000) if WORLD <= 2 else (37, 20_000)):
                t = inp(RANK, n, dtype)
                dist.all_reduce(t, op=op)
                same(t, expected(name, n, dtype), f"all_reduce {name} {dtype} n={n}",
                     1e-6 if dtype in FLOAT_DTYPES else 0.0)


def large_ops():
    n = 1_500_007  # 6 MB of float32: several slots, odd length
    for dtype, name in ((torch.float32, "sum"), (torch.int64, "max"), (torch.bfloat16, "avg")):
        t = inp(RANK, n, dtype)
        dist.all_reduce(t, op=OPS[name])
        same(t, expected(name, n, dtype), f"large all_reduce {name} {dtype}")
    # non-contiguous input: copied, reduced, copied back
    base = inp(RANK, 2 * 1001, torch.float32)
    view = base[::2]
    dist.all_reduce(view)
    want = sum(inp(r, 2 * 1001, torch.float32)[::2] for r in range(WORLD))
    same(base[::2], want, "all_reduce on a strided view")
    same(base[1::2], inp(RANK, 2 * 1001, torch.float32)[1::2], "strided view: others untouched")


def other_collectives():
    dtypes = (torch.float32, torch.int32, torch.bool, torch.uint8, torch.bfloat16)
    for dtype in dtypes if WORLD <= 2 else dtypes[1:4]:
        for n in (3, 300_001):
            # broadcast from the last rank
            root = WORLD - 1
            t = inp(RANK, n, dtype)
            dist.broadcast(t, src=root)
            same(t, inp(root, n, dtype), f"broadcast {dtype} n={n}")
            # all_gather (list) and all_gather_into_tensor
            outs = [torch.zeros(n, dtype=dtype) for _ in range(WORLD)]
            dist.all_gather(outs, inp(RANK, n, dtype))
            for r in range(WORLD):
                same(outs[r], inp(r, n, dtype), f"all_gather {dtype} n={n} slot {r}")
            flat = torch.zeros(WORLD * n, dtype=dtype)
            dist.all_gather_into_tensor(flat, inp(RANK, n, dtype))
            same(flat, torch.cat([inp(r, n, dtype) for r in range(WORLD)]),
                 f"all_gather_into_tensor {dtype} n={n}")
            # all_to_all: piece j of rank r is inp(r * WORLD + j)
            ins = [inp(RANK * WORLD + j, n, dtype) for j in range(WORLD)]
            outs = [torch.zeros(n, dtype=dtype) for _ in range(WORLD)]
            dist.all_to_all(outs, ins)
            for r in range(WORLD):
                same(outs[r], inp(r * WORLD + RANK, n, dtype), f"all_to_all {dtype} n={n} from {r}")
            single_in = torch.cat(ins)
            single_out = torch.zeros_like(single_in)
            dist.all_to_all_single(single_out, single_in)
            same(single_out, torch.cat([inp(r * WORLD + RANK, n, dtype) for r in range(WORLD)]),
                 f"all_to_all_single {dtype} n={n}")
            # gather / scatter to/from rank 0
            lst = [torch.zeros(n, dtype=dtype) for _ in range(WORLD)] if RANK == 0 else None
            dist.gather(inp(RANK, n, dtype), gather_list=lst, dst=0)
            if RANK == 0:
                for r in range(WORLD):
                    same(lst[r], inp(r, n, dtype), f"gather {dtype} n={n} slot {r}")
            out = torch.zeros(n, dtype=dtype)
            src = [inp(10 + j, n, dtype) for j in range(WORLD)] if RANK == 0 else None
            dist.scatter(out, scatter_list=src, src=0)
            same(out, inp(10 + RANK, n, dtype), f"scatter {dtype} n={n}")
            if dtype == torch.bool:
                continue
            # reduce to rank 1; reduce_scatter_tensor
            t = inp(RANK, n, dtype)
            dist.reduce(t, dst=1, op=dist.ReduceOp.MAX)
            if RANK == 1:
                same(t, expected("max", n, dtype), f"reduce max {dtype} n={n}")
            else:
                same(t, inp(RANK, n, dtype), f"reduce leaves non-root {dtype} alone")
            full = torch.cat([inp(RANK + 100 * j, n, dtype) for j in range(WORLD)])
            out = torch.zeros(n, dtype=dtype)
            dist.reduce_scatter_tensor(out, full, op=dist.ReduceOp.SUM)
            want = sum(inp(r + 100 * RANK, n, torch.int64) for r in range(WORLD))
            same(out, want.to(dtype) if dtype != torch.bfloat16 else want.to(torch.float32).to(dtype),
                 f"reduce_scatter_tensor {dtype} n={n}", 1e-6)
    # reduce_scatter (list form) and AVG on float
    outs = torch.zeros(4)
    dist.reduce_scatter(outs, [torch.full((4,), float(RANK + j)) for j in range(WORLD)],
                        op=dist.ReduceOp.AVG)
    same(outs, torch.full((4,), sum(r + RANK for r in range(WORLD)) / WORLD), "reduce_scatter avg")
    dist.barrier()
    check(True, "barrier")


def async_and_p2p():
    # async collectives return work objects
    ts = [inp(RANK, 1000 + i, torch.float32) for i in range(4)]
    works = [dist.all_reduce(t, async_op=True) for t in ts]
    for i, (t, w) in enumerate(zip(ts, works)):
        check(w.wait() is True, "wait returns True")
        check(w.is_completed(), "completed after wait")
        check(pg.get_local_success(w), "local success")
        check(pg.get_failed_ranks_hint(w).sum().item() == 0, "empty hint")
        same(t, expected("sum", 1000 + i, torch.float32), f"async all_reduce {i}")
    t = inp(RANK, 10, torch.float64)
    fut = dist.all_reduce(t, async_op=True).get_future()
    fut.wait()
    same(t, expected("sum", 10, torch.float64), "future of an async all_reduce")
    # send / recv, isend / irecv, batch_isend_irecv along a ring, several sizes
    nxt, prv = (RANK + 1) % WORLD, (RANK - 1) % WORLD
    for n in (0, 7, 3_000_001):
        if RANK % 2 == 0:
            dist.send(inp(RANK, n, torch.float32), dst=nxt)
            got = torch.zeros(n)
            dist.recv(got, src=prv)
        else:
            got = torch.zeros(n)
            dist.recv(got, src=prv)
            dist.send(inp(RANK, n, torch.float32), dst=nxt)
        same(got, inp(prv, n, torch.float32), f"send/recv n={n}")
        got = torch.zeros(n, dtype=torch.int64)
        ws = [dist.isend(inp(RANK, n, torch.int64), dst=nxt), dist.irecv(got, src=prv)]
        for w in ws:
            w.wait()
        same(got, inp(prv, n, torch.int64), f"isend/irecv n={n}")
        got = torch.zeros(n, dtype=torch.bfloat16)
        ops = [dist.P2POp(dist.irecv, got, prv),
               dist.P2POp(dist.isend, inp(RANK, n, torch.bfloat16), nxt)]
        for w in dist.batch_isend_irecv(ops):
            w.wait()
        same(got, inp(prv, n, torch.bfloat16), f"batch_isend_irecv n={n}")
    # several messages to the same peer keep their order
    if WORLD >= 2 and RANK < 2:
        peer = 1 - RANK
        if RANK == 0:
            ws = [dist.isend(torch.full((5,), float(i)), dst=peer) for i in range(5)]
        else:
            bufs = [torch.zeros(5) for _ in range(5)]
            ws = [dist.irecv(b, src=peer) for b in bufs]
        for w in ws:
            w.wait()
        if RANK == 1:
            for i, b in enumerate(bufs):
                same(b, torch.full((5,), float(i)), f"p2p FIFO message {i}")


def subgroup():
    g = dist.new_group(ranks=[0, 1], backend="mooncake-cpu",
                       pg_options=pg.MooncakeBackendOptions(2))
    if RANK < 2:
        t = torch.full((8,), float(RANK + 1))
        dist.all_reduce(t, group=g)
        same(t, torch.full((8,), 3.0), "subgroup all_reduce")
        check(pg.get_active_ranks(g).tolist() == [1, 1], "subgroup active ranks")


def scenario_ops():
    active = torch.zeros(WORLD, dtype=torch.int32)
    init(pg.MooncakeBackendOptions(active))
    check(active.tolist() == [1] * WORLD, f"active_ranks mirrored at init: {active.tolist()}")
    check(pg.get_active_ranks(dist.group.WORLD) is active, "get_active_ranks is the user's tensor")
    check(pg.get_current_epoch(dist.group.WORLD) == 0, "epoch 0 at start")
    check(dist.get_backend() == os.environ.get("PG_BACKEND", "mooncake-cpu"), "backend name")
    all_reduce_matrix()
    large_ops()
    other_collectives()
    async_and_p2p()
    subgroup()
    check(pg.sync_after_failure(dist.group.WORLD).status == pg.SyncAfterFailureStatus.NoPending,
          "no failure pending")
    dist.barrier()
    dist.destroy_process_group()


def expect_error(fn, words, what):
    try:
        fn()
    except (RuntimeError, ValueError, TypeError) as e:
        msg = str(e)
        check(all(w.lower() in msg.lower() for w in words), f"{what}: message {msg!r} has {words}")
        return
    raise AssertionError(f"rank {RANK}: {what}: no error")


def scenario_bad_input():
    init(pg.MooncakeBackendOptions(WORLD))
    t = torch.ones(4)
    # local checks: raised at the call
    expect_error(lambda: dist.all_gather([torch.zeros(4)] * (WORLD + 1), t), ["one per rank"],
                 "all_gather list length")
    expect_error(lambda: dist.all_gather([torch.zeros(5) for _ in range(WORLD)], t), ["numel"],
                 "all_gather wrong shape")
    expect_error(lambda: dist.all_gather_into_tensor(torch.zeros(4 * WORLD + 1), t), ["output"],
                 "all_gather_into_tensor wrong size")
    expect_error(lambda: dist.reduce_scatter_tensor(torch.zeros(4), torch.zeros(4 * WORLD - 1)),
                 ["input"], "reduce_scatter_tensor wrong size")
    expect_error(lambda: dist.all_to_all([torch.zeros(4)] * WORLD, [torch.zeros(3)] * WORLD),
                 ["numel"], "all_to_all mismatched pieces")
    expect_error(lambda: dist.broadcast(t, src=WORLD + 3), ["rank"], "broadcast bad root")
    expect_error(lambda: dist.all_reduce(torch.ones(3, dtype=torch.int32), op=dist.ReduceOp.AVG),
                 ["AVG"], "AVG on int")
    if hasattr(torch, "float8_e5m2"):
        expect_error(lambda: dist.all_reduce(torch.ones(3).to(torch.float8_e5m2)), ["reduc"],
                     "fp8 reduction")
    expect_error(lambda: dist.broadcast(torch.empty(3, dtype=torch.bits8), src=0), ["datatype"],
                 "unsupported dtype")
    expect_error(lambda: dist.all_reduce(torch.ones(3), op=dist.ReduceOp.BXOR), ["op"],
                 "unsupported op")
    # a tensor off the CPU (CUDA in real use; "meta" here, there is no GPU) is refused
    expect_error(lambda: dist.all_reduce(torch.ones(3, device="meta")), ["runs on CPU"],
                 "non-CPU tensor")
    expect_error(lambda: pg.MooncakeBackendOptions(torch.ones(WORLD)), ["int32"],
                 "options: float tensor")
    expect_error(lambda: pg.MooncakeBackendOptions(4, False, False, True),
                 ["auto_sync_on_failure requires"], "options: auto_sync without deactivate")
    expect_error(lambda: pg.MooncakeBackendOptions(4, False, True), ["incompatible"],
                 "options: no 3-int form")
    expect_error(lambda: pg.set_p2p_timeout_us(-1), [">= 0"], "negative p2p timeout")
    # cross-rank mismatches: every rank fails, none hangs
    n = 10 + RANK
    expect_error(lambda: dist.all_reduce(torch.ones(n)), ["mismatched"], "sizes differ")
    dt = torch.float32 if RANK == 0 else torch.float64
    expect_error(lambda: dist.all_reduce(torch.ones(4, dtype=dt)), ["mismatched"], "dtypes differ")
    big = 5_000_000 if RANK == 0 else 4
    expect_error(lambda: dist.all_reduce(torch.ones(big)), ["mismatched"], "big vs small")
    op = dist.ReduceOp.SUM if RANK == 0 else dist.ReduceOp.MAX
    expect_error(lambda: dist.all_reduce(torch.ones(4), op=op), ["mismatched"], "ops differ")
    if RANK == 0:
        expect_error(lambda: dist.broadcast(torch.ones(4), src=0), ["mismatched"], "kinds differ")
    else:
        expect_error(lambda: dist.all_reduce(torch.ones(4)), ["mismatched"], "kinds differ")
    # p2p size mismatch: the receive fails with both sizes, the channel stays usable
    if RANK == 0:
        dist.send(torch.ones(8), dst=1)
        dist.send(torch.full((3,), 2.0), dst=1)
    elif RANK == 1:
        expect_error(lambda: dist.recv(torch.zeros(6), src=0), ["24 bytes", "32 bytes"], "recv size mismatch")
        got = torch.zeros(3)
        dist.recv(got, src=0)
        same(got, torch.full((3,), 2.0), "channel usable after a mismatch")
    # still in step afterwards
    t = torch.full((4,), float(RANK))
    dist.all_reduce(t)
    same(t, torch.full((4,), float(sum(range(WORLD)))), "collectives work after bad input")
    if os.environ.get("PG_HOST_IDS"):
        # Ranks on several hosts: proposals are decided across hosts (test_pg_membership.py
        # runs the flows); bad ones are refused with the reason, redundant ones Applied.
        r = pg.deactivate_ranks(dist.group.WORLD, [WORLD + 3])
        check(r.status == pg.ProposalStatus.Rejected and "out of range" in r.reject_reason,
              f"out-of-range deactivate refused: {r.status} {r.reject_reason!r}")
        r = pg.recover_ranks(dist.group.WORLD, list(range(WORLD)))
        check(r.status == pg.ProposalStatus.Applied,
              f"redundant recover: {r.status} {r.reject_reason!r}")
        # Every rank's proposal is answered before any rank leaves: a proposal decided after
        # a peer called destroy_process_group is refused, rightly ("rank 0 left the group").
        dist.barrier()
    dist.destroy_process_group()


def scenario_sigkill():
    """The last rank dies (SIGKILL) while the others are inside an all_reduce."""
    pg.set_collective_timeout_us(500_000)
    pg.set_fault_reconciliation_window_us(500_000)
    active = torch.zeros(WORLD, dtype=torch.int32)
    init(pg.MooncakeBackendOptions(active))
    victim = WORLD - 1
    t = torch.full((1000,), float(RANK + 1))
    dist.all_reduce(t)
    same(t, torch.full((1000,), float(sum(range(1, WORLD + 1)))), "all_reduce before the kill")
    if RANK == victim:
        # the others mark the store right before the next all_reduce; once every mark is
        # there they are entering it (or inside it): either way the kill lands mid-collective
        wait_marks([f"sigkill/entering/{r}" for r in range(WORLD - 1)], "the others to enter")
        print(f"KILL_AT {time.time():.6f}", flush=True)
        os.kill(os.getpid(), signal.SIGKILL)
    for n in (1000, 3_000_000):  # one-phase and two-phase paths
        t = torch.full((n,), float(RANK + 1))
        if n == 1000:
            mark(f"sigkill/entering/{RANK}")
        start = time.monotonic()
        w = dist.all_reduce(t, async_op=True)
        check(w.wait() is True, "wait does not raise for a dead peer")
        took = time.monotonic() - start
        if n == 1000:
            print(f"DONE_AT {time.time():.6f}", flush=True)
            check(took < 0.5 + 0.5 + 0.3 + 2.0, f"completed within timeout + window ({took:.3f}s)")
            hint = pg.get_failed_ranks_hint(w)
            check(hint.tolist() == [int(r == victim) for r in range(WORLD)], f"hint {hint.tolist()}")
            check(not pg.get_local_success(w), "local success is False")
        else:
            check(pg.get_local_success(w), "second op: dead rank already excluded")
        survivors = sum(range(1, WORLD))  # ranks 0..WORLD-2 contribute RANK+1
        same(t, torch.full((n,), float(survivors)), f"survivors' sum excludes the dead, n={n}")
        check(active.tolist() == [int(r != victim) for r in range(WORLD)],
              f"active_ranks {active.tolist()}")
    check(pg.get_current_epoch(dist.group.WORLD) == 1, "epoch advanced once")
    check(pg.get_peer_state(dist.group.WORLD, [victim]) == [False], "dead peer not ready")
    r = pg.sync_after_failure(dist.group.WORLD)
    check(r.status == pg.SyncAfterFailureStatus.Reconciled, f"sync_after_failure {r.status}")
    r = pg.recover_ranks(dist.group.WORLD, [0])
    check(r.status == pg.ProposalStatus.Applied, "recover of an active rank: Applied")
    # later collectives among the survivors: broadcast, all_gather (dead slot untouched)
    t = torch.full((10,), float(RANK))
    dist.broadcast(t, src=0)
    same(t, torch.zeros(10), "broadcast among survivors")
    outs = [torch.full((3,), -1.0) for _ in range(WORLD)]
    dist.all_gather(outs, torch.full((3,), float(RANK)))
    for r in range(WORLD):
        same(outs[r], torch.full((3,), float(r) if r != victim else -1.0), f"all_gather slot {r}")
    # large all_gather (the direct-read path when available): the dead rank's slot untouched
    outs = [torch.full((100_000,), -1.0) for _ in range(WORLD)]
    w = dist.all_gather(outs, torch.full((100_000,), float(RANK)), async_op=True)
    w.wait()
    for r in range(WORLD):
        same(outs[r], torch.full((100_000,), float(r) if r != victim else -1.0),
             f"large all_gather slot {r}")
    # p2p to the dead rank fails without hanging, the hint names it
    w = dist.isend(torch.ones(4_000_000), dst=victim)  # larger than the channel: needs acks
    w.wait()
    check(not pg.get_local_success(w), "send to a dead rank: no local success")
    check(pg.get_failed_ranks_hint(w)[victim].item() == 1, "send to a dead rank: hint")
    dist.barrier()
    # No destroy_process_group: the dead rank cannot take part in shutdown; main() exits.


def scenario_leave():
    """The last rank leaves gracefully (deactivate_ranks([self])); the others go on."""
    active = torch.zeros(WORLD, dtype=torch.int32)
    init(pg.MooncakeBackendOptions(active))
    g = dist.group.WORLD
    leaver = WORLD - 1
    t = torch.ones(10)
    dist.all_reduce(t)
    same(t, torch.full((10,), float(WORLD)), "all_reduce before the leave")
    if RANK == leaver:
        r = pg.deactivate_ranks(g, [RANK])
        check(r.status == pg.ProposalStatus.Applied, f"leave applied: {r.status}")
        check(active[RANK].item() == 0, "own slot inactive after leaving")
        expect_error(lambda: dist.all_reduce(torch.ones(3)), ["not active"], "collective after leave")
        # stay alive until the others are through their collectives: they must not need
        # this process to be gone
        wait_marks([f"leave/through/{r}" for r in range(WORLD - 1)], "the others' all_reduce")
        mark("leave/seen")  # rank 0 hosts the store: it stays until this is read
        return
    for n in (10, 3_000_000):
        t = torch.ones(n)
        w = dist.all_reduce(t, async_op=True)
        w.wait()
        same(t, torch.full((n,), float(WORLD - 1)), f"survivors' all_reduce n={n}")
        check(pg.get_local_success(w), "a graceful leave is not a failure")
    mark(f"leave/through/{RANK}")
    check(active.tolist() == [int(r != leaver) for r in range(WORLD)], f"active {active.tolist()}")
    r = pg.deactivate_ranks(g, [leaver])  # already out: nothing to change
    check(r.status == pg.ProposalStatus.Applied, f"deactivating the leaver again: {r.status}")
    if RANK == 0:
        wait_marks(["leave/seen"], "the leaver to see the others through")
    dist.barrier()


def all_to_all_p2p(n, tag):
    """One round of send/recv between every pair of ranks through batch_isend_irecv: returns
    [(kind, peer, work)] and the receive buffers by peer. Rank r sends r * 100 + peer + tag."""
    ops, meta, bufs = [], [], {}
    for peer in range(WORLD):
        if peer == RANK:
            continue
        bufs[peer] = torch.full((n,), -1.0)
        ops.append(dist.P2POp(dist.isend, torch.full((n,), RANK * 100.0 + peer + tag), peer))
        meta.append(("send", peer))
        ops.append(dist.P2POp(dist.irecv, bufs[peer], peer))
        meta.append(("recv", peer))
    works = dist.batch_isend_irecv(ops)
    check(len(works) == len(ops), f"one work per op ({len(works)} for {len(ops)})")
    return [(k, p, w) for (k, p), w in zip(meta, works)], bufs


def check_p2p_round(round_, victim, tag, n):
    """Waits on every work of a round and checks its own op's outcome: the hint marks the
    victim only on ops addressed to it, and only those lack local success. Reports every
    wrong work at once."""
    wrong = []
    for kind, peer, w in round_[0]:
        check(w.wait(datetime.timedelta(seconds=30)) is True, f"{kind} {peer}: wait")
        hint = pg.get_failed_ranks_hint(w).tolist()
        dead = peer == victim
        want = [int(dead and r == peer) for r in range(WORLD)]
        ok, succ = pg.get_local_success(w), w.is_success()
        if hint != want or ok is dead or succ is dead:
            wrong.append(f"{kind} peer {peer}: hint {hint} (want {want}), local_success {ok}, "
                         f"is_success {succ}")
    check(not wrong, f"tag {tag} n={n}: " + "; ".join(wrong))
    for peer, buf in round_[1].items():
        if peer != victim:
            same(buf, torch.full((n,), peer * 100.0 + RANK + tag), f"tag {tag}: from {peer}")


def scenario_p2p_hints():
    """Every rank exchanges with every other through batch_isend_irecv; the victim (env
    PG_VICTIM) exits (PG_VICTIM_HOW=kill: SIGKILL, else os._exit) between two rounds. Each
    survivor's work carries its own op's outcome only."""
    victim = int(os.environ["PG_VICTIM"])
    pg.set_p2p_timeout_us(20_000_000)  # a failure must come from the death, not a timeout
    init()
    for n in (5, 300_000):  # one chunk, several chunks
        check_p2p_round(all_to_all_p2p(n, 0), None, 0, n)
    if RANK == victim:
        dist.barrier()  # every rank's first rounds are through
        if os.environ.get("PG_VICTIM_HOW") == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        os._exit(0)
    dist.barrier()
    # Issued at once, maybe before the victim is gone: the outcome must not depend on that.
    for tag, n in ((1, 5), (2, 300_000)):
        check_p2p_round(all_to_all_p2p(n, tag), victim, tag, n)
    # The survivors go on exchanging among themselves.
    survivors = [r for r in range(WORLD) if r != victim]
    ops, bufs = [], {}
    for peer in survivors:
        if peer != RANK:
            bufs[peer] = torch.zeros(3)
            ops += [dist.P2POp(dist.isend, torch.full((3,), float(RANK)), peer),
                    dist.P2POp(dist.irecv, bufs[peer], peer)]
    for w in dist.batch_isend_irecv(ops):
        w.wait()
        check(pg.get_local_success(w), "survivors' round after the death")
    for peer, b in bufs.items():
        same(b, torch.full((3,), float(peer)), f"survivors' round from {peer}")


def scenario_reinit():
    """PG_CYCLES times: all_reduce, destroy_process_group, init_process_group again with the
    same rendezvous, all_reduce. Prints how long each cycle took."""
    init()
    for cycle in range(int(os.environ.get("PG_CYCLES", "1"))):
        start = time.monotonic()
        t = torch.full((1000,), float(RANK + cycle))
        dist.all_reduce(t)
        same(t, torch.full((1000,), float(sum(range(WORLD)) + WORLD * cycle)), f"cycle {cycle}")
        dist.destroy_process_group()
        init()
        t = torch.ones(10)
        dist.all_reduce(t)
        same(t, torch.full((10,), float(WORLD)), f"cycle {cycle}: after re-init")
        print(f"CYCLE {cycle} {time.monotonic() - start:.3f}", flush=True)
    dist.destroy_process_group()


SCENARIOS = {"reinit": scenario_reinit, "p2p_hints": scenario_p2p_hints, "leave": scenario_leave, "ops": scenario_ops, "bad_input": scenario_bad_input, "sigkill": scenario_sigkill}

if __name__ == "__main__":
    SCENARIOS[SCENARIO]()
    print(f"OK {SCENARIO} {CHECKS}", flush=True)
    sys.stdout.flush()
    os._exit(0)
