#!/usr/bin/env bash
# Installs what building, testing and running mooncake-rs needs on a fresh Debian machine with
# Rust and Python 3: Debian packages (when root), Rust components, cargo-fuzz (SETUP_FUZZ=1),
# and .venv/ at the repo root with the `mooncake` package and its console scripts
# (mooncake_master, mooncake_client, mooncake_http_metadata_server, transfer_engine_bench).
# WITH_TORCH=1 also installs torch (CPU use; from PyPI) for the tensor tests; WITH_BROWSER=1
# headless Chromium for the status page test; WITH_K8S_SCHEMAS=1 kubernetes-validate (the
# Kubernetes JSON schemas, offline) for the deployment manifests' test.
# Idempotent: a second run only checks and rebuilds what changed.
set -euo pipefail
cd "$(dirname "$0")/.."

# protobuf-compiler and libprotobuf-dev: the etcd-client crate's build runs protoc on etcd's
# .proto files, which import the well-known types (google/protobuf/*.proto); those live in
# libprotobuf-dev, which --no-install-recommends does not bring in with protoc.
# libibverbs1: the RDMA transport dlopens it at run time (no build dependency); installed so
# the tests exercise loading it and listing (no) devices (docs/rdma.md).
APT_PACKAGES=(ca-certificates curl pkg-config build-essential python3-venv etcd-server
  protobuf-compiler libprotobuf-dev iproute2 libibverbs1)
# WITH_BROWSER=1 (the test suite): headless Chromium for the status page's browser test
# (tests/tests/status_page.rs).
if [ "${WITH_BROWSER:-0}" = 1 ]; then
  APT_PACKAGES+=(chromium-headless-shell)
fi

log() { echo "[setup] $*"; }
die() {
  echo "[setup] error: $*" >&2
  exit 1
}

command -v cargo >/dev/null 2>&1 || die "no cargo on PATH: install Rust first (rustup)"
command -v python3 >/dev/null 2>&1 || die "no python3 on PATH: install Python 3 first"

installed() { dpkg-query -W -f='${Status}' "$1" 2>/dev/null | grep -q 'install ok installed'; }
missing=()
for p in "${APT_PACKAGES[@]}"; do
  installed "$p" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  [ "$(id -u)" = 0 ] ||
    die "missing Debian package(s): ${missing[*]} (run as root, or: sudo apt-get install ${missing[*]})"
  log "apt-get install ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  aptlog=$(mktemp)
  if ! { apt-get update -q && apt-get install -y -q --no-install-recommends "${missing[@]}"; } >"$aptlog" 2>&1; then
    tail -n 30 "$aptlog" >&2
    die "apt-get could not install: ${missing[*]} (full log: $aptlog)"
  fi
  rm -f "$aptlog"
  still=()
  for p in "${missing[@]}"; do installed "$p" || still+=("$p"); done
  [ ${#still[@]} -eq 0 ] || die "still missing after apt-get install: ${still[*]}"
fi

if command -v rustup >/dev/null 2>&1; then
  rustup component list --installed 2>/dev/null | grep -q '^rustfmt' || rustup component add rustfmt
  rustup component list --installed 2>/dev/null | grep -q '^clippy' || rustup component add clippy
fi

# cargo-fuzz compiles from source (a few minutes on 2 cores): in the background, while the
# Python packages below download and unpack, and waited for at the end.
fuzz_pid=
if [ "${SETUP_FUZZ:-0}" = 1 ] && ! cargo fuzz --version >/dev/null 2>&1; then
  log "cargo install cargo-fuzz (in the background)"
  fuzz_log=$(mktemp)
  cargo install cargo-fuzz --locked >"$fuzz_log" 2>&1 &
  fuzz_pid=$!
fi

if [ ! -x .venv/bin/python ]; then
  log "creating .venv"
  python3 -m venv .venv
fi
PIP=(.venv/bin/python -m pip install -q --disable-pip-version-check)
# mypy: python/tests/test_stubs.py checks mooncake/_native.pyi against the built module (stubtest).
# aiohttp and msgpack are the package's own dependencies (python/pyproject.toml), installed
# here too so the --no-build-isolation install below finds them in place. pyzmq:
# python/tests/test_kv_events.py subscribes to the master's KV-cache events as a router does.
PIP_PACKAGES=("maturin>=1.5,<2" pytest numpy mypy aiohttp "msgpack>=1.0" pyzmq)
# WITH_K8S_SCHEMAS=1 (the test suite): python/tests/test_deploy_manifests.py validates
# deploy/k8s against the schemas this package bundles, and test_dropin_structured.py stores
# PIL images (Pillow; the package itself does not need it).
if [ "${WITH_K8S_SCHEMAS:-0}" = 1 ]; then
  PIP_PACKAGES+=(kubernetes-validate pillow)
fi
"${PIP[@]}" "${PIP_PACKAGES[@]}"
if [ "${WITH_TORCH:-0}" = 1 ]; then
  .venv/bin/python -c "import torch" 2>/dev/null || { log "pip install torch"; "${PIP[@]}" torch; }
fi
log "building and installing the mooncake package (release)"
PATH="$PWD/.venv/bin:$PATH" "${PIP[@]}" --no-build-isolation ./python
log "ok: $(.venv/bin/python -c 'import mooncake.store as s; print(s.__name__)') and console scripts in .venv/bin"
if [ -n "$fuzz_pid" ]; then
  wait "$fuzz_pid" || {
    tail -n 30 "$fuzz_log" >&2
    die "cargo install cargo-fuzz failed (full log: $fuzz_log)"
  }
  rm -f "$fuzz_log"
  log "ok: $(cargo fuzz --version)"
fi
