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


# Upstream's allocator tuning flags for its mmap buffers (`mooncake_master` and
# `mooncake_client` both have them): our memory is allocated otherwise, so they are accepted
# (values checked as gflags checks them) and have no effect.
_IGNORED_BOOL = {"use_mmap_arena_allocator"}
_IGNORED_UINT64 = {"mmap_arena_pool_size"}
_GFLAGS_TRUE = {"true", "t", "yes", "y", "1"}
_GFLAGS_FALSE = {"false", "f", "no", "n", "0"}


def without_ignored_flags(args):
    """`args` less upstream's flags that do not apply here; raises ValueError on a bad value."""
    out = []
    i = 0
    while i < len(args):
        arg = args[i]
        i += 1
        name, eq, value = arg.lstrip("-").partition("=")
        if not arg.startswith("-") or name not in _IGNORED_BOOL | _IGNORED_UINT64:
            out.append(arg)
            continue
        if name in _IGNORED_BOOL:
            if eq and value.lower() not in _GFLAGS_TRUE | _GFLAGS_FALSE:
                raise ValueError(f"invalid value for --{name}: {value!r} (a bool)")
            continue
        if not eq:
            if i >= len(args):
                raise ValueError(f"--{name} needs a value")
            value, i = args[i], i + 1
        if not value.isdigit() or int(value) >= 1 << 64:
            raise ValueError(f"invalid value for --{name}: {value!r} (an unsigned integer)")
    return out


def _run(name, attr):
    sys.exit(call(name, attr))


def master():
    """`mooncake_master`: the control-plane master (upstream's flags; its mmap arena
    allocator flags are accepted and have no effect)."""
    try:
        args = without_ignored_flags(sys.argv[1:])
    except ValueError as e:
        print(f"mooncake_master: {e}", file=sys.stderr)
        sys.exit(2)
    sys.exit(call("mooncake_master", "run_master", args))


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
