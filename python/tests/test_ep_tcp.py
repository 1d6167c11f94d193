"""mooncake.mooncake_ep_buffer.Buffer across "hosts": ranks given different ``MC_PG_HOST_ID``
values write each other's EP buffers over TCP links instead of shared memory (docs/ep.md).

The workers are ep_worker.py's scenarios, so the checks are test_ep.py's: counts, layout,
exact bf16 rows, the fp8 error bound, the combine weighted sum, hook/async/zero-copy modes and
update_ep_member, for 2 ranks on two hosts and a mixed group of 3 (hosts a, a, b: ranks 0 and
1 keep shared memory between them); and the dead-rank case with the victim on the other host,
once exiting and once SIGKILLed.
"""

import os
import signal
import subprocess
import sys
import time

import pytest

torch = pytest.importorskip("torch")

WORKER = os.path.join(os.path.dirname(__file__), "ep_worker.py")
sys.path.insert(0, os.path.dirname(__file__))
from test_ep import free_port  # noqa: E402

# (scenario, hosts of the ranks, victim SIGKILLs itself)
GROUPS = {
    "basic-ab": ("basic", "ab", False),
    "secret-ab": ("basic", "ab", False),
    "basic-aab": ("basic", "aab", False),
    "dead-aab": ("dead", "aab", False),
    "killed-aab": ("dead", "aab", True),
}


def start_group(scenario, hosts, kill, tmp, secret=False):
    port = free_port()
    procs = []
    for r, h in enumerate(hosts):
        env = dict(os.environ, MC_PG_HOST_ID=f"ep-tcp-host-{h}", EP_HOSTS=hosts)
        if secret:
            env["MC_AUTH_TOKEN"] = "ep-tcp-test-cluster-secret"
        if kill:
            env["EP_VICTIM_SIGKILL"] = "1"
        procs.append(subprocess.Popen(
            [sys.executable, WORKER, scenario, str(r), str(len(hosts)), str(port), str(tmp)],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env))
    return procs


@pytest.fixture(scope="module")
def groups(tmp_path_factory):
    started = {name: start_group(s, h, k, tmp_path_factory.mktemp(name),
                                 secret=name.startswith("secret"))
               for name, (s, h, k) in GROUPS.items()}
    yield started
    for procs in started.values():
        for p in procs:
            if p.poll() is None:
                p.kill()


def finish(groups, name, timeout=150):
    scenario, hosts, kill = GROUPS[name]
    procs = groups[name]
    outs = []
    deadline = time.monotonic() + timeout
    try:
        for p in procs:
            out, _ = p.communicate(timeout=max(1, deadline - time.monotonic()))
            outs.append(out)
    except subprocess.TimeoutExpired:
        for p in procs:
            p.kill()
        pytest.fail(f"{name} hung (> {timeout}s)")
    for r, (p, out) in enumerate(zip(procs, outs)):
        killed = kill and r == len(hosts) - 1
        want = -signal.SIGKILL if killed else 0
        assert p.returncode == want and f"OK {scenario}" in out, \
            f"rank {r} (rc {p.returncode}) failed:\n{out[-4000:]}"


@pytest.mark.parametrize("name", ["basic-ab", "basic-aab"])
def test_ep_tcp_dispatch_combine_against_reference(groups, name):
    finish(groups, name)


def test_ep_tcp_with_a_cluster_secret(groups):
    """With the same MC_AUTH_TOKEN on both ranks, each link proves the secret and the group
    (every rank's host, endpoint, size and buffer name) before its hello, and dispatch and
    combine give the reference results (docs/ep.md)."""
    finish(groups, "secret-ab")


def test_ep_tcp_rank_that_never_dispatches_is_marked_after_timeout(groups):
    finish(groups, "dead-aab")


def test_ep_tcp_sigkilled_remote_rank_is_marked(groups):
    finish(groups, "killed-aab")
