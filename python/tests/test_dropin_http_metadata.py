"""`mooncake.http_metadata_server` against upstream's module: `KVBootstrapServer` answers a
sequence of requests exactly as upstream's (status, body, content type), `KVPoll` and
`poll()` follow the same states, and `main()` takes the same arguments (its help, its
refusals) and serves the metadata protocol through our native server until SIGTERM."""

import http.client
import json
import os
import signal
import subprocess
import sys

import pytest

import upstream
from conftest import free_port, wait_for_port

# (method, path, body): the protocol's uses and misuses.
REQUESTS = [
    ("PUT", "/metadata?key=seg1", b'{"name": "seg1"}'),
    ("GET", "/metadata?key=seg1", None),
    ("GET", "/metadata?key=%20seg1%20", None),
    ("PUT", "/metadata?key=seg1", b"v2"),
    ("GET", "/metadata?key=seg1", None),
    ("PUT", "/metadata?key=a/rpc_meta/1", b"rpc"),
    ("PUT", "/metadata?key=a/rpc_meta/1", b"again"),
    ("GET", "/metadata?key=a/rpc_meta/1", None),
    ("GET", "/metadata?key=missing", None),
    ("GET", "/metadata", None),
    ("GET", "/metadata?key=", None),
    ("PUT", "/metadata?key=%20%20", b"x"),
    ("POST", "/metadata?key=seg1", b"x"),
    ("DELETE", "/metadata?key=seg1", None),
    ("DELETE", "/metadata?key=seg1", None),
    ("GET", "/metadata?key=seg1", None),
    ("GET", "/other", None),
    ("PUT", "/metadata?key=empty", b""),
    ("GET", "/metadata?key=empty", None),
]

SCENARIO = r"""
def scenario():
    import http.client, json, socket
    from mooncake.http_metadata_server import KVBootstrapServer, KVPoll

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = KVBootstrapServer(port=port, host="127.0.0.1")
    out = [[m.name, m.value] for m in KVPoll]
    out.append(["poll before run", server.poll().name])
    server.run()
    import time
    for _ in range(200):  # upstream's run() returns before it listens
        try:
            socket.create_connection(("127.0.0.1", port), 0.2).close()
            break
        except OSError:
            time.sleep(0.02)
    out.append(["poll running", server.poll().name])
    for method, path, body in REQUESTS:
        c = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
        c.request(method, path, body=body.encode("latin-1") if body is not None else None)
        r = c.getresponse()
        out.append([method, path, r.status, r.read().decode("latin-1"),
                    r.getheader("Content-Type")])
        c.close()
    server.close()
    out.append(["poll closed", server.poll().name])
    return out
"""


def scenario_source():
    reqs = [(m, p, b.decode("latin-1") if b is not None else None) for m, p, b in REQUESTS]
    return SCENARIO.replace("REQUESTS", json.dumps(reqs).replace("null", "None"))


def test_kv_bootstrap_server_answers_as_upstream():
    scope = {}
    exec(scenario_source(), scope)
    mine = scope["scenario"]()
    theirs = upstream.run(scenario_source())
    assert mine == theirs


def test_kv_bootstrap_server_without_the_wheel():
    from mooncake.http_metadata_server import KVBootstrapServer, KVPoll

    with pytest.raises(TypeError):
        KVBootstrapServer(port="80")
    with pytest.raises(ValueError):
        KVBootstrapServer(port=70000)
    with pytest.raises(TypeError):
        KVBootstrapServer(port=0, host=5)
    server = KVBootstrapServer(port=0, host="127.0.0.1")
    assert server.poll() is KVPoll.Failed
    server.run()
    try:
        assert server.poll() is KVPoll.Success and server.port != 0
        c = http.client.HTTPConnection("127.0.0.1", server.port, timeout=10)
        c.request("PUT", "/metadata?key=k", body=b"v")
        assert c.getresponse().read() == b"metadata updated"
        c.request("GET", "/metadata?key=k")
        assert c.getresponse().read() == b"v"
    finally:
        server.close()
    assert server.poll() is KVPoll.Failed
    # A port already taken: run() returns, poll() says Failed.
    holder = KVBootstrapServer(port=0, host="127.0.0.1")
    holder.run()
    try:
        taken = KVBootstrapServer(port=holder.port, host="127.0.0.1")
        taken.run()
        assert taken.poll() is KVPoll.Failed
    finally:
        holder.close()


def test_kv_bootstrap_server_needs_the_bearer_with_a_cluster_secret():
    # The secret is read once per process: a fresh interpreter with MC_AUTH_TOKEN set.
    code = r"""
import http.client
from mooncake.http_metadata_server import KVBootstrapServer
from mooncake.mooncake_store_service import http_bearer
s = KVBootstrapServer(port=0, host="127.0.0.1")
s.run()
c = http.client.HTTPConnection("127.0.0.1", s.port, timeout=10)
c.request("PUT", "/metadata?key=k", body=b"v")
r = c.getresponse(); r.read(); print(r.status)
c.request("PUT", "/metadata?key=k", body=b"v",
          headers={"Authorization": "Bearer " + http_bearer(b"s3cret")})
r = c.getresponse(); r.read(); print(r.status)
s.close()
"""
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       timeout=60, env=dict(os.environ, MC_AUTH_TOKEN="s3cret"))
    assert p.stdout.split() == ["401", "200"], p.stderr


def request(port, method, path, body=None):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    c.request(method, path, body=body)
    r = c.getresponse()
    out = (r.status, r.read())
    c.close()
    return out


# The protocol as the transfer engine uses it: these answers are the same from upstream's
# main() (its aiohttp server) and ours (the native server).
CORE = [
    ("PUT", "/metadata?key=seg", b"v1"), ("GET", "/metadata?key=seg", None),
    ("PUT", "/metadata?key=x/rpc_meta", b"1"), ("PUT", "/metadata?key=x/rpc_meta", b"2"),
    ("GET", "/metadata?key=nope", None), ("DELETE", "/metadata?key=seg", None),
    ("DELETE", "/metadata?key=seg", None), ("GET", "/metadata?key=seg", None),
]


def serve(python, upstream_side):
    port = free_port()
    env = dict(os.environ)
    if upstream_side:
        env.pop("PYTHONPATH", None)
    p = subprocess.Popen([python, "-m", "mooncake.http_metadata_server", "--port", str(port),
                          "--host", "127.0.0.1", "--log-level", "WARNING"],
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    try:
        assert wait_for_port(port)
        answers = [request(port, *r) for r in CORE]
    finally:
        p.send_signal(signal.SIGTERM)
        rc = p.wait(timeout=15)
    return answers, rc


def test_main_serves_as_upstreams_main():
    mine = serve(sys.executable, False)
    theirs = serve(upstream.python(), True)
    assert mine == theirs
    assert mine[1] == 0 and mine[0][1] == (200, b"v1")


def cli(python, args, upstream_side):
    env = dict(os.environ)
    if upstream_side:
        env.pop("PYTHONPATH", None)
    p = subprocess.run([python, "-m", "mooncake.http_metadata_server", *args],
                       capture_output=True, text=True, timeout=30, env=env)
    return p.returncode, p.stdout, p.stderr.splitlines()[-1:] if p.returncode else []


@pytest.mark.parametrize("args", [["--help"], ["--log-level", "TRACE"], ["--port", "x"],
                                  ["--bogus"]])
def test_main_arguments_are_upstreams(args):
    assert cli(sys.executable, args, False) == cli(upstream.python(), args, True)


def test_main_passes_upstreams_arguments_to_the_native_server(monkeypatch):
    """--log-level reaches the native server only when given, so that otherwise RUST_LOG /
    MC_LOG_LEVEL set its level, as for every program here."""
    from mooncake import _native, http_metadata_server

    seen = []
    monkeypatch.setattr(_native, "run_http_metadata_server", lambda a: seen.append(a) or 7)
    monkeypatch.setattr(sys, "argv", ["x", "--port", "0", "--host", "127.0.0.1"])
    assert http_metadata_server.main() == 7
    monkeypatch.setattr(sys, "argv", ["x", "--log-level", "ERROR"])
    assert http_metadata_server.main() == 7
    assert seen == [["--port", "0", "--host", "127.0.0.1"],
                    ["--port", "8080", "--host", "0.0.0.0", "--log-level", "ERROR"]]
    assert http_metadata_server.parse_args([]).log_level == "INFO"  # upstream's parser
