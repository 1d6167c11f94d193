"""Extra segments: `allocate_and_mount_segment` mounts more memory as one more segment of a
client (served, re-mounted after a master restart as the first one), `unmount_segment` /
`unmount_and_free_segment` take it away (the master drops the replicas held there), against
the real master."""

import subprocess
import time

import pytest

from conftest import MIB, console_script, free_port, stop_process, wait_for_port

from mooncake.store import MooncakeDistributedStore


class RestartableMaster:
    """A `mooncake_master` that can be restarted on the same ports (no HA: it forgets
    everything, and clients re-mount what they serve)."""

    def __init__(self):
        self.rpc_port, self.http_port = free_port(), free_port()
        self.start()

    def start(self):
        args = console_script("mooncake_master") + [
            f"--rpc_port={self.rpc_port}", "--rpc_address=127.0.0.1",
            f"--metrics_port={free_port()}", "--metrics_host=127.0.0.1",
            "--enable_http_metadata_server=true", "--http_metadata_server_host=127.0.0.1",
            f"--http_metadata_server_port={self.http_port}", "--default_kv_lease_ttl=0",
        ]
        self.proc = subprocess.Popen(args, stdin=subprocess.DEVNULL)
        assert wait_for_port(self.rpc_port), "mooncake_master did not start"

    @property
    def addr(self):
        return f"127.0.0.1:{self.rpc_port}"

    @property
    def metadata(self):
        return f"http://127.0.0.1:{self.http_port}/metadata"

    def stop(self):
        return stop_process(self.proc)


@pytest.fixture
def cluster():
    m = RestartableMaster()
    made = []

    def client(segment=0):
        s = MooncakeDistributedStore()
        assert s.setup("127.0.0.1", m.metadata, segment, 64 * MIB, "tcp", "", m.addr) == 0
        made.append(s)
        return s

    yield m, client
    for s in made:
        s.close()
    m.stop()


def wait_until(pred, timeout=20.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return True
        time.sleep(0.1)
    return False


def test_a_segment_less_client_mounts_serves_and_unmounts_memory(cluster):
    _, client = cluster
    owner, reader = client(), client()
    # No segment anywhere yet: a put has nowhere to go.
    assert owner.put("x/none", b"v") != 0
    r = owner.allocate_and_mount_segment(32 * MIB)
    assert r["ret"] == 0 and len(r["segment_ids"]) == 1 and r["allocated_size"] >= 32 * MIB
    seg = r["segment_ids"][0]
    data = bytes(range(256)) * 4096
    assert owner.put("x/held", data) == 0
    assert reader.get("x/held") == data and owner.get("x/held") == data
    # A second extra segment; both take replicas.
    r2 = owner.allocate_and_mount_segment(16 * MIB)
    assert r2["ret"] == 0 and r2["segment_ids"][0] != seg
    from mooncake.store import ReplicateConfig
    two = ReplicateConfig()
    two.replica_num = 2
    assert owner.put("x/two", b"both" * 1000, two) == 0
    assert len(owner.get_replica_desc("x/two")) == 2
    # Unmount the first: what only it held is gone (as upstream), the rest stays readable.
    assert owner.unmount_segment([seg]) == 0
    assert wait_until(lambda: reader.is_exist("x/held") == 0)
    assert reader.get("x/held") == b""
    assert reader.get("x/two") == b"both" * 1000
    # Unknown, already unmounted and malformed ids are refused; nothing changes.
    assert owner.unmount_segment([seg]) == -1
    assert owner.unmount_and_free_segment(["not-an-id"]) == -1
    assert owner.unmount_segment([r2["segment_ids"][0], seg]) == -1
    assert reader.get("x/two") == b"both" * 1000
    assert owner.unmount_segment([]) == 0
    assert owner.unmount_and_free_segment(r2["segment_ids"], grace_period_seconds=1) == 0
    assert wait_until(lambda: reader.is_exist("x/two") == 0)
    assert owner.put("x/none", b"v") != 0


def test_extra_segment_is_remounted_after_a_master_restart(cluster):
    master, client = cluster
    owner = client(segment=8 * MIB)
    r = owner.allocate_and_mount_segment(32 * MIB)
    assert r["ret"] == 0
    big = b"e" * (12 * MIB)  # larger than the own segment: it can only live in the extra one
    assert owner.put("x/extra", big) == 0
    master.stop()
    master.start()
    # The owner's pinger re-mounts both segments with what their catalogs hold.
    reader = client()
    assert wait_until(lambda: reader.is_exist("x/extra") == 1, timeout=30)
    assert reader.get("x/extra") == big
    # New puts land in the re-mounted extra segment too.
    assert owner.put("x/after", b"f" * (12 * MIB)) == 0
    assert reader.get("x/after") == b"f" * (12 * MIB)


def test_close_unmounts_extra_segments(cluster):
    _, client = cluster
    owner, reader = client(), client()
    assert owner.allocate_and_mount_segment(8 * MIB)["ret"] == 0
    assert owner.put("x/c", b"c" * 100) == 0
    assert reader.get("x/c") == b"c" * 100
    owner.close()
    assert wait_until(lambda: reader.is_exist("x/c") == 0)


def test_refusals(cluster):
    _, client = cluster
    s = MooncakeDistributedStore()
    assert s.allocate_and_mount_segment(MIB) == {"ret": -1, "segment_ids": [],
                                                 "allocated_size": 0}
    owner = client()
    assert owner.allocate_and_mount_segment(0)["ret"] == -1
    assert owner.allocate_and_mount_segment(MIB, protocol="nvmeof")["ret"] == -1
    assert owner.mount_segment("/dev/shm/mooncake-test-none", MIB) == \
        {"ret": -1, "segment_ids": []}


def test_mount_segment_serves_a_shared_memory_file(cluster, tmp_path):
    """`mount_segment(path, size, offset)`: the bytes of a file in /dev/shm (or under a
    directory of MC_MOUNT_FILE_DIRS) become one more segment of the client: objects put there
    are the file's bytes, other clients read them, unmounting leaves the file. What the file
    cannot back is refused."""
    import os
    _, client = cluster
    owner, reader = client(), client()
    path = f"/dev/shm/mooncake-test-{os.getpid()}"
    if not os.path.isdir("/dev/shm"):
        path = str(tmp_path / "segment")
    size, offset = 16 * MIB, 4096
    with open(path, "wb") as f:
        f.truncate(offset + size)
    try:
        # What the file cannot back, and what mmap cannot map, is refused before mounting.
        failed = {"ret": -1, "segment_ids": []}
        assert owner.mount_segment(path, size + 1, offset) == failed
        assert owner.mount_segment(path, size, 100) == failed
        assert owner.mount_segment(path, 0) == failed
        assert owner.mount_segment(path, size, offset, protocol="nvmeof") == failed
        assert owner.put("f/none", b"v") != 0  # still no segment anywhere

        r = owner.mount_segment(path, size, offset)
        assert r["ret"] == 0 and len(r["segment_ids"]) == 1 and set(r) == {"ret", "segment_ids"}
        marker = b"mooncake-file-segment:" + os.urandom(16)
        data = marker * 4096
        assert owner.put("f/held", data) == 0
        assert reader.get("f/held") == data
        with open(path, "rb") as f:
            assert data in f.read(), "the object's bytes are the file's"
        assert owner.unmount_segment(r["segment_ids"]) == 0
        assert wait_until(lambda: reader.is_exist("f/held") == 0)
        assert os.path.getsize(path) == offset + size, "the file stays"
    finally:
        os.unlink(path)
