"""mooncake.pg across "hosts": ranks given different host ids (MC_PG_HOST_ID) on 127.0.0.1
take the TCP path (collective::net) instead of shared memory.

Each test spawns ranks of pg_tcp_worker.py, which runs pg_worker.py's scenarios with a host id
per rank; results are checked in the ranks against values they compute themselves.
"""

import os
import signal
import socket
import subprocess
import sys
import time

import pytest

torch = pytest.importorskip("torch")

WORKER = os.path.join(os.path.dirname(__file__), "pg_tcp_worker.py")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_group(scenario, hosts, timeout=120, env=None, expect_dead=()):
    world = len(hosts.split(","))
    port = free_port()
    e = dict(os.environ, PG_HOST_IDS=hosts, **(env or {}))
    procs = [
        subprocess.Popen(
            [sys.executable, WORKER, scenario, str(r), str(world), str(port)],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=e)
        for r in range(world)
    ]
    outs = []
    deadline = time.monotonic() + timeout
    try:
        for p in procs:
            out, _ = p.communicate(timeout=max(1, deadline - time.monotonic()))
            outs.append(out)
    except subprocess.TimeoutExpired:
        for p in procs:
            p.kill()
        pytest.fail(f"{scenario} on hosts {hosts} hung (> {timeout}s)")
    for r, (p, out) in enumerate(zip(procs, outs)):
        if r in expect_dead:
            assert p.returncode == -signal.SIGKILL, f"rank {r} should have been killed:\n{out}"
            continue
        assert p.returncode == 0 and f"OK {scenario}" in out, f"rank {r} failed:\n{out[-4000:]}"
    return outs


def test_pg_tcp_every_op_two_hosts():
    """Every op (several dtypes and sizes), the two ranks on different hosts."""
    outs = run_group("tcp_ops", "a,b")
    assert int(outs[0].strip().split()[-1]) > 80


def test_pg_tcp_mixed_group():
    """Ranks 0 and 1 on host a share memory; rank 2 on host b links to both over TCP. Every
    op at one-chunk sizes (the multi-chunk sizes run in the two-host test)."""
    run_group("tcp_ops", "a,a,b", timeout=150, env={"PG_TCP_LIGHT": "1"})


def test_pg_tcp_with_a_cluster_secret():
    """With the same MC_AUTH_TOKEN on every rank, each TCP link first proves the secret and
    the group's id (which rank 0 put in the store), and every op runs as without it
    (docs/pg.md, Security)."""
    run_group("tcp_ops", "a,a,b", timeout=150,
              env={"PG_TCP_LIGHT": "1", "MC_AUTH_TOKEN": "pg-tcp-test-cluster-secret"})


def test_pg_tcp_bad_input():
    """Mismatched calls across hosts fail everywhere, without a hang."""
    run_group("bad_input", "a,b")


def test_pg_tcp_sigkill_remote_rank():
    """The rank on host b is SIGKILLed inside an all_reduce; the two on host a complete,
    mark it failed in active_ranks and the hint, and go on among themselves."""
    outs = run_group("sigkill", "a,a,b", expect_dead=(2,))
    killed = _stamp(outs[-1], "KILL_AT")
    for r, out in enumerate(outs[:-1]):
        took = _stamp(out, "DONE_AT") - killed
        print(f"rank {r}: all_reduce completed {took * 1000:.1f} ms after the SIGKILL over TCP")
        assert took < 1.5


def test_pg_tcp_silent_remote_rank_missed_heartbeats():
    """A remote rank stopped with SIGSTOP keeps its connections open; the survivor marks it
    dead once no frame (data or heartbeat) has come for the collective timeout (2 s)."""
    port = free_port()
    e = dict(os.environ, PG_HOST_IDS="a,b")
    procs = [
        subprocess.Popen([sys.executable, WORKER, "sigstop", str(r), "2", str(port)],
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=e)
        for r in range(2)
    ]
    try:
        out, _ = procs[0].communicate(timeout=90)
    finally:
        procs[1].kill()
        procs[1].communicate()
        procs[0].kill()
    assert procs[0].returncode == 0 and "OK sigstop" in out, out[-4000:]
    print(out.strip().splitlines()[-2])


def _stamp(out, key):
    return float([x for x in out.splitlines() if x.startswith(key)][0].split()[1])
