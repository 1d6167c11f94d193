"""`ReplicateConfig.group_ids`: lease groups, checked against upstream's 0.3.13.post1 wheel
(the expected values are what it returned for the same calls, with a 4 s and a 3 s lease).

A read lease (get, get_buffer, batch_get...) or an existence probe (is_exist,
batch_is_exist) granted on a grouped key covers the group's keys at that moment: a
non-forced remove of any of them answers -706 until it ends (a key put into the group later
is not covered). A single put names one group (two, or an empty list:
-600); a batch names one per key (another count: every key -600). An upsert may not move a
key into, out of or across groups (-600); one without groups keeps the key's. Groups do not
place keys (upstream spreads a group's keys over segments as any others).
"""

from conftest import lease_wait
from mooncake.store import ReplicateConfig

INVALID = -600
HAS_LEASE = -706


def cfg(*groups):
    c = ReplicateConfig()
    c.group_ids = list(groups)
    return c


def test_a_read_or_a_probe_leases_the_whole_group(store):
    assert store.put("grp_a", b"x" * 100, cfg("grp_g1")) == 0
    assert store.put("grp_b", b"y" * 100, cfg("grp_g1")) == 0
    assert store.put("grp_c", b"z" * 100) == 0
    assert store.put("grp_o", b"o" * 100, cfg("grp_g9")) == 0
    assert len(store.get("grp_a")) == 100
    assert store.remove("grp_b") == HAS_LEASE, "same group as the key just read"
    assert store.remove("grp_c") == 0, "no group"
    assert store.remove("grp_o") == 0, "another group"
    assert store.remove("grp_b", True) == 0, "force ignores the lease"
    assert store.put("grp_late", b"l", cfg("grp_g1")) == 0
    assert store.remove("grp_late") == 0, "a key that joined after the read is not covered"
    lease_wait()
    # A batch with one group per key; an existence probe leases the group too.
    assert store.put_batch(["grp_d", "grp_e"], [b"1" * 10, b"2" * 10], cfg("grp_g3", "grp_g3")) == 0
    assert store.put_batch(["grp_r1", "grp_r2"], [b"1", b"2"], cfg("grp_A", "grp_B")) == 0
    assert store.is_exist("grp_d") == 1
    assert store.remove("grp_e") == HAS_LEASE
    assert store.get_buffer("grp_e") is not None
    assert store.remove("grp_d") == HAS_LEASE, "get_buffer leases the group too"
    assert store.batch_is_exist(["grp_r1"]) == [1]
    assert store.remove("grp_r2") == 0, "grp_r2 is in grp_B, not grp_A"
    lease_wait()
    for k in ("grp_a", "grp_d", "grp_e", "grp_r1"):
        assert store.remove(k) == 0


def test_group_ids_must_fit_the_keys(store):
    assert store.put("grp_f", b"1", cfg("grp_g4", "grp_g5")) == INVALID
    assert store.put("grp_h", b"1", cfg()) == INVALID
    assert store.put("grp_q", b"1", cfg("")) == 0
    assert store.put_batch(["grp_r3", "grp_r4"], [b"1", b"2"], cfg("grp_A")) == INVALID
    assert store.is_exist("grp_r3") == 0 and store.is_exist("grp_f") == 0
    lease_wait()
    assert store.remove("grp_q") == 0


def test_an_upsert_keeps_a_keys_group(store):
    assert store.put("grp_k", b"q" * 100, cfg("grp_g1")) == 0
    assert store.put("grp_m", b"m" * 100, cfg("grp_g1")) == 0
    assert store.put("grp_p", b"1") == 0
    assert store.upsert("grp_k", b"q" * 100, cfg("grp_g2")) == INVALID
    assert store.upsert("grp_p", b"2", cfg("grp_g1")) == INVALID
    assert store.upsert("grp_k", b"q" * 100, cfg("grp_g1")) == 0
    assert store.upsert("grp_k", b"q" * 200) == 0
    assert store.upsert_batch(["grp_k", "grp_m"], [b"1", b"2"], cfg("grp_g1", "grp_g7")) \
        == INVALID
    lease_wait()
    assert len(store.get("grp_k")) == 1, "the key that kept its group was upserted"
    assert len(store.get("grp_m")) == 100, "the one that would have moved was not"
    assert store.remove("grp_k") == HAS_LEASE, "grp_k is still in grp_g1"
    lease_wait()
    for k in ("grp_k", "grp_m", "grp_p"):
        assert store.remove(k) == 0
