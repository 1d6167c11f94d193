"""`mooncake.cli_bench`: the `transfer_engine_bench` console script, upstream's module name
for it.

`main()` runs this package's transfer-engine benchmark with the process's arguments and
returns its exit code (upstream's runs its `transfer_engine_bench` binary and returns that
exit code). The flags are upstream's (`--mode=initiator|target`, `--metadata_server`,
`--segment_id`, `--protocol`, `--operation=read|write`, `--block_size`, `--batch_size`,
`--duration`, `--threads`, ...; `--help` lists them): a target process registers memory, an
initiator reads or writes it and reports the throughput.
"""

import sys

from mooncake.cli import call

__all__ = ["main"]


def main():
    """Main entry point for the transfer_engine_bench command."""
    return call("transfer_engine_bench", "run_transfer_engine_bench")


if __name__ == "__main__":
    sys.exit(main())
