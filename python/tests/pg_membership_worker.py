"""One process of a Mooncake PG membership test (spawned by test_pg_membership.py).

usage: pg_membership_worker.py SCENARIO RANK WORLD PORT

Inputs are deterministic functions of the rank, so every process computes the expected
results itself. A failed check raises; on success the last line is "OK <scenario> <checks>".
"""

import os
import signal
import sys
import time

import torch
import torch.distributed as dist

from mooncake import pg

SCENARIO, RANK, WORLD, PORT = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
if os.environ.get("PG_HOST_IDS"):
    # "Other hosts" on one machine: ranks with different ids link over TCP (net.rs).
    os.environ["MC_PG_HOST_ID"] = os.environ["PG_HOST_IDS"].split(",")[RANK]
CHECKS = 0
APPLIED = pg.ProposalStatus.Applied


def check(cond, what):
    global CHECKS
    CHECKS += 1
    if not cond:
        raise AssertionError(f"rank {RANK}: {what}")


def init(opts):
    if os.environ.get("PG_TEST_EXTERNAL_STORE") == "1":
        # The store is a server outside every rank (the test process), so rank 0 can die
        # and be replaced.
        store = dist.TCPStore("127.0.0.1", PORT, is_master=False,
                              timeout=__import__("datetime").timedelta(seconds=60))
        dist.init_process_group(
            backend="mooncake-cpu", store=store, rank=RANK, world_size=WORLD, pg_options=opts)
        return
    dist.init_process_group(
        backend="mooncake-cpu", init_method=f"tcp://127.0.0.1:{PORT}", rank=RANK,
        world_size=WORLD, pg_options=opts)


def all_reduce_of(ranks, n=10):
    """all_reduce of rank-dependent inputs; checks the result is the sum over ``ranks``."""
    t = torch.full((n,), float(RANK + 1))
    dist.all_reduce(t)
    want = float(sum(r + 1 for r in ranks))
    check(torch.equal(t, torch.full((n,), want)), f"all_reduce over {ranks}: got {t[0].item()} want {want}")


def wait_for(cond, what, timeout=30.0):
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            c = pg._pg(None)._comm
            raise AssertionError(
                f"rank {RANK}: timed out waiting for {what} (view {c.view_id()}, epoch "
                f"{c.epoch()}, active mask {c.active():b})")
        time.sleep(0.01)
    check(True, what)


def expect_error(fn, words, what):
    try:
        fn()
    except RuntimeError as e:
        msg = str(e)
        check(all(w in msg for w in words), f"{what}: error {msg!r} lacks {words}")
        return
    raise AssertionError(f"rank {RANK}: {what}: no error")


def scenario_replace():
    """Rank 2 is SIGKILLed; a new process takes rank 2 over (is_extension + join_group), the
    survivors recover it (both, redundantly) and later collectives include it again."""
    active = torch.ones(WORLD, dtype=torch.int32)
    init(pg.MooncakeBackendOptions(active))
    g = dist.group.WORLD
    all_reduce_of(range(WORLD))
    if RANK == 2:
        os.kill(os.getpid(), signal.SIGKILL)
    all_reduce_of([0, 1])
    check(active.tolist() == [1, 1, 0], f"dead rank inactive: {active.tolist()}")
    check(pg.sync_after_failure(g).status == pg.SyncAfterFailureStatus.Reconciled, "reconciled")
    check(pg.sync_after_failure(g).status == pg.SyncAfterFailureStatus.NoPending, "no pending")
    check(pg.get_peer_state(g, [0, 1, 2]) == [True, True, False], "peer state after the death")
    check(pg.get_num_synced_ranks(g) == 2, "two synced ranks")
    epoch = pg.get_current_epoch(g)
    wait_for(lambda: pg.get_peer_state(g, [2]) == [True], "the replacement waits to join")
    check(pg.get_num_synced_ranks(g) == 3, "three synced ranks")
    r = pg.recover_ranks(g, [2])
    check(r.status == APPLIED, f"recover applied: {r.status} {r.reject_reason}")
    all_reduce_of(range(WORLD))
    check(active.tolist() == [1, 1, 1], f"all active again: {active.tolist()}")
    check(pg.get_current_epoch(g) > epoch, "epoch advanced")
    common_after_join(g)


def scenario_replace_rank0():
    """Rank 0 (whose process does not hold the store here) is SIGKILLed; a new process
    takes rank 0 over and the survivors recover it. Rank 1 decides meanwhile."""
    active = torch.ones(WORLD, dtype=torch.int32)
    init(pg.MooncakeBackendOptions(active))
    g = dist.group.WORLD
    all_reduce_of(range(WORLD))
    if RANK == 0:
        os.kill(os.getpid(), signal.SIGKILL)
    all_reduce_of(range(1, WORLD))
    check(active.tolist() == [0, 1, 1], f"dead rank 0 inactive: {active.tolist()}")
    wait_for(lambda: pg.get_peer_state(g, [0]) == [True], "the replacement waits to join")
    r = pg.recover_ranks(g, [0])
    check(r.status == APPLIED, f"recover rank 0 applied: {r.status} {r.reject_reason}")
    all_reduce_of(range(WORLD))
    check(active.tolist() == [1, 1, 1], f"all active again: {active.tolist()}")
    common_after_join(g, joined=0)


def scenario_replace_rank0_joiner():
    """The replacement process for rank 0."""
    active = torch.zeros(WORLD, dtype=torch.int32)
    init(pg.MooncakeBackendOptions(active, True))
    g = dist.group.WORLD
    check(active.tolist() == [1, 0, 0], f"isolated before join: {active.tolist()}")
    t = torch.full((4,), 7.0)
    dist.all_reduce(t)
    check(torch.equal(t, torch.full((4,), 7.0)), "isolated all_reduce is local")
    pg.join_group(g)
    check(active.tolist() == [1, 1, 1], f"active after join: {active.tolist()}")
    all_reduce_of(range(WORLD))
    common_after_join(g, joined=0)


def scenario_subgroup_extend():
    """Upstream's extension of a subgroup: ranks 0 and 1 create ``new_group([0])`` with
    max_group_size 2; rank 2 creates ``new_group([0, 2])`` with is_extension=True. Both are
    the first new_group of their process, so torch names them alike and they resolve as one
    group of two slots: rank 2 takes slot 1 (join_group), rank 0 activates it."""
    T0 = time.monotonic()
    init(pg.MooncakeBackendOptions(torch.ones(WORLD, dtype=torch.int32)))
    if RANK < 2:
        g = dist.new_group([0], backend="mooncake-cpu", pg_options=pg.MooncakeBackendOptions(2))
        dist.barrier()  # rank 2 extends the subgroup only once it exists
    else:
        dist.barrier()
        g = dist.new_group([0, 2], backend="mooncake-cpu",
                           pg_options=pg.MooncakeBackendOptions(2, True))
    if RANK == 0:
        active = pg.get_active_ranks(g)
        check(active.tolist() == [1, 0] and dist.get_world_size(g) == 1, "alone in [0]")
        t = torch.full((4,), 5.0)
        dist.all_reduce(t, group=g)
        check(torch.equal(t, torch.full((4,), 5.0)), "all_reduce alone")
        wait_for(lambda: pg.get_peer_state(g, [1]) == [True], "rank 2 waits in slot 1")
        check(pg.get_num_synced_ranks(g) == 2, "two synced slots")
        r = pg.recover_ranks(g, [1])
        check(r.status == APPLIED, f"activate slot 1: {r.status} {r.reject_reason}")
    elif RANK == 2:
        active = pg.get_active_ranks(g)
        check(active.tolist() == [0, 1], f"isolated before join: {active.tolist()}")
        check(dist.get_world_size(g) == 2, "declared size while joining")
        pg.join_group(g)
        check(active.tolist() == [1, 1], f"active after join: {active.tolist()}")
    print(f"rank {RANK}: joined at {time.monotonic() - T0:.1f}s", flush=True)
    if RANK != 1:
        slot = 0 if RANK == 0 else 1
        t = torch.full((10,), float(RANK + 1))
        dist.all_reduce(t, group=g)
        check(torch.equal(t, torch.full((10,), 4.0)), f"all_reduce over 0, 2: {t[0].item()}")
        check(active.tolist() == [1, 1] and dist.get_world_size(g) == 2, "two active slots")
        big = torch.full((3_000_000,), float(RANK + 1))
        dist.all_reduce(big, group=g)
        check(torch.equal(big, torch.full((3_000_000,), 4.0)), "large all_reduce over 0, 2")
        outs = [torch.zeros(1000) for _ in range(2)]
        dist.all_gather(outs, torch.full((1000,), float(RANK)), group=g)
        check(torch.equal(outs[0], torch.zeros(1000)) and torch.equal(outs[1], torch.full((1000,), 2.0)),
              "all_gather over the extended group")
        b = torch.arange(100, dtype=torch.float64) + (7 if RANK == 0 else 0)
        dist.broadcast(b, src=0, group=g)
        check(torch.equal(b, torch.arange(100, dtype=torch.float64) + 7), "broadcast")
        # torch's dist.send/recv map ranks through the torch group ([0] on rank 0), which
        # has no slot 1: rank 0 addresses it through the group object.
        if slot == 1:
            dist.send(torch.full((5,), 42.0), group=g, group_dst=0)
        else:
            got = torch.zeros(5)
            g.recv([got], 1, 0).wait()
            check(torch.equal(got, torch.full((5,), 42.0)), "recv from the extension")
    if RANK == 2:
        # A group with no founder under its torch name: runs alone, join_group says so.
        g2 = dist.new_group([0, 2], backend="mooncake-cpu",
                            pg_options=pg.MooncakeBackendOptions(2, True))
        expect_error(lambda: pg.join_group(g2), ["extension target not found"], "no target")
    dist.barrier()


def scenario_remote_replace():
    """Both ranks on host a, reading each other's memory directly: rank 1 is SIGKILLed;
    rank 0 carries on alone and waits until a replacement on another host was refused."""
    init(pg.MooncakeBackendOptions(torch.ones(WORLD, dtype=torch.int32)))
    check(pg._pg(None)._comm.cma_probe(), "direct reads work here (the refusal needs them)")
    all_reduce_of(range(WORLD))
    if RANK == 1:
        os.kill(os.getpid(), signal.SIGKILL)
    all_reduce_of([0])
    dist.TCPStore("127.0.0.1", PORT, is_master=False).wait(["joiner_refused"])
    all_reduce_of([0])


def scenario_remote_replace_joiner():
    """A replacement for rank 1 from another host, for a group that reads its peers' memory
    directly (which a remote process cannot serve): refused at init, naming the rank and
    the way out (MC_PG_CMA=0)."""
    os.environ["MC_PG_HOST_ID"] = "elsewhere"
    expect_error(lambda: init(pg.MooncakeBackendOptions(torch.zeros(WORLD, dtype=torch.int32), True)),
                 ["rank 0 runs on another host", "MC_PG_CMA=0"], "remote replacement")
    dist.TCPStore("127.0.0.1", PORT, is_master=False).set("joiner_refused", "1")


def scenario_replace_joiner():
    """The replacement process for rank 2."""
    active = torch.zeros(WORLD, dtype=torch.int32)
    init(pg.MooncakeBackendOptions(active, True))
    g = dist.group.WORLD
    check(active.tolist() == [0, 0, 1], f"isolated before join: {active.tolist()}")
    t = torch.full((4,), 7.0)
    dist.all_reduce(t)  # local only before the join, as upstream
    check(torch.equal(t, torch.full((4,), 7.0)), "isolated all_reduce is local")
    pg.join_group(g)
    check(active.tolist() == [1, 1, 1], f"active after join: {active.tolist()}")
    expect_error(lambda: pg.join_group(g), ["already active"], "join when already active")
    all_reduce_of(range(WORLD))
    common_after_join(g)


def common_after_join(g, joined=2):
    """Collectives and point-to-point with the rejoined rank, large and small."""
    all_reduce_of(range(WORLD), n=3_000_000)
    t = torch.arange(1000, dtype=torch.float64) + (100 if RANK == 0 else 0)
    dist.broadcast(t, src=0)
    check(torch.equal(t, torch.arange(1000, dtype=torch.float64) + 100), "broadcast")
    outs = [torch.zeros(300_000) for _ in range(WORLD)]
    dist.all_gather(outs, torch.full((300_000,), float(RANK)))
    check(all(torch.equal(o, torch.full((300_000,), float(r))) for r, o in enumerate(outs)),
          "all_gather")
    other = 1 if joined == 0 else 0
    if RANK == joined:
        dist.send(torch.full((5,), 42.0), dst=other)
    elif RANK == other:
        got = torch.zeros(5)
        dist.recv(got, src=joined)
        check(torch.equal(got, torch.full((5,), 42.0)), "recv from the rejoined rank")
    dist.barrier()


def scenario_evict_rejoin():
    """A live rank is deactivated by one survivor, then rejoins in place (join_group) and is
    activated by every survivor."""
    active = torch.ones(WORLD, dtype=torch.int32)
    init(pg.MooncakeBackendOptions(active))
    g = dist.group.WORLD
    all_reduce_of(range(WORLD))
    check(pg.get_current_epoch(g) == 0, "epoch 0")
    victim = WORLD - 1
    if RANK == 0:
        r = pg.deactivate_ranks(g, [victim])
        check(r.status == APPLIED, f"deactivate applied: {r.status} {r.reject_reason}")
        check(r.dropped_ranks == [], "nothing dropped")
        r = pg.deactivate_ranks(g, [victim])
        check(r.status == APPLIED, "deactivating an inactive rank again is a no-op")
    # Everybody else learns it without calling anything (idle ranks adopt the view).
    wait_for(lambda: active[victim].item() == 0, "the victim is inactive")
    check(pg.get_current_epoch(g) == 1, "epoch 1 after the deactivation")
    if RANK == victim:
        expect_error(lambda: dist.all_reduce(torch.ones(3)), ["not active"], "evicted collective")
        pg.join_group(g)
        check(active.tolist() == [1] * WORLD, f"active after rejoin: {active.tolist()}")
    else:
        all_reduce_of(range(WORLD - 1))
        all_reduce_of(range(WORLD - 1), n=3_000_000)
        wait_for(lambda: pg.get_peer_state(g, [victim]) == [True], "the victim waits to join")
        r = pg.activate_ranks(g, [victim])
        check(r.status == APPLIED, f"activate applied: {r.status} {r.reject_reason}")
    all_reduce_of(range(WORLD))
    check(active.tolist() == [1] * WORLD, f"all active: {active.tolist()}")
    all_reduce_of(range(WORLD), n=3_000_000)
    dist.barrier()


def scenario_decider_dies():
    """The decider (rank 0) dies; rank 1 becomes the decider and deactivates rank 2."""
    active = torch.ones(WORLD, dtype=torch.int32)
    init(pg.MooncakeBackendOptions(8, False, False, False))
    g = dist.group.WORLD
    all_reduce_of(range(WORLD))
    if RANK == 0:
        os.kill(os.getpid(), signal.SIGKILL)
    active = pg.get_active_ranks(g)
    all_reduce_of(range(1, WORLD))  # auto-deactivation is off: rank 0 stays in the view
    check(active.tolist()[:WORLD] == [1] * WORLD, f"rank 0 still active: {active.tolist()}")
    r = pg.deactivate_ranks(g, [0])
    check(r.status == APPLIED, f"deactivate the dead decider: {r.status} {r.reject_reason}")
    wait_for(lambda: active[0].item() == 0, "rank 0 inactive")
    if RANK == 1:
        r = pg.deactivate_ranks(g, [3])
        check(r.status == APPLIED, f"rank 1 decides: {r.status} {r.reject_reason}")
    wait_for(lambda: active[3].item() == 0, "rank 3 inactive")
    if RANK == 3:
        expect_error(lambda: dist.all_reduce(torch.ones(3)), ["not active"], "evicted collective")
        return
    t = torch.full((10,), float(RANK + 1))
    w = dist.all_reduce(t, async_op=True)
    w.wait()
    check(torch.equal(t, torch.full((10,), 5.0)), f"all_reduce over 1, 2: {t[0].item()}")
    check(pg.get_local_success(w), "no failure seen once rank 0 is out of the view")


def scenario_no_ack():
    """A stopped member cannot acknowledge: the proposal is Rejected naming it. When the
    stopped member is killed while the next proposal waits, it is dropped from the view:
    AppliedWithDroppedRanks with dropped_ranks == [2]."""
    import threading

    active = torch.ones(WORLD, dtype=torch.int32)
    init(pg.MooncakeBackendOptions(active))
    g = dist.group.WORLD
    pids = [torch.zeros(1, dtype=torch.int64) for _ in range(WORLD)]
    dist.all_gather(pids, torch.tensor([os.getpid()], dtype=torch.int64))
    if RANK == 2:
        time.sleep(120)  # stopped, then killed by rank 0
        return
    if RANK == 1:
        wait_for(lambda: active[1].item() == 0, "rank 1 deactivated", timeout=60)
        expect_error(lambda: dist.all_reduce(torch.ones(3)), ["not active"], "evicted collective")
        return
    victim = int(pids[2].item())
    os.kill(victim, signal.SIGSTOP)
    r = pg.deactivate_ranks(g, [1])
    check(r.status == pg.ProposalStatus.Rejected and "rank 2 did not acknowledge" in r.reject_reason,
          f"stopped member: {r.status} {r.reject_reason!r}")
    check(active.tolist() == [1, 1, 1], "nothing changed")
    threading.Timer(1.0, lambda: os.kill(victim, signal.SIGKILL)).start()
    r = pg.deactivate_ranks(g, [1])
    check(r.status == pg.ProposalStatus.AppliedWithDroppedRanks and r.dropped_ranks == [2],
          f"killed while deciding: {r.status} {r.dropped_ranks} {r.reject_reason!r}")
    wait_for(lambda: active.tolist() == [1, 0, 0], "only rank 0 left")
    t = torch.full((4,), 3.0)
    dist.all_reduce(t)
    check(torch.equal(t, torch.full((4,), 3.0)), "all_reduce alone")


def scenario_bad_input():
    active = torch.ones(WORLD, dtype=torch.int32)
    init(pg.MooncakeBackendOptions(active))
    g = dist.group.WORLD
    for fn, name in ((pg.recover_ranks, "recover"), (pg.activate_ranks, "activate"),
                     (pg.deactivate_ranks, "deactivate")):
        r = fn(g, [WORLD + 3])
        check(r.status == pg.ProposalStatus.Rejected and "out of range" in r.reject_reason,
              f"{name} out of range: {r.status} {r.reject_reason!r}")
        r = fn(g, [-1])
        check(r.status == pg.ProposalStatus.Rejected, f"{name} of -1 rejected")
    r = pg.recover_ranks(g, list(range(WORLD)))
    check(r.status == APPLIED, "recovering active ranks is a no-op")
    if RANK == 0:
        r = pg.deactivate_ranks(g, list(range(WORLD)))
        check(r.status == pg.ProposalStatus.Rejected and "without an active rank" in r.reject_reason,
              f"deactivating everyone: {r.status} {r.reject_reason!r}")
    expect_error(lambda: pg.join_group(g), ["already active"], "join when already active")
    expect_error(lambda: pg.get_peer_state(g, [64]), ["out of"], "peer state out of range")
    check(pg.get_peer_state(g, list(range(WORLD))) == [True] * WORLD, "everyone ready")
    all_reduce_of(range(WORLD))
    check(active.tolist() == [1] * WORLD, "nothing changed")


SCENARIOS = {
    "replace": scenario_replace,
    "replace_joiner": scenario_replace_joiner,
    "replace_rank0": scenario_replace_rank0,
    "replace_rank0_joiner": scenario_replace_rank0_joiner,
    "subgroup_extend": scenario_subgroup_extend,
    "remote_replace": scenario_remote_replace,
    "remote_replace_joiner": scenario_remote_replace_joiner,
    "evict_rejoin": scenario_evict_rejoin,
    "decider_dies": scenario_decider_dies,
    "bad_input": scenario_bad_input,
    "no_ack": scenario_no_ack,
}

if __name__ == "__main__":
    import faulthandler

    faulthandler.dump_traceback_later(100, exit=True)  # a hang shows where it waits
    try:
        SCENARIOS[SCENARIO]()
    except BaseException:  # noqa: BLE001 - report and leave without waiting for the group
        import traceback
        traceback.print_exc()
        sys.stdout.flush()
        os._exit(1)
    print(f"OK {SCENARIO} {CHECKS}", flush=True)
    os._exit(0)
