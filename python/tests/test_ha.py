"""HA from Python, unchanged user code: `MooncakeDistributedStore.setup(...)` with
`master_server_addr="etcd://127.0.0.1:<port>"` follows the leader of two `mooncake_master
--enable_ha` processes in a real etcd (Debian's etcd-server), and everything put before the
leader is killed with SIGKILL reads back from the new leader (`docs/ha.md`)."""

import os
import signal
import time
import urllib.request

import pytest

from conftest import MIB, Master
from test_engine_etcd import ETCD_BIN, Etcd

CLUSTER = "py_ha"


def role(m):
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{m.metrics_port}/ha_status",
                                    timeout=2) as r:
            return r.read().decode()
    except OSError:
        return "unreachable"


def wait_for(pred, timeout):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return True
        time.sleep(0.05)
    return False


@pytest.fixture
def ha_cluster(monkeypatch):
    if not os.path.exists(ETCD_BIN):
        pytest.skip(f"{ETCD_BIN} not found (install Debian's etcd-server)")
    etcd = Etcd()
    assert etcd.healthy(), "etcd did not become healthy"
    flags = ["--enable_ha=true", f"--etcd_endpoints={etcd.addr}", f"--cluster_id={CLUSTER}"]
    masters = [Master(extra=flags), Master(extra=flags)]
    monkeypatch.setenv("MC_STORE_CLUSTER_ID", CLUSTER)
    try:
        assert wait_for(lambda: any(role(m) == "leading" for m in masters), 10)
        yield etcd, masters
    finally:
        for m in masters:
            if m.proc.poll() is None:
                m.proc.kill()
                m.proc.wait()
        etcd.stop()


def test_store_follows_the_leader_across_a_kill(ha_cluster):
    from mooncake.store import MooncakeDistributedStore, ReplicateConfig

    etcd, masters = ha_cluster
    stores = []
    for _ in range(2):
        s = MooncakeDistributedStore()
        rc = s.setup("localhost", f"etcd://{etcd.addr}", 64 * MIB, 16 * MIB, "tcp", "",
                     f"etcd://{etcd.addr}")
        assert rc == 0, f"setup through etcd:// failed: {rc}"
        stores.append(s)
    writer, reader = stores
    cfg = ReplicateConfig()
    cfg.replica_num = 1
    values = {f"ha-key-{i}": bytes([i % 251]) * (1000 + 37 * i) for i in range(40)}
    for k, v in values.items():
        assert writer.put(k, v, cfg) == 0, k

    leader = next(m for m in masters if role(m) == "leading")
    leader.proc.send_signal(signal.SIGKILL)
    leader.proc.wait()
    survivor = next(m for m in masters if m is not leader)
    t0 = time.monotonic()
    assert wait_for(lambda: role(survivor) == "leading", 10), "the standby takes over"

    # The same store objects, no new setup: every value reads back from the new leader once
    # its owners re-reported (within a ping interval of the election).
    def all_back():
        return all(reader.get(k) == v for k, v in values.items())

    assert wait_for(all_back, 15), "every acknowledged value reads back after failover"
    print(f"failover + re-report: {time.monotonic() - t0:.2f} s")
    assert writer.put("after-failover", b"x" * 4096, cfg) == 0
    assert reader.get("after-failover") == b"x" * 4096
    for s in stores:
        s.close()
