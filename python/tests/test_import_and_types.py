"""Import surface, value classes, and the tensor header format checked byte by byte against a
hand-built `struct.pack` of upstream's C struct (no torch needed)."""

import struct
import subprocess
import sys
import textwrap

import pytest

import mooncake.store as ms
from mooncake.store import (
    MooncakeDistributedStore,
    ObjectDataType,
    ReplicaStatus,
    ReplicateConfig,
    SoftPinAction,
)


def test_imports_without_torch_or_numpy():
    code = textwrap.dedent(
        """
        import sys
        class Block:
            def find_spec(self, name, path=None, target=None):
                if name.split(".")[0] in ("torch", "numpy"):
                    raise ImportError("blocked " + name)
        sys.meta_path.insert(0, Block())
        from mooncake.store import MooncakeDistributedStore, ReplicateConfig
        s = MooncakeDistributedStore()
        assert s.get("k") == b""
        assert "torch" not in sys.modules and "numpy" not in sys.modules
        print("ok")
        """
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.stdout.strip() == "ok", out.stderr


def test_module_surface():
    for name in ("MooncakeDistributedStore", "ReplicateConfig", "ReplicaDescriptor",
                 "MemoryDescriptor", "Descriptor", "BufferHandle", "ObjectDataType",
                 "ReplicaStatus", "SoftPinAction", "_tensor_metadata_size",
                 "_serialize_tensor", "_deserialize_tensor"):
        assert hasattr(ms, name), name
    assert ms._tensor_metadata_size() == 304
    assert ms.KVCACHE == ObjectDataType.KVCACHE and int(ms.GENERAL) == 9
    assert ms.COMPLETE == ReplicaStatus.COMPLETE and int(ms.FAILED) == 5
    assert [int(x) for x in (SoftPinAction.PRESERVE, SoftPinAction.ENABLE,
                             SoftPinAction.DISABLE)] == [0, 1, 2]
    assert ObjectDataType.OPTIMIZER_STATE.name == "OPTIMIZER_STATE"
    assert ObjectDataType.TENSOR.value == 2
    import mooncake
    assert mooncake.__path__  # pkgutil.extend_path namespace


def test_replicate_config_defaults_and_str():
    c = ReplicateConfig()
    assert (c.replica_num, c.nof_replica_num, c.dfs_replica_num) == (1, 0, 0)
    assert c.with_soft_pin is False and c.soft_pin_action == SoftPinAction.PRESERVE
    assert c.soft_pin_ttl_ms is None and c.with_hard_pin is False
    assert c.preferred_segments == [] and c.preferred_segment == ""
    assert c.preferred_nof_segments == [] and c.prefer_alloc_in_same_node is False
    assert c.data_type == ObjectDataType.UNKNOWN and c.group_ids is None
    assert str(c) == (
        "ReplicateConfig: { replica_num: 1, nof_replica_num: 0, dfs_replica_num: 0, "
        "soft_pin_action: PRESERVE, soft_pin_ttl_ms: default, with_hard_pin: 0, "
        "preferred_segments: [], preferred_nof_segments: [], prefer_alloc_in_same_node: 0, "
        "data_type: UNKNOWN }"
    )
    c.replica_num = 3
    c.with_soft_pin = True
    c.soft_pin_ttl_ms = 250
    c.with_hard_pin = True
    c.preferred_segments = ["a:1", "b:2"]
    c.preferred_segment = "node1:12345"
    c.prefer_alloc_in_same_node = True
    c.data_type = ObjectDataType.KVCACHE
    c.group_ids = ["g"]
    assert c.soft_pin_action == SoftPinAction.ENABLE and c.with_soft_pin
    assert str(c) == (
        "ReplicateConfig: { replica_num: 3, nof_replica_num: 0, dfs_replica_num: 0, "
        "soft_pin_action: ENABLE, soft_pin_ttl_ms: 250, with_hard_pin: 1, "
        "preferred_segments: [a:1, b:2], preferred_segment (deprecated): node1:12345, "
        "preferred_nof_segments: [], prefer_alloc_in_same_node: 1, data_type: KVCACHE, "
        "group_ids: [g] }"
    )
    c.group_ids = None
    assert c.group_ids is None


@pytest.mark.parametrize("bad", [-1, 2**64, "5", 1.5])
def test_soft_pin_ttl_type_errors(bad):
    c = ReplicateConfig()
    with pytest.raises(TypeError):
        c.soft_pin_ttl_ms = bad
    c.soft_pin_ttl_ms = 2**64 - 1
    assert c.soft_pin_ttl_ms == 2**64 - 1


def test_store_class_is_subclassable_and_has_the_methods():
    names = """setup init_all close health_check get_hostname put get put_batch get_batch
    put_parts upsert upsert_parts upsert_batch get_size is_exist batch_is_exist remove
    remove_by_regex remove_all batch_remove get_buffer batch_get_buffer get_replica_desc
    batch_get_replica_desc register_buffer unregister_buffer put_from get_into batch_put_from
    batch_get_into upsert_from batch_upsert_from put_from_with_metadata get_into_ranges
    batch_put_from_multi_buffers batch_get_into_multi_buffers alloc_from_mem_pool put_tensor
    get_tensor batch_put_tensor batch_get_tensor pub_tensor batch_pub_tensor upsert_tensor
    batch_upsert_tensor upsert_pub_tensor batch_upsert_pub_tensor put_tensor_with_tp
    get_tensor_with_tp batch_put_tensor_with_tp batch_get_tensor_with_tp pub_tensor_with_tp
    batch_pub_tensor_with_tp get_tensor_into batch_get_tensor_into put_tensor_from
    batch_put_tensor_from upsert_tensor_from batch_upsert_tensor_from""".split()
    missing = [n for n in names if not callable(getattr(MooncakeDistributedStore, n, None))]
    assert missing == []


def hand_header(dtype, shape, layout=0, global_shape=None, axes=()):
    n = 1
    for d in shape:
        n *= d
    elem = {0: 4, 1: 8, 4: 2, 12: 2, 13: 1}[dtype]
    b = struct.pack("<IHHiiIIQQ", 0x4D4F4F4E, 1, 304, dtype, len(shape), layout, 0, 304,
                    n * elem)
    for s in (global_shape or shape, shape):
        b += struct.pack("<8q", *(list(s) + [-1] * (8 - len(s))))
    b += struct.pack("<II", len(axes), 0)
    for a in axes:
        b += struct.pack("<6iq", *a)
    b += bytes(32 * (4 - len(axes)))
    assert len(b) == 304
    return b


def test_tensor_header_matches_a_hand_built_struct():
    assert ms._encode_tensor_header(0, [2, 3]) == hand_header(0, [2, 3])
    assert ms._encode_tensor_header(12, [2, 0, 3]) == hand_header(12, [2, 0, 3])
    assert ms._encode_tensor_header(1, []) == hand_header(1, [])
    shard = ms._encode_tensor_header(13, [4, 3], [4, 6], [(1, 0, 1, 2, 1, 0, 3)])
    assert shard == hand_header(13, [4, 3], 1, [4, 6], [(1, 0, 1, 2, 1, 0, 3)])
    assert shard[:4] == b"NOOM"
    parsed = ms._decode_tensor_header(hand_header(4, [5]) + bytes(10))
    assert parsed == (4, 0, [5], [5], [], 304, 10)
    with pytest.raises(ValueError):
        ms._decode_tensor_header(hand_header(4, [5]) + bytes(9))
    with pytest.raises(ValueError):
        ms._decode_tensor_header(b"\0" * 304)
    with pytest.raises(ValueError):
        ms._encode_tensor_header(99, [1])
