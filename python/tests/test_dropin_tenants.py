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


def _http(master, method, path, body=None):
    import json
    import urllib.error
    import urllib.request

    req = urllib.request.Request(f"http://127.0.0.1:{master.metrics_port}{path}", method=method,
                                 data=body.encode() if body is not None else None)
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def test_tenant_quotas_as_upstreams(tmp_path):
    """A quota policy file (`--tenant_quota_connector_uri`), checked against the values the
    upstream wheel's master gave for the same calls: an unregistered tenant (the default one
    included) is refused with -1701, a tenant past its quota loses its own least recently read
    objects, an object larger than the quota is -1700, and `/api/v1/tenant_quotas` reads and
    changes the policy, which is written back to the file."""
    policy = tmp_path / "quota.yaml"
    policy.write_text("version: 1\ntenants:\n  - name: t1\n    quota: 1MB\n")
    m = Master(extra=[f"--default_kv_lease_ttl={LEASE_MS}", "--enable_multi_tenants=true",
                      f"--tenant_quota_connector_uri={policy}"])
    node = Node(m, 64 * MIB)
    stores = []
    try:
        plain, t1 = _store(m, "default"), _store(m, "t1")
        stores += [plain, t1]
        # upstream: put default -1701 b'' 0; put t1 0 b'xxx' 1
        assert (plain.put("k", b"x" * 1000), plain.get("k"), plain.is_exist("k")) == (-1701, b"", 0)
        assert t1.put("k", b"x" * 1000) == 0
        status, body = _http(m, "GET", "/api/v1/tenant_quotas")
        assert status == 200 and body["success"] is True
        assert body["data"] == [{"tenant_id": "t1", "requested_quota_bytes": 1 << 20,
                                 "effective_quota_bytes": 1 << 20, "charged_bytes": 1000,
                                 "admission_closed": False, "over_quota": False,
                                 "has_explicit_policy": True}]
        # upstream: four puts of 400 000 bytes all answer 0; two objects stay, 800 000 charged
        assert [t1.put(f"f{i}", b"z" * 400_000) for i in range(4)] == [0, 0, 0, 0]
        assert sum(t1.is_exist(f"f{i}") for i in range(4)) == 2
        assert t1.is_exist("k") == 0
        status, row = _http(m, "GET", "/api/v1/tenant_quotas?tenant_id=t1")
        assert (status, row["data"]["charged_bytes"]) == (200, 800_000)
        # upstream: put big -1700 (larger than the quota)
        assert t1.put("big", b"x" * 2_000_000) == -1700
        # A tenant that still holds objects keeps its policy; another one can be added.
        assert _http(m, "DELETE", "/api/v1/tenant_quotas?tenant_id=t1") == \
            (409, {"success": False, "error_code": -1702, "error_message": "TENANT_NOT_EMPTY"})
        status, row = _http(m, "PUT", "/api/v1/tenant_quotas?tenant_id=t2",
                            '{"requested_quota_bytes": 2097152}')
        assert (status, row["data"]["requested_quota_bytes"]) == (200, 2 << 20)
        assert "name: \"t2\"\n    quota: 2097152" in policy.read_text()
        t2 = _store(m, "t2")
        stores.append(t2)
        assert t2.put("k", b"y" * 10) == 0
        assert _http(m, "GET", "/api/v1/tenant_quotas?tenant_id=nope") == \
            (404, {"success": False, "error_code": -704, "error_message": "OBJECT_NOT_FOUND"})
    finally:
        for s in stores:
            s.close()
        node.stop()
        m.stop()
