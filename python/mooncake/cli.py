"""Console scripts: each runs the native program in this process with the GIL released."""

import sys

from mooncake import _native


def call(name, attr, argv=None):
    """Runs the native program `attr` with `argv` (default: this process's arguments) and
    returns its exit code (130 after Ctrl-C, 2 when this build lacks it)."""
    fn = getattr(_native, attr, None)
    if fn is None:
        print(f"{name}: not built yet in this version of mooncake-rs", file=sys.stderr)
        return 2
    args = sys.argv[1:] if argv is None else list(argv)
    if not all(isinstance(a, str) for a in args):
        raise TypeError(f"{name}: every argument must be a str")
    try:
        return fn(args)
    except KeyboardInterrupt:
        return 130


def _run(name, attr):
    sys.exit(call(name, attr))


def master():
    """`mooncake_master`: the control-plane master (upstream's flags)."""
    _run("mooncake_master", "run_master")


def main():
    """`mooncake_master` (upstream's name for this entry point, `mooncake.cli:main`)."""
    master()


def http_metadata_server():
    """`mooncake_http_metadata_server`: the transfer-engine HTTP metadata store alone."""
    _run("mooncake_http_metadata_server", "run_http_metadata_server")


def client():
    """`mooncake_client`: a storage node contributing memory to the store."""
    _run("mooncake_client", "run_client")


def transfer_engine_bench():
    """`transfer_engine_bench`: the transfer-engine benchmark."""
    _run("transfer_engine_bench", "run_transfer_engine_bench")


if __name__ == "__main__":
    main()
