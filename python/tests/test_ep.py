"""mooncake.mooncake_ep_buffer.Buffer: dispatch/combine between spawned ranks on one host
(shared memory; test_ep_tcp.py runs the same scenarios across "hosts").

Each test owns a group of WORLD ranks of ep_worker.py over a Mooncake Backend group
("mooncake"); the ranks check every output against a reference they compute from the
semantics (see ep_worker.py for the scenarios). All groups start together (module fixture).
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


# Every group starts when the first test needs one, all at once: most of a rank's time is
# torch's import and the group's set-up, which then overlap instead of adding up.
GROUPS = [("basic", 2), ("basic", 3), ("dead", 3), ("bad_input", 2), ("fp8", 2)]


def start_group(scenario, world, tmp):
    port = free_port()
    return [
        subprocess.Popen(
            [sys.executable, WORKER, scenario, str(r), str(world), str(port), str(tmp)],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        for r in range(world)
    ]


@pytest.fixture(scope="module")
def groups(tmp_path_factory):
    started = {(s, w): start_group(s, w, tmp_path_factory.mktemp(f"{s}{w}"))
               for s, w in GROUPS}
    yield started
    for procs in started.values():
        for p in procs:
            if p.poll() is None:
                p.kill()


def finish(groups, scenario, world, timeout=150):
    procs = groups[(scenario, world)]
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
def test_ep_dispatch_combine_against_reference(groups, world):
    finish(groups, "basic", world)


def test_ep_fp8_edge_cases_are_bit_identical_to_the_kernels_formula(groups):
    finish(groups, "fp8", 2)


def test_ep_rank_that_never_dispatches_is_marked_after_timeout(groups):
    finish(groups, "dead", 3)


def test_ep_bad_input_is_refused(groups):
    finish(groups, "bad_input", 2)


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
