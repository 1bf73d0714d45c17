"""Shared fixtures: a datasets root with every supported layout, and a real server over it."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from app.demo import write_demo_dataset
from app.demo_cameras import TWO_CAMERAS
from tests.support import ServerProcess, write_generic_dataset, write_nullable_dataset, write_plain_dataset


@pytest.fixture(scope="session")
def datasets_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("datasets")
    write_demo_dataset(root / "lerobot" / "demo-v3", format="v3.0", episodes=60, seed=1, files=3)
    write_demo_dataset(root / "lerobot" / "demo-v21", format="v2.1", episodes=30, seed=2)
    write_generic_dataset(root / "generic")
    write_plain_dataset(root / "plain")
    write_nullable_dataset(root / "nullable")
    return root


@pytest.fixture(scope="session")
def video_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Two cameras of different sizes in mp4 files: `cams-v3` (LeRobot v3.0, 3 files per camera holding several
    episodes each) and `cams-v21` (v2.1, one file per episode and camera); 9 episodes each."""
    root = tmp_path_factory.mktemp("video-root")
    write_demo_dataset(root / "cams-v3", format="v3.0", episodes=9, seed=3, cameras=TWO_CAMERAS, video_files=3)
    write_demo_dataset(root / "cams-v21", format="v2.1", episodes=9, seed=3, cameras=TWO_CAMERAS)
    return root


@pytest.fixture(scope="session")
def server(datasets_root: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    with ServerProcess([datasets_root], tmp_path_factory.mktemp("cache")) as running:
        yield running


@pytest.fixture(scope="session")
def http(server: ServerProcess) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=server.url, timeout=30.0) as client:
        yield client
