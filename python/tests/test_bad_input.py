"""Bad input through the installed package against a real master: wrong types, negative and
huge sizes, empty and 1 MiB keys, mismatched batch lengths, unregistered and freed addresses,
calls before `setup` and after `close`, and the same for `mooncake.engine.TransferEngine`.

Each row names a call and the documented result (docs/reliability.md, "Bad input"). A group of
rows runs in a child process, so a crash (segfault, abort) fails that group with its exit code
instead of killing pytest; the child reports each row's outcome as JSON on its last line.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

MIB = 1024 * 1024
INVALID = -600  # INVALID_PARAMS
NOT_FOUND = -704  # OBJECT_NOT_FOUND
HERE = Path(__file__).resolve().parent


# ---- expectations ------------------------------------------------------------------------


def eq(value):
    return ("eq", value)


def raises(*names):
    return ("raises", list(names))


NEGATIVE = ("negative", None)


def check(expect, outcome):
    """None when `outcome` ({'value': repr-able} or {'raised': name}) meets `expect`."""
    kind, want = expect
    if kind == "raises":
        if outcome.get("raised") in want:
            return None
    elif "raised" in outcome:
        pass
    elif kind == "eq" and outcome["value"] == want:
        return None
    elif kind == "negative" and isinstance(outcome["value"], int) and outcome["value"] < 0:
        return None
    return f"expected {kind} {want!r}, got {outcome!r}"


# ---- the tables (evaluated in the child) ---------------------------------------------------


def store_rows(s, buf_addr):
    """Rows for a store `s` that is set up; `buf_addr` is 4096 bytes of this process."""
    big_key = "k" * MIB
    return [
        # wrong types: refused by the binding before anything runs
        ("put(None, b'x')", lambda: s.put(None, b"x"), raises("TypeError")),
        ("put(1, b'x')", lambda: s.put(1, b"x"), raises("TypeError")),
        ("put(b'k', b'x')", lambda: s.put(b"k", b"x"), raises("TypeError")),
        ("put('k', None)", lambda: s.put("k", None), raises("TypeError")),
        ("put('k', 1)", lambda: s.put("k", 1), raises("TypeError")),
        ("put('k', 1.5)", lambda: s.put("k", 1.5), raises("TypeError")),
        ("put('k', 'str')", lambda: s.put("k", "abc"), raises("TypeError")),
        ("put('k', [1])", lambda: s.put("k", [1]), raises("TypeError")),
        ("get(None)", lambda: s.get(None), raises("TypeError")),
        ("get(1.5)", lambda: s.get(1.5), raises("TypeError")),
        ("get_batch(None)", lambda: s.get_batch(None), raises("TypeError")),
        ("get_batch([None])", lambda: s.get_batch([None]), raises("TypeError")),
        ("is_exist([])", lambda: s.is_exist([]), raises("TypeError")),
        ("register_buffer(1.5, 10)", lambda: s.register_buffer(1.5, 10), raises("TypeError")),
        ("register_buffer('a', 10)", lambda: s.register_buffer("a", 10), raises("TypeError")),
        ("get_into('k', None, 1)", lambda: s.get_into("k", None, 1), raises("TypeError")),
        # negative and huge sizes and pointers
        ("register_buffer(-1, 10)", lambda: s.register_buffer(-1, 10), raises("OverflowError")),
        ("register_buffer(2**64, 10)", lambda: s.register_buffer(2**64, 10),
         raises("OverflowError")),
        ("register_buffer(buf, 2**63)", lambda: s.register_buffer(buf_addr, 2**63), eq(INVALID)),
        ("register_buffer(4096, 4096) unmapped", lambda: s.register_buffer(4096, 4096),
         eq(INVALID)),
        ("register_buffer(0, 0)", lambda: s.register_buffer(0, 0), eq(INVALID)),
        ("get_into('k', -1, 10)", lambda: s.get_into("k", -1, 10), raises("OverflowError")),
        ("get_into('k', buf, 2**64)", lambda: s.get_into("k", buf_addr, 2**64),
         raises("OverflowError")),
        ("get_into('k', buf, 2**64-1)", lambda: s.get_into("k", buf_addr, 2**64 - 1), NEGATIVE),
        ("put_from('k', 0x1000, 10) unregistered", lambda: s.put_from("bi_k", 0x1000, 10),
         eq(INVALID)),
        ("put_from('k', buf, 2**63)", lambda: s.put_from("bi_k", buf_addr, 2**63), eq(INVALID)),
        ("put_from('k', buf, -1)", lambda: s.put_from("bi_k", buf_addr, -1),
         raises("OverflowError")),
        ("alloc_from_mem_pool(-1)", lambda: s.alloc_from_mem_pool(-1), raises("OverflowError")),
        ("alloc_from_mem_pool(2**64)", lambda: s.alloc_from_mem_pool(2**64),
         raises("OverflowError")),
        ("alloc_from_mem_pool(2**63)", lambda: s.alloc_from_mem_pool(2**63), eq(0)),
        ("put of 64 MiB > local buffer", lambda: s.put("bi_big", bytes(64 * MIB)), eq(INVALID)),
        # empty keys
        ("put('', b'x')", lambda: s.put("", b"x"), eq(INVALID)),
        ("put('k', b'') empty value", lambda: s.put("bi_empty", b""), eq(INVALID)),
        ("get('')", lambda: s.get(""), eq(b"")),
        ("is_exist('')", lambda: s.is_exist(""), eq(0)),
        ("remove('')", lambda: s.remove(""), eq(NOT_FOUND)),
        # 1 MiB keys: refused with a clean code, never sent whole to the master's index
        ("put(1 MiB key)", lambda: s.put(big_key, b"x"), eq(INVALID)),
        ("get(1 MiB key)", lambda: s.get(big_key), eq(b"")),
        ("is_exist(1 MiB key)", lambda: s.is_exist(big_key), eq(0)),
        ("get_size(1 MiB key)", lambda: s.get_size(big_key), NEGATIVE),
        ("remove(1 MiB key)", lambda: s.remove(big_key), NEGATIVE),
        ("put_batch([1 MiB key])", lambda: s.put_batch([big_key], [b"x"]), eq(INVALID)),
        ("batch_is_exist([1 MiB key, 'a'])", lambda: s.batch_is_exist([big_key, "a"]),
         eq([0, 0])),
        # mismatched batch lengths
        ("put_batch(2 keys, 1 value)", lambda: s.put_batch(["a", "b"], [b"x"]), eq(INVALID)),
        ("batch_get_into(2 keys, 1 ptr, 2 sizes)",
         lambda: s.batch_get_into(["a", "b"], [buf_addr], [1, 2]), eq([INVALID, INVALID])),
        ("batch_put_from(2 keys, 1 ptr, 1 size)",
         lambda: s.batch_put_from(["a", "b"], [buf_addr], [1]), eq([INVALID, INVALID])),
        ("remove_by_regex('(')", lambda: s.remove_by_regex("("), eq(INVALID)),
    ]


def registered_rows(s, buf_addr):
    """Register, use, unregister, then use again: a range running past a registered buffer is
    refused; once unregistered, the still-mapped buffer is used like any mapped memory."""
    return [
        ("register_buffer(buf, 4096)", lambda: s.register_buffer(buf_addr, 4096), eq(0)),
        ("register_buffer(buf, 4096) again", lambda: s.register_buffer(buf_addr, 4096), eq(0)),
        ("put_from(buf, 100)", lambda: s.put_from("bi_reg", buf_addr, 100), eq(0)),
        ("put_from past the buffer end", lambda: s.put_from("bi_reg2", buf_addr, 8192),
         eq(INVALID)),
        ("get_into straddling the end", lambda: s.get_into("bi_reg", buf_addr + 4000, 200),
         eq(INVALID)),
        ("get_into(buf, 100)", lambda: s.get_into("bi_reg", buf_addr, 100), eq(100)),
        ("unregister_buffer(buf)", lambda: s.unregister_buffer(buf_addr), eq(0)),
        ("unregister_buffer(buf) again", lambda: s.unregister_buffer(buf_addr), eq(INVALID)),
        # Unregistered but still mapped: used, as upstream over TCP does (a wild or unmapped
        # address is still refused, see the rows of `store_rows`).
        ("get_into unregistered buffer", lambda: s.get_into("bi_reg", buf_addr, 100), eq(100)),
        ("batch_get_into unregistered buffer",
         lambda: s.batch_get_into(["bi_reg"], [buf_addr], [100]), eq([100])),
        ("put_from unregistered buffer", lambda: s.put_from("bi_reg3", buf_addr, 100), eq(0)),
        ("remove('bi_reg', force)", lambda: s.remove("bi_reg", True), eq(0)),
    ]


def unusable_rows(s, buf_addr):
    """Every method class on a store that is not set up (or was closed)."""
    return [
        ("put", lambda: s.put("k", b"x"), eq(INVALID)),
        ("put_batch", lambda: s.put_batch(["k"], [b"x"]), eq(INVALID)),
        ("get", lambda: s.get("k"), eq(b"")),
        ("get_batch", lambda: s.get_batch(["k"]), eq([b""])),
        ("get_buffer", lambda: s.get_buffer("k"), eq(None)),
        ("is_exist", lambda: s.is_exist("k"), eq(INVALID)),
        ("batch_is_exist", lambda: s.batch_is_exist(["k"]), eq([INVALID])),
        ("get_size", lambda: s.get_size("k"), eq(INVALID)),
        ("remove", lambda: s.remove("k"), eq(INVALID)),
        ("remove_all", lambda: s.remove_all(), eq(INVALID)),
        ("get_replica_desc", lambda: s.get_replica_desc("k"), eq([])),
        ("register_buffer", lambda: s.register_buffer(buf_addr, 4096), eq(INVALID)),
        ("unregister_buffer", lambda: s.unregister_buffer(buf_addr), eq(INVALID)),
        ("put_from", lambda: s.put_from("k", buf_addr, 1), eq(INVALID)),
        ("get_into", lambda: s.get_into("k", buf_addr, 1), eq(INVALID)),
        ("batch_get_into", lambda: s.batch_get_into(["k"], [buf_addr], [1]), eq([INVALID])),
        ("alloc_from_mem_pool", lambda: s.alloc_from_mem_pool(10), eq(0)),
        ("health_check", lambda: s.health_check(), eq(1)),
        ("close", lambda: s.close(), eq(0)),
    ]


def engine_rows_uninitialized(e, buf_addr):
    return [
        ("get_rpc_port", lambda: e.get_rpc_port(), eq(0)),
        ("register_memory", lambda: e.register_memory(buf_addr, 4096), eq(-1)),
        ("allocate_managed_buffer", lambda: e.allocate_managed_buffer(4096), eq(0)),
        ("transfer_sync_write", lambda: e.transfer_sync_write("127.0.0.1:1", buf_addr, 4096, 10),
         eq(-1)),
        ("get_first_buffer_address", lambda: e.get_first_buffer_address("x"), eq(0)),
    ]


def engine_rows(e, buf_addr):
    """Rows for an initialized engine with nothing registered yet."""
    return [
        ("initialize twice", lambda: e.initialize("127.0.0.1", "P2PHANDSHAKE", "tcp", ""),
         eq(-1)),
        ("register_memory(-1, 10)", lambda: e.register_memory(-1, 10), raises("OverflowError")),
        ("register_memory(0x10, 4096) unmapped", lambda: e.register_memory(0x10, 4096), eq(-1)),
        ("register_memory(buf, 2**63)", lambda: e.register_memory(buf_addr, 2**63), eq(-1)),
        ("register_memory(None, 1)", lambda: e.register_memory(None, 1), raises("TypeError")),
        ("register_memory(buf, 4096)", lambda: e.register_memory(buf_addr, 4096), eq(0)),
        ("transfer_sync_write to an unknown segment",
         lambda: e.transfer_sync_write("nosuch:1", buf_addr, 4096, 10), eq(-1)),
        ("transfer_sync_read from an unknown segment",
         lambda: e.transfer_sync_read("nosuch:1", buf_addr, 4096, 10), eq(-1)),
        ("get_first_buffer_address of an unknown segment",
         lambda: e.get_first_buffer_address("nosuch:1"), eq(0)),
        ("transfer_sync_write(len 2**64)",
         lambda: e.transfer_sync_write("nosuch:1", buf_addr, buf_addr, 2**64),
         raises("OverflowError")),
        ("transfer_sync_write(len 2**63)",
         lambda: e.transfer_sync_write("nosuch:1", buf_addr, buf_addr, 2**63), eq(-1)),
        ("transfer_sync_write(None target)",
         lambda: e.transfer_sync_write(None, buf_addr, buf_addr, 1), raises("TypeError")),
        ("batch_transfer_sync_write mismatched lengths",
         lambda: e.batch_transfer_sync_write("nosuch:1", [buf_addr], [buf_addr, buf_addr], [1]),
         eq(-1)),
        ("write_bytes_to_buffer(unregistered)", lambda: e.write_bytes_to_buffer(0x1000, b"abc", 3),
         eq(-1)),
        ("write_bytes_to_buffer(length > src)", lambda: e.write_bytes_to_buffer(buf_addr, b"a", 10),
         eq(-1)),
        ("read_bytes_from_buffer(unregistered)", lambda: e.read_bytes_from_buffer(0x1000, 3),
         eq(-1)),
        ("read_bytes_from_buffer(len -1)", lambda: e.read_bytes_from_buffer(buf_addr, -1),
         raises("OverflowError")),
        ("read_bytes_from_buffer(len 2**62)", lambda: e.read_bytes_from_buffer(buf_addr, 2**62),
         raises("MemoryError", "OverflowError")),
        ("free_managed_buffer(unknown)", lambda: e.free_managed_buffer(0x1000, 10), NEGATIVE),
        ("transfer_check_status(bogus id)", lambda: e.transfer_check_status(12345), NEGATIVE),
        ("unregister_memory(buf)", lambda: e.unregister_memory(buf_addr), eq(0)),
        ("unregister_memory(buf) again", lambda: e.unregister_memory(buf_addr), NEGATIVE),
        ("read_bytes_from_buffer(freed)", lambda: e.read_bytes_from_buffer(buf_addr, 3), eq(-1)),
    ]


# ---- the child -------------------------------------------------------------------------------


def run_group(group, master_addr, metadata):
    """Runs one group in this (child) process and prints its outcomes as a JSON line."""
    import ctypes

    from mooncake.engine import TransferEngine
    from mooncake.store import MooncakeDistributedStore

    buf = ctypes.create_string_buffer(4096)
    buf_addr = ctypes.addressof(buf)

    def setup():
        s = MooncakeDistributedStore()
        rc = s.setup("localhost", metadata, 64 * MIB, 32 * MIB, "tcp", "", master_addr)
        assert rc == 0, f"setup failed: {rc}"
        return s

    if group == "store_types_sizes_keys_batches":
        s = setup()
        rows = store_rows(s, buf_addr)
    elif group == "store_registered_then_freed":
        s = setup()
        rows = registered_rows(s, buf_addr)
    elif group == "store_before_setup":
        rows = unusable_rows(MooncakeDistributedStore(), buf_addr)
    elif group == "store_after_close":
        s = setup()
        assert s.close() == 0
        rows = unusable_rows(s, buf_addr) + [
            ("setup again after close is refused or succeeds cleanly",
             lambda: s.setup("localhost", metadata, 64 * MIB, 32 * MIB, "tcp", "", master_addr)
             in (0, INVALID), eq(True)),
            ("close again", lambda: s.close(), eq(0)),
        ]
    elif group == "store_setup_twice":
        s = setup()
        rows = [
            ("setup twice", lambda: s.setup("localhost", metadata, 64 * MIB, 32 * MIB, "tcp", "",
                                            master_addr), eq(INVALID)),
            ("still usable: put", lambda: s.put("bi_twice", b"x"), eq(0)),
            ("still usable: remove", lambda: s.remove("bi_twice", True), eq(0)),
        ]
    elif group == "engine_before_initialize":
        rows = engine_rows_uninitialized(TransferEngine(), buf_addr)
    elif group == "engine_bad_initialize":
        rows = [
            ("initialize(None, ...)",
             lambda: TransferEngine().initialize(None, metadata, "tcp", ""), raises("TypeError")),
            ("initialize against a dead metadata server",
             lambda: TransferEngine().initialize("127.0.0.1", "http://127.0.0.1:1/metadata",
                                                 "tcp", ""), eq(-1)),
        ]
    elif group == "engine_initialized":
        e = TransferEngine()
        assert e.initialize("127.0.0.1", "P2PHANDSHAKE", "tcp", "") == 0
        rows = engine_rows(e, buf_addr)
    else:
        raise SystemExit(f"unknown group {group}")

    results = []
    for name, call, expect in rows:
        try:
            outcome = {"value": call()}
        except Exception as e:  # noqa: BLE001 (the row states which exception is expected)
            outcome = {"raised": type(e).__name__, "message": str(e)[:200]}
        error = check(expect, outcome)
        if "value" in outcome and not isinstance(outcome["value"], (int, list, type(None))):
            outcome["value"] = repr(outcome["value"])[:200]
        results.append({"row": name, "outcome": outcome, "error": error})
    sys.stdout.flush()
    print("RESULTS " + json.dumps(results, default=repr), flush=True)


GROUPS = [
    "store_types_sizes_keys_batches",
    "store_registered_then_freed",
    "store_before_setup",
    "store_after_close",
    "store_setup_twice",
    "engine_before_initialize",
    "engine_bad_initialize",
    "engine_initialized",
]


@pytest.mark.parametrize("group", GROUPS)
def test_bad_input_group(master, group):
    env = dict(os.environ, MC_LOG_LEVEL="3", PYTHONPATH=str(HERE))
    proc = subprocess.run(
        [sys.executable, "-c",
         "import sys, test_bad_input as t; t.run_group(*sys.argv[1:])",
         group, master.addr, master.metadata],
        env=env, capture_output=True, text=True, timeout=120,
    )
    assert proc.returncode == 0, (
        f"group {group} died with exit code {proc.returncode}\n"
        f"stdout tail: {proc.stdout[-2000:]}\nstderr tail: {proc.stderr[-2000:]}"
    )
    line = next(l for l in reversed(proc.stdout.splitlines()) if l.startswith("RESULTS "))
    results = json.loads(line[len("RESULTS "):])
    assert results, "no rows ran"
    failures = [f"{r['row']}: {r['error']}" for r in results if r["error"]]
    assert not failures, "\n".join(failures)
