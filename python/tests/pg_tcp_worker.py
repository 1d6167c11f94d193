"""One rank of a Mooncake PG group whose ranks pretend to be on different hosts (spawned by
test_pg_tcp.py; not collected by pytest).

usage: pg_tcp_worker.py SCENARIO RANK WORLD PORT      (as pg_worker.py)

``PG_HOST_IDS`` is a comma-separated host id per rank (e.g. "a,a,b"); this rank sets
``MC_PG_HOST_ID`` to its entry before torch builds the group, so ranks with different ids
link over TCP while equal ids share memory. The scenarios are pg_worker.py's, which check
every result against values computed in the process.
"""

import os
import sys

RANK = int(sys.argv[2])
os.environ["MC_PG_HOST_ID"] = "tcp-test-host-" + os.environ["PG_HOST_IDS"].split(",")[RANK]
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import pg_worker  # noqa: E402  (parses the same argv)

if __name__ == "__main__":
    pg_worker.SCENARIOS[pg_worker.SCENARIO]()
    print(f"OK {pg_worker.SCENARIO} {pg_worker.CHECKS}", flush=True)
    sys.stdout.flush()
    os._exit(0)
