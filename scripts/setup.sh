#!/usr/bin/env bash
# Installs what building, testing and running mooncake-rs needs on a fresh Debian machine with
# Rust and Python 3: Debian packages (when root), Rust components, cargo-fuzz (SETUP_FUZZ=1),
# and .venv/ at the repo root with the `mooncake` package and its console scripts
# (mooncake_master, mooncake_client, mooncake_http_metadata_server, transfer_engine_bench).
# WITH_TORCH=1 also installs torch (CPU use; from PyPI) for the tensor tests.
# Idempotent: a second run only checks and rebuilds what changed.
set -euo pipefail
cd "$(dirname "$0")/.."

# protobuf-compiler and libprotobuf-dev: the etcd-client crate's build runs protoc on etcd's
# .proto files, which import the well-known types (google/protobuf/*.proto); those live in
# libprotobuf-dev, which --no-install-recommends does not bring in with protoc.
APT_PACKAGES=(ca-certificates curl pkg-config build-essential python3-venv etcd-server
  protobuf-compiler libprotobuf-dev iproute2)

log() { echo "[setup] $*"; }

missing=()
for p in "${APT_PACKAGES[@]}"; do
  dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  if [ "$(id -u)" = 0 ]; then
    log "apt-get install ${missing[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -q
    apt-get install -y -q --no-install-recommends "${missing[@]}"
  else
    echo "[setup] error: missing Debian package(s): ${missing[*]} (run as root, or: sudo apt-get install ${missing[*]})" >&2
    exit 1
  fi
fi

if command -v rustup >/dev/null 2>&1; then
  rustup component list --installed 2>/dev/null | grep -q '^rustfmt' || rustup component add rustfmt
  rustup component list --installed 2>/dev/null | grep -q '^clippy' || rustup component add clippy
fi

if [ "${SETUP_FUZZ:-0}" = 1 ] && ! cargo fuzz --version >/dev/null 2>&1; then
  log "cargo install cargo-fuzz"
  cargo install cargo-fuzz --locked
fi

if [ ! -x .venv/bin/python ]; then
  log "creating .venv"
  python3 -m venv .venv
fi
PIP=(.venv/bin/python -m pip install -q --disable-pip-version-check)
"${PIP[@]}" "maturin>=1.5,<2" pytest numpy
if [ "${WITH_TORCH:-0}" = 1 ]; then
  .venv/bin/python -c "import torch" 2>/dev/null || { log "pip install torch"; "${PIP[@]}" torch; }
fi
log "building and installing the mooncake package (release)"
PATH="$PWD/.venv/bin:$PATH" "${PIP[@]}" --no-build-isolation ./python
log "ok: $(.venv/bin/python -c 'import mooncake.store as s; print(s.__name__)') and console scripts in .venv/bin"
