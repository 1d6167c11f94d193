"""`mooncake.transfer_engine_topology_dump`: the `transfer_engine_topology_dump` console script.

Prints which devices the transfer engine would use from each NUMA node, as upstream's does:
`Local topology [<backend>/<mode>]: ` followed by `TransferEngine.get_local_topology()` in
jsoncpp's styled layout (tab indents; one `"cpu:<node>"` entry per NUMA node of
`/sys/devices/system/node`, each `[[preferred NICs], [other NICs]]`). This build has no RDMA
devices in its topology, so both lists are empty. The flags are upstream's: `--device-name`
(filter; no device matches here), `--backend auto|te|tent` (one engine here: `tent` prints
the same), `--use-custom-topo` (keeps `MC_CUSTOM_TOPO_JSON`; without it, exit 1, as
upstream) and `--custom-topo-json PATH`: a custom NIC priority matrix gives the NUMA entries,
each keeping only the devices that exist (none here), as upstream's engine loads it (a
missing or empty file falls back to discovery; text that is not JSON, or a malformed entry,
prints `{}`; JSON that is not an object is an error). Exit code 0, or 1 with `error: ...` on
stderr.
"""

import argparse
import json
import os
import sys

__all__ = ["parse_args", "resolve_backend", "apply_backend", "dump_te_topology",
           "dump_tent_topology", "styled_json", "main"]


def parse_args(argv=None):
    """Parse command line arguments (upstream's parser)."""
    parser = argparse.ArgumentParser(
        description=(
            "Dump device topology for classic Transfer Engine or TENT. "
            "By default clears custom topology overrides so the output "
            "reflects auto-discovery. Use --use-custom-topo or "
            "--custom-topo-json to load a custom NIC priority matrix instead. "
            "TENT backend prints native {nics,mems} JSON with rank0/1/2."
        ),
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument("--device-name", type=str, default="",
                        help=("Filter topology by IB device name(s), comma-separated. "
                              "Under TENT this maps to MC_TE_FILTERS."))
    parser.add_argument("--backend", choices=("auto", "te", "tent"), default="auto",
                        help=("Topology backend: te=classic Transfer Engine, tent=Mooncake "
                              "TENT, auto=follow MC_USE_TENT/MC_USE_TEV1"))
    parser.add_argument("--use-custom-topo", action="store_true",
                        help=("Keep existing MC_CUSTOM_TOPO_JSON / TENT topology overrides "
                              "(compare discover vs custom by running with and without this "
                              "flag)"))
    parser.add_argument("--custom-topo-json", type=str, default=None,
                        help=("Path to custom topology JSON; sets MC_CUSTOM_TOPO_JSON "
                              "(also honored by TENT as topology/custom_json_path)"))
    return parser.parse_args(argv)


def resolve_backend(backend: str) -> str:
    if backend == "auto":
        if os.environ.get("MC_USE_TENT") or os.environ.get("MC_USE_TEV1"):
            return "tent"
        return "te"
    return backend


def apply_backend(backend: str) -> None:
    if backend == "tent":
        os.environ.setdefault("MC_USE_TENT", "1")
    else:
        os.environ.pop("MC_USE_TENT", None)
        os.environ.pop("MC_USE_TEV1", None)


def styled_json(value) -> str:
    """`value` as jsoncpp's `Value::toStyledString()` writes it: tab indents, `" : "` after a
    key, keys sorted, every non-empty array and object across lines, a final newline."""
    out = []
    state = {"indent": "", "indented": True}

    def write_indent():
        out.append("\n" + state["indent"])

    def write_with_indent(text):
        if not state["indented"]:
            write_indent()
        out.append(text)
        state["indented"] = False

    def write_value(v):
        if isinstance(v, dict) and v:
            write_with_indent("{")
            state["indent"] += "\t"
            keys = sorted(v)
            for i, k in enumerate(keys):
                write_with_indent(json.dumps(str(k)))
                out.append(" : ")
                write_value(v[k])
                if i + 1 < len(keys):
                    out.append(",")
            state["indent"] = state["indent"][:-1]
            write_with_indent("}")
        elif isinstance(v, list) and v:
            write_with_indent("[")
            state["indent"] += "\t"
            for i, item in enumerate(v):
                if not state["indented"]:
                    write_indent()
                state["indented"] = True
                write_value(item)
                state["indented"] = False
                if i + 1 < len(v):
                    out.append(",")
            state["indent"] = state["indent"][:-1]
            write_with_indent("]")
        elif isinstance(v, dict):
            out.append("{}")
        elif isinstance(v, list):
            out.append("[]")
        else:
            out.append(json.dumps(v))

    write_value(value)
    return "".join(out) + "\n"


def _load_tent_conf_object(conf: str):
    if not conf:
        return None, False
    if os.path.isfile(conf):
        with open(conf, "r", encoding="utf-8") as f:
            return json.load(f), True
    try:
        return json.loads(conf), False
    except json.JSONDecodeError:
        return None, False


def _custom_matrix(discovered):
    """The NIC priority matrix of `MC_CUSTOM_TOPO_JSON` as the engine would take it, or None
    when unset or unreadable (upstream then discovers): its NUMA entries, each list keeping
    only devices that exist (here none: this build's topology has no RDMA devices)."""
    path = os.environ.get("MC_CUSTOM_TOPO_JSON", "")
    if not path:
        return None
    try:
        with open(path, "rb") as f:
            text = f.read().decode("utf-8", errors="replace")
    except OSError:
        return None
    # What upstream's engine makes of each kind of file (observed): an empty file is as none,
    # text that is not JSON gives an empty matrix, JSON that is not an object an error.
    if not text:
        return None
    try:
        matrix = json.loads(text)
    except ValueError:
        return {}
    if matrix is None:
        return {}
    if not isinstance(matrix, dict):
        raise RuntimeError("in Json::Value::getMemberNames(), value must be objectValue")
    if not all(isinstance(v, list) and len(v) == 2 and all(isinstance(x, list) for x in v)
               for v in matrix.values()):
        return {}  # a malformed entry: the whole matrix is refused
    present = {d for lists in discovered.values() for ds in lists for d in ds}
    return {k: [[d for d in ds if d in present] for ds in v] for k, v in matrix.items()}


def dump_te_topology(device_name: str) -> str:
    from mooncake.engine import TransferEngine

    engine = TransferEngine()
    discovered = json.loads(engine.get_local_topology(device_name=device_name or None))
    custom = _custom_matrix(discovered)
    return styled_json(discovered if custom is None else custom)


def dump_tent_topology(device_name: str) -> str:
    """Upstream prefers its `tent` module; there is none here, so this is the classic dump."""
    if device_name:
        os.environ["MC_TE_FILTERS"] = device_name
    return dump_te_topology(device_name)


def main():
    args = parse_args()
    os.environ["MC_LOG_LEVEL"] = "ERROR"

    backend = resolve_backend(args.backend)
    apply_backend(backend)

    if args.custom_topo_json is not None:
        os.environ["MC_CUSTOM_TOPO_JSON"] = args.custom_topo_json
        mode = f"custom ({args.custom_topo_json})"
    elif args.use_custom_topo:
        custom_path = os.environ.get("MC_CUSTOM_TOPO_JSON", "")
        has_inline = False
        if backend == "tent":
            data, _ = _load_tent_conf_object(os.environ.get("MC_TENT_CONF", ""))
            topo = data.get("topology") if isinstance(data, dict) else None
            has_inline = isinstance(topo, dict) and (
                "priority_matrix" in topo or "custom_json_path" in topo)
        if not custom_path and not has_inline:
            print("error: --use-custom-topo requires MC_CUSTOM_TOPO_JSON "
                  "or TENT topology/priority_matrix|custom_json_path in "
                  "MC_TENT_CONF", file=sys.stderr)
            return 1
        mode = (f"custom ({custom_path})" if custom_path
                else "custom (MC_TENT_CONF topology)")
    else:
        os.environ["MC_CUSTOM_TOPO_JSON"] = ""
        mode = "discover"

    try:
        if backend == "tent":
            topo = dump_tent_topology(args.device_name)
        else:
            topo = dump_te_topology(args.device_name)
        print(f"Local topology [{backend}/{mode}]: ", end="")
        print(topo)
        return 0
    except Exception as exc:  # noqa: BLE001  (upstream's contract: a message and exit 1)
        print(f"error: failed to dump topology: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
