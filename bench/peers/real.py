"""P10's real peers, driven from the bench: LeRobot 0.6.1's `LeRobotDataset` and Lance's `LanceDBDataset` (on a
copy converted by lerobot-lancedb), each run by `bench/peers/real_loader.py` in the peers' Python 3.12 venv
(`bench/peers/real_env.py`), one subprocess per measurement, a JSON line back.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import signal
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from bench.camera_datasets import CameraDataset
from bench.peers import real_env

RUNNER = Path(__file__).resolve().with_name("real_loader.py")
PEERS = {"lerobot 0.6.1": "lerobot", "lance": "lance"}  # bench key -> runner peer
LABELS = {
    "lerobot 0.6.1": "LeRobot 0.6.1 `LeRobotDataset` (torchcodec)",
    "lance": "Lance `LanceDBDataset` (lerobot-lancedb 0.3.1)",
}
_COPY_MARKER = "episerve-bench-source.json"


class PeerFailed(RuntimeError):
    """The runner exited with an error (its stderr is in the peers' log)."""


def directory_bytes(path: Path) -> int:
    """Bytes of every file under `path`."""
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


@dataclass
class RealPeers:
    """The peers' interpreter and where their scratch state (Lance copies, LeRobot's home) lives."""

    python: Path
    workdir: Path
    log: Path
    versions: dict[str, str]

    @classmethod
    def ensure(cls, workdir: Path, log: Path) -> RealPeers | str:
        """The peers, their environment built or reused; or the reason they cannot run."""
        env = real_env.ensure(log)
        if env.python is None:
            return env.reason
        return cls(env.python, workdir, log, env.versions)

    def lance_copy(self, dataset: CameraDataset) -> Path:
        """The Lance copy of `dataset`, converted unless a copy of the same source is there already."""
        out = self.workdir / "lance" / dataset.name
        source = (dataset.path / "bench.json").read_text() if (dataset.path / "bench.json").is_file() else ""
        marker = out / _COPY_MARKER
        if not (marker.is_file() and marker.read_text() == source and source):
            self._run(["convert", "--root", str(dataset.path), "--out", str(out)])
            marker.write_text(source)
        return out

    def root(self, key: str, dataset: CameraDataset) -> Path:
        return self.lance_copy(dataset) if key == "lance" else dataset.path

    def measure(
        self, key: str, dataset: CameraDataset, samples: int, batch: int, workers: int, frames: bool = False
    ) -> float:
        """Samples/s of the peer's shuffled DataLoader, clock started after the first batch; `frames`: P9's
        uint8 frames without action windows."""
        command = ["measure", "--peer", PEERS[key], "--root", str(self.root(key, dataset))]
        command += ["--frames"] if frames else []
        command += ["--samples", str(samples), "--batch", str(batch), "--workers", str(workers)]
        return float(self._run(command)["samples_per_s"])

    def measured_or_nan(
        self, key: str, dataset: CameraDataset, samples: int, batch: int, workers: int, frames: bool = False
    ) -> float:
        """`measure`, or NaN when the peer failed (the row then says so; the log has the peer's stderr)."""
        try:
            return self.measure(key, dataset, samples, batch, workers, frames)
        except PeerFailed:
            return math.nan

    def samples(
        self, key: str, dataset: CameraDataset, indices: list[int], frames: bool = False
    ) -> dict[int, dict[str, np.ndarray]]:
        """The peer's samples at `indices`, every value a numpy array (`frames`: as `measure`)."""
        out = self.workdir / "lance" / f"samples-{PEERS[key]}-{dataset.name}.npz"
        out.parent.mkdir(parents=True, exist_ok=True)
        command = ["samples", "--peer", PEERS[key], "--root", str(self.root(key, dataset))]
        command += ["--frames"] if frames else []
        self._run([*command, "--indices", ",".join(map(str, indices)), "--out", str(out)])
        found: dict[int, dict[str, np.ndarray]] = {index: {} for index in indices}
        with np.load(out) as arrays:
            for name in arrays.files:
                index, key_name = name.split("/", 1)
                found[int(index)][key_name] = arrays[name]
        out.unlink()
        return found

    def _run(self, arguments: list[str], timeout_s: float = 1800.0) -> dict[str, Any]:
        """The runner's JSON answer. It runs in a process group of its own (with its DataLoader workers and
        Lance's forkserver), which is ended whole if the bench is interrupted or the runner hangs."""
        env = {k: v for k, v in os.environ.items() if not k.startswith(("EPISERVE_", "PYTHON", "VIRTUAL_ENV"))}
        env |= {"HF_HUB_OFFLINE": "1", "HF_LEROBOT_HOME": str(self.workdir / "lerobot-home")}
        with open(self.log, "a") as log:
            log.write(f"$ real_loader.py {' '.join(arguments)}\n")
            log.flush()
            runner = subprocess.Popen(
                [str(self.python), str(RUNNER), *arguments],
                stdout=subprocess.PIPE,
                stderr=log,
                env=env,
                text=True,
                start_new_session=True,
            )
            try:
                stdout, _ = runner.communicate(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                _end_group(runner)
                raise PeerFailed(f"real_loader.py {arguments[0]} took over {timeout_s:.0f} s: see {self.log}") from None
            except BaseException:
                _end_group(runner)
                raise
        if runner.returncode != 0:
            raise PeerFailed(f"real_loader.py {arguments[0]} exited with {runner.returncode}: see {self.log}")
        return json.loads(stdout.strip().splitlines()[-1])


def _end_group(runner: subprocess.Popen[str]) -> None:
    """SIGTERM to the runner's process group (its own session: nothing else is in it), then wait for it."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(runner.pid, signal.SIGTERM)
    try:
        runner.wait(timeout=20)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(runner.pid, signal.SIGKILL)
        runner.wait()
