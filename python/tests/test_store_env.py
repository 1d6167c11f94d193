"""`MC_*` environment variables the store honours (each case in a fresh process, since the
settings are read at set-up)."""

import os

import pytest
import subprocess
import sys
import textwrap

from conftest import Master

SCRIPT = textwrap.dedent(
    """
    import os, sys
    from mooncake.store import MooncakeDistributedStore, ReplicateConfig

    def sockets():
        n = 0
        for fd in os.listdir("/proc/self/fd"):
            try:
                n += os.readlink(f"/proc/self/fd/{fd}").startswith("socket:")
            except OSError:
                pass
        return n

    s = MooncakeDistributedStore()
    assert s.setup("127.0.0.1", sys.argv[1], 64 << 20, 16 << 20, "tcp", "", sys.argv[2]) == 0
    cfg = ReplicateConfig()
    cfg.preferred_segment = s.get_hostname()
    value = os.urandom(3 << 20)
    before = sockets()
    assert s.put("env_k", value, cfg) == 0
    assert s.get("env_k") == value
    print("new_sockets", sockets() - before)
    print("cluster", s._cluster_id())
    s.close()
    """
)


def run(master, **env):
    e = dict(os.environ)
    e.update(env)
    p = subprocess.run([sys.executable, "-c", SCRIPT, master.metadata, master.addr],
                       capture_output=True, text=True, env=e, timeout=120)
    assert p.returncode == 0, p.stderr
    return dict(line.split(" ", 1) for line in p.stdout.splitlines())


def test_memcpy_default_and_forced_network_path():
    m = Master()
    try:
        # Our own replica is written and read with memcpy: no data-plane connection opens.
        out = run(m, MC_STORE_MEMCPY="1")
        assert out["new_sockets"] == "0"
        # MC_STORE_MEMCPY=0: the same read goes through our own data-plane server.
        out = run(m, MC_STORE_MEMCPY="0")
        assert int(out["new_sockets"]) > 0
    finally:
        assert m.stop() == 0


def test_cluster_id_hugepages_timeout_force_tcp_and_log_level_are_accepted():
    m = Master()
    try:
        out = run(m, MC_STORE_CLUSTER_ID="bench_cluster", MC_STORE_USE_HUGEPAGE="1",
                  MC_TRANSFER_TIMEOUT="5", MC_FORCE_TCP="true", MC_LOG_LEVEL="0")
        assert out["cluster"] == "bench_cluster"
        out = run(m, MC_STORE_CLUSTER_ID="", MC_TRANSFER_TIMEOUT="junk")
        assert out["cluster"] == "mooncake_cluster"
    finally:
        assert m.stop() == 0


@pytest.mark.parametrize("shm", ["0", "1"])
def test_transfer_timeout_bounds_a_stalled_transfer(monkeypatch, shm):
    """MC_TRANSFER_TIMEOUT=1: a get from a storage node that stopped answering (SIGSTOP)
    fails after about a second instead of hanging for the default 30 s, over TCP
    (MC_STORE_SHM=0). With the same-host shared segment (MC_STORE_SHM=1, the default) the
    stopped node's memory is still there, intact, and the get reads it without waiting."""
    import signal
    import time

    from conftest import Node, make_store
    from polling import process_stopped, wait_until

    m = Master()
    node = Node(m, 64 * 1024 * 1024).proc
    try:
        monkeypatch.setenv("MC_TRANSFER_TIMEOUT", "1")
        monkeypatch.setenv("MC_STORE_SHM", shm)
        s = make_store(m, segment=0, local_buffer=16 << 20)
        try:
            assert s.put("stall_k", b"z" * 65536) == 0
            assert s.get("stall_k") == b"z" * 65536
            node.send_signal(signal.SIGSTOP)
            wait_until(lambda: process_stopped(node.pid), 10, "the node to stop")
            t0 = time.monotonic()
            got = s.get("stall_k")
            took = time.monotonic() - t0
            if shm == "0":
                assert got == b"" and 0.5 < took < 10, (len(got), took)
            else:
                assert got == b"z" * 65536 and took < 0.5, (len(got), took)
            node.send_signal(signal.SIGCONT)
        finally:
            s.close()
    finally:
        node.send_signal(signal.SIGCONT)
        node.terminate()
        node.wait(10)
        assert m.stop() == 0
