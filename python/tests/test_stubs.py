"""The type stubs of `mooncake._native` (`mooncake/_native.pyi`) match the built module.

`mypy.stubtest` imports the installed `mooncake._native` and compares every class, method,
parameter (names, kinds, defaults), `@final`-ness and module attribute with the stub, with no
allowlist. It cannot see parameter types (PyO3 does not publish them): those are read from
`python/src/*.rs` by hand. Also checks that the wheel ships the stub and the `py.typed` marker,
without which type checkers ignore both.
"""

import importlib.util
import pathlib
import subprocess
import sys

import mooncake


def _package_dir():
    spec = importlib.util.find_spec("mooncake._native")
    assert spec is not None and spec.origin is not None
    return pathlib.Path(spec.origin).parent


def test_package_ships_stub_and_py_typed():
    pkg = _package_dir()
    assert (pkg / "py.typed").is_file(), f"no py.typed in {pkg}"
    assert (pkg / "_native.pyi").is_file(), f"no _native.pyi in {pkg}"
    assert pathlib.Path(mooncake.__file__).parent == pkg


def test_stubtest_finds_no_error(tmp_path):
    if importlib.util.find_spec("mypy") is None:
        raise AssertionError("mypy is missing: scripts/setup.sh installs it (the test extra)")
    # From an empty directory, so the stub checked is the installed one, not a source tree's.
    out = subprocess.run(
        [sys.executable, "-m", "mypy.stubtest", "mooncake._native"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
    )
    assert out.returncode == 0, out.stdout + out.stderr


USER_CODE = '''
from mooncake.engine import TransferEngine
from mooncake.store import (
    BufferHandle, ErrorCode, MooncakeDistributedStore, ReplicaDescriptor, ReplicateConfig,
)

store = MooncakeDistributedStore()
config = ReplicateConfig()
config.replica_num = 2
rc: int = store.put("k", b"v", config)
codes: list[int] = store.batch_put_from(("a", "b"), [0, 0], [1, 1])
data: bytes = store.get("k")
handle: BufferHandle | None = store.get_buffer("k")
if handle is not None:
    address: int = handle.ptr()
descs: dict[str, list[ReplicaDescriptor]] = store.batch_get_replica_desc(["k"])
named: ErrorCode = ErrorCode(rc)
engine = TransferEngine()
engine.transfer_sync(
    "peer:1", 0, 0, 8, TransferEngine.TransferOpcode.Write
)
'''

WRONG_CODE = '''
from mooncake.store import MooncakeDistributedStore

store = MooncakeDistributedStore()
store.put(b"key", "not bytes")
text: str = store.get("k")
'''


def _mypy(tmp_path, code):
    from mypy import api

    (tmp_path / "user.py").write_text(code)
    # The cache goes to the test's directory, not the checkout.
    out, err, status = api.run(
        [
            "--no-incremental",
            "--cache-dir",
            str(tmp_path / "mypy_cache"),
            "--python-executable",
            sys.executable,
            str(tmp_path / "user.py"),
        ]
    )
    return out + err, status


def test_user_code_type_checks_against_the_stub(tmp_path):
    """The stub, py.typed and the Python modules together: typical calls check clean, and
    wrong argument or result types are caught where they are made."""
    out, status = _mypy(tmp_path, USER_CODE)
    assert status == 0, out
    out, status = _mypy(tmp_path, WRONG_CODE)
    assert status == 1, out
    assert 'Argument 1 to "put" of "MooncakeDistributedStore" has incompatible type "bytes"' in out
    assert 'Argument 2 to "put" of "MooncakeDistributedStore" has incompatible type "str"' in out
    assert 'expression has type "bytes", variable has type "str"' in out
