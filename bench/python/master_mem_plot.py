#!/usr/bin/env python3
"""PNG plot of `master_mem` results: master RSS against object count, one line per master.

  master_mem_plot.py OUT_PNG LABEL=RESULT_JSON [LABEL=RESULT_JSON ...]

Each RESULT_JSON is what `master_mem --json` wrote. The left panel is the RSS growth over the
empty master (GiB) against objects held, with the 160-byte-per-object line for reference;
the right one is the single `GetReplicaList` p99 at each count. Prints a Markdown table of
bytes per object and lookup latencies (for `bench/README.md`).
"""

import json
import sys

import matplotlib

matplotlib.use("Agg")  # no display
import matplotlib.pyplot as plt  # noqa: E402

TARGET_BYTES_PER_OBJECT = 160
COLORS = ["#1f6feb", "#d1242f", "#2da44e", "#8250df"]


def main():
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    out = sys.argv[1]
    runs = []
    for arg in sys.argv[2:]:
        label, path = arg.split("=", 1)
        with open(path) as f:
            runs.append((label, json.load(f)))
    fig, (mem, lat) = plt.subplots(1, 2, figsize=(11, 4.2))
    top = 0
    for (label, r), color in zip(runs, COLORS):
        xs = [row["objects"] / 1e6 for row in r["rows"]]
        ys = [(row["rss_bytes"] - r["base_rss_bytes"]) / (1 << 30) for row in r["rows"]]
        top = max(top, max(xs))
        mem.plot(xs, ys, marker="o", color=color, label=label)
        lat.plot(xs, [row["get_p99_us"] for row in r["rows"]], marker="o", color=color,
                 label=f"{label} GetReplicaList p99")
        lat.plot(xs, [row["exist128_p99_us"] for row in r["rows"]], marker="s",
                 linestyle="--", color=color, label=f"{label} BatchExistKey(128) p99")
    mem.plot([0, top], [0, top * 1e6 * TARGET_BYTES_PER_OBJECT / (1 << 30)], color="gray",
             linestyle=":", label=f"{TARGET_BYTES_PER_OBJECT} B/object")
    mem.set_xlabel("objects held (millions; 40-byte keys, 64-byte values)")
    mem.set_ylabel("master RSS growth (GiB)")
    mem.set_title("Master memory against objects held")
    mem.grid(alpha=0.3)
    mem.legend()
    lat.set_xlabel("objects held (millions)")
    lat.set_ylabel("latency p99 (µs, one call at a time)")
    lat.set_title("Lookup latency against objects held")
    lat.set_yscale("log")
    lat.grid(alpha=0.3)
    lat.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    print("| master | objects | RSS growth | bytes/object | GetReplicaList p50 / p99 | "
          "BatchExistKey(128) p50 / p99 |")
    print("|---|---|---|---|---|---|")
    for label, r in runs:
        for row in r["rows"]:
            growth = (row["rss_bytes"] - r["base_rss_bytes"]) / (1 << 20)
            print(f"| {label} | {row['objects']:,} | {growth:,.0f} MiB | "
                  f"{row['bytes_per_object']:.0f} | {row['get_p50_us']} / {row['get_p99_us']} µs"
                  f" | {row['exist128_p50_us']} / {row['exist128_p99_us']} µs |")


if __name__ == "__main__":
    main()
