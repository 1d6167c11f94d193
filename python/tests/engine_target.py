"""A transfer-engine target process for the two-process tests (like upstream's
transfer_engine_target.py).

It initializes a `TransferEngine`, makes a buffer peers may read and write (a 64 MiB managed
buffer, or with `--buffer numpy` a registered `np.ones` array as in the seed's Pattern 4),
and a guarded region: three 4 KiB pages of 0xAB of which only the middle one is registered.
It prints one JSON line

    {"segment": ..., "buffer": addr, "buffer_len": n, "guarded": addr, "guarded_len": 4096,
     "guard_before": addr, "guard_after": addr, "guard_len": 4096}

and then answers commands on stdin, one JSON line each:

    peek <addr> <len>   the bytes there (any memory of this process), as hex
    notifies            the notifies received since the last call, as [[name, msg], ...]
    first               get_first_buffer_address(own segment)
    sockets             how many sockets this process has open (a same-host peer opens no
                        data connection, a TCP one does)
    unregister <addr>   unregister_memory(addr): its return code, once it has returned

When stdin closes it keeps serving until killed.
"""

import argparse
import ctypes
import json
import os
import sys
import time

from mooncake.engine import TransferEngine

GUARD = 4096
GUARD_BYTE = 0xAB


def count_sockets():
    n = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            n += os.readlink(f"/proc/self/fd/{fd}").startswith("socket:")
        except OSError:
            pass  # closed since the listing (the listing's own descriptor)
    return n


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--metadata", default="P2PHANDSHAKE")
    p.add_argument("--hostname", default="127.0.0.1")
    p.add_argument("--buffer", choices=["managed", "numpy"], default="managed")
    p.add_argument("--size", type=int, default=64 * 1024 * 1024)
    args = p.parse_args()

    engine = TransferEngine()
    rc = engine.initialize(args.hostname, args.metadata, "tcp", "")
    if rc != 0:
        print(json.dumps({"error": rc}), flush=True)
        return 1

    keep = []
    if args.buffer == "numpy":
        import numpy as np

        buffer = np.ones(args.size, dtype=np.uint8)
        keep.append(buffer)
        addr = buffer.ctypes.data
        rc = engine.register_memory(addr, buffer.nbytes)
    else:
        addr = engine.allocate_managed_buffer(args.size)
        rc = 0 if addr else -1
    if rc != 0:
        print(json.dumps({"error": rc}), flush=True)
        return 1

    guarded = ctypes.create_string_buffer(bytes([GUARD_BYTE]) * (3 * GUARD), 3 * GUARD)
    g0 = ctypes.addressof(guarded)
    rc = engine.register_memory(g0 + GUARD, GUARD)
    if rc != 0:
        print(json.dumps({"error": rc}), flush=True)
        return 1

    if args.metadata.strip().upper() == "P2PHANDSHAKE":
        segment = f"{args.hostname.split(':')[0]}:{engine.get_rpc_port()}"
    else:
        segment = args.hostname
    print(json.dumps({
        "segment": segment,
        "buffer": addr,
        "buffer_len": args.size,
        "guarded": g0 + GUARD,
        "guarded_len": GUARD,
        "guard_before": g0,
        "guard_after": g0 + 2 * GUARD,
        "guard_len": GUARD,
    }), flush=True)

    for line in sys.stdin:
        cmd = line.split()
        if not cmd:
            continue
        if cmd[0] == "peek":
            out = ctypes.string_at(int(cmd[1]), int(cmd[2])).hex()
        elif cmd[0] == "notifies":
            out = [[n.name, n.msg] for n in engine.get_notifies()]
        elif cmd[0] == "first":
            out = engine.get_first_buffer_address(segment)
        elif cmd[0] == "sockets":
            out = count_sockets()
        elif cmd[0] == "unregister":
            out = engine.unregister_memory(int(cmd[1]))
        else:
            out = {"error": f"unknown command {cmd[0]!r}"}
        print(json.dumps(out), flush=True)
    while True:
        time.sleep(3600)  # idle until the test kills it (stdin closed, it still serves)


if __name__ == "__main__":
    sys.exit(main())
