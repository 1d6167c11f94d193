"""Addresses handed from Python to the store: memory from `alloc_from_mem_pool` is a
registered buffer (a call given more bytes than a block holds is refused, never written past
it into the heap); `MC_STORE_REQUIRE_REGISTERED=1` refuses any address that is not
registered; `close()` waits for calls in flight on other threads before it frees the pool.
Each case runs in a child process, so a crash fails the case with its exit code."""

import os
import subprocess
import sys
import textwrap

from conftest import MIB

PREAMBLE = textwrap.dedent(
    """
    import ctypes, sys, threading, time
    from mooncake.store import MooncakeDistributedStore
    metadata, master = sys.argv[1], sys.argv[2]
    s = MooncakeDistributedStore()
    assert s.setup("localhost", metadata, 64 << 20, 32 << 20, "tcp", "", master) == 0
    """
)


def run(master, body, **env):
    e = dict(os.environ)
    e.update(env)
    p = subprocess.run([sys.executable, "-c", PREAMBLE + textwrap.dedent(body),
                        master.metadata, master.addr],
                       capture_output=True, text=True, env=e, timeout=120)
    assert p.returncode == 0, f"exit {p.returncode}\n{p.stdout}\n{p.stderr}"
    return p.stdout.split()


def test_a_pool_block_cannot_be_overrun(master):
    out = run(master, """
        value = bytes(range(256)) * 16 * 64          # 256 KiB
        assert s.put("boundary/big", value) == 0
        block = s.alloc_from_mem_pool(4096)
        assert block != 0
        # The object is larger than the block: refused, and the block holds what it held.
        ctypes.memset(block, 0x5a, 4096)
        print(s.get_into("boundary/big", block, len(value)))
        print(ctypes.string_at(block, 4096) == b"\\x5a" * 4096)
        # Within the block it works.
        assert s.put("boundary/small", b"x" * 100) == 0
        print(s.get_into("boundary/small", block, 4096))
        s.close()
    """)
    assert int(out[0]) < 0, out
    assert out[1:] == ["True", "100"], out


def test_strict_mode_refuses_unregistered_memory(master):
    body = """
        assert s.put("boundary/strict", b"y" * 64) == 0
        plain = ctypes.create_string_buffer(4096)
        print(s.get_into("boundary/strict", ctypes.addressof(plain), 4096))
        reg = ctypes.create_string_buffer(4096)
        assert s.register_buffer(ctypes.addressof(reg), 4096) == 0
        print(s.get_into("boundary/strict", ctypes.addressof(reg), 4096))
        s.close()
    """
    strict = run(master, body, MC_STORE_REQUIRE_REGISTERED="1")
    assert int(strict[0]) < 0 and strict[1] == "64", strict
    relaxed = run(master, body)
    assert relaxed == ["64", "64"], relaxed


def test_close_waits_for_calls_in_flight(master):
    out = run(master, """
        value = b"z" * (8 << 20)
        assert s.put("boundary/inflight", value) == 0
        block = s.alloc_from_mem_pool(8 << 20)
        assert block != 0
        stop, done = threading.Event(), []
        def reader():
            while not stop.is_set():
                r = s.get_into("boundary/inflight", block, 8 << 20)
                if r < 0:
                    break
                done.append(r)
        threads = [threading.Thread(target=reader) for _ in range(3)]
        for t in threads:
            t.start()
        time.sleep(0.5)
        print(s.close())
        stop.set()
        for t in threads:
            t.join()
        print(len(done) > 0)
    """)
    assert out == ["0", "True"], out
