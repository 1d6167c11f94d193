#!/usr/bin/env bash
# Proves README command 1 on a machine that has only Rust and Python 3: builds a minimal Debian
# root with debootstrap (plus Debian's python3), binds this machine's Rust toolchain into it
# read-only, clones the repository into it and runs `bash scripts/demo.sh` there.
#
# Why: CI runs on a machine that earlier work may have changed. A build prerequisite that is
# present only because someone installed it by hand (libprotobuf-dev once was) keeps the normal
# run green while a new user's first command fails. Inside the clean root nothing is installed
# but what scripts/setup.sh installs, so such a gap fails here.
#
# Needs root (debootstrap, chroot, mounts). Uses the Debian mirror and suites this machine's
# own apt configuration names; copies that configuration into the root as well.
# CLEAN_ROOT=DIR picks the folder (default: a fresh one under /var/tmp); KEEP_CLEAN_ROOT=1 keeps it.
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$PWD

log() { echo "[clean-root] $*"; }
die() {
  echo "[clean-root] error: $*" >&2
  exit 1
}

[ "$(id -u)" = 0 ] || die "needs root (debootstrap, chroot and bind mounts)"

export DEBIAN_FRONTEND=noninteractive
if ! command -v debootstrap >/dev/null 2>&1; then
  log "apt-get install debootstrap"
  apt-get install -y -q --no-install-recommends debootstrap >/dev/null
fi

# The suite and the mirror: this machine's own, read from its apt configuration.
. /etc/os-release
suite=${VERSION_CODENAME:?/etc/os-release names no VERSION_CODENAME}
mirror=$(
  {
    # deb822 stanzas: "URIs:" lines whose stanza lists the suite.
    cat /etc/apt/sources.list.d/*.sources 2>/dev/null | awk -v s="$suite" '
      /^URIs:/ { uri = $2 }
      /^Suites:/ { for (i = 2; i <= NF; i++) if ($i == s) print uri }' || true
    # one-line sources: "deb [opts] URI suite components".
    cat /etc/apt/sources.list /etc/apt/sources.list.d/*.list 2>/dev/null |
      awk -v s="$suite" '$1 == "deb" { for (i = 2; i <= NF; i++) if ($i == s) print $(i - 1) }' || true
  } | head -n 1
)
[ -n "$mirror" ] || die "no apt source for suite '$suite' in /etc/apt"

rustup_home=${RUSTUP_HOME:-$HOME/.rustup}
cargo_bin=$(dirname "$(command -v cargo)")
[ -d "$rustup_home/toolchains" ] || die "no Rust toolchain under $rustup_home"

root=${CLEAN_ROOT:-$(mktemp -d /var/tmp/mooncake-clean-root.XXXXXX)}
# mktemp makes the folder 0700; as the root's "/" it must let the unprivileged user in.
chmod 0755 "$root"
mounted=()
cleanup() {
  local i
  for ((i = ${#mounted[@]} - 1; i >= 0; i--)); do
    umount -l "${mounted[$i]}" 2>/dev/null || true
  done
  if [ "${KEEP_CLEAN_ROOT:-0}" != 1 ]; then
    rm -rf --one-file-system "$root"
  fi
}
trap cleanup EXIT
bind() { # bind SRC DST [ro]
  mkdir -p "$2"
  mount --bind "$1" "$2"
  mounted+=("$2")
  if [ "${3:-}" = ro ]; then mount -o remount,bind,ro "$2"; fi
}

t0=$SECONDS
if [ ! -x "$root/usr/bin/python3" ]; then
  log "debootstrap $suite (minbase + python3) into $root"
  debootstrap --variant=minbase --include=python3 "$suite" "$root" "$mirror" >"$root.debootstrap.log" 2>&1 ||
    {
      tail -n 20 "$root.debootstrap.log" >&2
      die "debootstrap failed"
    }
  rm -f "$root.debootstrap.log"
fi
# The same apt sources as this machine, so the root installs what a fresh machine would.
rm -f "$root/etc/apt/sources.list"
cp -a /etc/apt/sources.list.d/. "$root/etc/apt/sources.list.d/" 2>/dev/null || true
[ -f /etc/apt/sources.list ] && cp /etc/apt/sources.list "$root/etc/apt/sources.list"
cp -L /etc/resolv.conf "$root/etc/resolv.conf"
# This machine's network and trust settings (not the project's dependencies): apt options, a
# local certificate authority (picked up when setup installs ca-certificates), pip's config.
cp -a /etc/apt/apt.conf.d/. "$root/etc/apt/apt.conf.d/" 2>/dev/null || true
if [ -d /usr/local/share/ca-certificates ]; then
  mkdir -p "$root/usr/local/share/ca-certificates"
  cp -a /usr/local/share/ca-certificates/. "$root/usr/local/share/ca-certificates/"
fi
[ -f /etc/pip.conf ] && cp /etc/pip.conf "$root/etc/pip.conf"
passenv=()
while IFS= read -r name; do
  passenv+=("$name=${!name}")
done < <(compgen -e | grep -E '^(PIP_|SSL_CERT_|REQUESTS_CA_BUNDLE$|CURL_CA_BUNDLE$|CARGO_HTTP_|CARGO_NET_|CARGO_REGISTR|RUSTUP_AUTO_INSTALL$|https?_proxy$|HTTPS?_PROXY$|no_proxy$|NO_PROXY$)' || true)

bind /proc "$root/proc"
bind /sys "$root/sys" ro
bind /dev "$root/dev"
bind /dev/pts "$root/dev/pts"
mkdir -p "$root/dev/shm"
mount -t tmpfs tmpfs "$root/dev/shm"
mounted+=("$root/dev/shm")
# The toolchain, read-only: rustup's proxies and the toolchains they dispatch to.
bind "$rustup_home" "$root/opt/rustup" ro
bind "$cargo_bin" "$root/opt/cargo-bin" ro

log "cloning $(git rev-parse --short HEAD) into the root"
rm -rf "$root/src"
git clone -q --no-local "$repo" "$root/src"

in_root() {
  chroot "$root" /usr/bin/env -i \
    HOME=/root PATH=/opt/cargo-bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    RUSTUP_HOME=/opt/rustup CARGO_HOME=/root/.cargo TERM=dumb LANG=C.UTF-8 \
    RPC_PORT="${RPC_PORT:-50151}" META_PORT="${META_PORT:-8180}" ADMIN_PORT="${ADMIN_PORT:-9103}" \
    "${passenv[@]}" "$@"
}

# Not root and packages missing: setup must stop at once, with one line naming them.
if in_root /bin/bash -c 'dpkg-query -W libprotobuf-dev >/dev/null 2>&1'; then
  log "the root already has libprotobuf-dev: skipping the non-root check"
else
  log "scripts/setup.sh as a non-root user, packages missing: must stop naming them"
  set +e
  out=$(in_root setpriv --reuid=65534 --regid=65534 --clear-groups /bin/bash -c 'cd /src && bash scripts/setup.sh' 2>&1)
  rc=$?
  set -e
  echo "$out" | sed 's/^/    /'
  [ "$rc" -ne 0 ] || die "non-root setup with missing packages exited 0"
  echo "$out" | grep -q 'error: missing Debian package(s): .*libprotobuf-dev' ||
    die "non-root setup did not name the missing packages"
  [ "$(echo "$out" | wc -l)" -eq 1 ] || die "non-root setup said more than one line before stopping"
fi

log "bash scripts/demo.sh (README command 1) inside the root"
in_root /bin/bash -c 'cd /src && bash scripts/demo.sh'
log "ok: README command 1 works in a clean $suite root ($((SECONDS - t0)) s)"
