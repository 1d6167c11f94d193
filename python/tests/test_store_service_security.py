"""`mc_store_rest_server`'s security rules, each driven from outside as a stranger would try
the hole it closes: the service runs as its own process (`python -m
mooncake.mooncake_store_service`) against a real master, and is spoken to over real sockets.

- decode-mode `/api/reconfigure` (and `/api/mount_shm`) cannot map a file outside /dev/shm,
  nor one a symlink leads to: the victim's bytes stay as they were after puts;
- with a cluster secret every route needs the derived bearer (401 and nothing done without
  it, or with a wrong one), and a misconfigured secret stops the program with status 2;
- it listens on 127.0.0.1 unless told otherwise, and warns when told otherwise without a
  secret;
- mount sizes and offsets are checked and capped; bodies are capped;
- a half-sent request head is dropped within the head timeout (also one trickled a byte at a
  time, and the second head of a kept-alive connection), while others are answered; at most
  `_CONNECTIONS_MAX` connections are open at once.
"""

import hashlib
import hmac
import http.client
import json
import os
import select
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import MIB, Master, free_port, lease_wait, stop_process, wait_for_port

import mooncake.mooncake_store_service as service_module

SECRET = "rest-service-test-cluster-secret"
# The limits the service documents (read from the module when it has them).
HEAD_TIMEOUT = getattr(service_module, "_HEAD_TIMEOUT_SECONDS", 5.0)
KEEPALIVE = getattr(service_module, "_KEEPALIVE_SECONDS", 15.0)
CONNECTIONS_MAX = getattr(service_module, "_CONNECTIONS_MAX", 256)
MOUNT_MAX = 1 << 40
# Slack for a busy machine on top of a timeout.
SLACK = 5.0


def bearer(secret):
    return hmac.new(secret.encode(), b"mooncake-rs auth v1 http", hashlib.sha256).hexdigest()


class Service:
    """`mc_store_rest_server` in its own process, for `master`, listening on a free port;
    its log goes to `log_path`."""

    def __init__(self, master, log_path, args=(), wait=True, **env):
        self.port = free_port()
        self.log_path = log_path
        e = {k: v for k, v in os.environ.items()
             if not k.startswith("MC_AUTH_TOKEN") and k != "MOONCAKE_CONFIG_PATH"}
        e.update(MOONCAKE_MASTER=master.addr if master else "127.0.0.1:1",
                 MOONCAKE_TE_META_DATA_SERVER=master.metadata if master else "P2PHANDSHAKE",
                 MOONCAKE_GLOBAL_SEGMENT_SIZE="64mb", MOONCAKE_LOCAL_BUFFER_SIZE="32mb")
        e.update(env)
        cmd = [sys.executable, "-m", "mooncake.mooncake_store_service", "--port",
               str(self.port), "-Dlocal_hostname=127.0.0.1", "--max-wait-time", "30", *args]
        self.log = open(log_path, "w")
        self.proc = subprocess.Popen(cmd, env=e, stdin=subprocess.DEVNULL,
                                     stdout=self.log, stderr=subprocess.STDOUT)
        if wait and not wait_for_port(self.port, 60):
            self.stop()
            raise AssertionError(f"the service did not start:\n{self.text()[-3000:]}")

    def text(self):
        return Path(self.log_path).read_text(errors="replace")

    def stop(self):
        rc = stop_process(self.proc)
        self.log.close()
        return rc


def call(port, method, path, body=None, headers=None, host="127.0.0.1"):
    """(status, JSON or bytes, headers) of one request on a fresh connection."""
    conn = http.client.HTTPConnection(host, port, timeout=30)
    try:
        data = None if body is None else json.dumps(body).encode()
        h = dict(headers or {})
        if data is not None:
            h["Content-Type"] = "application/json"
        conn.request(method, path, body=data, headers=h)
        r = conn.getresponse()
        raw = r.read()
        kind = r.getheader("Content-Type") or ""
        return r.status, (json.loads(raw) if kind.startswith("application/json") else raw), r
    finally:
        conn.close()


@pytest.fixture(scope="module")
def open_service(master, tmp_path_factory):
    """One service with no cluster secret and default flags."""
    s = Service(master, tmp_path_factory.mktemp("svc") / "service.log")
    yield s
    assert s.stop() == 0, s.text()[-3000:]


@pytest.fixture
def shm_file():
    """A 2 MiB /dev/shm file, removed afterwards."""
    name = f"mc-svc-sec-{os.getpid()}-{time.monotonic_ns()}"
    with open(f"/dev/shm/{name}", "wb") as f:
        f.truncate(2 * MIB)
    yield name
    os.unlink(f"/dev/shm/{name}")


# ---- paths ---------------------------------------------------------------------------------


def test_reconfigure_cannot_map_a_file_outside_dev_shm(open_service, tmp_path):
    port = open_service.port
    victim = tmp_path / "victim"
    original = os.urandom(MIB)
    victim.write_bytes(original)
    link = tmp_path / "link"
    link.symlink_to(victim)
    planted = f"mc-svc-planted-{os.getpid()}"
    os.symlink(victim, f"/dev/shm/{planted}")
    try:
        tries = [
            {"mode": "decode", "path": str(victim), "size": MIB},
            {"mode": "decode", "path": str(link), "size": MIB},
            {"mode": "decode", "path": f"/dev/shm/../..{victim}", "size": MIB},
            {"mode": "decode", "path": f"/dev/shm//..{victim}", "size": MIB},
            {"mode": "decode", "path": f"/dev/shm/{planted}", "size": MIB},
            {"mode": "decode", "name": planted, "size": MIB},
            {"mode": "decode", "name": f"../..{victim}", "size": MIB},
        ]
        for body in tries:
            status, answer, _ = call(port, "POST", "/api/reconfigure", body)
            assert 400 <= status < 500, (body, status, answer)
            assert "error" in answer
        status, answer, _ = call(port, "POST", "/api/mount_shm", {"name": planted, "size": MIB})
        assert status == 400, answer
        # Had any of them been mounted, puts would land in it: write a few MiB.
        for i in range(64):
            status, answer, _ = call(port, "PUT", "/api/put",
                                     {"key": f"victim_probe_{i}", "value": "x" * 65536})
            assert status == 200, answer
        assert victim.read_bytes() == original
        assert call(port, "POST", "/api/reconfigure", {"mode": "prefill"})[:2] == \
            (200, {"status": "success", "mode": "prefill"})
    finally:
        os.unlink(f"/dev/shm/{planted}")
        call(port, "DELETE", "/api/remove_all")


# ---- the cluster secret ---------------------------------------------------------------------


ROUTES = [
    ("PUT", "/api/put", {"key": "sec_k2", "value": "v"}),
    ("GET", "/api/get/sec_k", None),
    ("GET", "/api/exist/sec_k", None),
    ("DELETE", "/api/remove/sec_k", None),
    ("DELETE", "/api/remove_all", None),
    ("POST", "/api/mount_shm", {"name": "x", "size": 4096}),
    ("POST", "/api/unmount_shm", {"segment_ids": ["x"]}),
    ("POST", "/api/mount", {"size": MIB}),
    ("POST", "/api/unmount", {"segment_ids": ["x"]}),
    ("POST", "/api/unmount_local_disk", {}),
    ("POST", "/api/reconfigure", {"mode": "prefill"}),
    ("GET", "/api/nothing", None),
]


@pytest.fixture(scope="module")
def secret_master(tmp_path_factory):
    token_file = tmp_path_factory.mktemp("token") / "token"
    token_file.write_text(SECRET + "\n")
    token_file.chmod(0o600)
    m = Master(extra=[f"--auth_token_file={token_file}"])
    yield m
    assert m.stop() == 0


def test_every_route_needs_the_bearer(secret_master, tmp_path):
    s = Service(secret_master, tmp_path / "service.log", MC_AUTH_TOKEN=SECRET)
    try:
        port, good = s.port, {"Authorization": f"Bearer {bearer(SECRET)}"}
        assert call(port, "PUT", "/api/put", {"key": "sec_k", "value": "kept"}, good)[:2] == \
            (200, {"status": "success"})
        wrong = [
            None,
            f"Bearer {bearer('another-secret')}",
            f"Bearer {SECRET}",  # the raw secret is not the bearer
            f"Bearer {os.urandom(32).hex()}",
            f"bearer {bearer(SECRET)}",
            f"Basic {bearer(SECRET)}",
            f"Bearer {bearer(SECRET)[:-1]}",
            "Bearer ",
        ]
        for method, path, body in ROUTES:
            for header in wrong:
                h = {} if header is None else {"Authorization": header}
                status, answer, r = call(port, method, path, body, h)
                assert status == 401, (method, path, header, status, answer)
                assert isinstance(answer, dict) and "error" in answer
                assert r.getheader("WWW-Authenticate") == "Bearer"
        # Nothing changed: the key is there, nothing was put.
        assert call(port, "GET", "/api/get/sec_k", headers=good)[:2] == (200, b"kept")
        assert call(port, "GET", "/api/exist/sec_k2", headers=good)[:2] == \
            (200, {"exists": False})
        # The right bearer works, in either case, and remove_all then does its job (once the
        # read's lease has run out).
        upper = {"Authorization": f"Bearer {bearer(SECRET).upper()}"}
        assert call(port, "GET", "/api/exist/sec_k", headers=upper)[:2] == \
            (200, {"exists": True})
        lease_wait()
        status, answer, _ = call(port, "DELETE", "/api/remove_all", headers=good)
        assert status == 200 and answer["status"].startswith("success removed"), answer
        assert call(port, "GET", "/api/exist/sec_k", headers=good)[:2] == \
            (200, {"exists": False})
        assert "no or wrong bearer" in s.text()
    finally:
        assert s.stop() == 0, s.text()[-3000:]


def test_a_token_file_serves_and_a_loose_one_is_warned_about(secret_master, tmp_path):
    token_file = tmp_path / "token"
    token_file.write_text(f"  {SECRET}\n")
    token_file.chmod(0o644)
    s = Service(secret_master, tmp_path / "service.log", MC_AUTH_TOKEN_FILE=str(token_file))
    try:
        good = {"Authorization": f"Bearer {bearer(SECRET)}"}
        assert call(s.port, "GET", "/api/exist/k", headers=good)[:2] == (200, {"exists": False})
        assert call(s.port, "GET", "/api/exist/k")[0] == 401
        assert "group or others" in s.text()
    finally:
        assert s.stop() == 0, s.text()[-3000:]


@pytest.mark.parametrize("env, says", [
    ({"MC_AUTH_TOKEN": SECRET, "MC_AUTH_TOKEN_FILE": "/nonexistent"}, "set one"),
    ({"MC_AUTH_TOKEN": " \n"}, "empty"),
    ({"MC_AUTH_TOKEN_FILE": ""}, "cannot read token file"),
    ({"MC_AUTH_TOKEN_FILE": "/nonexistent/token"}, "cannot read token file"),
    ({"MC_STORE_SERVICE_MAX_MOUNT_BYTES": "lots"}, "MC_STORE_SERVICE_MAX_MOUNT_BYTES"),
])
def test_a_misconfiguration_stops_the_program(tmp_path, env, says):
    s = Service(None, tmp_path / "service.log", wait=False, **env)
    try:
        assert s.proc.wait(timeout=30) == 2
        assert says in s.text()
        assert not wait_for_port(s.port, 0.5)
    finally:
        s.stop()


# ---- the bind address -----------------------------------------------------------------------


def listening_addresses(port):
    """The local addresses of the sockets listening on `port` (from /proc/net/tcp{,6})."""
    found = []
    for table, width in (("/proc/net/tcp", 8), ("/proc/net/tcp6", 32)):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            local, _remote, state = line.split()[1:4]
            addr, hexport = local.split(":")
            if int(hexport, 16) == port and state == "0A" and len(addr) == width:
                found.append(addr)
    return found


def outward_address():
    """An address of this machine that is not loopback, or None."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect(("192.0.2.1", 9))  # no packet is sent for a UDP connect
            ip = s.getsockname()[0]
        except OSError:
            return None
    return None if ip.startswith("127.") or ip == "0.0.0.0" else ip


def test_it_listens_on_loopback_unless_told(open_service, master, tmp_path):
    assert listening_addresses(open_service.port) == ["0100007F"]  # 127.0.0.1, only
    ip = outward_address()
    if ip is not None:
        with pytest.raises(ConnectionRefusedError):
            socket.create_connection((ip, open_service.port), timeout=5).close()
    assert "NO cluster secret" not in open_service.text()
    # Told otherwise with no secret: it serves there, and says loudly who can change state.
    s = Service(master, tmp_path / "service.log", args=["--host", "0.0.0.0"])
    try:
        assert listening_addresses(s.port) == ["00000000"]
        if ip is not None:
            assert call(s.port, "GET", "/api/exist/k", host=ip)[:2] == (200, {"exists": False})
        warning = [line for line in s.text().splitlines() if "NO cluster secret" in line]
        assert warning and "WARNING" in warning[0] and "anyone who can reach" in warning[0]
    finally:
        assert s.stop() == 0, s.text()[-3000:]


# ---- sizes ----------------------------------------------------------------------------------


def test_mount_sizes_and_offsets_are_checked(open_service, shm_file):
    port = open_service.port
    bad_mounts = [
        ("/api/mount", {"size": MOUNT_MAX + 1}),
        ("/api/mount", {"size": 1 << 64}),
        ("/api/mount", {"size": 0}),
        ("/api/mount", {"size": -MIB}),
        ("/api/mount_shm", {"name": shm_file, "size": MOUNT_MAX + 1}),
        ("/api/mount_shm", {"name": shm_file, "size": 1 << 64}),
        ("/api/mount_shm", {"name": shm_file, "size": -1}),
        ("/api/mount_shm", {"name": shm_file, "size": "1048576"}),
        ("/api/mount_shm", {"name": shm_file, "size": MIB, "offset": -4096}),
        ("/api/mount_shm", {"name": shm_file, "size": MIB, "offset": "0"}),
        ("/api/reconfigure", {"mode": "decode", "name": shm_file, "size": MOUNT_MAX + 1}),
        ("/api/reconfigure", {"mode": "decode", "name": shm_file, "size": 1.5}),
        ("/api/reconfigure", {"mode": "decode", "name": shm_file, "size": MIB,
                              "offset": -4096}),
    ]
    for path, body in bad_mounts:
        status, answer, _ = call(port, "POST", path, body)
        assert status == 400, (path, body, status, answer)
        assert "Invalid" in answer["error"], answer
    status, answer, _ = call(port, "POST", "/api/mount", {"size": MOUNT_MAX + 1})
    assert answer == {"error": f"Invalid size, must be no greater than {MOUNT_MAX} bytes"}
    # The range itself is fine: mounted and unmounted.
    status, answer, _ = call(port, "POST", "/api/mount_shm", {"name": shm_file, "size": MIB})
    assert status == 200, answer
    assert call(port, "POST", "/api/unmount_shm", answer)[0] == 200


def test_the_mount_cap_can_be_lowered(master, tmp_path):
    s = Service(master, tmp_path / "service.log", MC_STORE_SERVICE_MAX_MOUNT_BYTES=str(4 * MIB))
    try:
        assert call(s.port, "POST", "/api/mount", {"size": 8 * MIB})[:2] == \
            (400, {"error": f"Invalid size, must be no greater than {4 * MIB} bytes"})
        status, answer, _ = call(s.port, "POST", "/api/mount", {"size": 4 * MIB})
        assert status == 200, answer
        assert call(s.port, "POST", "/api/unmount", {"segment_ids": answer["segment_ids"]})[0] \
            == 200
    finally:
        assert s.stop() == 0, s.text()[-3000:]


def test_a_body_over_the_cap_is_refused_before_it_is_read(open_service):
    with socket.create_connection(("127.0.0.1", open_service.port), timeout=10) as c:
        c.sendall(b"PUT /api/put HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                  b"Content-Length: 209715200\r\n\r\n{\"key\": ")
        head = c.recv(4096)
    assert head.split(b" ", 2)[1] == b"413", head


# ---- slow and many connections --------------------------------------------------------------


def closed_by_peer(sock):
    """Whether the server has closed `sock` (EOF or reset); waits at most 0.2 s."""
    ready, _, _ = select.select([sock], [], [], 0.2)
    if not ready:
        return False
    try:
        return sock.recv(65536) == b""
    except (ConnectionResetError, socket.timeout):
        return True


def test_half_sent_requests_are_dropped_while_others_are_answered(open_service):
    port = open_service.port
    started = time.monotonic()
    # A first request head that never ends.
    half = socket.create_connection(("127.0.0.1", port))
    half.sendall(b"GET /api/exist/x HTTP/1.1\r\n")
    # The same, trickled a byte a second (every byte is "progress", the clock must not reset).
    trickle = socket.create_connection(("127.0.0.1", port))
    trickle.sendall(b"GET /api/exist/x HTTP/1.1\r\n")
    # A kept-alive connection: one whole request answered, then half of a second one.
    kept = socket.create_connection(("127.0.0.1", port))
    kept.sendall(b"GET /api/exist/x HTTP/1.1\r\nHost: x\r\n\r\n")
    assert kept.recv(65536).split(b" ", 2)[1] == b"200"
    kept.sendall(b"GET /api/exist/x HTTP/1.1\r\n")
    kept_at = time.monotonic()
    closed = {}
    answered = 0
    while len(closed) < 3 and time.monotonic() - started < KEEPALIVE + 2 * SLACK:
        for name, sock in (("half", half), ("trickle", trickle), ("kept", kept)):
            if name not in closed and closed_by_peer(sock):
                closed[name] = time.monotonic()
        if "trickle" not in closed:
            try:
                trickle.send(b"X")
            except OSError:
                closed["trickle"] = time.monotonic()
        assert call(port, "GET", "/api/exist/x")[:2] == (200, {"exists": False})
        answered += 1
        time.sleep(0.5)
    for sock in (half, trickle, kept):
        sock.close()
    assert set(closed) == {"half", "trickle", "kept"}, closed
    assert closed["half"] - started < HEAD_TIMEOUT + SLACK
    assert closed["trickle"] - started < HEAD_TIMEOUT + SLACK
    assert closed["kept"] - kept_at < KEEPALIVE + SLACK
    assert answered >= 3


def test_connections_beyond_the_cap_are_closed(open_service):
    port = open_service.port
    extra = 8
    socks = [socket.create_connection(("127.0.0.1", port)) for _ in range(CONNECTIONS_MAX + extra)]
    try:
        deadline = time.monotonic() + HEAD_TIMEOUT / 2
        refused = set()
        while time.monotonic() < deadline and len(refused) < extra:
            for i, s in enumerate(socks):
                if i not in refused:
                    ready, _, _ = select.select([s], [], [], 0)
                    if ready and closed_by_peer(s):
                        refused.add(i)
            time.sleep(0.05)
        assert len(refused) == extra, len(refused)
    finally:
        for s in socks:
            s.close()
    # Once they are gone, the service answers again.
    deadline = time.monotonic() + SLACK
    while True:
        try:
            assert call(port, "GET", "/api/exist/x")[:2] == (200, {"exists": False})
            break
        except (ConnectionError, http.client.HTTPException):
            assert time.monotonic() < deadline
            time.sleep(0.1)
