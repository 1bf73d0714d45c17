#!/usr/bin/env bash
# tests/wheels/run.sh — the two wheels as a user gets them, with no source tree beside them:
#
#   1. `python -m build` makes an sdist and, from it, a wheel of the server (app/, the viewer's libraries inside)
#      and of the client (client/);
#   2. a fresh venv in a temporary directory gets both wheels (pinned by constraints.txt), and every check runs
#      from that directory: the packages import from the venv, and the server's wheel holds the viewer's files;
#   3. `episerve-server serve` from the venv serves the built-in demo;
#   4. /ui/ renders an episode in Chromium (Playwright from the test environment drives Debian's chromium; a SKIP
#      line where either is missing);
#   5. the client wheel reads rows from that server.
#
# Environment (optional): PYTHON (the interpreter of the fresh venv, default python3), TEST_PYTHON (a python with
# `build` and Playwright, default .venv/bin/python), WHEELS_TEST_TIMEOUT (s, default 600), KEEP=1 keeps the
# temporary directory (the server's log and the viewer's screenshot are there).
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/../.." && pwd)
cd "$repo"

if [ -z "${_EPISERVE_WHEELS_TEST_CAPPED:-}" ] && command -v timeout >/dev/null 2>&1; then
  export _EPISERVE_WHEELS_TEST_CAPPED=1
  exec timeout -k 30 "${WHEELS_TEST_TIMEOUT:-600}" bash "${BASH_SOURCE[0]}" "$@"
fi
while read -r name; do unset "$name"; done < <(compgen -e | grep -E '^EPISERVE_' || true)

PYTHON=${PYTHON:-python3}
TEST_PYTHON=${TEST_PYTHON:-$repo/.venv/bin/python}
T0=$(date +%s)
PASSED=0
SKIPPED=0
log() { printf '[wheels %s +%3ss] %s\n' "$(date +%H:%M:%S)" "$(( $(date +%s) - T0 ))" "$*"; }
pass() { PASSED=$(( PASSED + 1 )); log "ok: $*"; }
fail() { echo "FAIL: tests/wheels/run.sh: $*" >&2; echo "wheels: $PASSED passed, 1 failed"; exit 1; }

WORK=$(mktemp -d "${TMPDIR:-/tmp}/episerve-wheels.XXXXXX")
SERVER_PID=
cleanup() {
  if [ -n "$SERVER_PID" ]; then
    kill -TERM -- "-$SERVER_PID" 2>/dev/null || true
    for _ in $(seq 50); do kill -0 "$SERVER_PID" 2>/dev/null || break; sleep 0.2; done
    kill -KILL -- "-$SERVER_PID" 2>/dev/null || true
  fi
  if [ "${KEEP:-0}" = 1 ]; then log "kept $WORK"; else rm -rf "$WORK"; fi
}
trap cleanup EXIT

# ---- 1. build ----------------------------------------------------------------------------------------------------
[ -x "$TEST_PYTHON" ] || fail "no test environment at $TEST_PYTHON (make venv)"
"$TEST_PYTHON" -m build --version >/dev/null 2>&1 || fail "$TEST_PYTHON has no 'build' (make venv)"
for project in . client; do
  "$TEST_PYTHON" -m build --outdir "$WORK/dist" "$project" > "$WORK/build.log" 2>&1 \
    || { tail -30 "$WORK/build.log" >&2; fail "python -m build $project failed"; }
done
server_wheel=$(ls "$WORK"/dist/episerve_server-*.whl)
client_wheel=$(ls "$WORK"/dist/episerve-*.whl)
pass "built $(cd "$WORK/dist" && ls | tr '\n' ' ')"

# ---- 2. install into a fresh venv, away from the source tree ----------------------------------------------------
cp constraints.txt "$WORK/constraints.txt"
cp "$here/check.py" "$WORK/check.py"
cd "$WORK"
"$PYTHON" -m venv venv
venv/bin/pip install -q -c constraints.txt "$server_wheel" "$client_wheel" > install.log 2>&1 \
  || { tail -30 install.log >&2; fail "pip install of the wheels failed"; }
site=$(venv/bin/python -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
venv/bin/python check.py installed "$site" || fail "the installed wheels are not what they should be"
pass "installed both wheels into a fresh venv ($(du -sm venv | cut -f1) MB), the viewer's libraries inside"

# ---- 3. serve the demo -------------------------------------------------------------------------------------------
port=$(venv/bin/python -c "import socket; s = socket.socket(); s.bind(('127.0.0.1', 0)); print(s.getsockname()[1])")
url="http://127.0.0.1:$port"
setsid env EPISERVE_PORT="$port" EPISERVE_CACHE_DIR="$WORK/cache" venv/bin/episerve-server serve > server.log 2>&1 &
SERVER_PID=$!
for _ in $(seq 600); do
  venv/bin/python -c "import urllib.request; urllib.request.urlopen('$url/healthz', timeout=2)" 2>/dev/null && break
  kill -0 "$SERVER_PID" 2>/dev/null || { tail -30 server.log >&2; fail "the server from the wheel exited"; }
  sleep 0.5
done
venv/bin/python -c "import urllib.request; urllib.request.urlopen('$url/healthz', timeout=2)" \
  || { tail -30 server.log >&2; fail "the server from the wheel did not answer within 300 s"; }
pass "episerve-server from the wheel serves the demo at $url"

# ---- 4. the viewer in Chromium ----------------------------------------------------------------------------------
if [ ! -x /usr/bin/chromium ]; then
  SKIPPED=$(( SKIPPED + 1 )); echo "SKIP: tests/wheels/run.sh: no Chromium at /usr/bin/chromium: the viewer not opened"
elif ! "$TEST_PYTHON" -c "import playwright" 2>/dev/null; then
  SKIPPED=$(( SKIPPED + 1 )); echo "SKIP: tests/wheels/run.sh: $TEST_PYTHON has no Playwright: the viewer not opened"
else
  "$TEST_PYTHON" check.py viewer "$url" "$WORK/viewer.png" || fail "the viewer did not render from the wheel"
  pass "the viewer renders from the wheel in Chromium"
fi

# ---- 5. the client wheel -----------------------------------------------------------------------------------------
venv/bin/python check.py client "$url" || fail "the client wheel could not read the demo's rows"
pass "the client wheel reads rows"

log "done in $(( $(date +%s) - T0 )) s"
echo "wheels: $PASSED passed, 0 failed, $SKIPPED skipped"
