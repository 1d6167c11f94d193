"""`mooncake.cli_client`: the `mooncake_client` console script, upstream's module name for it.

`main()` runs this package's storage node (`mooncake_client`: contributes memory to the
store and serves it, with upstream's flags such as `--master_server_address`,
`--global_segment_size`, `--metadata_server`, `--protocol`, `--port`, `--host`) with the
process's arguments, in this process (same process id, as upstream's `execv` of its binary
keeps it), and returns its exit code: 0 after SIGINT or SIGTERM, non-zero on a bad flag or
a failed start. Upstream's `--use_mmap_arena_allocator` and `--mmap_arena_pool_size` (how
its mmap buffers are allocated) are accepted and have no effect here.
"""

import sys

from mooncake.cli import call

__all__ = ["main"]

# Upstream's allocator tuning flags for its mmap buffers: this node's memory is allocated
# otherwise, so they are accepted (values checked as gflags checks them) and have no effect.
_IGNORED_BOOL = {"use_mmap_arena_allocator"}
_IGNORED_UINT64 = {"mmap_arena_pool_size"}
_GFLAGS_TRUE = {"true", "t", "yes", "y", "1"}
_GFLAGS_FALSE = {"false", "f", "no", "n", "0"}


def _without_ignored(args):
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


def main():
    """Main entry point for the mooncake_client command."""
    try:
        args = _without_ignored(sys.argv[1:])
    except ValueError as e:
        print(f"mooncake_client: {e}", file=sys.stderr)
        return 2
    return call("mooncake_client", "run_client", args)


if __name__ == "__main__":
    sys.exit(main())
