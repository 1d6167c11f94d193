#!/usr/bin/env python3
"""PNG plots of a `sweep_bench.py` result, ours beside upstream (`bench/plots.sh` runs both).

  plots.py SWEEP_JSON OUT_DIR

Writes into OUT_DIR:
- `throughput_vs_size.png`: put and get MiB/s against value size (log axes);
- `latency_percentiles_<size>.png` for 4 KiB, 1 MiB and 16 MiB: latency against percentile,
  drawn as HdrHistogram plots are (x is 1/(1-p), so the tail is spread out; log y);
- `latency_p50_p99_vs_size.png`: p50 and p99 latency against value size;
and prints a Markdown table of the figures (for `bench/README.md`).
"""

import json
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # no display
import matplotlib.pyplot as plt  # noqa: E402

STYLE = {
    ("ours", "put"): dict(color="#1f6feb", linestyle="-", marker="o"),
    ("ours", "get"): dict(color="#1f6feb", linestyle="--", marker="s"),
    ("upstream", "put"): dict(color="#d1242f", linestyle="-", marker="o"),
    ("upstream", "get"): dict(color="#d1242f", linestyle="--", marker="s"),
}
LABEL = {"ours": "mooncake-rs", "upstream": "upstream 0.3.13 (TCP)"}


def human(size):
    size = int(size)
    for unit, n in (("MiB", 1 << 20), ("KiB", 1 << 10)):
        if size >= n:
            return f"{size // n} {unit}"
    return f"{size} B"


def impls(r):
    return [k for k in ("ours", "upstream") if r.get(k)]


def throughput(r, out, subtitle):
    fig, ax = plt.subplots(figsize=(8, 5))
    for impl in impls(r):
        sizes = sorted(int(s) for s in r[impl])
        for d in ("put", "get"):
            ys = [r[impl][str(s)][d]["mib_s"] for s in sizes]
            ax.plot(sizes, ys, label=f"{LABEL[impl]} {d}", **STYLE[(impl, d)])
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xticks(sorted(int(s) for s in r[impls(r)[0]]))
    ax.set_xticklabels([human(s) for s in sorted(int(s) for s in r[impls(r)[0]])])
    ax.set_xlabel("value size")
    ax.set_ylabel("MiB/s (one client, calls one after another)")
    ax.set_title(f"Store throughput against value size\n{subtitle}", fontsize=10)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(out / "throughput_vs_size.png", dpi=110)
    plt.close(fig)


def percentiles(r, size, out, subtitle):
    fig, ax = plt.subplots(figsize=(8, 5))
    ticks = None
    for impl in impls(r):
        if str(size) not in r[impl]:
            continue
        for d in ("put", "get"):
            pct = r[impl][str(size)][d]["pct_us"]
            qs = sorted(pct, key=float)
            xs = [1.0 / (1.0 - float(q) / 100.0) for q in qs]
            ax.plot(xs, [pct[q] for q in qs], label=f"{LABEL[impl]} {d}", **STYLE[(impl, d)])
            ticks = (xs, [f"p{q}" for q in qs])
    ax.set_xscale("log")
    ax.set_yscale("log")
    if ticks:
        keep = [(x, t) for x, t in zip(*ticks) if t in ("p0", "p50", "p90", "p99", "p99.9", "p99.99")]
        ax.set_xticks([x for x, _ in keep])
        ax.set_xticklabels([t for _, t in keep])
    ax.set_xlabel("percentile")
    ax.set_ylabel("latency (µs)")
    ax.set_title(f"Latency percentiles, {human(size)} values\n{subtitle}", fontsize=10)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(out / f"latency_percentiles_{human(size).replace(' ', '')}.png", dpi=110)
    plt.close(fig)


def p50_p99(r, out, subtitle):
    fig, ax = plt.subplots(figsize=(8, 5))
    for impl in impls(r):
        sizes = sorted(int(s) for s in r[impl])
        for d in ("put", "get"):
            st = STYLE[(impl, d)]
            p50 = [r[impl][str(s)][d]["pct_us"]["50"] for s in sizes]
            p99 = [r[impl][str(s)][d]["pct_us"]["99"] for s in sizes]
            ax.plot(sizes, p50, label=f"{LABEL[impl]} {d} p50", **st)
            ax.plot(sizes, p99, label=f"{LABEL[impl]} {d} p99", alpha=0.45, **st)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    sizes = sorted(int(s) for s in r[impls(r)[0]])
    ax.set_xticks(sizes)
    ax.set_xticklabels([human(s) for s in sizes])
    ax.set_xlabel("value size")
    ax.set_ylabel("latency (µs)")
    ax.set_title(f"p50 and p99 latency against value size\n{subtitle}", fontsize=10)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8, ncol=2)
    fig.tight_layout()
    fig.savefig(out / "latency_p50_p99_vs_size.png", dpi=110)
    plt.close(fig)


def table(r):
    rows = ["| size | op | ours MiB/s | upstream MiB/s | ours p50 / p99 µs | upstream p50 / p99 µs |",
            "|---|---|---|---|---|---|"]
    ours, up = r.get("ours") or {}, r.get("upstream") or {}
    for s in sorted((int(x) for x in ours), key=int):
        for d in ("put", "get"):
            o = ours[str(s)][d]
            u = up.get(str(s), {}).get(d)
            ut = f"{u['mib_s']:.0f}" if u else "n/a"
            ul = f"{u['pct_us']['50']:.0f} / {u['pct_us']['99']:.0f}" if u else "n/a"
            rows.append(f"| {human(s)} | {d} | {o['mib_s']:.0f} | {ut} | "
                        f"{o['pct_us']['50']:.0f} / {o['pct_us']['99']:.0f} | {ul} |")
    return "\n".join(rows)


def main():
    if len(sys.argv) != 3:
        raise SystemExit(__doc__)
    r = json.loads(Path(sys.argv[1]).read_text())
    out = Path(sys.argv[2])
    out.mkdir(parents=True, exist_ok=True)
    if not r.get("ours"):
        raise SystemExit(f"no result for ours in {sys.argv[1]} (see the logs it names)")
    subtitle = f"1 client, 1 storage node, 127.0.0.1; median of {r['runs']} run(s); {r['machine']}"
    throughput(r, out, subtitle)
    for size in (4096, 1 << 20, 16 << 20):
        percentiles(r, size, out, subtitle)
    p50_p99(r, out, subtitle)
    print(table(r))
    print(f"\nplots in {out}", file=sys.stderr)


if __name__ == "__main__":
    main()
