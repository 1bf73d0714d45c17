"""Shared fixtures: a datasets root with every supported layout, and a real server over it."""

from __future__ import annotations

import importlib.util
import re
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from app.demo import ensure_demo_dataset, write_demo_dataset
from app.demo_cameras import TWO_CAMERAS
from tests.support import (
    ServerProcess,
    write_generic_dataset,
    write_nullable_dataset,
    write_plain_dataset,
    written_once,
)

# torch is the client's optional extra: where it is not installed (the Python 3.10 lane of CI, which has no CPU
# build of torch to install), the test modules that import it are not collected, and the header says so.
HAS_TORCH = importlib.util.find_spec("torch") is not None
_IMPORTS_TORCH = re.compile(r"^(import torch|from torch)\b", re.MULTILINE)


def pytest_ignore_collect(collection_path: Path) -> bool | None:
    if HAS_TORCH or collection_path.suffix != ".py" or not collection_path.is_file():
        return None
    return True if _IMPORTS_TORCH.search(collection_path.read_text(encoding="utf-8")) else None


def pytest_report_header() -> str | None:
    return None if HAS_TORCH else "torch is not installed: test modules that import it are not collected"


@pytest.fixture(scope="session")
def default_demo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The built-in demo dataset (`write_demo_dataset`'s defaults: 200 episodes and a camera's videos), written once
    per session and shared by every xdist worker: read it, never change it."""
    return written_once(tmp_path_factory, "default-demo", lambda root: ensure_demo_dataset(root / "demo")) / "demo"


def _write_datasets(root: Path) -> None:
    write_demo_dataset(root / "lerobot" / "demo-v3", format="v3.0", episodes=60, seed=1, files=3)
    write_demo_dataset(root / "lerobot" / "demo-v21", format="v2.1", episodes=30, seed=2)
    write_generic_dataset(root / "generic")
    write_plain_dataset(root / "plain")
    write_nullable_dataset(root / "nullable")


@pytest.fixture(scope="session")
def datasets_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Every supported layout: LeRobot v3.0 and v2.1 demos (`lerobot/demo-v3`, `lerobot/demo-v21`), plain parquet
    files with episodes (`generic`), without (`plain`) and with nulls (`nullable`); shared by the xdist workers."""
    return written_once(tmp_path_factory, "datasets", _write_datasets)


@pytest.fixture(scope="session")
def video_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Two cameras of different sizes in mp4 files: `cams-v3` (LeRobot v3.0, 3 files per camera holding several
    episodes each) and `cams-v21` (v2.1, one file per episode and camera); 9 episodes each."""
    return written_once(tmp_path_factory, "video-root", _write_video_root)


def _write_video_root(root: Path) -> None:
    write_demo_dataset(root / "cams-v3", format="v3.0", episodes=9, seed=3, cameras=TWO_CAMERAS, video_files=3)
    write_demo_dataset(root / "cams-v21", format="v2.1", episodes=9, seed=3, cameras=TWO_CAMERAS)


@pytest.fixture(scope="session")
def server(datasets_root: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    with ServerProcess([datasets_root], tmp_path_factory.mktemp("cache")) as running:
        yield running


@pytest.fixture(scope="session")
def http(server: ServerProcess) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=server.url, timeout=30.0) as client:
        yield client
