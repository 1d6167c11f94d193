"""Fixtures: a real `mooncake_master` (the installed console script) on free loopback ports,
with the embedded HTTP metadata server and upstream's test lease of 500 ms, and store clients
set up against it.

The suite runs against the installed package (`pip install ./python`), never the source tree.
"""

import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

# The lease the master grants, in ms (upstream's tests run the master with the same value and
# sleep this long before removing what they read).
DEFAULT_KV_LEASE_TTL = 500
MIB = 1024 * 1024

REPO = Path(__file__).resolve().parents[2]


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for_port(port, timeout=20.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                return True
        except OSError:
            time.sleep(0.05)
    return False


def console_script(name):
    """The installed console script `name` (next to this interpreter, else on PATH), or the
    cargo-built binary as a fallback."""
    here = Path(sys.executable).parent / name
    if here.exists():
        return [str(here)]
    found = shutil.which(name)
    if found:
        return [found]
    built = REPO / "target" / "release" / name
    if built.exists():
        return [str(built)]
    pytest.skip(f"{name} not found: install the package first (pip install ./python)")


class Master:
    def __init__(self, extra=()):
        self.rpc_port = free_port()
        self.http_port = free_port()
        self.metrics_port = free_port()
        args = console_script("mooncake_master") + [
            f"--rpc_port={self.rpc_port}",
            "--rpc_address=127.0.0.1",
            f"--metrics_port={self.metrics_port}",
            "--metrics_host=127.0.0.1",
            "--enable_http_metadata_server=true",
            "--http_metadata_server_host=127.0.0.1",
            f"--http_metadata_server_port={self.http_port}",
            f"--default_kv_lease_ttl={DEFAULT_KV_LEASE_TTL}",
            *extra,
        ]
        env = dict(os.environ, MC_LOG_LEVEL=os.environ.get("MC_LOG_LEVEL", "2"))
        self.proc = subprocess.Popen(args, stdin=subprocess.DEVNULL, env=env)
        if not wait_for_port(self.rpc_port):
            self.stop()
            raise RuntimeError("mooncake_master did not start")

    @property
    def addr(self):
        return f"127.0.0.1:{self.rpc_port}"

    @property
    def metadata(self):
        return f"http://127.0.0.1:{self.http_port}/metadata"

    def stop(self):
        return stop_process(self.proc)


def stop_process(proc):
    """SIGTERM, then SIGKILL after 10 s; the exit status."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    return proc.returncode


class Node:
    """A storage node (the installed `mooncake_client`) on 127.0.0.1, serving `segment` bytes
    in `shards` shards for `master`; ready when constructed. `port` (default: a free one) is
    also the name of the dummy-client socket it serves; `lines` holds its start-up output."""

    def __init__(self, master, segment, shards=1, extra=(), port=None):
        self.port = port or free_port()
        args = console_script("mooncake_client") + [
            "--host=127.0.0.1",
            f"--port={self.port}",
            f"--global_segment_size={segment}",
            f"--shards={shards}",
            f"--master_server_address={master.addr}",
            f"--metadata_server={master.metadata}",
            *extra,
        ]
        self.proc = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                     text=True)
        deadline = time.monotonic() + 30
        self.lines = []
        for line in self.proc.stdout:
            self.lines.append(line.strip())
            if line.strip() == "mooncake_client ready":
                break
            if time.monotonic() > deadline:
                break
        else:
            raise RuntimeError("mooncake_client exited before `ready`")
        # Keep draining its stdout so it never blocks on a full pipe.
        threading.Thread(target=lambda: [None for _ in self.proc.stdout], daemon=True).start()

    def stop(self):
        return stop_process(self.proc)


@pytest.fixture(scope="session")
def master():
    m = Master()
    yield m
    assert m.stop() == 0, "mooncake_master should exit 0 on SIGTERM"


def make_store(master, segment=512 * MIB, local_buffer=128 * MIB, hostname="localhost", cls=None):
    from mooncake.store import MooncakeDistributedStore

    store = (cls or MooncakeDistributedStore)()
    rc = store.setup(hostname, master.metadata, segment, local_buffer, "tcp", "", master.addr)
    assert rc == 0, f"setup failed: {rc}"
    return store


@pytest.fixture(scope="module")
def store(master):
    """One client contributing a 3200 MB segment (memory is touched only when used) with a
    512 MB local buffer, as upstream's test_distributed_object_store.py sets it up."""
    s = make_store(master, segment=3200 * MIB, local_buffer=512 * MIB)
    yield s
    s.close()


@pytest.fixture
def new_store(master):
    """A factory of extra clients, closed at the end of the test."""
    made = []

    def make(**kw):
        s = make_store(master, **kw)
        made.append(s)
        return s

    yield make
    for s in made:
        s.close()


def lease_wait():
    # The subject, not a settle: a read's lease has to run out before the object can go.
    time.sleep(DEFAULT_KV_LEASE_TTL / 1000 + 0.05)
