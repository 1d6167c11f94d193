"""The console scripts installed with the package."""

import signal
import subprocess
import urllib.request

from conftest import console_script, free_port, wait_for_port


def test_master_help_and_bad_flag():
    out = subprocess.run(console_script("mooncake_master") + ["--help"], capture_output=True,
                         text=True, timeout=30)
    assert out.returncode == 0 and "--rpc_port" in out.stdout
    bad = subprocess.run(console_script("mooncake_master") + ["--no_such_flag=1"],
                         capture_output=True, text=True, timeout=30)
    assert bad.returncode == 2


def test_http_metadata_server_serves_and_stops():
    port = free_port()
    p = subprocess.Popen(console_script("mooncake_http_metadata_server")
                         + ["--host", "127.0.0.1", "--port", str(port)],
                         stdout=subprocess.DEVNULL)
    try:
        assert wait_for_port(port)
        url = f"http://127.0.0.1:{port}/metadata?key=k1"
        req = urllib.request.Request(url, data=b"v1", method="PUT")
        assert urllib.request.urlopen(req, timeout=5).status == 200
        assert urllib.request.urlopen(url, timeout=5).read() == b"v1"
    finally:
        p.send_signal(signal.SIGTERM)
        assert p.wait(timeout=15) == 0


def test_mooncake_client_joins_the_master_and_serves_data(master, store):
    """Upstream's test_cli: a `mooncake_client` storage node starts against the master; here it
    also holds a replica that a store client reads back."""
    port = free_port()
    p = subprocess.Popen(
        console_script("mooncake_client")
        + [f"--master_server_address={master.addr}", f"--port={port}", "--host=127.0.0.1",
           "--global_segment_size=64MB", f"--metadata_server={master.metadata}"],
        stdout=subprocess.PIPE, text=True)
    try:
        for line in p.stdout:
            if "mooncake_client ready" in line:
                break
        assert p.poll() is None
        from mooncake.store import ReplicateConfig

        cfg = ReplicateConfig()
        cfg.preferred_segment = f"127.0.0.1:{port}"
        assert store.put("on_storage_node", b"held by mooncake_client", cfg) == 0
        descs = store.get_replica_desc("on_storage_node")
        assert store.get("on_storage_node") == b"held by mooncake_client"
        own = ReplicateConfig()
        own.preferred_segment = store.get_hostname()
        assert store.put("on_own_segment", b"x", own) == 0
        ep = lambda k: store.get_replica_desc(k)[0].get_memory_descriptor() \
            .buffer_descriptor.transport_endpoint  # noqa: E731
        assert len(descs) == 1 and ep("on_storage_node") != ep("on_own_segment")
    finally:
        p.send_signal(signal.SIGTERM)
        assert p.wait(timeout=15) == 0


def test_transfer_engine_bench_help():
    out = subprocess.run(console_script("transfer_engine_bench") + ["--help"],
                         capture_output=True, text=True, timeout=30)
    assert out.returncode == 0 and "--block_size" in out.stdout + out.stderr
