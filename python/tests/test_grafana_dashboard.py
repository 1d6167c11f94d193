"""The Grafana dashboard (`deploy/grafana/mooncake-dashboard.json`) names only metrics that
the binaries export: a real master and storage node are scraped, and every metric in every
panel query must be among the names their `/metrics` pages carry (`docs/master.md`,
"Grafana dashboard")."""

import json
import re
import urllib.request

from conftest import MIB, REPO, Node, free_port, make_store

DASHBOARD = REPO / "deploy" / "grafana" / "mooncake-dashboard.json"
# PromQL words that are not metric names.
PROMQL = {"rate", "irate", "increase", "sum", "avg", "max", "min", "by", "without",
          "histogram_quantile", "topk"}


def scrape(port):
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    names = set()
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            names.add(line.split()[2])
        elif line and not line.startswith("#"):
            names.add(re.split(r"[{ ]", line, maxsplit=1)[0])
    return names


def metric_names(expr):
    """Metric names in a PromQL expression: label matchers, ranges, groupings and strings
    removed, what is left that is not a PromQL word."""
    e = re.sub(r'"[^"]*"', "", expr)
    e = re.sub(r"\{[^}]*\}", "", e)
    e = re.sub(r"\[[^\]]*\]", "", e)
    e = re.sub(r"\b(by|without)\s*\([^)]*\)", "", e)
    return {t for t in re.findall(r"[A-Za-z_:][A-Za-z0-9_:]*", e) if t not in PROMQL}


def test_every_dashboard_metric_is_exported(master):
    dash = json.loads(DASHBOARD.read_text())
    exprs = [t["expr"] for p in dash["panels"] for t in p["targets"]]
    assert len(exprs) >= 20
    node_metrics = free_port()
    node = Node(master, 64 * MIB, extra=[f"--metrics_port={node_metrics}"])
    try:
        store = make_store(master, segment=0, local_buffer=16 * MIB)
        assert store.put("grafana-probe", b"x" * 4096) == 0
        assert store.get("grafana-probe") == b"x" * 4096
        exported = scrape(master.metrics_port) | scrape(node_metrics)
        store.close()
    finally:
        node.stop()
    used = set().union(*(metric_names(e) for e in exprs))
    assert used, exprs
    missing = sorted(used - exported)
    assert not missing, f"dashboard metrics not exported by the binaries: {missing}"
    # The panels cover the master and the storage node.
    assert any(n.startswith("master_") for n in used)
    assert any(n.startswith("mooncake_node_") for n in used)


def test_the_name_extractor_sees_through_promql():
    assert metric_names('rate(master_x_total{quantile="0.5"}[1m])') == {"master_x_total"}
    assert metric_names("sum by (instance) (rate(a_b[5m]))") == {"a_b"}
