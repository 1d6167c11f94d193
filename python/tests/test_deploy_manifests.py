"""The deployment files in deploy/ against what they drive.

- Every Kubernetes manifest in deploy/k8s validates against the JSON schemas of a recent
  Kubernetes (strict: an unknown field, e.g. a typo, is an error), through the PyPI package
  kubernetes-validate, which bundles the schemas and needs no network.
- Every `--flag` that a manifest, a systemd unit or a command in docs/deploy.md passes to
  mooncake_master, mooncake_client or mooncake_tune is one that binary lists in its `--help`.

The schemas need kubernetes-validate (scripts/setup.sh installs it with WITH_K8S_SCHEMAS=1,
which scripts/test.sh sets); without it that test skips, unless WITH_K8S_SCHEMAS=1 says it
must be there. The flag test needs the binaries (the installed console scripts, else
target/release or target/debug).
"""

import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

# PyYAML comes with kubernetes-validate; the suite's base install does not have it.
if os.environ.get("WITH_K8S_SCHEMAS") == "1":
    import yaml
else:
    yaml = pytest.importorskip("yaml")

REPO = Path(__file__).resolve().parents[2]
K8S = REPO / "deploy" / "k8s"
SYSTEMD = REPO / "deploy" / "systemd"
GUIDE = REPO / "docs" / "deploy.md"
# A recent minor still in wide use (kubernetes-validate 1.37 bundles schemas up to 1.37); the
# manifests use nothing newer.
KUBERNETES_VERSION = "1.35.0"
BINARIES = ("mooncake_master", "mooncake_client", "mooncake_tune")


def manifests():
    files = sorted(K8S.glob("*.yaml"))
    assert files, f"no manifests in {K8S}"
    return files


def documents(path):
    return [d for d in yaml.safe_load_all(path.read_text()) if d is not None]


def test_manifests_match_the_kubernetes_schemas():
    if os.environ.get("WITH_K8S_SCHEMAS") == "1":
        import kubernetes_validate
    else:
        kubernetes_validate = pytest.importorskip("kubernetes_validate")
    kinds = set()
    for path in manifests():
        for doc in documents(path):
            try:
                kubernetes_validate.validate(doc, KUBERNETES_VERSION, strict=True)
            except kubernetes_validate.ValidationError as e:
                where = "/".join(str(p) for p in e.path)
                name = f"{doc['kind']}/{doc['metadata']['name']}"
                pytest.fail(f"{path.name}: {name}: {where}: {e.message}")
            kinds.add(doc["kind"])
    # What docs/deploy.md promises is there.
    assert {"StatefulSet", "DaemonSet", "Service"} <= kinds, kinds


def test_the_validator_rejects_a_broken_manifest():
    """The schema check can fail: a misspelt field and a wrong type are caught."""
    kubernetes_validate = pytest.importorskip("kubernetes_validate")
    doc = documents(K8S / "30-node.yaml")[0]
    doc["spec"]["template"]["spec"]["hostNetwrok"] = True
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(doc, KUBERNETES_VERSION, strict=True)
    doc = documents(K8S / "20-master.yaml")[1]
    doc["spec"]["replicas"] = "three"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(doc, KUBERNETES_VERSION, strict=True)


def binary(name):
    """The installed console script, else a cargo-built binary; None if there is none."""
    for cand in (Path(sys.executable).parent / name, shutil.which(name)):
        if cand and Path(cand).exists():
            return str(cand)
    for profile in ("release", "debug"):
        built = REPO / "target" / profile / name
        if built.exists():
            return str(built)
    return None


def accepted_flags(name):
    """The flags `name --help` lists (for mooncake_master the honoured and the accepted ones)."""
    path = binary(name)
    if path is None:
        pytest.skip(f"{name} not found: install the package or cargo build --workspace --bins")
    out = subprocess.run([path, "--help"], capture_output=True, text=True, timeout=30)
    text = out.stdout + out.stderr
    flags = set(re.findall(r"--([a-z][a-z0-9_-]*)", text))
    assert flags, f"{name} --help listed no flags:\n{text}"
    return flags


def commands_in_systemd(path):
    """The argument vectors of the Exec* lines of a unit (continuations joined)."""
    text = path.read_text().replace("\\\n", " ")
    out = []
    for line in text.splitlines():
        m = re.match(r"\s*Exec\w+=\s*(.*)", line)
        if m:
            # Drop systemd's command prefixes (-, +, !, @, :).
            out.append(shlex.split(m.group(1).lstrip("-+!@:")))
    return out


def commands_in_manifest(path):
    out = []

    def walk(node):
        if isinstance(node, dict):
            if "command" in node and isinstance(node["command"], list):
                argv = [str(a) for a in node["command"] + node.get("args", [])]
                # `sh -c "..."`: the shell line is the command.
                if len(argv) >= 3 and argv[1] == "-c":
                    argv = shlex.split(argv[2])
                out.append(argv)
            for v in node.values():
                walk(v)
        elif isinstance(node, list):
            for v in node:
                walk(v)

    for doc in documents(path):
        walk(doc)
    return out


def commands_in_guide():
    """Command lines inside the guide's sh/bash code blocks (continuations joined)."""
    out = []
    lang = None  # inside a fence: its language; outside: None
    block = []
    for line in GUIDE.read_text().splitlines():
        if line.startswith("```"):
            if lang is None:
                lang = line[3:].strip()
                block = []
                continue
            if lang in ("sh", "bash"):
                for cmd in "\n".join(block).replace("\\\n", " ").splitlines():
                    if any(b in cmd for b in BINARIES):
                        out.append(shlex.split(cmd, comments=True))
            lang = None
        elif lang is not None:
            block.append(line)
    return out


def flags_used():
    """(where, binary, flag) for every --flag passed to one of ours."""
    sources = [(p.name, commands_in_manifest(p)) for p in manifests()]
    sources += [(p.name, commands_in_systemd(p)) for p in sorted(SYSTEMD.glob("*.service"))]
    if GUIDE.exists():
        sources.append((GUIDE.name, commands_in_guide()))
    used = []
    for where, argvs in sources:
        for argv in argvs:
            current = None
            for word in argv:
                base = os.path.basename(word)
                if base in BINARIES:
                    current = base
                elif current and word.startswith("--"):
                    used.append((where, current, word[2:].split("=", 1)[0]))
                elif word in ("|", "||", "&&", ";"):
                    current = None
    return used


def test_every_flag_in_the_deployment_files_is_accepted():
    used = flags_used()
    seen = {b for _, b, _ in used}
    # Each binary appears somewhere, so a parser that finds nothing fails here.
    assert seen == set(BINARIES), f"commands found for {seen} only"
    accepted = {b: accepted_flags(b) for b in BINARIES}
    bad = [f"{where}: {b} --{f}" for where, b, f in used if f not in accepted[b]]
    assert not bad, "flags the binaries do not accept:\n" + "\n".join(bad)


def test_the_flag_check_can_fail():
    assert "no_such_flag" not in accepted_flags("mooncake_client")
    assert "hugepages" in accepted_flags("mooncake_tune")
    assert "enable_ha" in accepted_flags("mooncake_master")
