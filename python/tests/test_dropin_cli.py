"""The console scripts' modules, run as `python -m mooncake.<module>` on both sides:
`transfer_engine_topology_dump` (stdout byte for byte, exit codes), `cli_client`,
`cli_bench` and `cli` (same flags reach our programs), and the entry-point table itself
against the wheel's `entry_points.txt`."""

import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

import upstream
from conftest import REPO, free_port

TOPO_CASES = [
    [], ["--backend", "tent"], ["--backend", "te"], ["--device-name", "mlx5_0"],
    ["--use-custom-topo"], ["--custom-topo-json", "/nonexistent/topo.json"],
    ["--backend", "bogus"], ["--help"],
]
# Custom NIC priority matrices, and what upstream's engine made of each: its entries (with
# the devices that exist), `{}` for a malformed entry or text that is not JSON, discovery for
# an empty file, an error for JSON that is not an object.
CUSTOM_FILES = [
    '{"cpu:1": [["mlx5_0", "mlx5_1"], ["mlx5_2"]], "cpu:0": [[], ["mlx5_3"]]}',
    '{"cpu:0": 5}', '{"cpu:0": [[], [], []]}', "garbage", "  \n", "", "[1, 2]", '"s"', "null",
]


def run_module(python, module, args, env_extra=None):
    env = dict(os.environ, **(env_extra or {}))
    p = subprocess.run([python, "-m", module, *args], capture_output=True, text=True,
                       timeout=60, env=env)
    errors = [line for line in p.stderr.splitlines() if line.startswith("error:")
              or ": error:" in line]
    return p.returncode, p.stdout, errors


# Every case in one process per side (importing upstream's engine takes a second): main()
# with the case's argv and MC_CUSTOM_TOPO_JSON unset; stdout, exit code and error lines.
DUMP_SCENARIO = r"""
def scenario():
    import contextlib, io, os, sys
    from mooncake import transfer_engine_topology_dump as dump

    results = []
    for args in CASES:
        os.environ.pop("MC_CUSTOM_TOPO_JSON", None)
        os.environ.pop("MC_USE_TENT", None)
        sys.argv = ["transfer_engine_topology_dump.py", *args]
        out, err = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                rc = dump.main()
            except SystemExit as e:
                rc = e.code
        errors = [l for l in err.getvalue().splitlines() if "error:" in l]
        results.append([rc, out.getvalue(), errors])
    return results
"""


@pytest.fixture(scope="module")
def dump_cases(tmp_path_factory):
    d = tmp_path_factory.mktemp("topo")
    cases = list(TOPO_CASES)
    for i, text in enumerate(CUSTOM_FILES):
        f = d / f"topo{i}.json"
        f.write_text(text)
        cases.append(["--custom-topo-json", str(f)])
    source = DUMP_SCENARIO.replace("CASES", json.dumps(cases))
    theirs = upstream.run(source)
    code = source + "\nimport json\nprint('\\nRESULT ' + json.dumps(scenario()))\n"
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    mine = json.loads(p.stdout.rsplit("\nRESULT ", 1)[1])
    return cases, mine, theirs


def test_topology_dump_prints_what_upstream_prints(dump_cases):
    """The flags, and custom NIC priority matrices of every kind (kept entries, malformed
    entries, text that is not JSON, JSON that is not an object, empty files)."""
    cases, mine, theirs = dump_cases
    for args, a, b in zip(cases, mine, theirs):
        assert (args, a) == (args, b)
    assert len(mine) == len(theirs) == len(cases)


def test_topology_dump_without_the_wheel():
    rc, out, errors = run_module(sys.executable, "mooncake.transfer_engine_topology_dump", [])
    assert rc == 0 and errors == []
    prefix = "Local topology [te/discover]: "
    assert out.startswith(prefix) and out.endswith("}\n\n")
    topo = json.loads(out[len(prefix):])
    nodes = sorted(int(p.name[4:]) for p in Path("/sys/devices/system/node").glob("node[0-9]*"))
    assert sorted(topo) == sorted(f"cpu:{n}" for n in (nodes or [0]))
    assert all(v == [[], []] for v in topo.values())
    rc, _, errors = run_module(sys.executable, "mooncake.transfer_engine_topology_dump",
                               ["--use-custom-topo"], {"MC_CUSTOM_TOPO_JSON": ""})
    assert rc == 1 and errors[0].startswith("error: --use-custom-topo requires")


def test_styled_json_is_jsoncpps_layout():
    from mooncake.transfer_engine_topology_dump import styled_json

    assert styled_json({}) == "{}\n"
    assert styled_json({"b": [["x", "y"], []], "a": [[], ["z\u00e9"]]}) == (
        '{\n\t"a" : \n\t[\n\t\t[],\n\t\t[\n\t\t\t"z\\u00e9"\n\t\t]\n\t],\n'
        '\t"b" : \n\t[\n\t\t[\n\t\t\t"x",\n\t\t\t"y"\n\t\t],\n\t\t[]\n\t]\n}\n')


# The console scripts of upstream's wheel (its entry_points.txt).
UPSTREAM_SCRIPTS = {
    "mc_store_rest_server": "mooncake.mooncake_store_service:sync_main",
    "mooncake_client": "mooncake.cli_client:main",
    "mooncake_http_metadata_server": "mooncake.http_metadata_server:main",
    "mooncake_master": "mooncake.cli:main",
    "transfer_engine_bench": "mooncake.cli_bench:main",
    "transfer_engine_topology_dump": "mooncake.transfer_engine_topology_dump:main",
}


def test_entry_points_are_upstreams():
    """pyproject.toml declares the wheel's console scripts, each at the wheel's module:function,
    and each of those is callable here."""
    section = (REPO / "python" / "pyproject.toml").read_text().split("[project.scripts]")[1]
    section = section.split("\n[")[0]
    ours = dict(re.findall(r'^(\w+) = "(\S+)"$', section, re.M))
    assert ours == UPSTREAM_SCRIPTS
    import importlib

    for target in ours.values():
        module, func = target.split(":")
        assert callable(getattr(importlib.import_module(module), func))


def test_recorded_entry_points_are_the_wheels():
    ep = Path(upstream.python()).parent.parent.glob(
        "lib/python3*/site-packages/mooncake_transfer_engine_non_cuda-*.dist-info/entry_points.txt")
    ep = next(iter(ep), None)
    if ep is None:
        pytest.skip("the upstream wheel's entry_points.txt is not there")
    assert dict(re.findall(r"^(\w+) = (\S+)$", ep.read_text(), re.M)) == UPSTREAM_SCRIPTS


def test_cli_modules_pass_flags_through():
    """Each module runs our program with the flags given: `--help` lists upstream's flags, a
    flag the program does not know fails, as upstream's binaries do."""
    py = sys.executable
    p = subprocess.run([py, "-m", "mooncake.cli_bench", "--help"], capture_output=True,
                       text=True, timeout=30)
    assert p.returncode == 0 and "--block_size" in p.stdout + p.stderr and "--segment_id" in p.stdout + p.stderr
    p = subprocess.run([py, "-m", "mooncake.cli_client", "--help"], capture_output=True,
                       text=True, timeout=30)
    assert p.returncode == 0 and "--master_server_address" in p.stdout + p.stderr
    for module in ("mooncake.cli_client", "mooncake.cli_bench", "mooncake.cli"):
        p = subprocess.run([py, "-m", module, "--no_such_flag=1"], capture_output=True,
                           text=True, timeout=30)
        assert p.returncode != 0, module


def test_cli_client_runs_a_storage_node(master):
    """`python -m mooncake.cli_client` is a storage node: it joins the master and stops with
    exit code 0 on SIGTERM, in the same process (as upstream's execv keeps the pid). Upstream's
    allocator flags are taken."""
    port = free_port()
    p = subprocess.Popen(
        [sys.executable, "-m", "mooncake.cli_client", f"--master_server_address={master.addr}",
         f"--port={port}", "--host=127.0.0.1", "--global_segment_size=16MB",
         f"--metadata_server={master.metadata}", "--use_mmap_arena_allocator=true",
         "--mmap_arena_pool_size", "1048576"], stdout=subprocess.PIPE, text=True)
    try:
        for line in p.stdout:
            if "mooncake_client ready" in line:
                break
        assert p.poll() is None
    finally:
        p.send_signal(signal.SIGTERM)
        assert p.wait(timeout=15) == 0


def test_call_rejects_non_string_arguments():
    from mooncake.cli import call

    with pytest.raises(TypeError, match="must be a str"):
        call("transfer_engine_bench", "run_transfer_engine_bench", ["--help", 3])


@pytest.mark.parametrize("args", [["--use_mmap_arena_allocator=maybe"],
                                  ["--mmap_arena_pool_size=-1"], ["--mmap_arena_pool_size"]])
def test_cli_client_checks_the_flags_it_ignores(args):
    p = subprocess.run([sys.executable, "-m", "mooncake.cli_client", *args],
                       capture_output=True, text=True, timeout=30)
    assert p.returncode == 2 and "mooncake_client: " in p.stderr


def test_master_takes_upstreams_allocator_flags():
    """The only flags of upstream's mooncake_master ours lacks are its mmap arena allocator's:
    accepted (here with --help, which then lists the master's flags), values checked."""
    p = subprocess.run([sys.executable, "-m", "mooncake.cli", "--use_mmap_arena_allocator",
                        "--mmap_arena_pool_size=8589934592", "--help"],
                       capture_output=True, text=True, timeout=30)
    assert p.returncode == 0 and "--rpc_port" in p.stdout + p.stderr
    p = subprocess.run([sys.executable, "-m", "mooncake.cli", "--mmap_arena_pool_size=x"],
                       capture_output=True, text=True, timeout=30)
    assert p.returncode == 2 and "mooncake_master: invalid value" in p.stderr


def upstream_flags(binary):
    """`{flag: default}` of the Mooncake sources' section of a wheel program's `--help`
    (gflags' own flags left out)."""
    out = subprocess.run([binary, "--help"], capture_output=True, text=True, timeout=30,
                         env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"})
    flags = {}
    for section in re.split(r"\n  Flags from ", out.stdout + out.stderr)[1:]:
        head, _, body = section.partition("\n")
        if "Mooncake/Mooncake" not in head:
            continue
        for entry in re.split(r"\n    -(?=\w+ \()", "\n" + body)[1:]:
            m = re.search(r"type: (\w+)\s+default: (.*?)\s*$", " ".join(entry.split()))
            if m:
                default = m.group(2)
                if default.startswith('"') and default.endswith('"'):
                    default = default[1:-1]
                flags[entry.split(" ", 1)[0]] = default
    return flags


@pytest.mark.parametrize("program,module", [("mooncake_master", "mooncake.cli"),
                                            ("mooncake_client", "mooncake.cli_client"),
                                            ("transfer_engine_bench", "mooncake.cli_bench")])
def test_every_upstream_flag_is_taken(program, module):
    """Each flag of upstream's program, at its default value, is taken by ours (with --help,
    which exits 0 only when every flag before it is known and well-formed)."""
    flags = upstream_flags(str(Path(upstream.bin_dir()) / program))
    assert len(flags) > 5, "the wheel's --help was not parsed"
    p = subprocess.run([sys.executable, "-m", module,
                        *(f"--{k}={v}" for k, v in flags.items()), "--help"],
                       capture_output=True, text=True, timeout=30)
    assert p.returncode == 0, p.stderr
