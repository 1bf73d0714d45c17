#!/usr/bin/env bash
# tests/deploy/run.sh — end-to-end test of the Dockerfile and docker-compose.yml, for real:
#
#   1. builds the images (server + nginx) with the compose file;
#   2. default profile: one server, built-in demo dataset; rows equal those of a local server run from this
#      checkout; non-root; /data read-only;
#   3. default profile with a dataset directory mounted (EPISERVE_DATA_DIR + EPISERVE_ROOTS=/data), bearer tokens set
#      through .env (the compose env_file), `episerve-server warm` run in the container;
#   4. profile `scale`: three replicas sharing one cache volume behind nginx; rows fetched through nginx many times
#      (the first round concurrently, on a cold cache) equal the local ones, every replica serves (X-Upstream),
#      the ETag is the same on every replica, and the cache volume holds exactly one segment per source parquet
#      file and no temporary file;
#   5. tears everything down (`down -v`), also on failure or interrupt.
#
# Works with Docker (engine + `docker compose`) or podman + podman-compose, auto-detected (DEPLOY_ENGINE=docker|podman
# forces one). Without usable tooling it runs tests/deploy/setup-tools.sh (podman, runc, podman-compose, a local
# python:3.11-slim stand-in; INSTALL_TOOLS=0 disables that); when that is impossible it prints a SKIP line and
# exits 0. Every wait is bounded; the whole run is capped at DEPLOY_TEST_TIMEOUT seconds (default 900).
#
# Environment (optional): PROJECT (compose project, default episerve-deploytest), PYTHON (a python with pyarrow and
# this repo's dependencies; default .venv/bin/python, else a throwaway venv), HEALTH_TIMEOUT (s, default 180),
# KEEP_IMAGES=0 to remove the test images afterwards, SHARED (see setup-tools.sh).
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(git -C "$here" rev-parse --show-toplevel 2>/dev/null || (cd "$here/../.." && pwd))
cd "$repo"

if [ -z "${_EPISERVE_DEPLOY_TEST_CAPPED:-}" ] && command -v timeout >/dev/null 2>&1; then
  export _EPISERVE_DEPLOY_TEST_CAPPED=1
  exec timeout -k 60 "${DEPLOY_TEST_TIMEOUT:-900}" bash "${BASH_SOURCE[0]}" "$@"
fi

# Hermetic: the stack is configured below, not by whatever EPISERVE_* the caller has exported.
while read -r name; do unset "$name"; done < <(compgen -e | grep -E '^(EPISERVE_|NGINX_PUBLISH_)' || true)

PROJECT=${PROJECT:-episerve-deploytest}
HEALTH_TIMEOUT=${HEALTH_TIMEOUT:-180}
INSTALL_TOOLS=${INSTALL_TOOLS:-1}
COMPOSE_VENV=${COMPOSE_VENV:-/tmp/podman-compose-venv}
TAG=deploytest
T0=$(date +%s)

log() { printf '[deploy-test %s +%3ss] %s\n' "$(date +%H:%M:%S)" "$(( $(date +%s) - T0 ))" "$*"; }
skip() { SKIPPED=1; echo "SKIP: tests/deploy/run.sh: $*"; exit 0; }
fail() { echo "FAIL: tests/deploy/run.sh: $*" >&2; exit 1; }

# ---- teardown, also on failure and interrupts -----------------------------------------------------------------
REF_PIDS=()
COMPOSE=()
SKIPPED=0
WORK=
project_containers() {
  "$ENGINE" ps -a -q --filter "label=com.docker.compose.project=$PROJECT" 2>/dev/null || true
}
remove_stack() {  # down -v; then force-remove whatever of this test project survived (e.g. a crash-looping server)
  timeout 120 "${COMPOSE[@]}" --profile scale down -v >/dev/null 2>&1
  local left; left=$(project_containers)
  [ -z "$left" ] || "$ENGINE" rm -f $left >/dev/null 2>&1
  "$ENGINE" volume rm -f "${PROJECT}_cache" >/dev/null 2>&1
  return 0
}
cleanup() {
  local rc=$?
  set +e
  if [ $rc -ne 0 ] && [ ${#COMPOSE[@]} -gt 0 ]; then
    for c in $(project_containers); do
      echo "---- logs of $("$ENGINE" inspect --format '{{.Name}}' "$c" 2>/dev/null) (last 40 lines)" >&2
      timeout 20 "$ENGINE" logs --tail 40 "$c" 2>&1 | grep -v -E 'systemd|syslog' >&2
    done
    for f in "${WORK:-/nonexistent}"/ref-*.log; do [ -e "$f" ] && { echo "---- $f" >&2; tail -20 "$f" >&2; }; done
  fi
  [ ${#COMPOSE[@]} -gt 0 ] && remove_stack
  for pid in "${REF_PIDS[@]}"; do kill "$pid" 2>/dev/null; done
  for pid in "${REF_PIDS[@]}"; do wait "$pid" 2>/dev/null; done
  if [ "${KEEP_IMAGES:-1}" = 0 ] && [ ${#COMPOSE[@]} -gt 0 ]; then
    "$ENGINE" rmi "episerve-server:$TAG" "episerve-nginx:$TAG" >/dev/null 2>&1
  fi
  [ -n "$WORK" ] && rm -rf "$WORK"
  if [ "$SKIPPED" = 1 ]; then :
  elif [ $rc -eq 0 ]; then log "PASS (deploy test took $(( $(date +%s) - T0 )) s)"
  else echo "FAIL: tests/deploy/run.sh (exit $rc after $(( $(date +%s) - T0 )) s)" >&2; fi
  exit $rc
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

WORK=$(mktemp -d "${TMPDIR:-/tmp}/episerve-deploytest.XXXXXX")
chmod 755 "$WORK"   # the server runs as uid 10001 in the container and must read the mounted datasets

# ---- container tooling -----------------------------------------------------------------------------------------
docker_ok() {
  command -v docker >/dev/null 2>&1 && timeout 20 docker info >/dev/null 2>&1 \
    && timeout 20 docker compose version >/dev/null 2>&1
}
podman_compose_bin() {
  if [ -x "$COMPOSE_VENV/bin/podman-compose" ]; then echo "$COMPOSE_VENV/bin/podman-compose"
  else command -v podman-compose 2>/dev/null || true; fi
}
setup_tools() {
  log "setting up podman tooling (tests/deploy/setup-tools.sh)"
  local rc=0
  COMPOSE_VENV=$COMPOSE_VENV "$here/setup-tools.sh" > "$WORK/setup-tools.log" 2>&1 || rc=$?
  if [ $rc -ne 0 ]; then
    tail -5 "$WORK/setup-tools.log" >&2
    skip "no container tooling could be installed or used here (setup-tools.sh exit $rc: $(grep -o 'UNAVAILABLE: .*' "$WORK/setup-tools.log" | tail -1))"
  fi
  tail -1 "$WORK/setup-tools.log"
}

ENGINE=${DEPLOY_ENGINE:-auto}
if [ "$ENGINE" = auto ]; then
  if docker_ok; then ENGINE=docker
  elif command -v podman >/dev/null 2>&1 || [ "$INSTALL_TOOLS" = 1 ]; then ENGINE=podman
  else skip "no usable container tooling (Docker engine + compose, or podman + podman-compose) and INSTALL_TOOLS=0"; fi
fi
case $ENGINE in
  docker)
    docker_ok || fail "DEPLOY_ENGINE=docker but no working Docker engine with the compose plugin"
    COMPOSE=(docker compose -p "$PROJECT" --env-file "$WORK/test.env" -f "$repo/docker-compose.yml") ;;
  podman)
    # idempotent, ~1 s when everything is there; builds the python:3.11-slim stand-in if missing
    [ "$INSTALL_TOOLS" != 1 ] || setup_tools
    command -v podman >/dev/null 2>&1 || skip "podman not found and INSTALL_TOOLS=0"
    timeout 60 podman info >/dev/null 2>&1 || skip "podman does not work here (podman info failed)"
    pc=$(podman_compose_bin); [ -n "$pc" ] || skip "podman-compose not found (INSTALL_TOOLS=1 installs it)"
    export BUILDAH_FORMAT=docker   # keep the Dockerfile's HEALTHCHECK (the OCI image format drops it)
    COMPOSE=("$pc" -p "$PROJECT" --env-file "$WORK/test.env" -f "$repo/docker-compose.yml") ;;
  *) fail "DEPLOY_ENGINE must be docker or podman, not $ENGINE" ;;
esac
log "engine: $ENGINE ($("$ENGINE" --version | head -1))"

# ---- python for the local reference run and the checks ---------------------------------------------------------
PY=${PYTHON:-}
if [ -z "$PY" ]; then
  if [ -x .venv/bin/python ] && .venv/bin/python -c 'import app.cli, pyarrow' >/dev/null 2>&1; then
    PY=.venv/bin/python
  else
    log "no usable .venv: installing this checkout into a throwaway venv"
    python3 -m venv "$WORK/venv"
    timeout 600 "$WORK/venv/bin/pip" install -q -c constraints.txt . || fail "pip install of the server failed"
    PY=$WORK/venv/bin/python
  fi
fi
check() { timeout 300 "$PY" "$here/compare.py" "$@"; }
free_port() { "$PY" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }

# ---- local reference: the same demo, and the same mounted dataset, served from this checkout -------------------
mkdir -p "$WORK/data/lerobot"
timeout 120 "$PY" -m app.cli demo --out "$WORK/demo-src" >/dev/null              # the default demo, as `serve` makes it
timeout 120 "$PY" -m app.cli demo --out "$WORK/data/lerobot/demo-v21" --format v2.1 --episodes 24 --seed 7 >/dev/null
chmod -R a+rX "$WORK/data"
REF_DEMO_PORT=$(free_port); REF_DATA_PORT=$(free_port)
(unset EPISERVE_ROOTS; exec "$PY" -m app.cli serve --cache-dir "$WORK/ref-cache-demo" --port "$REF_DEMO_PORT") \
  > "$WORK/ref-demo.log" 2>&1 & REF_PIDS+=($!)
"$PY" -m app.cli serve --root "$WORK/data" --cache-dir "$WORK/ref-cache-data" --port "$REF_DATA_PORT" \
  > "$WORK/ref-data.log" 2>&1 & REF_PIDS+=($!)
REF_DEMO=http://127.0.0.1:$REF_DEMO_PORT; REF_DATA=http://127.0.0.1:$REF_DATA_PORT
check wait "$REF_DEMO/readyz" --timeout 120
check wait "$REF_DATA/readyz" --timeout 120
check source --reference "$REF_DEMO" --dataset demo --source "$WORK/demo-src"   # serve's demo == `demo --out`
log "local reference servers up ($REF_DEMO: built-in demo, $REF_DATA: $WORK/data)"

# ---- compose configuration for the test (ports chosen free, the caller's .env ignored) ---------------------------
API_PORT=$(free_port); NGINX_PORT=$(free_port)
write_env() {  # extra KEY=VALUE lines are appended
  {
    echo "EPISERVE_IMAGE_TAG=$TAG"
    echo "EPISERVE_ENV_FILE=$WORK/test.env"
    echo "EPISERVE_PUBLISH_PORT=$API_PORT"
    echo "NGINX_PUBLISH_PORT=$NGINX_PORT"
    echo "EPISERVE_DATA_DIR=$WORK/data"
    printf '%s\n' "$@"
  } > "$WORK/test.env"
}
write_env

wait_healthy() {  # $1 = number of containers expected; all must report healthy within HEALTH_TIMEOUT
  local want=$1 end=$(( $(date +%s) + HEALTH_TIMEOUT )) ids healthy
  while :; do
    if [ "$ENGINE" = podman ]; then
      # no systemd here, so podman never runs healthchecks by itself: run them (container-testing.md §5)
      ids=$(podman ps -q --filter "label=com.docker.compose.project=$PROJECT" --filter health=starting
            podman ps -q --filter "label=com.docker.compose.project=$PROJECT" --filter health=unhealthy)
      for c in $ids; do timeout 30 podman healthcheck run "$c" >/dev/null 2>&1 || true; done
    fi
    healthy=0
    for c in $("$ENGINE" ps -q --filter "label=com.docker.compose.project=$PROJECT"); do
      [ "$("$ENGINE" inspect --format '{{if .State.Health}}{{.State.Health.Status}}{{end}}' "$c" 2>/dev/null)" = healthy ] \
        && healthy=$(( healthy + 1 ))
    done
    [ "$healthy" -ge "$want" ] && break
    if [ "$(date +%s)" -ge "$end" ]; then
      "$ENGINE" ps -a --filter "label=com.docker.compose.project=$PROJECT" --format '{{.Names}} {{.Status}}' >&2
      fail "$healthy of $want containers healthy after ${HEALTH_TIMEOUT} s"
    fi
    sleep 1
  done
  "$ENGINE" ps --filter "label=com.docker.compose.project=$PROJECT" --format '  {{.Names}}: {{.Status}}'
}
service_container() {
  "$ENGINE" ps -q --filter "label=com.docker.compose.project=$PROJECT" \
    --filter "label=com.docker.compose.service=$1" | head -1
}
datasets_at() {  # $1 = base URL, $2 = bearer token (optional)
  "$PY" -c 'import json, sys, urllib.request
request = urllib.request.Request(sys.argv[1] + "/datasets")
if len(sys.argv) > 2:
    request.add_header("Authorization", "Bearer " + sys.argv[2])
print(" ".join(d["id"] for d in json.load(urllib.request.urlopen(request, timeout=30))["datasets"]))' "$@"
}
up() { timeout 300 "${COMPOSE[@]}" "$@" up -d > "$WORK/up.log" 2>&1 || { cat "$WORK/up.log" >&2; fail "compose up $* failed"; }; }
down() { timeout 120 "${COMPOSE[@]}" --profile scale down -v > "$WORK/down.log" 2>&1 || { cat "$WORK/down.log" >&2; fail "compose down -v failed"; }; }

remove_stack   # leftovers of an interrupted earlier run

# ---- 1. build -------------------------------------------------------------------------------------------------------
t=$(date +%s)
timeout 900 "${COMPOSE[@]}" --profile scale build > "$WORK/build.log" 2>&1 \
  || { tail -40 "$WORK/build.log" >&2; fail "compose build failed"; }
image_size=$("$ENGINE" image inspect --format '{{.Size}}' "episerve-server:$TAG")
log "built episerve-server:$TAG ($(( image_size / 1000000 )) MB) and episerve-nginx:$TAG in $(( $(date +%s) - t )) s"

# ---- 2. default profile: one server, built-in demo -------------------------------------------------------------
up
wait_healthy 1
API=http://127.0.0.1:$API_PORT
check wait "$API/readyz" --timeout 60
[ "$(datasets_at "$API")" = demo ] || fail "default profile serves [$(datasets_at "$API")], expected the built-in demo only"
check rows --remote "$API" --reference "$REF_DEMO" --dataset demo --rounds 2
c=$(service_container episerve)
uid=$("$ENGINE" exec "$c" id -u); [ "$uid" != 0 ] || fail "the server runs as root"
if "$ENGINE" exec "$c" sh -c ': > /data/.write-test' 2>/dev/null; then fail "/data is writable in the container"; fi
if "$ENGINE" exec "$c" sh -c 'command -v curl' >/dev/null 2>&1; then
  log "note: this base image has curl (the real python:3.11-slim does not); the healthchecks use python"
fi
log "default profile OK (demo served as uid $uid, /data read-only)"
down

# ---- 3. default profile with a mounted dataset directory, bearer tokens from .env, `warm` ----------------------
TOKEN=deploy-test-$RANDOM$RANDOM
write_env "EPISERVE_ROOTS=/data" "EPISERVE_TOKENS=$TOKEN"
up
wait_healthy 1   # /healthz stays open with tokens configured
check wait "$API/readyz" --timeout 60
[ "$(datasets_at "$API" "$TOKEN")" = lerobot/demo-v21 ] \
  || fail "mounted data: serves [$(datasets_at "$API" "$TOKEN")], expected lerobot/demo-v21"
timeout 300 "$ENGINE" exec "$(service_container episerve)" episerve-server warm lerobot/demo-v21 > "$WORK/warm.log" 2>&1 \
  || { tail -20 "$WORK/warm.log" >&2; fail "episerve-server warm in the container failed"; }
check rows --remote "$API" --reference "$REF_DATA" --dataset lerobot/demo-v21 --rounds 2 --token "$TOKEN"
log "mounted dataset OK (EPISERVE_DATA_DIR + EPISERVE_ROOTS=/data read-only, EPISERVE_TOKENS via .env, warm)"
down
write_env

# ---- 4. profile scale: three replicas behind nginx, one shared cache -------------------------------------------
up --profile scale
wait_healthy 4
LB=http://127.0.0.1:$NGINX_PORT
check wait "$LB/readyz" --timeout 60
check rows --remote "$LB" --reference "$REF_DEMO" --dataset demo --rounds 6 --concurrency 6 --expect-upstreams 3
"$ENGINE" exec "$(service_container episerve-3)" python -c '
import json, os
root = "/cache"
print(json.dumps([[os.path.relpath(os.path.join(d, f), root), os.path.getsize(os.path.join(d, f))]
                  for d, _, files in os.walk(root) for f in files]))' > "$WORK/cache-listing.json"
check cache --listing "$WORK/cache-listing.json" --source "$WORK/demo-src"
log "scale profile OK (3 replicas behind nginx, one cache volume)"
down
if "$ENGINE" volume ls --format '{{.Name}}' | grep -q "^${PROJECT}_cache\$"; then fail "down -v left the cache volume"; fi
