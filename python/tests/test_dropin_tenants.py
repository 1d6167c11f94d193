"""`tenant_id` as upstream's 0.3.13.post1 master treats it. The expected values are what the
upstream wheel's master answered to the same calls (run with `--enable_multi_tenants` and a
quota policy naming the tenants, and without the flag); the test needs only this build."""

import time

import pytest

from conftest import MIB, Master, Node

LEASE_MS = 200


def _store(master, tenant):
    from mooncake.store import MooncakeDistributedStore

    s = MooncakeDistributedStore()
    assert s.setup("127.0.0.1", master.metadata, 0, 16 * MIB, "tcp", "", master.addr,
                   tenant_id=tenant) == 0
    return s


def _wait_lease():
    # The subject, not a settle: the read's lease has to run out before the object can go.
    time.sleep(LEASE_MS / 1000 + 0.1)


@pytest.fixture
def cluster(request):
    m = Master(extra=[f"--default_kv_lease_ttl={LEASE_MS}", *request.param])
    node = Node(m, 64 * MIB)
    stores = []

    def make(tenant):
        s = _store(m, tenant)
        stores.append(s)
        return s

    yield make
    for s in stores:
        s.close()
    node.stop()
    m.stop()


@pytest.mark.parametrize("cluster", [["--enable_multi_tenants=true"]], indirect=True)
def test_tenants_have_separate_key_spaces(cluster):
    a, b, c = cluster("default"), cluster("ta"), cluster("tb")
    assert a.put("k1", b"AAA") == 0
    assert b.put("k1", b"BBBB") == 0
    # upstream: get a b'AAA', get b b'BBBB', get c b''; exist c 0, exist b 1
    assert (a.get("k1"), b.get("k1"), c.get("k1")) == (b"AAA", b"BBBB", b"")
    assert (c.is_exist("k1"), b.is_exist("k1")) == (0, 1)
    assert b.put("k2", b"x") == 0
    assert c.put("k3", b"y") == 0
    _wait_lease()
    # upstream: a.remove_by_regex("k") == 1 (its own k1 only), b still holds k2
    assert a.remove_by_regex("k") == 1
    assert b.is_exist("k2") == 1
    # upstream: c.remove_all() == 1 (its k3 only); b keeps k1 and k2
    assert c.remove_all() == 1
    assert (b.is_exist("k1"), b.is_exist("k2"), c.is_exist("k3")) == (1, 1, 0)
    _wait_lease()
    assert (b.remove("k1"), a.remove("k1")) == (0, -704)
    assert b.remove_all(False) == 1
    assert (b.is_exist("k2"), b.get_size("k2")) == (0, -704)


@pytest.mark.parametrize("cluster", [[]], indirect=True)
def test_without_the_flag_tenants_share_the_default_key_space(cluster):
    a, b, c = cluster("default"), cluster("ta"), cluster("tb")
    assert a.put("k1", b"AAA") == 0
    # upstream: b's put answers 0 (first writer wins) and every tenant reads a's value
    assert b.put("k1", b"BBBB") == 0
    assert (a.get("k1"), b.get("k1"), c.get("k1")) == (b"AAA", b"AAA", b"AAA")
    assert c.is_exist("k1") == 1
    _wait_lease()
    assert c.remove_all() == 1
    assert a.is_exist("k1") == 0


@pytest.mark.parametrize("cluster", [[]], indirect=True)
def test_tenant_names_upstream_accepts(cluster):
    # upstream: "" and a 300-byte tenant set up and put fine
    for t in ["", "t" * 300, "tenant-a"]:
        s = cluster(t)
        assert s.put(f"x{len(t)}", b"1") == 0
