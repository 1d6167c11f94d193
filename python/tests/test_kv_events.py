"""KV-cache events (`docs/kv-events.md`), end to end: a real `mooncake_master
--enable_kv_events` on free ports, a real storage node, store clients through
`mooncake.store`, and a subscriber that reads the ZeroMQ socket with pyzmq and msgpack
exactly as a cache-aware router does (an empty topic frame, an 8-byte big-endian sequence
number, a msgpack payload). The subscriber's view of the pool is then reconciled with what
the master holds."""

import json
import random
import re
import struct
import threading
import time
import urllib.request

import pytest

zmq = pytest.importorskip("zmq")
msgpack = pytest.importorskip("msgpack")

from conftest import MIB, Master, Node, free_port, make_store  # noqa: E402

NO_SPACE = -200  # NO_AVAILABLE_HANDLE: the pool is full now


class Subscriber:
    """A SUB socket on the master's endpoint, read by a thread into `batches`:
    (sequence number, timestamp, events, dp_rank)."""

    def __init__(self, endpoint):
        self.ctx = zmq.Context()
        self.sock = self.ctx.socket(zmq.SUB)
        self.sock.setsockopt(zmq.RCVHWM, 0)
        self.sock.setsockopt(zmq.SUBSCRIBE, b"")
        self.sock.setsockopt(zmq.RCVTIMEO, 100)
        self.sock.connect(endpoint)
        self.batches = []
        self.lock = threading.Lock()
        self.running = True
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self):
        while self.running:
            try:
                frames = self.sock.recv_multipart()
            except zmq.Again:
                continue
            assert len(frames) == 3, f"a batch is three frames, got {len(frames)}"
            topic, seq, payload = frames
            assert topic == b""
            assert len(seq) == 8
            (seq,) = struct.unpack(">Q", seq)
            ts, events, dp_rank = msgpack.unpackb(payload, raw=False)
            with self.lock:
                self.batches.append((seq, ts, events, dp_rank))

    def events(self):
        with self.lock:
            return [e for b in self.batches for e in b[2]]

    def seqs(self):
        with self.lock:
            return [b[0] for b in self.batches]

    def close(self):
        self.running = False
        self.thread.join()
        self.sock.close(linger=0)
        self.ctx.term()


def http_json(port, path):
    with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as r:
        return json.loads(r.read())


def all_keys(port):
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/get_all_keys", timeout=5) as r:
        return set(r.read().decode().split())


def metric(port, name):
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
        m = re.search(rf"^{name} (\d+)$", r.read().decode(), re.M)
    return int(m.group(1)) if m else None


def start(extra=()):
    """A master publishing on a free loopback port, one node with a small pool."""
    zport = free_port()
    endpoint = f"tcp://127.0.0.1:{zport}"
    master = Master(extra=["--enable_kv_events", f"--kv_events_bind_endpoint={endpoint}",
                           "--kv_events_backend_id=pool-test", *extra])
    return master, endpoint


def join(sub, store, prefix="probe"):
    """Puts probe keys until the subscriber sees a batch: a SUB socket joins a little after
    it connects, and misses what was sent before (ZeroMQ's slow joiner)."""
    for i in range(200):
        assert store.put(f"{prefix}-{i}", b"x" * 64) == 0
        deadline = time.monotonic() + 0.1
        while time.monotonic() < deadline:
            if sub.seqs():
                return
            time.sleep(0.01)
    raise AssertionError("the subscriber never received a batch")


def settle(sub, port, timeout=20.0):
    """Waits until every event the master published has reached the subscriber."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        st = http_json(port, "/kv_events/status")
        if len(sub.events()) >= st["published_events"] - first_event_offset(sub):
            time.sleep(0.2)
            st2 = http_json(port, "/kv_events/status")
            if st2 == st:
                return st
        time.sleep(0.05)
    raise AssertionError("the subscriber did not catch up with the publisher")


def first_event_offset(sub):
    """Events published before the subscriber joined (event ids start at 1)."""
    ev = sub.events()
    return ev[0]["event_id"] - 1 if ev else 0


def parse_hash(key):
    if re.fullmatch(r"[0-9]+", key) and int(key) < 2**64:
        return int(key)
    if re.fullmatch(r"0[xX][0-9a-fA-F]{1,16}", key):
        return int(key, 16)
    return None


def check_event_shape(e):
    stored = e["event_type"] == "stored"
    assert e["event_type"] in ("stored", "removed")
    assert e["type"] == ("BlockStored" if stored else "BlockRemoved")
    for nil in ("model_name", "block_size", "additional_salt", "lora_name", "dp_rank"):
        assert e[nil] is None, nil
    assert e["tenant_id"] == "default"
    assert e["backend_id"] == "pool-test"
    assert e["group_id"] is None
    assert e["medium"] == "cpu"
    h = parse_hash(e["object_key"])
    assert e["seq_hashes"] == ([] if h is None else [h])
    signed = None if h is None else struct.unpack("<q", struct.pack("<Q", h))[0]
    assert e["block_hashes"] == ([] if h is None else [signed])
    if stored:
        assert e["base_block_idx"] == 0
        assert e["parent_hash"] is None and e["token_ids"] is None
        assert e["parent_block_hash"] is None
    else:
        assert e["base_block_idx"] is None


def key_pool(rng):
    """Hash-like decimal and 0x keys, and keys that are not hashes."""
    keys = [str(rng.randrange(2**64)) for _ in range(200)]
    keys += [hex(rng.randrange(2**64)) for _ in range(200)]
    keys += [f"layer{i % 7}/block-{i}" for i in range(200)]
    return keys


def run_mixed(store, rng, keys, n):
    """`n` mixed operations; returns how many puts failed for space (eviction's cue)."""
    value = b"v" * (48 * 1024)
    no_space = 0
    for i in range(n):
        r = rng.random()
        key = rng.choice(keys)
        if r < 0.6:
            rc = store.put(key, value)
            no_space += rc == NO_SPACE
        elif r < 0.85:
            store.remove(key)
        elif r < 0.97:
            store.get(key)
        elif r < 0.995:
            store.remove_by_regex(rng.choice([r"^layer3/", r"^0x[0-7]", r"^1"]))
        else:
            store.remove_all()
    return no_space


def test_a_subscriber_reconciles_with_the_pool_after_10000_mixed_operations():
    master, endpoint = start(["--eviction_high_watermark_ratio=0.8", "--eviction_ratio=0.1"])
    # 8 MiB of 48 KiB values: about 170 fit, against a pool of 600 keys, so eviction runs.
    node = Node(master, segment=8 * MIB)
    store = make_store(master, segment=0, local_buffer=16 * MIB)
    sub = Subscriber(endpoint)
    try:
        join(sub, store)
        rng = random.Random(20261206)
        keys = key_pool(rng)
        run_mixed(store, rng, keys, 10_000)
        # Let the lease of the last reads run out, and eviction settle.
        time.sleep(1.0)
        held = all_keys(master.metrics_port)
        st = settle(sub, master.metrics_port)
        assert all_keys(master.metrics_port) == held, "the pool changed after the run"
        assert st["enabled"] and st["endpoint"] == endpoint
        assert st["dropped_events"] == 0
        assert metric(master.metrics_port, "master_kv_events_published_events") == \
            st["published_events"]
        evicted = metric(master.metrics_port, "master_evicted_key_count")
        assert evicted and evicted > 0, "the run was meant to evict"

        seqs = sub.seqs()
        assert seqs == list(range(seqs[0], seqs[0] + len(seqs))), "a gap with no drop"
        events = sub.events()
        ids = [e["event_id"] for e in events]
        assert ids == list(range(ids[0], ids[0] + len(ids)))
        assert ids[-1] == st["published_events"]
        with sub.lock:
            assert all(b[3] == 0 for b in sub.batches), "dp_rank"
            assert all(e["timestamp"] == b[1] for b in sub.batches for e in b[2])
        last = {}
        for e in events:
            check_event_shape(e)
            last[e["object_key"]] = e["event_type"]
        non_hash = sum(1 for e in events if not e["seq_hashes"])
        assert non_hash > 0 and non_hash <= st["non_hash_keys"]
        # Every key held was announced stored last; every key not held, removed last.
        for key in held:
            assert last.get(key) == "stored", key
        for key in set(keys) - held:
            assert last.get(key) in (None, "removed"), key
        assert sum(1 for v in last.values() if v == "stored") == len(held)
    finally:
        sub.close()
        store.close()
        node.stop()
        assert master.stop() == 0


def test_a_full_queue_drops_events_and_the_sequence_shows_the_gap():
    master, endpoint = start(["--kv_events_queue_capacity=4"])
    node = Node(master, segment=256 * MIB)
    store = make_store(master, segment=0, local_buffer=64 * MIB)
    sub = Subscriber(endpoint)
    try:
        join(sub, store)
        before = settle(sub, master.metrics_port)
        assert before["dropped_events"] == 0
        base = len(sub.events())
        n = 400
        keys = [f"k{i}" for i in range(n)]
        assert store.put_batch(keys, [b"v" * 1024] * n) == 0
        # One remove_all announces 400+ removals in one pass under the master's lock: far
        # more than a queue of 4 holds while the publisher thread drains it.
        removed = store.remove_all()
        assert removed >= n
        # A put after the burst: its batch carries the gap if the burst's last ones were lost.
        time.sleep(0.3)
        assert store.put("after", b"x") == 0
        st = settle(sub, master.metrics_port)
        dropped = st["dropped_events"]
        assert dropped > 0, "a queue of 4 should have overflowed"
        seqs = sub.seqs()
        gaps = sum(b - a - 1 for a, b in zip(seqs, seqs[1:]))
        assert all(b > a for a, b in zip(seqs, seqs[1:]))
        assert gaps >= 1, "drops must show as a gap in the sequence"
        assert gaps <= dropped, "at most one skipped number per dropped event"
        # Every event is either received or counted as dropped.
        announced = n + removed + 1
        received = len(sub.events()) - base
        assert received + dropped == announced
        assert st["published_events"] - before["published_events"] == received
        assert metric(master.metrics_port, "master_kv_events_dropped_events") == dropped
    finally:
        sub.close()
        store.close()
        node.stop()
        assert master.stop() == 0


def test_status_reports_off_without_the_flag(master):
    st = http_json(master.metrics_port, "/kv_events/status")
    assert st["enabled"] is False
    assert st["published_events"] == 0 and st["dropped_events"] == 0
    assert metric(master.metrics_port, "master_kv_events_enabled") == 0
