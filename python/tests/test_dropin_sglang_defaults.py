"""SGLang HiCache's `MooncakeStore` defaults (`protocol="rdma"`, `metadata_server="P2PHANDSHAKE"`)
on a host without RDMA devices: upstream falls back to TCP and serves, and so must we.

`MC_REQUIRE_RDMA=1` turns the fall-back into an error; `MC_FORCE_TCP=1` asks for TCP without
the warning (docs/rdma.md).
"""

import os
import subprocess
import sys
from pathlib import Path

import pytest

import upstream

MIB = 1 << 20


def _has_rdma_device():
    d = Path("/sys/class/infiniband")
    return d.is_dir() and any(d.iterdir())


pytestmark = pytest.mark.skipif(_has_rdma_device(),
                                reason="this host has RDMA devices: the fall-back is not taken")


@pytest.fixture
def no_rdma_env(monkeypatch):
    for var in ("MOONCAKE_RDMA_SIM", "MOONCAKE_RDMA_SIM_DEVICES", "MC_FORCE_TCP",
                "MC_REQUIRE_RDMA"):
        monkeypatch.delenv(var, raising=False)
    return monkeypatch


def sglang_setup(master):
    from mooncake.store import MooncakeDistributedStore

    s = MooncakeDistributedStore()
    rc = s.setup("localhost", "P2PHANDSHAKE", 64 * MIB, 16 * MIB, "rdma", "", master.addr)
    return s, rc


def test_store_setup_with_sglang_defaults_falls_back_to_tcp(master, no_rdma_env):
    s, rc = sglang_setup(master)
    assert rc == 0
    try:
        value = bytes(range(256)) * 1000
        assert s.put("sglang/k", value) == 0
        assert s.get("sglang/k") == value
        assert s.is_exist("sglang/k") == 1
        assert s.remove("sglang/k", True) == 0
    finally:
        s.close()


def test_store_setup_with_mc_require_rdma_fails(master, no_rdma_env):
    no_rdma_env.setenv("MC_REQUIRE_RDMA", "1")
    s, rc = sglang_setup(master)
    assert rc != 0


ENGINE_SCENARIO = """
def scenario():
    from mooncake.engine import TransferEngine
    e = TransferEngine()
    return e.initialize("127.0.0.1", "P2PHANDSHAKE", "rdma", "")
"""


def test_engine_initialize_rdma_p2p_answers_as_upstream(no_rdma_env):
    scope = {}
    exec(ENGINE_SCENARIO, scope)
    mine = scope["scenario"]()
    assert mine == 0
    theirs = upstream.run(ENGINE_SCENARIO)
    assert mine == theirs


def _engine_in_subprocess(extra_env):
    code = ("from mooncake.engine import TransferEngine\n"
            "print(TransferEngine().initialize('127.0.0.1', 'P2PHANDSHAKE', 'rdma', ''))\n")
    env = {k: v for k, v in os.environ.items()
           if k not in ("MOONCAKE_RDMA_SIM", "MC_FORCE_TCP", "MC_REQUIRE_RDMA")}
    env.update(extra_env)
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60, env=env)


def test_engine_fallback_warns_and_names_the_variables():
    r = _engine_in_subprocess({})
    assert r.stdout.strip() == "0", r.stderr
    assert "WARN" in r.stderr and "TCP" in r.stderr, r.stderr
    assert "MC_FORCE_TCP=1" in r.stderr and "MC_REQUIRE_RDMA=1" in r.stderr, r.stderr
    # Asked for TCP explicitly: no warning.
    r = _engine_in_subprocess({"MC_FORCE_TCP": "1"})
    assert r.stdout.strip() == "0", r.stderr
    assert "MC_REQUIRE_RDMA" not in r.stderr, r.stderr


def test_engine_with_mc_require_rdma_fails():
    r = _engine_in_subprocess({"MC_REQUIRE_RDMA": "1"})
    assert r.stdout.strip() == "-1", r.stderr
    assert "MC_REQUIRE_RDMA" in r.stderr, r.stderr


def _metric(port, name):
    import urllib.request

    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
        text = r.read().decode()
    for line in text.splitlines():
        if line.startswith(name + " "):
            return int(line.rsplit(" ", 1)[1])
    raise AssertionError(f"{name} not in /metrics:\n{text}")


def test_fallback_is_counted_on_the_client_http_server(master, no_rdma_env):
    from conftest import free_port
    from mooncake.store import MooncakeDistributedStore

    port = free_port()
    s = MooncakeDistributedStore()
    rc = s.setup("localhost", "P2PHANDSHAKE", 16 * MIB, 16 * MIB, "rdma", "", master.addr,
                 enable_client_http_server=True, client_http_port=port)
    assert rc == 0
    try:
        # Process-wide: at least this setup's fall-back (others in this process count too).
        assert _metric(port, "mooncake_rdma_tcp_fallbacks_total") >= 1
    finally:
        s.close()
