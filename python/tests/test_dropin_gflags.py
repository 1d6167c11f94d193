"""gflags' own flags of `mooncake_master` (`--undefok`, `--fromenv`, `--tryfromenv`,
`--flagfile`), run side by side: each command line goes to upstream's wheel program and to ours
(`python -m mooncake.cli`), and both must start, or both must refuse it. What each setting
does once accepted is checked by the Rust unit tests (`protocol::gflags`,
`controlplane::config`, `client::node::config`), which hold upstream's recorded answers.
Skipped, saying why, without the upstream wheel."""

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

import upstream
from conftest import free_port

FLAGFILES = {
    # an unknown flag and a `--flag value` line are skipped; the rest applies
    "mixed": "# comment\n--nosuch=1\n--eviction_ratio 0.4\n  --client_ttl=20\n",
    "bad_value": "--eviction_ratio=abc\n",
    # sections: the bad value is for another program only
    "other_program": "other_prog\n--eviction_ratio=abc\nmooncake_m*\n--client_ttl=21\n",
    "this_program": "other_prog\n--client_ttl=21\nmooncake_master\n--eviction_ratio=abc\n",
    "nested": "--flagfile={dir}/mixed\n--noenable_metric_reporting\n",
}

# (command line, extra environment, starts?)
CASES = [
    (["--undefok=foo,bar", "--foo=1", "--bar"], {}, True),
    (["--foo=1"], {}, False),
    (["--nofoo", "--undefok=foo"], {}, True),
    (["--undefok=a", "--a=1", "--b"], {}, False),
    (["--fromenv=eviction_ratio"], {}, False),
    (["--tryfromenv=eviction_ratio"], {}, True),
    (["--fromenv=eviction_ratio,client_ttl"], {"FLAGS_eviction_ratio": "0.3",
                                               "FLAGS_client_ttl": "12"}, True),
    (["--tryfromenv=eviction_ratio"], {"FLAGS_eviction_ratio": "abc"}, False),
    (["--tryfromenv=eviction_ratio"], {"FLAGS_eviction_ratio": "fromenv"}, False),
    (["--tryfromenv=nosuch"], {}, False),
    (["--undefok=nosuch", "--tryfromenv=nosuch"], {}, True),
    (["--flagfile={dir}/mixed"], {}, True),
    (["--flagfile={dir}/bad_value"], {}, False),
    (["--flagfile={dir}/other_program"], {}, True),
    (["--flagfile={dir}/this_program"], {}, False),
    (["--flagfile={dir}/nested,{dir}/mixed"], {}, True),
    (["--flagfile={dir}/missing"], {}, False),
]


def starts(command, env_extra, port):
    """True when the master listens on `port` (then it is stopped), False when it exits
    first with a failure code."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLAGS_")}
    env.pop("PYTHONPATH", None)
    env.update(env_extra)
    p = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL,
                         stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if p.poll() is not None:
                assert p.returncode != 0, "exited 0 without serving"
                return False
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", port)) == 0:
                    return True
            time.sleep(0.05)
        raise AssertionError(f"{command}: neither started nor failed in 30 s")
    finally:
        if p.poll() is None:
            p.kill()
        p.wait(timeout=10)
        p.stderr.close()


@pytest.fixture(scope="module")
def flagfiles(tmp_path_factory):
    d = tmp_path_factory.mktemp("flags")
    for name, text in FLAGFILES.items():
        (d / name).write_text(text.format(dir=d))
    return d


@pytest.mark.parametrize("args,env_extra,expected", CASES,
                         ids=[" ".join(c[0]) + (" +env" if c[1] else "") for c in CASES])
def test_meta_flags_as_upstream(flagfiles, args, env_extra, expected):
    theirs = str(Path(upstream.bin_dir()) / "mooncake_master")
    args = [a.format(dir=flagfiles) for a in args]
    answers = {}
    for side, program in (("upstream", [theirs]), ("ours", [sys.executable, "-m", "mooncake.cli"])):
        rpc, metrics = free_port(), free_port()
        command = [*program, f"--rpc_port={rpc}", f"--metrics_port={metrics}", *args]
        answers[side] = starts(command, env_extra, rpc)
    assert answers == {"upstream": expected, "ours": expected}
