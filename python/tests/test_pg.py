"""mooncake.pg as a torch.distributed backend: multi-process groups on 127.0.0.1.

Each test spawns WORLD ranks of pg_worker.py, which run many checks per process group (torch's
import costs seconds per process). Results are checked against values the ranks compute
themselves; see pg_worker.py for the scenarios.
"""

import os
import socket
import subprocess
import sys
import time

import pytest

torch = pytest.importorskip("torch")

WORKER = os.path.join(os.path.dirname(__file__), "pg_worker.py")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_group(scenario, world, timeout=240, env=None, expect_dead=()):
    port = free_port()
    e = dict(os.environ, **(env or {}))
    procs = [
        subprocess.Popen(
            [sys.executable, WORKER, scenario, str(r), str(world), str(port)],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=e)
        for r in range(world)
    ]
    outs = []
    deadline = time.monotonic() + timeout
    try:
        for r, p in enumerate(procs):
            out, _ = p.communicate(timeout=max(1, deadline - time.monotonic()))
            outs.append(out)
    except subprocess.TimeoutExpired:
        for p in procs:
            p.kill()
        pytest.fail(f"{scenario} with {world} ranks hung (> {timeout}s)")
    for r, (p, out) in enumerate(zip(procs, outs)):
        if r in expect_dead:
            assert p.returncode == -9, f"rank {r} should have been SIGKILLed:\n{out}"
            continue
        assert p.returncode == 0 and f"OK {scenario}" in out, f"rank {r} failed:\n{out[-4000:]}"
    return outs


@pytest.mark.parametrize("world", [2, 4])
def test_pg_every_op_and_dtype(world):
    outs = run_group("ops", world)
    checks = int(outs[0].strip().split()[-1])
    assert checks > 200


def test_pg_mooncake_backend_name_and_slot_path():
    """The "mooncake" name on CPU, with direct reads off: large all_gather / all_to_all go
    through the shared slots instead."""
    run_group("ops", 2, env={"PG_BACKEND": "mooncake", "MC_PG_CMA": "0"})


def test_pg_sigkill_slot_path():
    report_kill_to_done(
        run_group("sigkill", 3, timeout=120, env={"MC_PG_CMA": "0"}, expect_dead=(2,)))


@pytest.mark.parametrize("world", [2, 4])
def test_pg_bad_input_errors_without_hang(world):
    run_group("bad_input", world, timeout=120)


@pytest.mark.parametrize("world", [2, 4])
def test_pg_sigkill_mid_collective(world):
    outs = run_group("sigkill", world, timeout=120, expect_dead=(world - 1,))
    report_kill_to_done(outs)


def report_kill_to_done(outs):
    """Prints how long after the SIGKILL each survivor's all_reduce completed."""
    def stamp(out, key):
        return float([x for x in out.splitlines() if x.startswith(key)][0].split()[1])

    killed = stamp(outs[-1], "KILL_AT")
    for r, out in enumerate(outs[:-1]):
        took = stamp(out, "DONE_AT") - killed
        print(f"rank {r}: all_reduce completed {took * 1000:.1f} ms after the SIGKILL")
        assert took < 1.5  # collective timeout 0.5 s + window 0.5 s + scheduling slack


def test_pg_graceful_leave():
    run_group("leave", 3, timeout=120)
