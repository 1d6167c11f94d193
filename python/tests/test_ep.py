"""mooncake.mooncake_ep_buffer.Buffer: dispatch/combine between spawned ranks on one host.

Each test spawns WORLD ranks of ep_worker.py over a Mooncake Backend group ("mooncake");
the ranks check every output against a reference they compute from the semantics (see
ep_worker.py for the scenarios).
"""

import os
import socket
import subprocess
import sys
import time

import pytest

torch = pytest.importorskip("torch")

WORKER = os.path.join(os.path.dirname(__file__), "ep_worker.py")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_group(scenario, world, tmp_path, timeout=90):
    port = free_port()
    procs = [
        subprocess.Popen(
            [sys.executable, WORKER, scenario, str(r), str(world), str(port), str(tmp_path)],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
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
        pytest.fail(f"{scenario} with {world} ranks hung (> {timeout}s)")
    for r, (p, out) in enumerate(zip(procs, outs)):
        assert p.returncode == 0 and f"OK {scenario}" in out, f"rank {r} failed:\n{out[-4000:]}"
    return outs


@pytest.mark.parametrize("world", [2, 3])
def test_ep_dispatch_combine_against_reference(world, tmp_path):
    run_group("basic", world, tmp_path)


def test_ep_rank_that_never_dispatches_is_marked_after_timeout(tmp_path):
    run_group("dead", 3, tmp_path)


def test_ep_bad_input_is_refused(tmp_path):
    run_group("bad_input", 2, tmp_path)


def test_ep_size_hint_is_upstreams_formula_and_allocates_nothing():
    from mooncake.mooncake_ep_buffer import Buffer

    assert Buffer.get_ep_buffer_size_hint(128, 7168, 8, 288) == 2_118_652_416
    assert Buffer.get_ep_buffer_size_hint(256, 2048, 1, 288) == 1_217_401_344
    # num_ranks does not enter, as upstream
    assert Buffer.get_ep_buffer_size_hint(256, 2048, 64, 288) == 1_217_401_344
    # far beyond this machine's memory: only a number
    assert Buffer.get_ep_buffer_size_hint(1 << 20, 1 << 16, 8, 4096) > 1 << 50


def test_ep_module_reexports_pg():
    from mooncake import ep

    assert ep.get_ep_buffer_size_hint(128, 7168, 8, 288) == 2_118_652_416
    assert callable(ep.get_active_ranks)
