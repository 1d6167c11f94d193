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
