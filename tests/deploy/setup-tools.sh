#!/usr/bin/env bash
# setup-tools.sh — install the container tooling the deploy test needs on a Debian machine without a
# Docker engine or registry: podman + runc (apt), podman-compose (PyPI, in its own venv), the podman
# config that selects runc, and a local stand-in for python:3.11-slim (shared/scripts/container-base.sh).
#
# Idempotent; a second run takes about a second. Must run as root (apt-get, rootful podman).
# Exit status: 0 = tools ready, 3 = tooling cannot be installed here (caller should SKIP), other = error.
#
# Environment (all optional):
#   SHARED           folder holding scripts/container-base.sh
#                    (default: <repo root>/../shared, repo root from `git rev-parse --show-toplevel`)
#   COMPOSE_VENV     venv for podman-compose (default /tmp/podman-compose-venv)
#   EXTRA_PACKAGES   passed to container-base.sh; default "" = no curl in the stand-in, like the real
#                    python:3.11-slim, so a Dockerfile that relies on curl fails here too
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(git -C "$here" rev-parse --show-toplevel 2>/dev/null || (cd "$here/../.." && pwd))
SHARED=${SHARED:-$repo/../shared}
COMPOSE_VENV=${COMPOSE_VENV:-/tmp/podman-compose-venv}
export EXTRA_PACKAGES=${EXTRA_PACKAGES-}

log() { printf '[setup-tools %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
unavailable() { log "UNAVAILABLE: $*"; exit 3; }

# A working Docker engine with the compose plugin needs nothing else.
if command -v docker >/dev/null 2>&1 && docker info >/dev/null 2>&1 && docker compose version >/dev/null 2>&1; then
  log "docker engine + docker compose available; nothing to install"
  exit 0
fi

# Everything already there (any user, e.g. rootless podman): nothing to install.
if command -v podman >/dev/null 2>&1 \
   && { [ -x "$COMPOSE_VENV/bin/podman-compose" ] || command -v podman-compose >/dev/null 2>&1; } \
   && podman image exists docker.io/library/python:3.11-slim 2>/dev/null \
   && timeout 120 podman run --rm --network none docker.io/library/python:3.11-slim python -c 'print("ok")' >/dev/null 2>&1
then
  log "tools ready: $(podman --version)"
  exit 0
fi

[ "$(id -u)" -eq 0 ] || unavailable "not root: cannot apt-get install podman/runc"
command -v apt-get >/dev/null 2>&1 || unavailable "no apt-get (not Debian/Ubuntu)"

t0=$(date +%s)
export DEBIAN_FRONTEND=noninteractive
missing=()
command -v podman >/dev/null 2>&1 || missing+=(podman)
command -v runc >/dev/null 2>&1 || missing+=(runc)
command -v debootstrap >/dev/null 2>&1 || missing+=(debootstrap)
python3 -c 'import ensurepip, venv' >/dev/null 2>&1 || missing+=(python3-venv)
if [ ${#missing[@]} -gt 0 ]; then
  log "apt-get install ${missing[*]}"
  timeout 300 apt-get update -qq || unavailable "apt-get update failed"
  timeout 600 apt-get install -y -qq "${missing[@]}" >/dev/null || unavailable "apt-get install ${missing[*]} failed"
fi

# podman config: crun cannot start containers on this VM class; runc can once the default ulimits go.
conf=${CONTAINERS_CONF:-/etc/containers/containers.conf}
if [ ! -e "$conf" ]; then
  log "writing $conf (runtime = runc, default_ulimits = [])"
  mkdir -p "$(dirname "$conf")"
  printf '[containers]\ndefault_ulimits = []\n\n[engine]\nruntime = "runc"\n' > "$conf"
fi

if [ ! -x "$COMPOSE_VENV/bin/podman-compose" ]; then
  log "installing podman-compose into $COMPOSE_VENV"
  # the venv's python must be a system one (a pyenv shim may vanish); prefer /usr/bin/python3
  py=/usr/bin/python3; [ -x "$py" ] || py=python3
  "$py" -m venv "$COMPOSE_VENV" && timeout 300 "$COMPOSE_VENV/bin/pip" install -q podman-compose \
    || unavailable "pip install podman-compose failed"
fi

if ! podman image exists docker.io/library/python:3.11-slim; then
  [ -x "$SHARED/scripts/container-base.sh" ] \
    || unavailable "no python:3.11-slim image and no $SHARED/scripts/container-base.sh to build a stand-in"
  log "building the python:3.11-slim stand-in with $SHARED/scripts/container-base.sh (~2 min)"
  timeout 900 "$SHARED/scripts/container-base.sh" || unavailable "container-base.sh failed"
fi

timeout 120 podman run --rm --network none docker.io/library/python:3.11-slim python -c 'print("ok")' >/dev/null \
  || unavailable "podman cannot run containers here"
log "tools ready in $(( $(date +%s) - t0 )) s: $(podman --version), $("$COMPOSE_VENV/bin/podman-compose" version 2>/dev/null | head -1)"
