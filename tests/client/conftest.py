"""Fixtures of the client tests: the session server and datasets from tests/conftest.py, plus oracle views."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pytest

from tests.client.helpers import DEMO
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
