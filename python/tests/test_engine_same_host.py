"""`mooncake.engine` between two processes of one host: the same-host path (cross-memory
attach, checked against the peer's live registration table) against the TCP path that
`MC_TE_SAME_HOST=0` forces. The target is an `engine_target.py` subprocess whose buffer is a
registered numpy array (plain process memory, not shared memory); this pytest process is
the initiator.

Which path a transfer took is seen from outside: a TCP initiator opens data connections to
the target (its socket count grows), a same-host one opens none.
"""

import os
import random
import threading
import time

import pytest

from polling import wait_until
from test_engine_transfer import MIB, TRANSFER_TIMEOUT_S, Target, _poll

from mooncake.engine import TransferEngine  # noqa: E402

LOCAL_BYTES = 64 * MIB


def _engine(same_host):
    """An engine with a 64 MiB managed buffer; `same_host=False` sets MC_TE_SAME_HOST=0 for
    its construction (the engine reads its environment once, when made)."""
    old = os.environ.get("MC_TE_SAME_HOST")
    os.environ["MC_TE_SAME_HOST"] = "1" if same_host else "0"
    try:
        e = TransferEngine()
    finally:
        if old is None:
            del os.environ["MC_TE_SAME_HOST"]
        else:
            os.environ["MC_TE_SAME_HOST"] = old
    assert e.initialize("127.0.0.1", "P2PHANDSHAKE", "tcp", "") == 0
    local = e.allocate_managed_buffer(LOCAL_BYTES)
    assert local != 0
    return e, local


@pytest.fixture(scope="module")
def target():
    t = Target("--buffer", "numpy")
    yield t
    t.kill()


@pytest.fixture(scope="module")
def shm():
    e, local = _engine(True)
    yield e, local
    e.free_managed_buffer(local, LOCAL_BYTES)


@pytest.fixture(scope="module")
def tcp():
    e, local = _engine(False)
    yield e, local
    e.free_managed_buffer(local, LOCAL_BYTES)


def _sockets_after(t, e, local):
    """How many more sockets the target holds after a few transfers from `e`, once the
    short-lived handshake connection had time to close."""
    before = t.cmd("sockets")
    assert e.transfer_sync_write(t.segment, local, t.buffer, 4096) == 0
    assert e.transfer_sync_read(t.segment, local, t.buffer, 4 * MIB) == 0
    deadline = time.monotonic() + 3
    while t.cmd("sockets") > before and time.monotonic() < deadline:
        time.sleep(0.05)
    return t.cmd("sockets") - before


def test_same_host_opens_no_data_connection_and_the_switch_forces_tcp():
    t = Target("--buffer", "numpy")
    try:
        e, local = _engine(True)
        assert _sockets_after(t, e, local) == 0, "the same-host path opened connections"
        e2, local2 = _engine(False)
        assert _sockets_after(t, e2, local2) >= 1, "MC_TE_SAME_HOST=0 did not use TCP"
    finally:
        t.kill()


@pytest.mark.parametrize("path", ["shm", "tcp"])
def test_round_trips_byte_exact(path, request, target):
    """Random sizes (to 16 MiB) and offsets: write, read back, check every byte, and the
    target's memory holds what was written."""
    e, local = request.getfixturevalue(path)
    rng = random.Random(48)
    half = LOCAL_BYTES // 2
    for i in range(60):
        size = rng.choice([1, 7, 4096, rng.randint(1, MIB), 16 * MIB])
        src_off = rng.randint(0, half - size)
        remote_off = rng.randint(0, target.info["buffer_len"] - size)
        data = rng.randbytes(size)
        assert e.write_bytes_to_buffer(local + src_off, data, size) == 0
        assert e.transfer_sync_write(target.segment, local + src_off,
                                     target.buffer + remote_off, size) == 0
        dst_off = half + rng.randint(0, half - size)
        assert e.transfer_sync_read(target.segment, local + dst_off,
                                    target.buffer + remote_off, size) == 0
        assert e.read_bytes_from_buffer(local + dst_off, size) == data, f"round trip {i}"
    assert target.peek(target.buffer + remote_off, min(size, 4096)) == data[:4096]


def test_batches_sync_and_async_byte_exact(shm, target):
    e, local = shm
    n, stride = 64, 64 * 1024
    payload = os.urandom(n * stride)
    assert e.write_bytes_to_buffer(local, payload, len(payload)) == 0
    bufs = [local + i * stride for i in range(n)]
    peers = [target.buffer + 8 * MIB + i * stride for i in range(n)]
    assert e.batch_transfer_sync_write(target.segment, bufs, peers, [stride] * n) == 0
    assert target.peek(target.buffer + 8 * MIB, 4096) == payload[:4096]
    back = [local + 16 * MIB + i * stride for i in range(n)]
    assert e.batch_transfer_sync_read(target.segment, back, peers, [stride] * n) == 0
    assert e.read_bytes_from_buffer(local + 16 * MIB, len(payload)) == payload
    other = os.urandom(len(payload))
    assert e.write_bytes_to_buffer(local, other, len(other)) == 0
    bid = e.batch_transfer_async_write(target.segment, bufs, peers, [stride] * n)
    assert bid != 0 and _poll(e, bid) == 1
    bid = e.batch_transfer_async_read(target.segment, back, peers, [stride] * n)
    assert bid != 0 and e.get_batch_transfer_status([bid]) == 0
    assert e.read_bytes_from_buffer(local + 16 * MIB, len(other)) == other


def _refusals(e, local, t):
    g = t.info
    n = g["guard_len"]
    out = []
    for remote, size in [(g["guard_before"], 16), (g["guarded"] - 8, 16),
                         (g["guarded"] + n - 8, 16), (g["guard_after"], 64),
                         ((1 << 64) - 8, 4096)]:  # past the end of the address space
        out.append(e.transfer_sync_write(t.segment, local, remote, size))
        out.append(e.transfer_sync_read(t.segment, local + MIB, remote, size))
        out.append(e.batch_transfer_sync_write(t.segment, [local], [remote], [size]))
        bid = e.transfer_submit_write(t.segment, local, remote, size)
        out.append(_poll(e, bid) if bid else "no batch")
    return out


def test_out_of_range_is_refused_with_the_tcp_code_and_untouched(shm, tcp, target):
    g = target.info
    before = target.peek(g["guard_before"], 3 * g["guard_len"])
    by_shm = _refusals(*shm, target)
    by_tcp = _refusals(*tcp, target)
    assert all(isinstance(c, int) and c < 0 for c in by_shm), by_shm
    assert by_shm == by_tcp
    assert target.peek(g["guard_before"], 3 * g["guard_len"]) == before


def test_unregister_while_reading():
    """A reader loops over a target buffer while the target unregisters it: every read
    either succeeds with the buffer's bytes or is refused as over TCP; once
    unregister_memory has returned, every read and write is refused and the target's bytes
    stay as they were."""
    t = Target("--buffer", "numpy", "--size", str(4 * MIB))
    e, local = _engine(True)
    over_tcp, tcp_local = _engine(False)
    try:
        ones = b"\x01" * MIB
        stop = threading.Event()
        seen = []

        def reader():
            while not stop.is_set():
                rc = e.transfer_sync_read(t.segment, local, t.buffer + MIB, MIB)
                ok = rc == 0 and e.read_bytes_from_buffer(local, MIB) == ones
                seen.append((rc, ok))

        th = threading.Thread(target=reader)
        th.start()
        time.sleep(0.2)
        assert t.cmd(f"unregister {t.buffer}") == 0
        after = len(seen)
        time.sleep(0.2)
        stop.set()
        th.join(timeout=30)
        assert not th.is_alive()
        assert any(rc == 0 for rc, _ in seen[:after]), "no read succeeded before unregister"
        assert all(ok for rc, ok in seen if rc == 0), "a successful read returned wrong bytes"
        late = [rc for rc, _ in seen[after + 1:]]
        assert late and all(rc < 0 for rc in late), "a read after unregister succeeded"
        code_tcp = over_tcp.transfer_sync_read(t.segment, tcp_local, t.buffer, 16)
        assert code_tcp < 0
        assert set(late) == {code_tcp}, (set(late), code_tcp)
        data = os.urandom(4096)
        assert e.write_bytes_to_buffer(local, data, len(data)) == 0
        assert e.transfer_sync_write(t.segment, local, t.buffer, 4096) == code_tcp
        assert t.peek(t.buffer, 4096) == b"\x01" * 4096, "an unregistered buffer was written"
    finally:
        t.kill()


@pytest.mark.parametrize("op", ["read", "write"])
def test_peer_killed_mid_transfer(op, shm, target):
    """16 MiB transfers in a loop while the target is SIGKILLed: the loop ends with an
    error, promptly, and the engine still works with another target."""
    e, local = shm
    victim = Target("--buffer", "numpy", "--size", str(32 * MIB))
    call = e.transfer_sync_read if op == "read" else e.transfer_sync_write
    results = []

    def loop():
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            rc = call(victim.segment, local, victim.buffer, 16 * MIB)
            results.append((time.monotonic(), rc))
            if rc != 0:
                return

    th = threading.Thread(target=loop)
    try:
        th.start()
        wait_until(lambda: len(results) >= 3, 30, "three transfers before the kill")
        t0 = time.monotonic()
        victim.kill()
        th.join(timeout=TRANSFER_TIMEOUT_S + 10)
        assert not th.is_alive(), "the transfer loop hung after the peer died"
        assert results[-1][1] < 0
        assert results[-1][0] - t0 <= TRANSFER_TIMEOUT_S + 1.0
        t1 = time.monotonic()
        assert call(victim.segment, local, victim.buffer, 16) < 0
        assert time.monotonic() - t1 <= TRANSFER_TIMEOUT_S + 1.0
    finally:
        victim.kill()
    data = os.urandom(MIB)
    assert e.write_bytes_to_buffer(local, data, MIB) == 0
    assert e.transfer_sync_write(target.segment, local, target.buffer, MIB) == 0
    assert e.transfer_sync_read(target.segment, local + 2 * MIB, target.buffer, MIB) == 0
    assert e.read_bytes_from_buffer(local + 2 * MIB, MIB) == data
