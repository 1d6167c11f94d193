"""Differential tests against upstream's wheel (`mooncake-transfer-engine-non-cuda==0.3.13.post1`).

The wheel lives in its own virtual environment, `MOONCAKE_UPSTREAM_PYTHON` (default
`/tmp/upstream-venv/bin/python`; it needs Debian's libibverbs1, librdmacm1 and libnuma1 to
import). A test hands it a scenario, the source of a function both sides run, and compares the
two results; without the wheel the test is skipped with the reason.

`run_with_store(source)` runs `scenario(store, BufferPool, MIB)` there against upstream's own
`mooncake_master` (free loopback ports for RPC, metadata and metrics, HTTP metadata embedded) and returns its JSON result;
`run(source)` runs `scenario()` alone. `with_site=True` lends that venv our numpy and torch
(it has neither); `module_file(name)` is the source file of one of upstream's modules.
"""

import atexit
import functools
import json
import os
import shutil
import subprocess
import tempfile
import textwrap
from pathlib import Path

import pytest

UPSTREAM_PYTHON = os.environ.get("MOONCAKE_UPSTREAM_PYTHON", "/tmp/upstream-venv/bin/python")

_IMPORT_CHECK = "import mooncake.store, mooncake.engine"


def python():
    """The upstream interpreter, or skip the test saying why."""
    if not Path(UPSTREAM_PYTHON).exists():
        pytest.skip(f"upstream wheel not installed ({UPSTREAM_PYTHON} missing; set "
                    "MOONCAKE_UPSTREAM_PYTHON to a venv with "
                    "mooncake-transfer-engine-non-cuda==0.3.13.post1)")
    probe = subprocess.run([UPSTREAM_PYTHON, "-c", _IMPORT_CHECK], capture_output=True,
                           timeout=60)
    if probe.returncode != 0:
        pytest.skip("upstream wheel does not import: "
                    + probe.stderr.decode(errors="replace").strip().splitlines()[-1])
    return UPSTREAM_PYTHON


def bin_dir():
    return str(Path(python()).parent)


_STORE_HARNESS = r'''
import json, os, socket, subprocess, sys, time

def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]

MIB = 1 << 20
rpc, http, metrics = free_port(), free_port(), free_port()
master = subprocess.Popen(
    [os.path.join(os.path.dirname(sys.executable), "mooncake_master"), f"--rpc_port={rpc}",
     "--enable_http_metadata_server=true", f"--http_metadata_server_port={http}",
     "--http_metadata_server_host=127.0.0.1", "--default_kv_lease_ttl=500",
     f"--metrics_port={metrics}", "--metrics_host=127.0.0.1"],
    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
try:
    deadline = time.monotonic() + 30
    while True:
        try:
            socket.create_connection(("127.0.0.1", rpc), 0.2).close()
            socket.create_connection(("127.0.0.1", http), 0.2).close()
            break
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)
    from mooncake import BufferPool
    from mooncake.store import MooncakeDistributedStore
    store = MooncakeDistributedStore()
    rc = store.setup("127.0.0.1", f"http://127.0.0.1:{http}/metadata", SEGMENT, LOCAL_BUFFER,
                     "tcp", "", f"127.0.0.1:{rpc}")
    assert rc == 0, rc
    SCENARIO
    result = scenario(store, BufferPool, MIB)
    store.close()
    print("\nRESULT " + json.dumps(result))
finally:
    master.terminate()
    master.wait()
'''


@functools.lru_cache(maxsize=None)
def _numpy_path():
    """A directory holding only this interpreter's numpy, for an upstream venv without one
    (the wheel does not depend on numpy; its `_fast_copy` needs it). None when the venv has
    numpy; skips when it has none and the Python versions differ."""
    probe = subprocess.run([python(), "-c", "import numpy"], capture_output=True, timeout=60,
                           env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"})
    if probe.returncode == 0:
        return None
    import numpy
    import sys
    theirs = subprocess.run([python(), "-c", "import sys; print(sys.version_info[:2])"],
                            capture_output=True, text=True, timeout=60).stdout.strip()
    if theirs != str(tuple(sys.version_info[:2])):
        pytest.skip("the upstream venv has no numpy, and ours is for another Python")
    src = Path(numpy.__file__).parent.parent
    out = Path(tempfile.mkdtemp(prefix="mooncake-upstream-numpy-"))
    atexit.register(shutil.rmtree, out, True)
    for name in ("numpy", "numpy.libs"):
        if (src / name).exists():
            (out / name).symlink_to(src / name)
    return str(out)


@functools.lru_cache(maxsize=None)
def _site_path():
    """A directory lending this interpreter's third-party packages (numpy, torch and what
    torch imports) to the upstream venv, which has none of them: symlinks to every entry of
    our site-packages except our own package (`mooncake*`), so the wheel's `mooncake` and its
    own `msgpack` stay the ones imported. Skips when the Python versions differ."""
    import sys
    import sysconfig
    theirs = subprocess.run([python(), "-c", "import sys; print(sys.version_info[:2])"],
                            capture_output=True, text=True, timeout=60).stdout.strip()
    if theirs != str(tuple(sys.version_info[:2])):
        pytest.skip("the upstream venv runs another Python; ours cannot lend it numpy/torch")
    src = Path(sysconfig.get_paths()["purelib"])
    out = Path(tempfile.mkdtemp(prefix="mooncake-upstream-site-"))
    atexit.register(shutil.rmtree, out, True)
    for entry in src.iterdir():
        name = entry.name
        if name.startswith(("mooncake", "msgpack", "_distutils_hack", "pip")) \
                or name.endswith(".pth"):
            continue
        (out / name).symlink_to(entry)
    return str(out)


def _run(code, timeout, with_numpy=False, with_site=False):
    # Without PYTHONPATH: it may point at our package, which would shadow the wheel's.
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    extra = _site_path() if with_site else _numpy_path() if with_numpy else None
    if extra:
        env["PYTHONPATH"] = extra
    env["MC_LOG_LEVEL"] = "ERROR"
    # From a file, not `-c`: a scenario may carry more data than an argument can.
    with tempfile.NamedTemporaryFile("w", suffix=".py", prefix="upstream-scenario-") as script:
        script.write(code)
        script.flush()
        proc = subprocess.run([python(), script.name], capture_output=True, timeout=timeout,
                              env=env)
    out = proc.stdout.decode(errors="replace")
    for line in reversed(out.splitlines()):
        if line.startswith("RESULT "):
            return json.loads(line[len("RESULT "):])
    raise AssertionError(f"upstream run failed (rc {proc.returncode}):\n{out}\n"
                         + proc.stderr.decode(errors="replace")[-4000:])


def run_with_store(source, segment=16 << 20, local_buffer=4 << 20, timeout=120,
                   with_site=False):
    """`scenario(store, BufferPool, MIB)` of `source` on upstream's store; its JSON result.
    `with_site`: lend it our numpy and torch (see `_site_path`)."""
    code = (_STORE_HARNESS.replace("SEGMENT", str(segment))
            .replace("LOCAL_BUFFER", str(local_buffer))
            .replace("    SCENARIO", textwrap.indent(textwrap.dedent(source), "    ")))
    return _run(code, timeout, with_site=with_site)


def run(source, timeout=60, with_numpy=False, with_site=False):
    """`scenario()` of `source` in upstream's interpreter; its JSON result."""
    code = textwrap.dedent(source) + "\nimport json\nprint('\\nRESULT ' + json.dumps(scenario()))\n"
    return _run(code, timeout, with_numpy, with_site)


def module_file(module):
    """The source file of upstream's `module` (found without importing it), or skip."""
    code = ("import importlib.util, sys; "
            f"print(importlib.util.find_spec({module!r}).origin)")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    proc = subprocess.run([python(), "-c", code], capture_output=True, text=True, timeout=60,
                          env=env)
    if proc.returncode != 0:
        pytest.skip(f"upstream has no {module}: {proc.stderr.strip()[-200:]}")
    return proc.stdout.strip()
