"""The real peers' environment: a Python 3.12 venv with LeRobot 0.6.1, Lance's LeRobot loader and their torch,
built by the bench on first use and reused by later runs.

episerve's own venv is Python 3.11; lerobot 0.6 needs 3.12, so the real peers run as subprocesses of that venv's
interpreter (`bench/peers/real_loader.py`). The interpreter is `$EPISERVE_BENCH_PYTHON312`, else a working
`python3.12` on PATH, else pyenv's newest 3.12. The venv lives in `$EPISERVE_BENCH_PEERS_VENV` (default
`~/.cache/episerve-bench/peers-venv`) with a stamp holding the pinned requirements it was built from, so a change
of pins rebuilds it. torchcodec, LeRobot 0.6's video decoder, loads FFmpeg's shared libraries from the system:
where it cannot and `apt-get` can be run (as root), the Debian packages below are installed.

`ensure()` never raises: when the environment cannot be had, it says why, and the peer rows are skipped.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

REQUIREMENTS = Path(__file__).resolve().with_name("real-requirements.txt")
PYTHON_VARIABLE = "EPISERVE_BENCH_PYTHON312"
VENV_VARIABLE = "EPISERVE_BENCH_PEERS_VENV"
DEFAULT_VENV = Path.home() / ".cache" / "episerve-bench" / "peers-venv"
STAMP = ".episerve-bench-requirements"
# FFmpeg 5's shared libraries, as Debian 12 packages them (torchcodec loads whichever FFmpeg 4-8 it finds).
FFMPEG_PACKAGES = (
    "libavcodec59",
    "libavformat59",
    "libavutil57",
    "libswscale6",
    "libswresample4",
    "libavdevice59",
    "libavfilter8",
)
_PROBE = (
    "import importlib.metadata as m, json, torchcodec.decoders, lerobot.datasets.lerobot_dataset, lerobot_lancedb; "
    "print(json.dumps({p: m.version(p) for p in ('lerobot', 'lerobot-lancedb', 'pylance', 'torch', 'torchcodec')}))"
)


@dataclass
class PeersEnv:
    """The interpreter of the built venv, or None and the reason it could not be had."""

    python: Path | None
    reason: str = ""
    versions: dict[str, str] = field(default_factory=dict)

    @property
    def ready(self) -> bool:
        return self.python is not None


def venv_dir() -> Path:
    return Path(os.environ.get(VENV_VARIABLE) or DEFAULT_VENV)


def find_python312() -> Path | None:
    """A Python 3.12 interpreter that runs: `$EPISERVE_BENCH_PYTHON312`, else `python3.12` on PATH, else pyenv's
    newest 3.12 (pyenv's `python3.12` shim fails unless 3.12 is selected, so its versions are looked at directly)."""
    named = os.environ.get(PYTHON_VARIABLE)
    if named:
        return Path(named) if _is_python312(Path(named)) else None
    candidates = [Path(found)] if (found := shutil.which("python3.12")) else []
    roots = [Path(os.environ["PYENV_ROOT"])] if os.environ.get("PYENV_ROOT") else []
    roots.append(Path.home() / ".pyenv")
    for root in roots:
        versions = sorted(
            (root / "versions").glob("3.12.*"), key=lambda p: [int(x) for x in p.name.split(".") if x.isdigit()]
        )
        candidates += [version / "bin" / "python3.12" for version in reversed(versions)]
    return next((candidate for candidate in candidates if _is_python312(candidate)), None)


def _is_python312(python: Path) -> bool:
    try:
        done = subprocess.run(
            [str(python), "-c", "import sys; print(sys.version_info[:2] == (3, 12))"],
            capture_output=True,
            text=True,
            timeout=60,
        )
    except (OSError, subprocess.SubprocessError):
        return False
    return done.returncode == 0 and done.stdout.strip() == "True"


def ensure(log: Path) -> PeersEnv:
    """The peers' venv, built or rebuilt when its stamp differs from the pinned requirements; its interpreter
    checked to import the peers (FFmpeg libraries installed when torchcodec cannot load them)."""
    try:
        return _ensure(log)
    except (OSError, subprocess.SubprocessError) as error:
        return PeersEnv(None, f"the peers' environment could not be built ({error})")


def _ensure(log: Path) -> PeersEnv:
    venv = venv_dir()
    python = venv / "bin" / "python"
    pins = REQUIREMENTS.read_text()
    stamp = venv / STAMP
    log.parent.mkdir(parents=True, exist_ok=True)
    if not (python.is_file() and stamp.is_file() and stamp.read_text() == pins):
        base = find_python312()
        if base is None:
            return PeersEnv(None, f"no Python 3.12 (set {PYTHON_VARIABLE}, or put python3.12 on PATH or in pyenv)")
        print(f"# building the real peers' environment in {venv} (several GB, once) ...", file=sys.stderr)
        shutil.rmtree(venv, ignore_errors=True)
        if not _run([str(base), "-m", "venv", str(venv)], log):
            return PeersEnv(None, f"`{base} -m venv` failed (see {log})")
        if not _run([str(python), "-m", "pip", "install", "-q", "-r", str(REQUIREMENTS)], log):
            return PeersEnv(None, f"pip could not install {REQUIREMENTS.name} (see {log})")
        stamp.write_text(pins)
    versions = _probe(python, log)
    if versions is None and _install_ffmpeg(log):
        versions = _probe(python, log)
    if versions is None:
        return PeersEnv(None, f"the peers do not import: torchcodec needs FFmpeg's shared libraries (see {log})")
    return PeersEnv(python, versions=versions)


def _probe(python: Path, log: Path) -> dict[str, str] | None:
    import json

    done = subprocess.run([str(python), "-c", _PROBE], capture_output=True, text=True)
    if done.returncode != 0:
        with open(log, "a") as out:
            out.write(done.stderr)
        return None
    return json.loads(done.stdout.strip().splitlines()[-1])


def _install_ffmpeg(log: Path) -> bool:
    """Debian's FFmpeg libraries through apt-get (as root only; the package lists updated when needed)."""
    apt = shutil.which("apt-get")
    if apt is None or os.geteuid() != 0:
        return False
    install = [apt, "install", "-y", "-q", "--no-install-recommends", *FFMPEG_PACKAGES]
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    return _run(install, log, env) or (_run([apt, "update", "-q"], log, env) and _run(install, log, env))


def _run(command: list[str], log: Path, env: dict[str, str] | None = None) -> bool:
    with open(log, "a") as out:
        out.write(f"$ {' '.join(command)}\n")
        out.flush()
        return subprocess.run(command, stdout=out, stderr=subprocess.STDOUT, env=env).returncode == 0
