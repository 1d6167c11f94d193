"""Console scripts: each runs the native program in this process with the GIL released."""

import sys

from mooncake import _native


def _run(name, attr):
    fn = getattr(_native, attr, None)
    if fn is None:
        print(f"{name}: not built yet in this version of mooncake-rs", file=sys.stderr)
        sys.exit(2)
    try:
        code = fn(sys.argv[1:])
    except KeyboardInterrupt:
        code = 130
    sys.exit(code)


def master():
    """`mooncake_master`: the control-plane master (upstream's flags)."""
    _run("mooncake_master", "run_master")


def http_metadata_server():
    """`mooncake_http_metadata_server`: the transfer-engine HTTP metadata store alone."""
    _run("mooncake_http_metadata_server", "run_http_metadata_server")


def client():
    """`mooncake_client`: a storage node contributing memory to the store."""
    _run("mooncake_client", "run_client")


def transfer_engine_bench():
    """`transfer_engine_bench`: the transfer-engine benchmark."""
    _run("transfer_engine_bench", "run_transfer_engine_bench")
