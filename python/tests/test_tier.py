"""The disk tier (`docs/tiering.md`), end to end: a real `mooncake_master --enable_offload`, real
storage nodes `mooncake_client --enable_offload=true` whose directory is a real one on this
machine's disk, and store clients that put and get through the upstream Python API. Each
test checks what a user of the original's SSD offload expects: objects that no longer fit in
memory still read back byte-exact; a disk copy shows as a `LOCAL_DISK` replica; removes remove
files; a node killed and started again on its directory serves what its disk holds; a flipped
byte on disk is a miss, never wrong bytes; a full disk stops offload while memory serves."""

import ctypes
import hashlib
import os
import signal
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest

from conftest import MIB, Master, Node, console_script, free_port, make_store, stop_process

NO_SPACE = -200  # NO_AVAILABLE_HANDLE: the pool is full now, try again later


def value_of(key, size):
    """Deterministic bytes for `key`, so a read can be checked without keeping every value."""
    seed = hashlib.sha256(key.encode()).digest()
    return (seed * (size // len(seed) + 1))[:size]


def wait_for(pred, timeout, step=0.05):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return True
        time.sleep(step)
    return pred()


def kinds(store, key):
    """The mediums of `key`'s replicas, memory first, as `get_replica_desc` shows them."""
    return ["disk" if r.is_local_disk_replica() else "memory"
            for r in store.get_replica_desc(key)]


def files_in(d):
    return sorted(p for p in Path(d).rglob("*.mco"))


def put_retrying(store, key, value, timeout=30.0):
    """A put that waits out NO_AVAILABLE_HANDLE (the pool is full until offload or eviction
    makes room), as a connector that acts on the code does."""
    deadline = time.monotonic() + timeout
    while True:
        rc = store.put(key, value)
        if rc != NO_SPACE or time.monotonic() > deadline:
            return rc
        time.sleep(0.02)


def metrics(port):
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
        return r.read().decode()


def metric(text, name):
    for line in text.splitlines():
        if line.startswith(name + " ") or line.startswith(name + "{"):
            return float(line.rsplit(" ", 1)[1])
    return None


class DiskNode(Node):
    """A storage node with a disk tier in `directory`."""

    def __init__(self, master, segment, directory, port=None, extra=(), env=None):
        old = dict(os.environ)
        os.environ.update({"MOONCAKE_OFFLOAD_FILE_STORAGE_PATH": str(directory), **(env or {})})
        try:
            self.metrics_port = free_port()
            super().__init__(master, segment, port=port,
                             extra=["--enable_offload=true",
                                    f"--metrics_port={self.metrics_port}", *extra])
        finally:
            os.environ.clear()
            os.environ.update(old)
        self.directory = directory


@pytest.fixture
def tier_master():
    m = Master(extra=["--enable_offload=true"])
    yield m
    m.stop()


def test_a_working_set_four_times_dram_reads_back(tier_master, tmp_path):
    """64 MiB of memory, 256 MiB of objects: every put succeeds (eager offload gives every
    object a disk copy, so eviction drops memory copies without losing anything), and every
    object reads back byte-exact, most of them from disk."""
    node = DiskNode(tier_master, "64MB", tmp_path)
    client = make_store(tier_master, segment=0, local_buffer=64 * MIB)
    try:
        keys = [f"big-{i}" for i in range(256)]
        for k in keys:
            assert put_retrying(client, k, value_of(k, MIB)) == 0, k
        on_disk = 0
        for k in keys:
            assert client.get(k) == value_of(k, MIB), k
            on_disk += kinds(client, k) == ["disk"]
        assert on_disk >= 128, f"only {on_disk} objects were disk-only"
        # Upstream's count of reads served from offloaded storage.
        assert client.get_offload_rpc_read_count() >= on_disk
        assert len(files_in(tmp_path)) >= on_disk
    finally:
        client.close()
        node.stop()


def test_on_evict_mode_moves_what_eviction_picks(tmp_path):
    """`--offload_on_evict`: nothing is written to disk until eviction picks it; then the
    object moves (its memory copy goes once the disk copy is complete) and reads back."""
    master = Master(extra=["--enable_offload=true", "--offload_on_evict=true"])
    node = DiskNode(master, "32MB", tmp_path)
    client = make_store(master, segment=0, local_buffer=64 * MIB)
    try:
        assert client.put("first", value_of("first", MIB)) == 0
        time.sleep(1.5)
        assert kinds(client, "first") == ["memory"], "eager offload is off"
        keys = [f"ev-{i}" for i in range(96)]
        for k in keys:
            assert put_retrying(client, k, value_of(k, MIB)) == 0, k
        for k in ["first", *keys]:
            assert client.get(k) == value_of(k, MIB), k
        assert any(kinds(client, k) == ["disk"] for k in ["first", *keys])
    finally:
        client.close()
        node.stop()
        master.stop()


def test_remove_and_remove_all_remove_disk_copies(tier_master, tmp_path):
    node = DiskNode(tier_master, "64MB", tmp_path)
    client = make_store(tier_master, segment=0, local_buffer=16 * MIB)
    try:
        for i in range(8):
            assert client.put(f"rm-{i}", value_of(f"rm-{i}", 64 * 1024)) == 0
        assert wait_for(lambda: all("disk" in kinds(client, f"rm-{i}") for i in range(8)), 20)
        assert len(files_in(tmp_path)) == 8
        time.sleep(0.6)  # the read lease of the replica lists above
        assert client.remove("rm-0") == 0
        assert client.is_exist("rm-0") == 0
        assert wait_for(lambda: len(files_in(tmp_path)) == 7, 10), files_in(tmp_path)
        time.sleep(0.6)  # the read lease of the gets above
        assert client.remove_all() >= 7
        assert wait_for(lambda: files_in(tmp_path) == [], 10), files_in(tmp_path)
    finally:
        client.close()
        node.stop()


def test_a_killed_node_serves_its_disk_after_a_restart(tmp_path):
    """SIGKILL loses the node's memory; started again on the same directory it reports what
    its disk holds, and those objects read back."""
    master = Master(extra=["--enable_offload=true", "--client_ttl=2"])
    node = DiskNode(master, "64MB", tmp_path)
    port = node.port
    client = make_store(master, segment=0, local_buffer=16 * MIB)
    try:
        keys = [f"kill-{i}" for i in range(16)]
        for k in keys:
            assert client.put(k, value_of(k, 256 * 1024)) == 0
        assert wait_for(lambda: all("disk" in kinds(client, k) for k in keys), 20)
        node.proc.send_signal(signal.SIGKILL)
        node.proc.wait()
        # The master forgets the dead node's segments at its client TTL (and with them every
        # replica: the keys are gone); the restarted node then re-reports its disk.
        assert wait_for(lambda: client.is_exist(keys[0]) == 0, 10)
        node = DiskNode(master, "64MB", tmp_path, port=port)
        assert wait_for(lambda: all(client.get(k) == value_of(k, 256 * 1024) for k in keys),
                        30), "the disk copies come back"
        assert all(kinds(client, k) == ["disk"] for k in keys)
    finally:
        client.close()
        node.stop()
        master.stop()


def test_a_flipped_byte_on_disk_is_a_miss(tier_master, tmp_path):
    """The checksum is checked on every read: a corrupted copy is never returned; the read is
    a miss, the node counts it, and the copy leaves the index."""
    node = DiskNode(tier_master, "64MB", tmp_path)
    client = make_store(tier_master, segment=0, local_buffer=16 * MIB)
    try:
        value = value_of("flip", 128 * 1024)
        assert client.put("flip", value) == 0
        make_disk_only(client, node, ["flip"])
        [path] = files_in(tmp_path)
        data = bytearray(path.read_bytes())
        data[len(data) - 64 * 1024] ^= 0x5A
        path.write_bytes(bytes(data))
        assert client.get("flip") == b"", "a corrupted copy is a miss, never wrong bytes"
        text = metrics(node.metrics_port)
        assert metric(text, "mooncake_disk_checksum_failures_total") == 1
        # The object sits at the start of the node's segment (block-aligned), so it was
        # written to disk straight from the segment, and the listener read it straight into
        # its aligned buffer: the direct path found the bad byte.
        assert metric(text, "mooncake_disk_direct_writes_total") == 1
        assert metric(text, "mooncake_disk_direct_reads_total") == 1
        assert wait_for(lambda: client.is_exist("flip") == 0, 10), "the copy is dropped"
        assert files_in(tmp_path) == []
    finally:
        client.close()
        node.stop()


def node_segment(node):
    return f"127.0.0.1:{node.port}"


def make_disk_only(client, node, keys):
    """Waits for each key's disk copy, then moves the key off memory: its disk copy exists,
    so the move only drops the memory replica, and the copy on disk is the only one left."""
    assert wait_for(lambda: all("disk" in kinds(client, k) for k in keys), 20)
    time.sleep(0.6)  # the read lease of the replica lists above
    for k in keys:
        _, rc = client.create_move_task(k, node_segment(node), node_segment(node) + "/disk")
        assert rc == 0, k
    assert wait_for(lambda: all(kinds(client, k) == ["disk"] for k in keys), 20)


def test_a_reader_on_the_owners_host_reads_its_files_itself(tier_master, tmp_path,
                                                             monkeypatch):
    """A client on the node's host reads disk-only objects from the node's files (the node
    hands it the directory over a unix socket, `docs/tiering.md`): the node's disk listener
    serves none of those reads. A client with same-host sharing off (`MC_STORE_SHM=0`) reads
    the same objects through the listener. The bytes are exact either way, whatever the size
    (a partial last block, a block exactly, several MiB) and whether the destination is the
    client's own buffer or a registered one."""
    node = DiskNode(tier_master, "64MB", tmp_path)
    client = make_store(tier_master, segment=0, local_buffer=16 * MIB)
    other = None
    try:
        sizes = {"sh-small": 777, "sh-block": 4096, "sh-mib": MIB + 100, "sh-big": 4 * MIB}
        for k, n in sizes.items():
            assert client.put(k, value_of(k, n)) == 0, k
        make_disk_only(client, node, list(sizes))
        served = metric(metrics(node.metrics_port), "mooncake_disk_reads_total")
        for k, n in sizes.items():
            assert client.get(k) == value_of(k, n), k
        buf = bytearray(4 * MIB)
        ptr = (ctypes.c_char * len(buf)).from_buffer(buf)
        addr = ctypes.addressof(ptr)
        assert client.register_buffer(addr, len(buf)) == 0
        assert client.get_into("sh-big", addr, len(buf)) == 4 * MIB
        assert bytes(buf) == value_of("sh-big", 4 * MIB)
        assert client.unregister_buffer(addr) == 0
        del ptr
        assert metric(metrics(node.metrics_port), "mooncake_disk_reads_total") == served, \
            "the same-host client read the files itself"
        assert client.get_offload_rpc_read_count() >= len(sizes) + 1

        monkeypatch.setenv("MC_STORE_SHM", "0")
        other = make_store(tier_master, segment=0, local_buffer=16 * MIB)
        for k, n in sizes.items():
            assert other.get(k) == value_of(k, n), k
        assert metric(metrics(node.metrics_port), "mooncake_disk_reads_total") == \
            served + len(sizes), "without sharing, the listener serves every read"
    finally:
        if other is not None:
            other.close()
        client.close()
        node.stop()


def abstract_socket_names(prefix):
    """Names of the abstract unix sockets listening in this network namespace that start
    with `prefix` (`/proc/net/unix` shows them with a leading `@`)."""
    names = set()
    for line in Path("/proc/net/unix").read_text().splitlines()[1:]:
        fields = line.split()
        path = fields[-1] if len(fields) > 7 else ""
        if path.startswith("@" + prefix):
            names.add(path[1:])
    return sorted(names)


ASK_FOR_THE_DIRECTORY = """
import socket, sys
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
s.connect("\\0" + sys.argv[1])
s.settimeout(5)
msg, anc, _, _ = s.recvmsg(64, socket.CMSG_SPACE(4))
print(len(msg), len(anc))
"""


def test_a_process_of_another_user_gets_no_directory(tier_master, tmp_path):
    """The directory share answers only processes of the owner's user or root
    (`SO_PEERCRED`): a process running as `nobody` that connects gets an end of file and no
    descriptor, and the node counts it; a process of the owner's user gets the 16-byte offer
    with the descriptor."""
    if os.geteuid() != 0:
        pytest.skip("running a process as another user needs root")
    # A Python `nobody` can run: the venv's may sit under a directory only root enters.
    python = "/usr/bin/python3"
    if not os.access(python, os.X_OK):
        pytest.skip("no system python3 to run as nobody")
    node = DiskNode(tier_master, "64MB", tmp_path)
    try:
        assert wait_for(lambda: abstract_socket_names("mooncake-disk/"), 10)
        [name] = abstract_socket_names("mooncake-disk/")

        def ask(**kw):
            out = subprocess.run([python, "-c", ASK_FOR_THE_DIRECTORY, name], cwd="/",
                                 capture_output=True, text=True, timeout=30, **kw)
            assert out.returncode == 0, out.stderr
            return out.stdout.split()

        def as_nobody():
            os.setgid(65534)
            os.setuid(65534)

        assert ask(preexec_fn=as_nobody) == ["0", "0"], "nobody gets nothing"
        assert ask() == ["16", "1"], "root gets the offer and a descriptor"
        text = metrics(node.metrics_port)
        assert metric(text, "mooncake_disk_share_refusals_total") == 1
    finally:
        node.stop()


def test_a_missing_or_unwritable_directory_fails_at_start(tier_master, tmp_path):
    missing = tmp_path / "nope" / "deeper"
    (tmp_path / "file").write_bytes(b"x")
    for bad in [tmp_path / "file"]:
        env = dict(os.environ, MOONCAKE_OFFLOAD_FILE_STORAGE_PATH=str(bad))
        args = console_script("mooncake_client") + [
            "--host=127.0.0.1", f"--port={free_port()}", "--global_segment_size=16MB",
            f"--master_server_address={tier_master.addr}", "--metadata_server=P2PHANDSHAKE",
            "--enable_offload=true"]
        p = subprocess.run(args, env=env, capture_output=True, text=True, timeout=30)
        assert p.returncode != 0
        assert str(bad) in p.stderr + p.stdout
    del missing


def test_embedded_store_with_ssd_offload(tier_master, tmp_path):
    """`setup(..., enable_ssd_offload=True, ssd_offload_path=...)`: a Python process's own
    segment gets a disk tier; its objects are offloaded and read back from disk by another
    client once the memory copy is gone."""
    from mooncake.store import MooncakeDistributedStore

    owner = MooncakeDistributedStore()
    rc = owner.setup("localhost", tier_master.metadata, 32 * MIB, 16 * MIB, "tcp", "",
                     tier_master.addr, enable_ssd_offload=True, ssd_offload_path=str(tmp_path))
    assert rc == 0
    reader = make_store(tier_master, segment=0, local_buffer=16 * MIB)
    try:
        keys = [f"emb-{i}" for i in range(96)]
        for k in keys:
            assert put_retrying(owner, k, value_of(k, MIB)) == 0, k
        for k in keys:
            assert reader.get(k) == value_of(k, MIB), k
        assert any(kinds(reader, k) == ["disk"] for k in keys)
    finally:
        reader.close()
        owner.close()


def test_a_remove_racing_offload_leaves_nothing_behind(tier_master, tmp_path):
    """Keys removed while their offloads are queued or being written: once the dust settles
    (the owner hears of the freed ranges at its pings), no file is left, none reads back."""
    node = DiskNode(tier_master, "256MB", tmp_path)
    client = make_store(tier_master, segment=0, local_buffer=64 * MIB)
    try:
        keys = [f"race-{i}" for i in range(64)]
        for k in keys:
            assert client.put(k, value_of(k, 512 * 1024)) == 0
            # Remove every other key at once, while its offload is queued or under way.
            if int(k.split("-")[1]) % 2 == 0:
                assert client.remove(k) == 0
        kept = [k for k in keys if int(k.split("-")[1]) % 2 == 1]
        assert wait_for(lambda: all("disk" in kinds(client, k) for k in kept), 30)
        assert wait_for(lambda: len(files_in(tmp_path)) == len(kept), 30), \
            f"{len(files_in(tmp_path))} files for {len(kept)} kept keys"
        time.sleep(0.6)
        assert client.remove_all() == len(kept)
        assert wait_for(lambda: files_in(tmp_path) == [], 30), files_in(tmp_path)
        assert all(client.is_exist(k) == 0 for k in keys)
    finally:
        client.close()
        node.stop()


@pytest.fixture
def small_fs(tmp_path):
    """A 24 MiB filesystem of its own (a size-capped tmpfs), so the disk fills for real."""
    if os.geteuid() != 0:
        pytest.skip("mounting a size-capped filesystem needs root")
    d = tmp_path / "small"
    d.mkdir()
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=24m", "tmpfs", str(d)],
                       capture_output=True, text=True)
    if r.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {r.stderr.strip()}")
    yield d
    subprocess.run(["umount", "-l", str(d)], check=False)


def test_a_full_disk_stops_offload_while_memory_serves(small_fs):
    """A disk far smaller than the tier's logical limit: offload stops with a log line and a
    metric once the filesystem is full, and every object the store still lists reads back
    byte-exact (memory copies keep serving)."""
    master = Master(extra=["--enable_offload=true"])
    # The logical limit is set above the filesystem on purpose: only the disk itself stops it.
    node = DiskNode(master, "128MB", small_fs,
                    env={"MOONCAKE_OFFLOAD_TOTAL_SIZE_LIMIT_BYTES": str(1 << 30),
                         "MOONCAKE_OFFLOAD_ENABLE_DISK_WATERMARK_EVICTION": "false"})
    client = make_store(master, segment=0, local_buffer=16 * MIB)
    try:
        keys = [f"full-{i}" for i in range(48)]
        for k in keys:
            assert client.put(k, value_of(k, MIB)) == 0
        time.sleep(3)
        text = metrics(node.metrics_port)
        assert metric(text, "mooncake_disk_writes_stopped") == 1 or \
            metric(text, "mooncake_disk_write_refusals_total") > 0 or \
            metric(text, "mooncake_disk_io_errors_total") > 0, text
        for k in keys:
            got = client.get(k)
            assert got == value_of(k, MIB), k
        assert len(files_in(small_fs)) < len(keys)
    finally:
        client.close()
        node.stop()
        master.stop()


def test_a_dummy_client_reads_disk_objects_through_its_standalone_client(tier_master,
                                                                         tmp_path):
    """`setup_dummy`: a light client's gets go through its standalone `mooncake_client`,
    which reads a disk-only object from the disk tier."""
    from mooncake.store import MooncakeDistributedStore

    node = DiskNode(tier_master, "64MB", tmp_path)
    client = make_store(tier_master, segment=0, local_buffer=16 * MIB)
    dummy = MooncakeDistributedStore()
    try:
        value = value_of("dummy-disk", 300 * 1024)
        assert client.put("dummy-disk", value) == 0
        make_disk_only(client, node, ["dummy-disk"])
        assert dummy.setup_dummy(64 * MIB, 16 * MIB, f"127.0.0.1:{node.port}") == 0
        assert dummy.is_exist("dummy-disk") == 1
        assert dummy.get("dummy-disk") == value
    finally:
        dummy.close()
        client.close()
        node.stop()


def test_promotion_brings_a_disk_only_object_back_to_memory(tmp_path):
    """`--promotion_on_hit` with the admission threshold at 2: the second read of a
    disk-only object queues its promotion, and it soon has a memory replica again."""
    master = Master(extra=["--enable_offload=true", "--promotion_on_hit=true",
                           "--promotion_admission_threshold=2"])
    node = DiskNode(master, "64MB", tmp_path)
    client = make_store(master, segment=0, local_buffer=16 * MIB)
    try:
        value = value_of("promo", 256 * 1024)
        assert client.put("promo", value) == 0
        make_disk_only(client, node, ["promo"])
        assert client.get("promo") == value
        assert client.get("promo") == value
        assert wait_for(lambda: kinds(client, "promo") == ["memory", "disk"], 20)
        assert client.get("promo") == value
    finally:
        client.close()
        node.stop()
        master.stop()


class _EtcdMaster:
    """What `Node` needs of a master, for a node that follows the HA leader through etcd."""

    def __init__(self, etcd):
        self.addr = f"etcd://{etcd.addr}"
        self.metadata = f"etcd://{etcd.addr}"


def test_disk_only_objects_survive_a_leader_failover(monkeypatch, tmp_path):
    """Two masters in a real etcd, a node with a disk tier following the leader: objects whose
    only copy is on disk read back after the leader is SIGKILLed (the node re-reports its
    disk to the new leader with its memory)."""
    from test_engine_etcd import ETCD_BIN, Etcd
    from test_ha import role

    if not os.path.exists(ETCD_BIN):
        pytest.skip(f"{ETCD_BIN} not found (install Debian's etcd-server)")
    cluster = "py_tier_ha"
    monkeypatch.setenv("MC_STORE_CLUSTER_ID", cluster)
    etcd = Etcd()
    assert etcd.healthy(), "etcd did not become healthy"
    flags = ["--enable_ha=true", f"--etcd_endpoints={etcd.addr}", f"--cluster_id={cluster}",
             "--enable_offload=true"]
    masters = [Master(extra=flags), Master(extra=flags)]
    node = client = None
    try:
        assert wait_for(lambda: any(role(m) == "leading" for m in masters), 10)
        node = DiskNode(_EtcdMaster(etcd), "64MB", tmp_path)
        from mooncake.store import MooncakeDistributedStore

        client = MooncakeDistributedStore()
        assert client.setup("localhost", f"etcd://{etcd.addr}", 0, 16 * MIB, "tcp", "",
                            f"etcd://{etcd.addr}") == 0
        keys = [f"ha-disk-{i}" for i in range(12)]
        for k in keys:
            assert client.put(k, value_of(k, 200 * 1024)) == 0
        assert wait_for(lambda: all("disk" in kinds(client, k) for k in keys), 20)
        make_disk_only(client, node, keys[:6])
        leader = next(m for m in masters if role(m) == "leading")
        leader.proc.send_signal(signal.SIGKILL)
        leader.proc.wait()
        survivor = next(m for m in masters if m is not leader)
        assert wait_for(lambda: role(survivor) == "leading", 15), "the standby takes over"
        assert wait_for(lambda: all(client.get(k) == value_of(k, 200 * 1024) for k in keys),
                        20), "every value reads back from the new leader"
        assert all("disk" in kinds(client, k) for k in keys), "the disk copies came back too"
    finally:
        if client is not None:
            client.close()
        if node is not None:
            node.stop()
        for m in masters:
            if m.proc.poll() is None:
                m.proc.kill()
                m.proc.wait()
        etcd.stop()


def test_the_disk_stays_within_its_logical_cap_by_its_watermarks(tmp_path):
    """A 16 MiB disk under a 64 MiB memory segment: eager offload writes every object, and
    the master evicts disk copies ahead of need (above 90% down to 80%), least recently read
    first, so the files never hold more than the cap; the objects read most recently keep
    their disk copies."""
    master = Master(extra=["--enable_offload=true"])
    node = DiskNode(master, "64MB", tmp_path,
                    env={"MOONCAKE_OFFLOAD_TOTAL_SIZE_LIMIT_BYTES": str(16 * MIB)})
    client = make_store(master, segment=0, local_buffer=16 * MIB)
    try:
        keys = [f"cap-{i}" for i in range(40)]
        most = 0
        for k in keys:
            assert put_retrying(client, k, value_of(k, MIB)) == 0, k
            most = max(most, len(files_in(tmp_path)))
        assert wait_for(lambda: len(files_in(tmp_path)) <= 16, 20)
        for _ in range(40):
            most = max(most, len(files_in(tmp_path)))
            time.sleep(0.05)
        assert most <= 16, f"{most} files of 1 MiB on a 16 MiB disk"
        data = sum(p.stat().st_size for p in files_in(tmp_path))
        assert data <= 16 * MIB + 16 * 8192
        # Every object is still in memory (64 MiB holds them all) and reads back.
        for k in keys:
            assert client.get(k) == value_of(k, MIB), k
    finally:
        client.close()
        node.stop()
        master.stop()


def test_a_drained_node_moves_its_only_copies_to_another_nodes_disk(tmp_path):
    """A node without a disk stops (SIGTERM) holding the only copies of eight 1 MiB objects;
    the other node's memory has room for a few: the drain moves the rest onto that node's
    disk tier, the stopping node exits 0, and every object reads back byte-exact, some of
    them from disk only."""
    master = Master(extra=["--enable_offload=true", "--offload_on_evict=true",
                           "--default_kv_lease_ttl=500"])
    leaving = Node(master, "64MB", extra=["--drain_timeout_sec=30"])
    client = make_store(master, segment=0, local_buffer=16 * MIB)
    staying = None
    try:
        keys = [f"drained-{i}" for i in range(8)]
        for k in keys:
            assert client.put(k, value_of(k, MIB)) == 0, k
        staying = DiskNode(master, "4MB", tmp_path)
        leaving.proc.send_signal(signal.SIGTERM)
        assert leaving.proc.wait(timeout=40) == 0, "the drained node exits 0"
        for k in keys:
            assert client.get(k) == value_of(k, MIB), k
        where = [kinds(client, k) for k in keys]
        assert sum(w == ["disk"] for w in where) >= 4, where
        text = metrics(master.metrics_port)
        assert metric(text, "master_drains_completed_total") == 1
        assert metric(text, "master_drain_objects_lost_total") == 0
    finally:
        client.close()
        stop_process(leaving.proc)
        if staying is not None:
            staying.stop()
        master.stop()
