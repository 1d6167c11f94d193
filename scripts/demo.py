"""A short tour of mooncake.store against a local cluster (see scripts/demo.sh).

Written against the upstream API exactly as users write it: the same calls run against the
original Mooncake.
"""
import argparse
import ctypes

from mooncake.store import MooncakeDistributedStore, ReplicateConfig


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--master", default="127.0.0.1:50051")
    ap.add_argument("--metadata", default="http://127.0.0.1:8080/metadata")
    args = ap.parse_args()

    store = MooncakeDistributedStore()
    # This client contributes no memory of its own (global_segment_size=0): the bytes go to the
    # storage node started by demo.sh.
    rc = store.setup("127.0.0.1", args.metadata, 0, 64 * 1024 * 1024, "tcp", "", args.master)
    assert rc == 0, f"setup failed: {rc}"
    print(f"client {store.get_hostname()} connected to master {args.master}")

    # Pattern 1: a simple KV store.
    assert store.put("config", b'{"model": "llama-7b"}') == 0
    print("get('config') ->", store.get("config"))
    print("second put of 'config' ->", store.put("config", b"other"), "(first writer wins)")
    print("upsert('config') ->", store.upsert("config", b'{"model": "llama-70b"}'))
    print("get('config') ->", store.get("config"))

    # Batches.
    keys = [f"kv-block-{i}" for i in range(8)]
    values = [bytes([i]) * 4096 for i in range(8)]
    print("put_batch(8 x 4 KiB) ->", store.put_batch(keys, values))
    got = store.get_batch(keys)
    print("get_batch ok:", got == values)
    print("batch_is_exist ->", store.batch_is_exist(keys[:3] + ["missing"]))
    print("get('missing') ->", store.get("missing"))

    # Zero copy: register caller memory, put from it and get into it.
    src = (ctypes.c_ubyte * (1 << 20)).from_buffer_copy(bytes(range(256)) * 4096)
    dst = (ctypes.c_ubyte * (1 << 20))()
    src_ptr, dst_ptr = ctypes.addressof(src), ctypes.addressof(dst)
    assert store.register_buffer(src_ptr, len(src)) == 0
    assert store.register_buffer(dst_ptr, len(dst)) == 0
    config = ReplicateConfig()
    config.replica_num = 1
    print("put_from(1 MiB) ->", store.put_from("zero-copy", src_ptr, len(src), config))
    print("get_into ->", store.get_into("zero-copy", dst_ptr, len(dst)), "bytes; equal:", bytes(src) == bytes(dst))
    print("get_into unregistered address ->", store.get_into("zero-copy", dst_ptr + (1 << 30), 16))
    store.unregister_buffer(src_ptr)
    store.unregister_buffer(dst_ptr)

    # A read grants a lease: remove is refused until it lapses; force skips the check.
    print("remove('config') while leased ->", store.remove("config"))
    print("remove_all(force=True) ->", store.remove_all(force=True), "objects")
    print("close ->", store.close())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
