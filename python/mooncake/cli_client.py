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

from mooncake.cli import call, without_ignored_flags

__all__ = ["main"]

def main():
    """Main entry point for the mooncake_client command."""
    try:
        args = without_ignored_flags(sys.argv[1:])
    except ValueError as e:
        print(f"mooncake_client: {e}", file=sys.stderr)
        return 2
    return call("mooncake_client", "run_client", args)


if __name__ == "__main__":
    sys.exit(main())
