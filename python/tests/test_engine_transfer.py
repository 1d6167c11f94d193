"""`mooncake.engine` between two processes: this pytest process is the initiator, and
`engine_target.py` subprocesses are targets (as upstream's transfer_engine_initiator_test.py
and transfer_engine_target.py). P2PHANDSHAKE unless a test says otherwise.

MC_TRANSFER_TIMEOUT is 5 s here (set before any engine is made), so a peer killed mid-batch
must be reported within about 5 s.
"""

import ctypes
import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

os.environ["MC_TRANSFER_TIMEOUT"] = "5"
TRANSFER_TIMEOUT_S = 5

from mooncake.engine import TransferEngine, TransferNotify, TransferOpcode  # noqa: E402
from polling import wait_until  # noqa: E402

HERE = Path(__file__).resolve().parent
MIB = 1024 * 1024
LOCAL_BYTES = 64 * MIB


class Target:
    """A target process: its JSON description and its stdin/stdout command channel."""

    def __init__(self, *args):
        self.proc = subprocess.Popen(
            [sys.executable, str(HERE / "engine_target.py"), *args],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"target exited with {self.proc.wait()}")
        self.info = json.loads(line)
        if "error" in self.info:
            raise RuntimeError(f"target failed to start: {self.info}")
        self.segment = self.info["segment"]
        self.buffer = self.info["buffer"]

    def cmd(self, line):
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()
        return json.loads(self.proc.stdout.readline())

    def peek(self, addr, n):
        return bytes.fromhex(self.cmd(f"peek {addr} {n}"))

    def notifies(self):
        return [tuple(x) for x in self.cmd("notifies")]

    def kill(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()


@pytest.fixture(scope="module")
def target():
    t = Target()
    yield t
    t.kill()


@pytest.fixture(scope="module")
def initiator():
    """An initiator engine with a 64 MiB managed buffer: (engine, local address)."""
    e = TransferEngine()
    assert e.initialize("127.0.0.1", "P2PHANDSHAKE", "tcp", "") == 0
    local = e.allocate_managed_buffer(LOCAL_BYTES)
    assert local != 0
    yield e, local
    e.free_managed_buffer(local, LOCAL_BYTES)


def test_1000_random_round_trips(initiator, target):
    """Upstream's initiator test: random sizes and offsets, write then read back, every byte
    checked on both legs."""
    e, local = initiator
    rng = random.Random(1234)
    half = LOCAL_BYTES // 2
    for i in range(1000):
        size = rng.randint(1, 1 * MIB) if i % 10 else rng.randint(1, 8 * MIB)
        src_off = rng.randint(0, half - size)
        remote_off = rng.randint(0, target.info["buffer_len"] - size)
        data = rng.randbytes(size)
        assert e.write_bytes_to_buffer(local + src_off, data, size) == 0
        rc = e.transfer_sync_write(target.segment, local + src_off, target.buffer + remote_off, size)
        assert rc == 0, f"write {i} of {size} bytes failed: {rc}"
        dst_off = half + rng.randint(0, half - size)
        rc = e.transfer_sync_read(target.segment, local + dst_off, target.buffer + remote_off, size)
        assert rc == 0, f"read {i} of {size} bytes failed: {rc}"
        back = e.read_bytes_from_buffer(local + dst_off, size)
        assert back == data, f"round trip {i}: {size} bytes differ"
    # And the target's memory holds what the last write sent.
    assert target.peek(target.buffer + remote_off, size) == data


def _stride_lists(local, remote, n=100, stride=1024):
    return ([local + i * stride for i in range(n)],
            [remote + i * stride for i in range(n)],
            [stride] * n)


def test_batch_sync_100_x_1k(initiator, target):
    e, local = initiator
    payload = bytes((i * 7 + 3) % 256 for i in range(100 * 1024))
    assert e.write_bytes_to_buffer(local, payload, len(payload)) == 0
    bufs, peers, lens = _stride_lists(local, target.buffer)
    assert e.batch_transfer_sync_write(target.segment, bufs, peers, lens) == 0
    assert target.peek(target.buffer, len(payload)) == payload
    dst = local + 8 * MIB
    bufs, peers, lens = _stride_lists(dst, target.buffer)
    assert e.batch_transfer_sync_read(target.segment, bufs, peers, lens) == 0
    assert e.read_bytes_from_buffer(dst, len(payload)) == payload
    # The generic form with an opcode, and keyword arguments.
    assert e.batch_transfer_sync(target_hostname=target.segment, buffers=bufs,
                                 peer_buffer_addresses=peers, lengths=lens,
                                 opcode=TransferOpcode.Read) == 0
    # Mismatched lists.
    assert e.batch_transfer_sync_write(target.segment, bufs, peers, lens[:-1]) == -1


def _poll(e, batch_id, timeout=30.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        s = e.transfer_check_status(batch_id)
        if s != 0:
            return s
        time.sleep(0.001)
    raise AssertionError(f"batch {batch_id} still running after {timeout} s")


def test_batch_async_with_status_polling(initiator, target):
    e, local = initiator
    payload = os.urandom(100 * 1024)
    assert e.write_bytes_to_buffer(local, payload, len(payload)) == 0
    bufs, peers, lens = _stride_lists(local, target.buffer + MIB)

    bid = e.batch_transfer_async_write(target.segment, bufs, peers, lens)
    assert bid != 0
    assert _poll(e, bid) == 1
    assert target.peek(target.buffer + MIB, len(payload)) == payload
    # A completed batch was freed: asking again is a failure, not a crash.
    assert e.transfer_check_status(bid) == -1

    dst = local + 16 * MIB
    bufs_r, peers_r, lens_r = _stride_lists(dst, target.buffer + MIB)
    bid = e.batch_transfer_async_read(target.segment, bufs_r, peers_r, lens_r)
    assert bid != 0
    assert e.get_batch_transfer_status([bid]) == 0
    assert e.read_bytes_from_buffer(dst, len(payload)) == payload

    ids = [e.batch_transfer_async(target.segment, bufs, peers, lens, TransferOpcode.Write)
           for _ in range(4)]
    assert all(ids) and len(set(ids)) == 4
    assert e.get_batch_transfer_status(ids) == 0

    bid = e.transfer_submit_write(target.segment, local, target.buffer + 2 * MIB, 4096)
    assert bid != 0
    assert _poll(e, bid) == 1
    assert target.peek(target.buffer + 2 * MIB, 4096) == payload[:4096]

    assert e.get_batch_transfer_status([123456789]) == -1


def test_unknown_peer(initiator):
    e, local = initiator
    unknown = "127.0.0.1:1"
    assert e.batch_transfer_async_write(unknown, [local], [0x1000], [16]) == 0
    assert e.batch_transfer_async_read(unknown, [local], [0x1000], [16]) == 0
    assert e.transfer_submit_write(unknown, local, 0x1000, 16) == 0
    assert e.transfer_sync_write(unknown, local, 0x1000, 16) < 0
    assert e.get_first_buffer_address(unknown) == 0


def test_send_probe(initiator, target):
    e, _ = initiator
    assert e.send_probe(target.segment) == 0
    assert e.send_probe(peer_server_name=target.segment) == 0
    assert e.send_probe("127.0.0.1:1") != 0


def test_unregistered_peer_memory_is_refused_and_untouched(initiator, target):
    e, local = initiator
    g = target.info
    n = g["guard_len"]
    before = target.peek(g["guard_before"], 3 * n)
    assert before == b"\xab" * (3 * n)
    assert e.write_bytes_to_buffer(local, b"\x00" * n, n) == 0
    # Entirely outside registered memory; straddling the start; straddling the end.
    for remote, size in [(g["guard_before"], 16), (g["guarded"] - 8, 16),
                         (g["guarded"] + n - 8, 16), (g["guard_after"], 64)]:
        assert e.transfer_sync_write(target.segment, local, remote, size) < 0, hex(remote)
        assert e.transfer_sync_read(target.segment, local + MIB, remote, size) < 0, hex(remote)
        bid = e.transfer_submit_write(target.segment, local, remote, size)
        assert bid != 0 and _poll(e, bid) == -1
    assert target.peek(g["guard_before"], 3 * n) == before, "the peer's memory changed"
    # The registered middle page is writable, and only it changes.
    assert e.transfer_sync_write(target.segment, local, g["guarded"], n) == 0
    after = target.peek(g["guard_before"], 3 * n)
    assert after == b"\xab" * n + b"\x00" * n + b"\xab" * n


def test_local_addresses_are_checked(initiator, target):
    """Raw local addresses must lie in memory registered with (or allocated by) this engine;
    anything else is a negative code, never a crash."""
    e, local = initiator
    stray = bytearray(4096)
    import ctypes

    stray_addr = ctypes.addressof((ctypes.c_char * len(stray)).from_buffer(stray))
    assert e.write_bytes_to_buffer(stray_addr, b"x", 1) == -1
    assert e.write_bytes_to_buffer(0, b"x", 1) == -1
    assert e.read_bytes_from_buffer(8, 16) == -1
    assert e.write_bytes_to_buffer(local, b"abc", 10) == -1  # length beyond the data
    assert e.write_bytes_to_buffer(local + LOCAL_BYTES - 2, b"abcd", 4) == -1  # past the end
    assert e.transfer_sync_write(target.segment, stray_addr, target.buffer, 16) < 0
    assert e.transfer_sync_read(target.segment, 0xdead0000, target.buffer, 16) < 0
    bid = e.transfer_submit_write(target.segment, stray_addr, target.buffer, 16)
    assert bid != 0 and _poll(e, bid) == -1
    assert e.register_memory(0x1000, 4096) == -1  # not mapped here
    # Once registered, the same bytearray works.
    assert e.register_memory(stray_addr, len(stray)) == 0
    assert e.write_bytes_to_buffer(stray_addr, b"ok", 2) == 0
    assert bytes(stray[:2]) == b"ok"
    assert e.transfer_sync_write(target.segment, stray_addr, target.buffer, 2) == 0
    assert e.register_memory(stray_addr + 16, 16) == -7  # overlaps
    assert e.unregister_memory(stray_addr) == 0
    assert e.unregister_memory(stray_addr) == -3
    assert e.write_bytes_to_buffer(stray_addr, b"no", 2) == -1


def test_notifications(initiator, target):
    e, local = initiator
    target.notifies()  # drain
    assert e.write_bytes_to_buffer(local, b"kv-block", 8) == 0
    assert e.transfer_sync(target.segment, local, target.buffer, 8, TransferOpcode.Write,
                           TransferNotify("req-1", "layer-0 done")) == 0
    assert e.transfer_sync(target_hostname=target.segment, buffer=local,
                           peer_buffer_address=target.buffer, length=8,
                           opcode=TransferOpcode.Read, notify=TransferNotify("req-1", "read")) == 0
    bufs, peers, lens = _stride_lists(local, target.buffer, n=4)
    assert e.batch_transfer_sync(target.segment, bufs, peers, lens, TransferOpcode.Write,
                                 TransferNotify("req-2", "batch")) == 0
    # Without notify nothing is delivered.
    assert e.transfer_sync(target.segment, local, target.buffer, 8, TransferOpcode.Write) == 0
    assert target.notifies() == [("req-1", "layer-0 done"), ("req-1", "read"),
                                 ("req-2", "batch")]
    assert target.notifies() == []


def test_peer_killed_mid_batch(initiator, target):
    """SIGKILL a target while a large batch is in flight: the batch reports failure within
    MC_TRANSFER_TIMEOUT, and the initiator keeps working with another target."""
    e, local = initiator
    victim = Target()
    try:
        n = 2000  # 2000 x 4 MiB = 8 GiB: far longer than the kill takes to land
        chunk = 4 * MIB
        bufs = [local + (i % 8) * chunk for i in range(n)]
        peers = [victim.buffer + (i % 16) * chunk for i in range(n)]
        marker = os.urandom(16)  # the first bytes of chunk 0, to see the batch moving
        ctypes.memmove(local, marker, len(marker))
        bid = e.batch_transfer_async_write(victim.segment, bufs, peers, [chunk] * n)
        assert bid != 0
        wait_until(lambda: victim.peek(victim.buffer, len(marker)) == marker, 30,
                   "the batch's first bytes at the victim")
        t0 = time.monotonic()
        victim.kill()
        status = _poll(e, bid, timeout=TRANSFER_TIMEOUT_S + 10)
        elapsed = time.monotonic() - t0
        assert status in (-1, -2), f"expected failure, got {status}"
        assert elapsed <= TRANSFER_TIMEOUT_S + 1.0, f"failure reported after {elapsed:.1f} s"
        if status == -2:  # timed out: it must still settle as a failure
            assert _poll(e, bid, timeout=TRANSFER_TIMEOUT_S + 10) == -1
        # Further transfers to the dead peer fail promptly; async submission gives 0 or a
        # batch that fails.
        t0 = time.monotonic()
        assert e.transfer_sync_write(victim.segment, local, victim.buffer, 16) < 0
        assert time.monotonic() - t0 <= TRANSFER_TIMEOUT_S + 1.0
    finally:
        victim.kill()
    # The initiator is still usable with the other target.
    data = os.urandom(MIB)
    assert e.write_bytes_to_buffer(local, data, len(data)) == 0
    assert e.transfer_sync_write(target.segment, local, target.buffer, len(data)) == 0
    assert e.transfer_sync_read(target.segment, local + 2 * MIB, target.buffer, len(data)) == 0
    assert e.read_bytes_from_buffer(local + 2 * MIB, len(data)) == data
    bid = e.transfer_submit_write(target.segment, local, target.buffer, 4096)
    assert bid != 0 and _poll(e, bid) == 1


def test_wrong_argument_types_raise_type_error(initiator, target):
    e, local = initiator
    calls = [
        lambda: e.transfer_sync_write(123, local, target.buffer, 16),
        lambda: e.transfer_sync_write(target.segment, "local", target.buffer, 16),
        lambda: e.transfer_sync_read(target.segment, local, None, 16),
        lambda: e.transfer_sync(target.segment, local, target.buffer, 16, 1),
        lambda: e.transfer_sync(target.segment, local, target.buffer, 16, TransferOpcode.Write,
                                "not a notify"),
        lambda: e.batch_transfer_sync_write(target.segment, "abc", [1], [1]),
        lambda: e.batch_transfer_async_write(target.segment, [local], ["x"], [1]),
        lambda: e.transfer_check_status("1"),
        lambda: e.get_batch_transfer_status(1),
        lambda: e.write_bytes_to_buffer(local, 12345, 4),
        lambda: e.read_bytes_from_buffer("x", 4),
        lambda: e.register_memory("x", 4),
        lambda: e.allocate_managed_buffer("big"),
        lambda: e.initialize(1, 2, 3, 4),
        # Positional-only parameters refuse keywords; others refuse unknown keywords.
        lambda: e.transfer_check_status(batch_id=1),
        lambda: e.unregister_memory(buffer_addr=local),
        lambda: e.transfer_sync_write(target_hostname=target.segment, buf=local,
                                      peer_buffer_address=target.buffer, length=1),
    ]
    for i, call in enumerate(calls):
        with pytest.raises(TypeError):
            call()
            pytest.fail(f"call {i} did not raise")


def test_keyword_names(initiator, target):
    e, local = initiator
    assert e.transfer_sync_write(target_hostname=target.segment, buffer=local,
                                 peer_buffer_address=target.buffer, length=16,
                                 transport_hint="") == 0
    assert e.transfer_sync_read(target.segment, local, target.buffer, 16, transport_hint="tcp") == 0
    bid = e.transfer_submit_write(target_hostname=target.segment, buffer=local,
                                  peer_buffer_address=target.buffer, length=16)
    assert _poll(e, bid) == 1
    bid = e.batch_transfer_async_read(target_hostname=target.segment, buffers=[local],
                                      peer_buffer_addresses=[target.buffer], lengths=[16])
    assert e.get_batch_transfer_status([bid]) == 0
