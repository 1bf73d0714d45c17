#!/usr/bin/env bash
# tests/python310/run.sh — the client and the server on a real Python 3.10 interpreter (ROS 2 Humble's Python).
#
# A venv of Python 3.10 gets the server, the client (numpy output, with Pillow) and the test tools, pinned by
# constraints.txt (its `python_version < "3.11"` lines), and runs, in one pytest process:
#   - tests/test_imports.py: every module of the server and of the client imports on 3.10 (syntax, the standard
#     library, and the pinned dependencies' 3.10 builds, in code no test below reaches);
#   - the client's tests (tests/client), whose session server runs on that same 3.10: the client is what runs on
#     a 3.10 robot machine;
#   - the server's HTTP reads on every dataset layout against the pyarrow oracle (tests/test_rows.py), its error
#     answers (tests/test_errors.py) and fixed-size lists with nulls (tests/test_fixed_lists.py): the server's
#     request path end to end.
# The server's other tests (caches, supervision, object stores, rescans) drive the same modules, imported and
# started above, through logic that does not depend on the interpreter's version: they run on the suite's Python
# only, kept out of this lane for CI's time. The whole suite on 3.10 is `$VENV/bin/python -m pytest` in such a venv. One process, no xdist: beside the main suite the cores are busy
# anyway, and a second worker would start a second session server. No torch: the only CPU build of torch at hand
# on machines of this project is for Python 3.11, and constraints.txt pins the CPU build (2.13.0+cpu), so a 3.10
# install can only fail, never fall back to a CUDA build; the test modules that import torch are not collected.
#
# The interpreter: PYTHON310, else `python3.10` on PATH, else pyenv's newest 3.10 ($PYENV_ROOT, default ~/.pyenv).
# Debian 12 packages no Python 3.10, and no Python build can be downloaded here, so without one this prints a SKIP
# line and exits 0.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/../.." && pwd)
cd "$repo"
while read -r name; do unset "$name"; done < <(compgen -e | grep -E '^EPISERVE_' || true)

is_310() { [ -n "$1" ] && "$1" -c 'import sys; assert sys.version_info[:2] == (3, 10)' >/dev/null 2>&1; }
python=
# (a pyenv shim named python3.10 may be on PATH without that version selected: each candidate is run to be sure)
for candidate in "${PYTHON310:-}" "$(command -v python3.10 || true)" \
    $(ls -d "${PYENV_ROOT:-$HOME/.pyenv}"/versions/3.10.*/bin/python 2>/dev/null | sort -V -r); do
  if is_310 "$candidate"; then python=$candidate; break; fi
done
if [ -z "$python" ]; then
  echo "SKIP: tests/python310/run.sh: no Python 3.10 interpreter (set PYTHON310, or put python3.10 on PATH)"
  exit 0
fi

T0=$(date +%s)
WORK=$(mktemp -d "${TMPDIR:-/tmp}/episerve-py310.XXXXXX")
trap 'rm -rf "$WORK"' EXIT
echo "python 3.10: $("$python" -V 2>&1) at $python"
"$python" -m venv "$WORK/venv"
"$WORK/venv/bin/pip" install -q -c constraints.txt -e . -e "./client[images]" \
  pytest pytest-timeout hypothesis httpx polars > "$WORK/install.log" 2>&1 \
  || { tail -30 "$WORK/install.log" >&2; echo "FAIL: tests/python310/run.sh: the install on Python 3.10 failed" >&2; exit 1; }
echo "python 3.10: installed in $(( $(date +%s) - T0 )) s ($(du -sm "$WORK/venv" | cut -f1) MB, no torch)"

"$WORK/venv/bin/python" -m pytest -q -p no:cacheprovider \
  tests/test_imports.py tests/client tests/test_rows.py tests/test_errors.py tests/test_fixed_lists.py
echo "python 3.10: done in $(( $(date +%s) - T0 )) s"
