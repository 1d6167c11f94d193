"""`mooncake.shared_segment`: layout (the same offsets upstream's module computes), one-rank
use, and two ranks over gloo sharing the owner's pages."""

import os
import subprocess
import sys
import textwrap

import pytest

torch = pytest.importorskip("torch")

from mooncake.shared_segment import (  # noqa: E402
    SharedSegmentError,
    create_shared_segment,
    shared_segment_supported,
)

from conftest import free_port  # noqa: E402

BLOCKS = {
    "v": dict(count=2, shape=(3, 5), dtype=torch.bfloat16),
    "k": dict(count=3, shape=(1000, 3), dtype=torch.float32),
}


def test_layout_and_single_rank():
    assert shared_segment_supported()
    assert not shared_segment_supported(mmap=False)
    seg = create_shared_segment("t1", BLOCKS, world_size=1, rank_id=0)
    # Blocks sorted by name, each rounded up to 4 KiB: k = 12000 -> 12288, v = 30 -> 4096.
    assert seg.total_size() == (12288 + 4096) * 3
    ks, vs = seg.tensors("k"), seg.tensors("v")
    assert len(ks) == 3 and len(vs) == 2
    assert ks[1].data_ptr() - seg.base_addr() == 16384
    assert vs[1].data_ptr() - seg.base_addr() == 16384 + 12288
    assert vs[0].dtype == torch.bfloat16 and tuple(vs[0].shape) == (3, 5)
    ks[2].fill_(7.0)
    assert float(seg.tensors("k")[2].sum()) == 7.0 * 3000
    with pytest.raises(SharedSegmentError):
        seg.tensors("nope")
    # No file is left behind in /dev/shm.
    assert not [f for f in os.listdir("/dev/shm") if f.startswith(f"mooncake_seg_{os.getpid()}_")]


@pytest.mark.parametrize("bad, match", [
    ({"x": dict(count=0, shape=(1,), dtype=torch.uint8)}, "positive count"),
    ({"x": dict(count=1, shape=(), dtype=torch.uint8)}, "positive shape"),
    ({"x": dict(count=1)}, "count, shape and dtype"),
    ({}, "at least one block"),
])
def test_bad_declarations(bad, match):
    with pytest.raises(SharedSegmentError, match=match):
        create_shared_segment("bad", bad, world_size=1, rank_id=0)


def test_unsupported_backings_are_refused():
    with pytest.raises(SharedSegmentError, match="VMM"):
        create_shared_segment("x", BLOCKS, 1, 0, mmap=False)
    with pytest.raises(SharedSegmentError, match="HostRegister"):
        create_shared_segment("x", BLOCKS, 1, 0, host_register=True)
    with pytest.raises(SharedSegmentError, match="comm_group is required"):
        create_shared_segment("x", BLOCKS, 2, 0)


WORKER = textwrap.dedent("""
    import os, sys, torch, torch.distributed as dist
    from mooncake.shared_segment import create_shared_segment, SharedSegmentError
    rank, port, mode = int(sys.argv[1]), sys.argv[2], sys.argv[3]
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=2)
    blocks = {"k": dict(count=2, shape=(4,), dtype=torch.int32)}
    if mode == "mismatch" and rank == 1:
        blocks = {"k": dict(count=3, shape=(4,), dtype=torch.int32)}
    try:
        seg = create_shared_segment("kv", blocks, 2, rank, owner_rank=1, comm_group=dist.group.WORLD)
    except SharedSegmentError as e:
        print("ERR", "different layouts" in str(e), flush=True)
        # os._exit: a normal exit tears Gloo's threads down while the peer may be closing
        # its side too, which aborts now and then ("terminate called without an active
        # exception"); the answer is already printed.
        os._exit(0)
    k = seg.tensors("k")
    if rank == 1:
        k[1].copy_(torch.tensor([1, 2, 3, 4], dtype=torch.int32))
    dist.barrier()
    print("SEEN", k[1].tolist(), flush=True)
    dist.barrier()
    os._exit(0)
""")


@pytest.mark.parametrize("mode", ["share", "mismatch"])
def test_two_ranks_share_the_owners_pages(tmp_path, mode):
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    port = str(free_port())
    procs = [subprocess.Popen([sys.executable, str(script), str(r), port, mode],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for r in range(2)]
    outs = [p.communicate(timeout=120) for p in procs]
    for p, (out, err) in zip(procs, outs):
        assert p.returncode == 0, err[-2000:]
        if mode == "share":
            assert "SEEN [1, 2, 3, 4]" in out
        else:
            assert "ERR True" in out
