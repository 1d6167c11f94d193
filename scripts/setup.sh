#!/usr/bin/env bash
# Installs what building and testing mooncake-rs needs on a fresh Debian machine with Rust and
# Python 3: Debian packages (when root), Rust components and cargo tools, and .venv/ at the
# repo root. Idempotent: a second run only checks.
set -euo pipefail
cd "$(dirname "$0")/.."

APT_PACKAGES=(ca-certificates curl pkg-config build-essential)

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
    log "missing Debian packages (run as root to install): ${missing[*]}"
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
log "ok"
