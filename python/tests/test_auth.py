"""The cluster secret from Python (each case in a fresh process: the secret is read once per
process). A master started with `--auth_token_file`; store clients that know the secret
through `MC_AUTH_TOKEN` put and get across the data plane (two stores in one process, one
reading the other's segment over TCP); a client with no secret or another one cannot set up.
"""

import os
import subprocess
import sys
import textwrap

from conftest import Master

SECRET = "python-test-cluster-secret"

SCRIPT = textwrap.dedent(
    """
    import os, sys
    from mooncake.store import MooncakeDistributedStore, ReplicateConfig

    metadata, master = sys.argv[1], sys.argv[2]
    a = MooncakeDistributedStore()
    rc = a.setup("127.0.0.1", metadata, 32 << 20, 16 << 20, "tcp", "", master)
    print("setup", rc)
    if rc != 0:
        sys.exit(0)
    b = MooncakeDistributedStore()
    assert b.setup("127.0.0.1", metadata, 32 << 20, 16 << 20, "tcp", "", master) == 0
    cfg = ReplicateConfig()
    cfg.preferred_segment = a.get_hostname()
    value = os.urandom(2 << 20)
    print("put", a.put("auth_k", value, cfg))
    # b reads a's segment over the data plane: both handshakes must have passed.
    print("get_ok", b.get("auth_k") == value)
    b.close()
    a.close()
    """
)


def run(master, **env):
    e = {k: v for k, v in os.environ.items() if not k.startswith("MC_AUTH_TOKEN")}
    e.update(env)
    p = subprocess.run([sys.executable, "-c", SCRIPT, master.metadata, master.addr],
                       capture_output=True, text=True, env=e, timeout=120)
    assert p.returncode == 0, p.stderr
    return dict(line.split(" ", 1) for line in p.stdout.splitlines()), p.stderr


def test_store_with_the_secret_works_and_without_it_does_not(tmp_path):
    token_file = tmp_path / "token"
    token_file.write_text(SECRET + "\n")
    m = Master(extra=[f"--auth_token_file={token_file}"])
    try:
        out, err = run(m, MC_AUTH_TOKEN=SECRET, MC_STORE_MEMCPY="0")
        assert out == {"setup": "0", "put": "0", "get_ok": "True"}, err
        # The file form of the same secret.
        out, err = run(m, MC_AUTH_TOKEN_FILE=str(token_file), MC_STORE_MEMCPY="0")
        assert out["get_ok"] == "True", err
        # No secret, or another one: the master refuses the client.
        out, _ = run(m)
        assert out["setup"] != "0"
        out, err = run(m, MC_AUTH_TOKEN="not-the-secret")
        assert out["setup"] != "0"
        assert "refused our proof" in err, err
        # Both variables set: a configuration error, not a silent pick.
        out, err = run(m, MC_AUTH_TOKEN=SECRET, MC_AUTH_TOKEN_FILE=str(token_file))
        assert out["setup"] != "0"
        assert "set one" in err
    finally:
        assert m.stop() == 0
