"""Subprocesses the benchmark starts: the episerve server and peer servers, each on a free loopback port.

Every process started here is stopped by its own pid when the benchmark ends, never by name.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from types import TracebackType

import httpx

REPO = Path(__file__).resolve().parent.parent
APP_PATH_VARIABLE = "BENCH_APP_PATH"


def app_dir() -> Path:
    """Directory whose `app` package the episerve server processes import: `$BENCH_APP_PATH` (a checkout or a
    scratch copy under test, see `python -m bench.run --app-path`) or this repository."""
    return Path(os.environ.get(APP_PATH_VARIABLE) or REPO)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class Managed:
    """A child process with a readiness probe; a context manager that always stops it."""

    def __init__(
        self, command: list[str], log_path: Path, ready: Callable[[], bool], env: dict[str, str], cwd: Path = REPO
    ) -> None:
        self.command = command
        self.cwd = cwd
        self.log_path = log_path
        self.ready = ready
        self.env = env
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def pid(self) -> int:
        assert self.process is not None
        return self.process.pid

    def start(self, timeout_s: float = 120.0) -> Managed:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen(
                self.command, cwd=self.cwd, env=self.env, stdout=log, stderr=subprocess.STDOUT
            )
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"{self.command[:4]} exited with {self.process.returncode}: see {self.log_path}")
            if self.ready():
                return self
            time.sleep(0.05)
        self.stop()
        raise RuntimeError(f"{self.command[:4]} not ready after {timeout_s} s: see {self.log_path}")

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.process = None

    def __enter__(self) -> Managed:
        """Start the process, unless `start()` already has (`with Server(...).start() as server:` starts it once)."""
        if self.process is not None and self.process.poll() is None:
            return self
        return self.start()

    def __exit__(
        self, kind: type[BaseException] | None, value: BaseException | None, traceback: TracebackType | None
    ) -> None:
        self.stop()


def _clean_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("EPISERVE_")}
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    return env | (extra or {})


class EpiserveServer(Managed):
    """`episerve-server serve` over one root and cache directory; `settings` are extra `EPISERVE_*` variables."""

    def __init__(
        self, root: Path, cache_dir: Path, log_dir: Path, workers: int = 2, settings: dict[str, str] | None = None
    ) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        command = [sys.executable, "-m", "app.cli", "serve", "--root", str(root), "--cache-dir", str(cache_dir)]
        command += ["--port", str(self.port), "--workers", str(workers), "--log-level", "warning"]
        # `python -m` puts the working directory first on sys.path: that is how the app under test is chosen.
        env = _clean_env(settings)
        super().__init__(command, log_dir / f"episerve-{self.port}.log", self._ready, env, app_dir())
        # One client for every readiness poll (a new one costs tens of milliseconds of CPU), holding no connection.
        self._probe = httpx.Client(timeout=1.0, limits=httpx.Limits(max_keepalive_connections=0))

    def _ready(self) -> bool:
        try:
            return self._probe.get(f"{self.url}/readyz").status_code == 200
        except httpx.TransportError:
            return False


def port_open(port: int) -> bool:
    with socket.socket() as sock:
        sock.settimeout(0.5)
        return sock.connect_ex(("127.0.0.1", port)) == 0


class ModuleServer(Managed):
    """`python -m <module> --port P <args>`: a bench peer server, ready once its port accepts connections."""

    def __init__(self, module: str, args: list[str], log_dir: Path) -> None:
        self.port = free_port()
        command = [sys.executable, "-m", module, "--port", str(self.port), *args]
        super().__init__(command, log_dir / f"{module.rsplit('.', 1)[-1]}-{self.port}.log", self._ready, _clean_env())

    def _ready(self) -> bool:
        return port_open(self.port)
