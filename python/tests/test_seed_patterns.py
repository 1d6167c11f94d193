"""The "Common Patterns" 1-3 of the seed skill (shared/seed/mooncake-python-api-skill.md),
run as written against a local cluster; only the addresses are the test master's, and
Pattern 2 uses protocol "tcp" (no RDMA here)."""

import pytest

from mooncake.store import MooncakeDistributedStore, ReplicateConfig


def test_pattern_1_simple_kv_store(master):
    store = MooncakeDistributedStore()
    store.setup("localhost", master.metadata,
                512*1024*1024, 128*1024*1024, "tcp", "", master.addr)

    # Store and retrieve
    store.put("config", b'{"model": "llama-7b"}')
    config = store.get("config")

    store.close()
    assert config == b'{"model": "llama-7b"}'


def test_pattern_2_tensor_storage(master, store):
    torch = pytest.importorskip("torch")
    # `store` (the module fixture) is a second client so that replica_num=2 can be honoured.
    assert store.get_hostname()

    store2 = MooncakeDistributedStore()
    store2.setup("localhost", master.metadata,
                 512*1024*1024, 128*1024*1024, "tcp", "", master.addr)

    # Configure replication
    config = ReplicateConfig()
    config.replica_num = 2
    config.with_soft_pin = True

    # Store tensor with replication
    tensor = torch.randn(1000, 1000)
    rc = store2.put_tensor("weights", tensor, config)

    # Retrieve
    retrieved = store2.get_tensor("weights")

    store2.close()
    assert rc == 0
    assert torch.equal(retrieved, tensor)


def test_seed_tensor_and_replication_snippets(master, store):
    """The seed's "PyTorch Tensor Operations" and "Replication Configuration" snippets."""
    torch = pytest.importorskip("torch")
    # Simple tensor operations
    tensor = torch.randn(100, 100)
    assert store.put_tensor("my_tensor", tensor) == 0
    retrieved = store.get_tensor("my_tensor")
    assert torch.equal(retrieved, tensor)

    # Batch tensor operations
    tensors = [torch.randn(100, 100) for _ in range(3)]
    assert store.batch_put_tensor(["t1", "t2", "t3"], tensors) == [0, 0, 0]
    retrieved_tensors = store.batch_get_tensor(["t1", "t2", "t3"])
    assert all(torch.equal(a, b) for a, b in zip(retrieved_tensors, tensors))

    # Tensor Parallelism (TP) support
    assert store.put_tensor_with_tp("model_weights", tensor, tp_rank=0, tp_size=4,
                                    split_dim=0) == 0
    shard = store.get_tensor_with_tp("model_weights", tp_rank=0, tp_size=4)
    assert torch.equal(shard, tensor[:25])

    config = ReplicateConfig()
    config.replica_num = 3              # Number of replicas
    config.with_soft_pin = True         # Keep in memory longer
    config.preferred_segment = store.get_hostname()  # Preferred location
    assert store.put("key_repl", b"value", config) == 0
    assert store.get("key_repl") == b"value"


def test_pattern_3_zero_copy_batch(master):
    np = pytest.importorskip("numpy")
    store = MooncakeDistributedStore()
    store.setup("localhost", master.metadata,
                512*1024*1024, 16*1024*1024, "tcp", "", master.addr)

    # Prepare buffers
    num_buffers = 10
    buffers = [np.random.randn(1024*1024).astype(np.float32) for _ in range(num_buffers)]
    buffer_ptrs = [buf.ctypes.data for buf in buffers]
    sizes = [buf.nbytes for buf in buffers]

    # Register all buffers
    for ptr, size in zip(buffer_ptrs, sizes):
        store.register_buffer(ptr, size)

    # Batch put
    keys = [f"tensor_{i}" for i in range(num_buffers)]
    put_results = store.batch_put_from(keys, buffer_ptrs, sizes)

    # Batch get
    recv_buffers = [np.empty(1024*1024, dtype=np.float32) for _ in range(num_buffers)]
    recv_ptrs = [buf.ctypes.data for buf in recv_buffers]

    for ptr, size in zip(recv_ptrs, sizes):
        store.register_buffer(ptr, size)

    results = store.batch_get_into(keys, recv_ptrs, sizes)

    # Cleanup
    for ptr in buffer_ptrs + recv_ptrs:
        store.unregister_buffer(ptr)

    store.close()
    assert put_results == [0] * num_buffers
    assert results == sizes
    for a, b in zip(buffers, recv_buffers):
        assert np.array_equal(a, b)


def test_seed_zero_copy_and_common_operations(master):
    """The seed's "Common Operations" and "Zero-Copy Operations" snippets."""
    np = pytest.importorskip("numpy")
    store = MooncakeDistributedStore()
    assert store.setup("localhost", master.metadata, 512*1024*1024, 128*1024*1024, "tcp", "",
                       master.addr) == 0
    store.put("key", b"value")
    assert store.get("key") == b"value"
    assert store.put_batch(["key1", "key2"], [b"val1", b"val2"]) == 0
    assert store.get_batch(["key1", "key2"]) == [b"val1", b"val2"]
    assert store.is_exist("key") == 1

    buffer = np.zeros(100*1024*1024, dtype=np.uint8)
    buffer[:5] = [1, 2, 3, 4, 5]
    buffer_ptr = buffer.ctypes.data
    assert store.register_buffer(buffer_ptr, buffer.nbytes) == 0
    assert store.put_from("zc_key", buffer_ptr, buffer.nbytes) == 0
    recv_buffer = np.empty(100*1024*1024, dtype=np.uint8)
    recv_ptr = recv_buffer.ctypes.data
    assert store.register_buffer(recv_ptr, recv_buffer.nbytes) == 0
    assert store.get_into("zc_key", recv_ptr, recv_buffer.nbytes) == buffer.nbytes
    assert np.array_equal(buffer, recv_buffer)
    assert store.unregister_buffer(buffer_ptr) == 0
    assert store.unregister_buffer(recv_ptr) == 0

    store.remove("key", force=True)
    assert store.remove_by_regex("^key") >= 0
    assert store.remove_all() >= 0
    store.close()
