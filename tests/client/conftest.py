"""Fixtures of the client tests: the session server and datasets from tests/conftest.py, plus oracle views, a
server of two robots' datasets for the LeRobot drop-in over mixtures, and LeRobot's training script."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pytest

from app.demo import write_demo_dataset
from tests.client.helpers import (
    ARM6,
    ARM9,
    CROSS_DOCUMENT,
    DEMO,
    FOLD,
    HIGH,
    PICK,
    SLOW,
    TOP,
    WRIST,
    LeRobotTrainer,
)
from tests.support import ServerProcess, oracle


@pytest.fixture(scope="session")
def url(server: ServerProcess) -> str:
    return server.url


@pytest.fixture(scope="session")
def demo_path(datasets_root: Path) -> Path:
    return datasets_root / DEMO


@pytest.fixture(scope="session")
def demo_view(demo_path: Path) -> pa.Table:
    """The whole demo dataset as the server must serve it."""
    return oracle(demo_path, None)


@pytest.fixture(scope="session")
def robots_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """LeRobot-format datasets of two robots, with video cameras and with parquet images only (which train
    fastest), for the LeRobot drop-in over mixtures."""
    root = tmp_path_factory.mktemp("robots")
    write_demo_dataset(root / PICK, format="v3.0", episodes=4, seed=51, cameras={TOP: (32, 64)})
    cameras = {HIGH: (32, 64), WRIST: (32, 64)}
    write_demo_dataset(root / FOLD, format="v2.1", episodes=4, seed=52, joints=9, cameras=cameras)
    write_demo_dataset(root / ARM6, format="v3.0", episodes=4, seed=53, cameras={}, image_size=32)
    write_demo_dataset(root / ARM9, format="v2.1", episodes=3, seed=54, joints=9, cameras={}, image_size=32)
    write_demo_dataset(root / SLOW, format="v3.0", episodes=2, seed=55, cameras={}, image_size=32, fps=15)
    return root


@pytest.fixture(scope="session")
def robots_mixtures(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The server's named mixtures: `cross` (the two video robots, weights 2:1, cam_high renamed top)."""
    named = tmp_path_factory.mktemp("robots-mixtures")
    (named / "cross.json").write_text(json.dumps(CROSS_DOCUMENT))
    return named


@pytest.fixture(scope="session")
def robots_url(robots_root: Path, robots_mixtures: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    environment = {"EPISERVE_MIXTURES_DIR": str(robots_mixtures)}
    with ServerProcess([robots_root], tmp_path_factory.mktemp("robots-cache"), env=environment) as running:
        yield running.url


@pytest.fixture(scope="session")
def lerobot_trainer(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LeRobotTrainer]:
    """LeRobot's training script, imported once for every training run of the session (of this xdist worker)."""
    trainer = LeRobotTrainer(tmp_path_factory.mktemp("lerobot-trainer"))
    try:
        yield trainer
    finally:
        trainer.close()
