"""`scripts/demo.sh` checks its ports before it builds or starts anything: a demo that met
another master on 50051 used to fail with "master closed the connection"."""

import os
import socket
import subprocess

from conftest import REPO, free_port


def test_demo_names_the_port_that_is_taken():
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        env = dict(os.environ, RPC_PORT=str(free_port()), META_PORT=str(port),
                   ADMIN_PORT=str(free_port()))
        r = subprocess.run(["bash", str(REPO / "scripts" / "demo.sh")], env=env,
                           capture_output=True, text=True, timeout=60)
    assert r.returncode == 1
    assert f"port {port} on 127.0.0.1 is already in use" in r.stderr
    assert "[demo] master" not in r.stdout, "nothing was started"
