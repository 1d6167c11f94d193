"""mooncake.pg membership: deactivation, in-place rejoin, replacement processes, a dying
decider and bad input, with multi-process groups on 127.0.0.1.

Each test spawns ranks of pg_membership_worker.py; results are checked against values the
processes compute themselves (see the worker for the scenarios).
"""

import os
import socket
import subprocess
import sys
import time

import pytest

torch = pytest.importorskip("torch")
dist = torch.distributed

WORKER = os.path.join(os.path.dirname(__file__), "pg_membership_worker.py")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def spawn(scenario, rank, world, port, env=None):
    return subprocess.Popen(
        [sys.executable, WORKER, scenario, str(rank), str(world), str(port)],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        env=None if env is None else {**os.environ, **env})


def finish(procs, timeout, expect_dead=()):
    """Waits for every (name, process); fails on a hang or a failed check."""
    deadline = time.monotonic() + timeout
    outs = {}
    try:
        for name, p in procs:
            outs[name], _ = p.communicate(timeout=max(1, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
        for _, p in procs:
            p.kill()
        for name, p in procs:
            out = p.communicate()[0]
            print(f"--- {name}:\n{out[-3000:]}")
        pytest.fail(f"hung (> {timeout}s)")
    for name, p in procs:
        if name in expect_dead:
            assert p.returncode == -9, f"{name} should have been SIGKILLed:\n{outs[name]}"
            continue
        assert p.returncode == 0 and "OK " in outs[name], f"{name} failed:\n{outs[name][-4000:]}"
    return outs


def run_group(scenario, world, timeout=120, expect_dead=(), hosts=None):
    """``hosts``: comma-separated host ids per rank (MC_PG_HOST_ID), so ranks with
    different ids run on "other hosts" (TCP links) on this machine."""
    port = free_port()
    env = None if hosts is None else {"PG_HOST_IDS": hosts}
    procs = [(r, spawn(scenario, r, world, port, env)) for r in range(world)]
    return finish(procs, timeout, expect_dead)


# Membership across hosts: the same scenarios with ranks on "other hosts" (TCP links).


def test_membership_across_hosts_deactivate_and_rejoin():
    """Rank 0 (host a) deactivates rank 2 (host b); rank 1 (host a) learns it without a
    call; rank 2 rejoins in place and both activate it."""
    run_group("evict_rejoin", 3, hosts="a,a,b")


def test_membership_across_hosts_decider_dies():
    """The decider (rank 0, host a) is SIGKILLed; rank 1 (host b) decides for a group
    spread over two hosts."""
    run_group("decider_dies", 4, expect_dead=(0,), hosts="a,b,a,b")


def test_membership_across_hosts_unacknowledged_and_dropped():
    """A SIGSTOPped remote member cannot acknowledge (Rejected naming it); SIGKILLed while
    the next proposal waits, it is dropped."""
    run_group("no_ack", 3, expect_dead=(2,), hosts="a,b,c")


def test_membership_across_hosts_replacement_refused():
    """Both ranks on host a read each other's memory directly; rank 1 is SIGKILLed and a
    replacement on another host is refused at init (it could not serve direct reads), with
    the remote rank's name and MC_PG_CMA=0 as the way out; rank 0 carries on."""
    world, port = 2, free_port()
    env = {"PG_HOST_IDS": "a,a"}
    procs = [(r, spawn("remote_replace", r, world, port, env)) for r in range(world)]
    try:
        procs[1][1].wait(timeout=90)
    except subprocess.TimeoutExpired:
        for _, p in procs:
            p.kill()
        pytest.fail("rank 1 did not reach its SIGKILL")
    joiner = spawn("remote_replace_joiner", 1, world, port, env)
    finish(procs + [("joiner", joiner)], 150, expect_dead=(1,))


def test_membership_across_hosts_bad_input():
    run_group("bad_input", 3, hosts="a,b,a")


@pytest.mark.parametrize("hosts", [None, "a,b,b", "a,a,b"],
                         ids=["one-host", "mapped-and-linked", "linked-only"])
def test_membership_replacement_process(hosts):
    """Rank 2 is SIGKILLed, a new process joins as rank 2 with is_extension=True, both
    survivors call recover_ranks (each gets Applied) and later collectives include it.
    Across hosts (``hosts``: the founders' host ids; the new process runs on rank 2's) it
    maps the members on its host and links to the others over TCP; "linked-only": it is
    alone on its host."""
    replace_rank_2(None if hosts is None else {"PG_HOST_IDS": hosts})


def test_membership_replacement_process_with_a_cluster_secret():
    """As the "linked-only" case with MC_AUTH_TOKEN on every process: the new process on
    another host proves the secret and the group's id (read from the store) to each member
    before its join hello, and is admitted (docs/pg.md, Security)."""
    replace_rank_2({"PG_HOST_IDS": "a,a,b", "MC_AUTH_TOKEN": "pg-membership-test-secret"})


def replace_rank_2(env):
    world, port = 3, free_port()
    procs = [(r, spawn("replace", r, world, port, env)) for r in range(world)]
    victim = procs[2][1]
    try:
        victim.wait(timeout=60)
    except subprocess.TimeoutExpired:
        for _, p in procs:
            p.kill()
        pytest.fail("rank 2 did not reach its SIGKILL")
    joiner = spawn("replace_joiner", 2, world, port, env)
    finish(procs + [("joiner", joiner)], 150, expect_dead=(2,))


def test_membership_replace_rank0_with_external_store():
    """The torch store runs outside the ranks (here: in the test process), so rank 0 can be
    SIGKILLed and replaced like any rank: rank 1 decides meanwhile, both survivors recover
    the new rank 0, which then sends, receives and is the broadcast root again."""
    world, port = 3, free_port()
    server = dist.TCPStore("127.0.0.1", port, world_size=None, is_master=True,
                           wait_for_workers=False)
    env = {"PG_TEST_EXTERNAL_STORE": "1"}
    procs = [(r, spawn("replace_rank0", r, world, port, env)) for r in range(world)]
    victim = procs[0][1]
    try:
        victim.wait(timeout=60)
    except subprocess.TimeoutExpired:
        for _, p in procs:
            p.kill()
        pytest.fail("rank 0 did not reach its SIGKILL")
    joiner = spawn("replace_rank0_joiner", 0, world, port, env)
    finish(procs + [("joiner", joiner)], 150, expect_dead=(0,))
    del server


def test_membership_subgroup_extension():
    """new_group([0], max_group_size 2) on the primaries and new_group([0, 2], 2, True) on
    the joiner resolve as one runtime group; slot 1 joins and collectives, broadcast and
    send/recv run over both; an extension with no group under its torch name is refused."""
    run_group("subgroup_extend", 3)


def test_membership_deactivate_and_rejoin_in_place():
    """One survivor deactivates a live rank (the others learn it without a call), the rank
    rejoins in place with join_group and every survivor activates it."""
    run_group("evict_rejoin", 3)


def test_membership_decider_dies():
    """The decider (rank 0) is SIGKILLed; the next lowest live rank decides from then on."""
    run_group("decider_dies", 4, expect_dead=(0,))


@pytest.mark.parametrize("world", [2, 3])
def test_membership_bad_input(world):
    """Out-of-range ranks, joining when active, emptying the group: clear errors, no hang."""
    run_group("bad_input", world)


def test_membership_unacknowledged_and_dropped():
    """A SIGSTOPped member makes a proposal Rejected (it cannot acknowledge); killed while the
    next one waits, it is dropped: AppliedWithDroppedRanks, dropped_ranks == [2]."""
    run_group("no_ack", 3, expect_dead=(2,))
