"""The workload of the concurrency soak (`test_soak.py`): threads sharing one
`MooncakeDistributedStore` doing random mixed operations on a shared key space until a
deadline, checking every return code against the codes a healthy cluster may answer and every
value read back against what some writer wrote for that key.

Used in two ways: imported by the test (64 threads in the pytest process), and run as a script
(`python soak_worker.py '<json args>'`) for the extra client processes, which print `ready`
after setup, start on a line from stdin, print one JSON line of statistics at the end, and
close the store on a second line from stdin (when no other process writes to their segment
any more).
"""

import ctypes
import json
import random
import sys
import threading
import time

# Codes a healthy but contended, full cluster may answer; anything else fails the soak.
EXPECTED = {
    -200: "NO_AVAILABLE_HANDLE",  # every segment full and nothing evictable right now
    # A put whose in-flight object another client's upsert took over (upsert preempts
    # puts in flight, see controlplane/src/service/object.rs): its PutEnd is refused.
    -601: "ILLEGAL_CLIENT",
    -703: "REPLICA_IS_NOT_READY",  # remove of a key whose put is in flight
    -704: "OBJECT_NOT_FOUND",  # missing, evicted or removed by another thread
    -705: "OBJECT_ALREADY_EXISTS",  # upsert racing another in-flight put of the key
    -706: "OBJECT_HAS_LEASE",  # remove of a key someone is reading
    -707: "LEASE_EXPIRED",  # a read slower than the lease: refused rather than risked
    -714: "OBJECT_REPLICA_BUSY",  # upsert of a key someone is reading
}

# Value sizes, picked by version: from one page to a few hundred KiB.
SIZES = (1024, 8 * 1024, 64 * 1024, 256 * 1024)
MAX_SIZE = max(SIZES)
BATCH = 4


def key_of(i):
    return f"soak/k{i}"


def make_value(key, ver):
    """`key:ver;` repeated to a size picked by `ver`: any read names its key and version and
    can be checked byte for byte."""
    unit = f"{key}:{ver};".encode()
    size = SIZES[ver % len(SIZES)]
    return (unit * (size // len(unit) + 1))[:size]


def check_value(key, data):
    """'miss' for an empty read, 'ok' when `data` is exactly some version of `key`, else
    'bad'."""
    if not data:
        return "miss"
    prefix = f"{key}:".encode()
    if not data.startswith(prefix):
        return "bad"
    end = data.find(b";", len(prefix), len(prefix) + 24)
    if end < 0:
        return "bad"
    try:
        ver = int(data[len(prefix):end])
    except ValueError:
        return "bad"
    return "ok" if data == make_value(key, ver) else "bad"


class Stats:
    """Counters of one thread (merged at the end, so no lock on the hot path)."""

    def __init__(self):
        self.ops = {}  # op -> calls
        self.codes = {}  # "op:code" -> count (non-zero codes only)
        self.reads = {"ok": 0, "miss": 0}
        self.unexpected = []  # first few unexpected results
        self.unexpected_count = 0
        self.bad_data = []
        self.bad_data_count = 0
        self.slowest = {}  # op -> seconds

    def op(self, name, took):
        self.ops[name] = self.ops.get(name, 0) + 1
        if took > self.slowest.get(name, 0.0):
            self.slowest[name] = took

    def code(self, name, rc):
        if rc >= 0:
            return
        k = f"{name}:{rc}"
        self.codes[k] = self.codes.get(k, 0) + 1
        if rc not in EXPECTED:
            self.unexpected_count += 1
            if len(self.unexpected) < 20:
                self.unexpected.append(k)

    def read(self, key, data):
        verdict = check_value(key, data)
        if verdict == "bad":
            self.bad_data_count += 1
            if len(self.bad_data) < 20:
                self.bad_data.append(f"{key}: {bytes(data[:48])!r}... ({len(data)} B)")
        else:
            self.reads[verdict] += 1

    def merge(self, other):
        for name, n in other.ops.items():
            self.ops[name] = self.ops.get(name, 0) + n
        for k, n in other.codes.items():
            self.codes[k] = self.codes.get(k, 0) + n
        for k in self.reads:
            self.reads[k] += other.reads[k]
        self.unexpected += other.unexpected[: max(0, 20 - len(self.unexpected))]
        self.unexpected_count += other.unexpected_count
        self.bad_data += other.bad_data[: max(0, 20 - len(self.bad_data))]
        self.bad_data_count += other.bad_data_count
        for name, t in other.slowest.items():
            self.slowest[name] = max(self.slowest.get(name, 0.0), t)

    def to_json(self):
        return dict(self.__dict__)

    @classmethod
    def from_json(cls, d):
        s = cls()
        s.__dict__.update(d)
        return s


def run_thread(store, seed, deadline, n_keys, stats):
    """Random mixed operations until `deadline` (time.monotonic())."""
    rng = random.Random(seed)
    # A registered buffer of BATCH slots for the zero-copy calls.
    buf = (ctypes.c_ubyte * (MAX_SIZE * BATCH))()
    base = ctypes.addressof(buf)
    rc = store.register_buffer(base, MAX_SIZE * BATCH)
    stats.code("register_buffer", rc)
    ver = seed << 20

    def pick(n=1):
        return [key_of(rng.randrange(n_keys)) for _ in range(n)]

    def new_value(key):
        nonlocal ver
        ver += 1
        return make_value(key, ver)

    ops = (
        ["put"] * 6 + ["upsert"] * 3 + ["get"] * 8 + ["get_buffer"] * 3 + ["is_exist"] * 3
        + ["batch_is_exist"] * 2 + ["put_batch"] * 2 + ["upsert_batch"] + ["get_batch"] * 3
        + ["batch_put_from"] * 2 + ["batch_get_into"] * 2 + ["get_size"] * 2 + ["remove"] * 2
        + ["batch_remove"] + ["remove_by_regex"]
    )
    while time.monotonic() < deadline:
        op = rng.choice(ops)
        t0 = time.monotonic()
        if op in ("put", "upsert"):
            (k,) = pick()
            stats.code(op, getattr(store, op)(k, new_value(k)))
        elif op == "get":
            (k,) = pick()
            stats.read(k, store.get(k))
        elif op == "get_buffer":
            (k,) = pick()
            h = store.get_buffer(k)
            stats.read(k, b"" if h is None else bytes(memoryview(h)))
        elif op == "is_exist":
            rc = store.is_exist(pick()[0])
            stats.code(op, rc if rc < 0 or rc in (0, 1) else -99999)
        elif op == "batch_is_exist":
            for rc in store.batch_is_exist(pick(BATCH)):
                stats.code(op, rc if rc < 0 or rc in (0, 1) else -99999)
        elif op in ("put_batch", "upsert_batch"):
            keys = list(dict.fromkeys(pick(BATCH)))
            stats.code(op, getattr(store, op)(keys, [new_value(k) for k in keys]))
        elif op == "get_batch":
            keys = pick(BATCH)
            for k, v in zip(keys, store.get_batch(keys)):
                stats.read(k, v)
        elif op == "batch_put_from":
            keys = list(dict.fromkeys(pick(BATCH)))
            ptrs, sizes = [], []
            for i, k in enumerate(keys):
                v = new_value(k)
                ctypes.memmove(base + i * MAX_SIZE, v, len(v))
                ptrs.append(base + i * MAX_SIZE)
                sizes.append(len(v))
            for rc in store.batch_put_from(keys, ptrs, sizes):
                stats.code(op, rc)
        elif op == "batch_get_into":
            keys = list(dict.fromkeys(pick(BATCH)))
            ptrs = [base + i * MAX_SIZE for i in range(len(keys))]
            got = store.batch_get_into(keys, ptrs, [MAX_SIZE] * len(keys))
            for i, (k, n) in enumerate(zip(keys, got)):
                if n < 0:
                    stats.code(op, n)
                    stats.read(k, b"")
                else:
                    stats.read(k, ctypes.string_at(base + i * MAX_SIZE, n))
        elif op == "get_size":
            (k,) = pick()
            n = store.get_size(k)
            stats.code(op, n if n < 0 or n in SIZES else -99999)
        elif op == "remove":
            stats.code(op, store.remove(pick()[0]))
        elif op == "batch_remove":
            for rc in store.batch_remove(pick(BATCH)):
                stats.code(op, rc)
        elif op == "remove_by_regex":
            # About ten keys: a small bite of the key space.
            stem = rng.randrange(max(1, n_keys // 10))
            n = store.remove_by_regex(f"^soak/k{stem}[0-9]$")
            stats.code(op, n if n < 0 or n <= 10 else -99999)
        stats.op(op, time.monotonic() - t0)
    stats.code("unregister_buffer", store.unregister_buffer(base))


def run_threads(store, n_threads, seconds, n_keys, seed, join_slack):
    """`n_threads` threads on `store` for `seconds`; returns (merged Stats, threads that did
    not finish within `seconds + join_slack`)."""
    deadline = time.monotonic() + seconds
    per_thread = [Stats() for _ in range(n_threads)]
    threads = [
        threading.Thread(
            target=run_thread,
            args=(store, seed * 1000 + i, deadline, n_keys, per_thread[i]),
            name=f"soak-{seed}-{i}",
            daemon=True,
        )
        for i in range(n_threads)
    ]
    for t in threads:
        t.start()
    hung = []
    for t in threads:
        t.join(timeout=max(0.0, deadline + join_slack - time.monotonic()))
        if t.is_alive():
            hung.append(t.name)
    total = Stats()
    for s in per_thread:
        total.merge(s)
    return total, hung


def main():
    from mooncake.store import MooncakeDistributedStore

    a = json.loads(sys.argv[1])
    store = MooncakeDistributedStore()
    rc = store.setup("127.0.0.1", a["metadata"], a["segment"], a["local_buffer"], "tcp", "",
                     a["master"])
    if rc != 0:
        print(json.dumps({"setup_rc": rc}), flush=True)
        sys.exit(2)
    print("ready", flush=True)
    # The parent writes a line when every process is ready: start together.
    sys.stdin.readline()
    stats, hung = run_threads(store, a["threads"], a["seconds"], a["keys"], a["seed"],
                              a["join_slack"])
    print(json.dumps({"stats": stats.to_json(), "hung": hung}), flush=True)
    if hung:
        sys.exit(3)
    # Close only when told: every process is done, so no transfer to our segment is cut.
    sys.stdin.readline()
    print(json.dumps({"close_rc": store.close()}), flush=True)


if __name__ == "__main__":
    main()
