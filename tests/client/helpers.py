"""Helpers for the client tests: a server that keeps its port across restarts, child processes, and oracles."""

from __future__ import annotations

import json
import multiprocessing
import os
import select
import signal
import subprocess
import sys
import traceback
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from tests.support import ROOT, ServerProcess

DEMO = "lerobot/demo-v3"
VECTORS = ("observation.state", "action")
SCALARS = ("timestamp", "frame_index", "episode_index", "index", "task_index")

# Two robots' datasets of the `robots_url` server (tests/client/conftest.py), for the LeRobot drop-in over mixtures.
PICK, FOLD = "so100/pick", "aloha/fold"  # 6 joints and camera `top`; 9 joints, cameras `cam_high` and `wrist`
ARM6, ARM9, SLOW = "images/arm6", "images/arm9", "images/slow"  # parquet images; 6 and 9 joints; 15 fps
TOP, HIGH, WRIST = "observation.images.top", "observation.images.cam_high", "observation.images.wrist"
CROSS_DOCUMENT = {
    "components": [
        {"dataset": PICK, "weight": 2},
        {"dataset": FOLD, "weight": 1, "episodes": "1-3", "features": {HIGH: TOP}},
    ]
}


class PinnedPortServer(ServerProcess):
    """A `ServerProcess` that picks a free port on its first start and keeps it for every restart."""

    @property
    def port(self) -> int:
        return self._port

    @port.setter
    def port(self, value: int) -> None:
        if not getattr(self, "_port", 0):
            self._port = value


class LeRobotTrainer:
    """LeRobot's training script with no Hub access, in a process of its own (tests/client/lerobot_train_run.py)
    that imports it once and forks every run from there: a run's start-up is mostly those imports."""

    def __init__(self, work: Path) -> None:
        self.work = work
        self.runs = 0
        self.log = work / "trainer.log"
        env = {k: v for k, v in os.environ.items() if not k.startswith("EPISERVE_")}
        env |= {"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
        env["HF_LEROBOT_HOME"] = str(work / "home")
        with self.log.open("wb") as log:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "tests.client.lerobot_train_run"],
                cwd=ROOT,
                env=env,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=log,
                start_new_session=True,
            )

    def train(self, *runs: tuple[str, list[str]], timeout: float = 280.0) -> list[dict[str, Any]]:
        """Train every run, `(mode, arguments)` as lerobot_train_run.py takes them, at once, each in a fresh fork;
        once all ended successfully, the record of each (what it did)."""
        import torch

        assert self.process.stdin is not None and self.process.stdout is not None
        requests = []
        for mode, arguments in runs:
            self.runs += 1
            base = self.work / f"run-{self.runs}"
            requests.append({"record": f"{base}.pt", "log": f"{base}.log", "mode": mode, "arguments": arguments})
        self.process.stdin.write(json.dumps(requests).encode() + b"\n")
        self.process.stdin.flush()
        ready, _, _ = select.select([self.process.stdout], [], [], timeout)
        answer = self.process.stdout.readline() if ready else b""
        if not answer:
            self.close()
            raise AssertionError(f"the runs did not end within {timeout} s:\n{self.log.read_text()[-4000:]}")
        for request, status in zip(requests, json.loads(answer), strict=True):
            assert status == 0, Path(request["log"]).read_text(errors="replace")[-4000:]
        return [torch.load(request["record"], weights_only=False) for request in requests]

    def close(self) -> None:
        """End the process (and any run still going)."""
        if self.process.poll() is None:
            assert self.process.stdin is not None
            self.process.stdin.close()
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait()
        assert self.process.stdout is not None
        self.process.stdout.close()


def run_in_process(target: Callable[..., Any], *args: Any, timeout: float = 120.0) -> Any:
    """`target(*args)` in a forked, non-daemonic child (so it may start DataLoader workers); its return value."""
    context = multiprocessing.get_context("fork")
    receiver, sender = context.Pipe(duplex=False)
    process = context.Process(target=_child, args=(sender, target, args))
    process.start()
    sender.close()
    try:
        if not receiver.poll(timeout):
            raise TimeoutError(f"{target.__name__} gave no result within {timeout} s")
        ok, value = receiver.recv()
    finally:
        process.join(timeout=10)
        if process.is_alive():
            process.kill()
            process.join()
    if not ok:
        raise AssertionError(f"{target.__name__} failed in its process:\n{value}")
    return value


def _child(sender: Any, target: Callable[..., Any], args: tuple[Any, ...]) -> None:
    try:
        result = (True, target(*args))
    except BaseException:
        result = (False, traceback.format_exc())
    sender.send(result)
    sender.close()


def positions_by_index(view: pa.Table) -> dict[int, int]:
    """Oracle view position of each global `index` value."""
    return {int(value): position for position, value in enumerate(view["index"].to_numpy())}


def assert_batch_equals_view(batch: dict[str, Any], view: pa.Table, positions: dict[int, int]) -> None:
    """Every column of a batch of samples equals the oracle rows with the same `index`."""
    indices = np.asarray(batch["index"])
    rows = view.take(pa.array([positions[int(i)] for i in indices]))
    for name in VECTORS:
        want = np.stack(rows[name].to_numpy(zero_copy_only=False))
        np.testing.assert_array_equal(np.asarray(batch[name]), want, err_msg=name)
    for name in SCALARS:
        np.testing.assert_array_equal(np.asarray(batch[name]), rows[name].to_numpy(), err_msg=name)
    if "observation.image" in batch:
        want_images = [image["bytes"] for image in rows["observation.image"].to_pylist()]
        assert list(batch["observation.image"]) == want_images


def exactly_once(parts: Iterable[Iterable[int]], expected: Iterable[int]) -> bool:
    """The parts are disjoint and their union is `expected` (no row lost, none repeated)."""
    combined = np.concatenate([np.asarray(list(p), dtype=np.int64) for p in parts] or [np.empty(0, np.int64)])
    want = np.sort(np.asarray(list(expected), dtype=np.int64))
    return len(combined) == len(want) and bool(np.array_equal(np.sort(combined), want))


def tag_worker(batch: dict[str, Any]) -> dict[str, Any]:
    """A dataset transform recording which DataLoader worker produced a batch."""
    from torch.utils.data import get_worker_info

    info = get_worker_info()
    return {**batch, "worker": -1 if info is None else info.id}


def iterate_rank(url: str, rank: int, world_size: int, epochs: list[int], options: dict[str, Any]) -> dict:
    """One simulated rank: a 2-worker DataLoader over its shard, for each epoch the indices each worker produced."""
    from torch.utils.data import DataLoader

    import episerve

    results = {}
    for epoch in epochs:
        dataset = episerve.EpisodeIterableDataset(
            url, DEMO, rank=rank, world_size=world_size, transform=tag_worker, **options
        )
        dataset.set_epoch(epoch)
        streams: dict[int, list[int]] = {}
        for batch in DataLoader(dataset, batch_size=None, num_workers=2):
            streams.setdefault(batch["worker"], []).extend(batch["index"].tolist())
        results[epoch] = streams
    return results


def consume_then_save(url: str, options: dict[str, Any], epoch: int, batches: int) -> tuple[list[int], dict]:
    """Take `batches` batches of an epoch from a 2-worker DataLoader, then the state to resume from."""
    from torch.utils.data import DataLoader

    import episerve

    dataset = episerve.EpisodeIterableDataset(url, DEMO, **options)
    dataset.set_epoch(epoch)
    seen: list[int] = []
    for taken, batch in enumerate(DataLoader(dataset, batch_size=None, num_workers=2)):
        if taken == batches:
            break
        seen.extend(batch["index"].tolist())
    return seen, dataset.state_dict(consumed=len(seen))


def load_then_finish(url: str, options: dict[str, Any], state: dict) -> list[int]:
    """A fresh process resuming from `state` to the end of its epoch."""
    from torch.utils.data import DataLoader

    import episerve

    dataset = episerve.EpisodeIterableDataset(url, DEMO, **options)
    dataset.load_state_dict(state)
    dataset.set_epoch(state["epoch"])
    return [i for batch in DataLoader(dataset, batch_size=None, num_workers=2) for i in batch["index"].tolist()]
