"""`episerve.Client`: catalog calls, rows and takes equal to the oracle, paging, auth, fork safety, packaging."""

from __future__ import annotations

import multiprocessing
import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

import episerve
from tests.client.helpers import DEMO
from tests.support import ROOT, ServerProcess, assert_tables_equal, oracle


@pytest.fixture(scope="module")
def limited_server(datasets_root: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """A server with tiny per-response limits and a bearer token."""
    env = {"EPISERVE_MAX_ROWS_PER_RESPONSE": "500", "EPISERVE_MAX_TAKE_INDICES": "300", "EPISERVE_TOKENS": "s3cret"}
    with ServerProcess([datasets_root], tmp_path_factory.mktemp("limited-cache"), env=env) as running:
        yield running


def test_catalog_calls_describe_the_datasets(url: str, demo_view: pa.Table) -> None:
    with episerve.Client(url) as client:
        ids = {entry["id"] for entry in client.datasets()}
        info = client.info(DEMO)
        episodes = client.episodes(DEMO)
    assert {DEMO, "lerobot/demo-v21", "generic", "plain"} <= ids
    assert info["rows"] == demo_view.num_rows
    assert [e["episode_index"] for e in episodes] == list(range(60))
    assert sum(e["length"] for e in episodes) == demo_view.num_rows


def test_rows_of_unsorted_episode_ids_equal_the_oracle(url: str, demo_path: Path) -> None:
    with episerve.Client(url) as client:
        table = client.rows(DEMO, episodes=[9, 2, 5, 2, 6])
    assert_tables_equal(table, oracle(demo_path, [2, 5, 6, 9]))


def test_rows_slice_and_projection_equal_the_oracle(url: str, demo_view: pa.Table) -> None:
    with episerve.Client(url) as client:
        table = client.rows(DEMO, start=100, stop=350, columns=["index", "action"])
        past_end = client.rows(DEMO, start=demo_view.num_rows + 5, columns=["index"])
        count = client.num_rows(DEMO, "0-3")
    assert_tables_equal(table, demo_view.slice(100, 250).select(["index", "action"]))
    assert past_end.num_rows == 0
    assert count == sum(1 for e in demo_view["episode_index"].to_pylist() if e <= 3)


def test_take_keeps_order_and_duplicates(url: str, demo_path: Path) -> None:
    view = oracle(demo_path, [3, 4, 10])
    indices = [view.num_rows - 1, 0, 7, 7, 3]
    with episerve.Client(url) as client:
        table = client.take(DEMO, np.array(indices), episodes="10,3-4", columns=["index", "observation.state"])
    assert_tables_equal(table, view.take(pa.array(indices)).select(["index", "observation.state"]))


def test_rows_and_take_page_past_the_server_limits(limited_server: ServerProcess, demo_view: pa.Table) -> None:
    indices = np.random.default_rng(0).integers(0, demo_view.num_rows, size=1000)
    with episerve.Client(limited_server.url, token="s3cret") as client:
        table = client.rows(DEMO, start=10)
        taken = client.take(DEMO, indices, columns=["index"])
    assert_tables_equal(table, demo_view.slice(10))
    assert taken["index"].to_pylist() == demo_view["index"].to_numpy()[indices].tolist()


def test_episode_specs_too_long_for_a_url_travel_in_a_post_body(url: str, demo_path: Path) -> None:
    spec = ",".join(["9", "2", "5-6"] * 800)  # ~5 kB of redundant terms: the same view as "2,5-6,9"
    view = oracle(demo_path, [2, 5, 6, 9])
    with episerve.Client(url) as client:
        count = client.num_rows(DEMO, spec)
        table = client.rows(DEMO, episodes=spec, start=3, stop=250, columns=["index"])
    assert count == view.num_rows
    assert table["index"].to_pylist() == view["index"].to_pylist()[3:250]


def test_token_is_sent_as_bearer_and_defaults_from_the_environment(
    limited_server: ServerProcess, monkeypatch: pytest.MonkeyPatch
) -> None:
    with pytest.raises(episerve.Unauthorized), episerve.Client(limited_server.url, token="wrong") as client:
        client.datasets()
    with pytest.raises(episerve.Unauthorized), episerve.Client(limited_server.url, token="wrong") as client:
        client.take(DEMO, [0], columns=["index"])  # the Arrow requests' socket transport
    monkeypatch.setenv("EPISERVE_TOKEN", "s3cret")
    with episerve.Client(limited_server.url) as client:
        assert client.datasets()
        assert client.take(DEMO, [1, 0], columns=["index"])["index"].to_pylist() == [1, 0]


def _use_inherited_client(client: episerve.Client, parent_ids: tuple[int, ...], queue: multiprocessing.Queue) -> None:
    rows = client.rows(DEMO, start=0, stop=5, columns=["index"])["index"].to_pylist()
    client.datasets()
    queue.put((rows, id(client._transport) not in parent_ids))


def test_forked_child_opens_its_own_connection_and_parent_keeps_working(url: str) -> None:
    client = episerve.Client(url)
    assert client.rows(DEMO, stop=3, columns=["index"]).num_rows == 3  # the parent's socket connection is open
    assert client.datasets()
    parent_transport = client._transport
    assert parent_transport is not None
    context = multiprocessing.get_context("fork")
    queue = context.Queue()
    child = context.Process(target=_use_inherited_client, args=(client, (id(parent_transport),), queue))
    child.start()
    rows, fresh = queue.get(timeout=30)
    child.join(timeout=10)
    assert child.exitcode == 0
    assert rows == [0, 1, 2, 3, 4]
    assert fresh, "the child reused the parent's connections"
    assert client._transport is parent_transport
    assert client.take(DEMO, [4, 2], columns=["index"])["index"].to_pylist() == [4, 2]
    client.close()


def test_client_pickles_without_its_connections(url: str) -> None:
    import pickle

    client = episerve.Client(url, token="t", retries=3)
    client.datasets()
    copy = pickle.loads(pickle.dumps(client))
    assert copy._transport is None and copy.token == "t" and copy.retries.attempts == 3
    assert copy.datasets() == client.datasets()


def test_client_distribution_depends_on_httpx_httptools_pyarrow_numpy_only() -> None:
    project = tomllib.loads((ROOT / "client" / "pyproject.toml").read_text())["project"]
    names = {re.split(r"[<>=!~\[; ]", dep, maxsplit=1)[0].lower() for dep in project["dependencies"]}
    assert names == {"httpx", "httptools", "pyarrow", "numpy"}
    assert set(project["optional-dependencies"]) >= {"torch", "images"}
    assert project["name"] == "episerve"


def test_importing_the_client_needs_no_server_or_torch_packages() -> None:
    blocked = ["fastapi", "uvicorn", "starlette", "pydantic", "torch", "app"]
    code = (
        f"import sys\nfor name in {blocked!r}: sys.modules[name] = None\n"
        "import episerve\nepiserve.Client('http://127.0.0.1:1')\nprint(sorted(episerve.__all__))"
    )
    result = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=60,
        env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"},
        cwd="/",
    )
    assert result.returncode == 0, result.stderr
    assert "Client" in result.stdout


@pytest.mark.parametrize("codec", ["lz4", "zstd"])
def test_compressed_bodies_give_the_same_rows(url: str, demo_view: pa.Table, codec: str) -> None:
    with episerve.Client(url, compression=codec) as client:
        assert_tables_equal(client.rows(DEMO), demo_view)
        assert_tables_equal(client.take(DEMO, [40, 3, 3]), demo_view.take(pa.array([40, 3, 3])))
        dataset = episerve.EpisodeDataset(client, DEMO, columns=["index", "action"], output="numpy")
        batch = dataset.__getitems__([7, 1])
    assert batch.data["index"].tolist() == demo_view["index"].to_numpy()[[7, 1]].tolist()


def test_unknown_compression_is_refused_at_construction() -> None:
    with pytest.raises(ValueError, match="compression"):
        episerve.Client("http://127.0.0.1:1", compression="gzip")


def test_warm_builds_the_cache_that_cache_status_reports(tmp_path: Path) -> None:
    from app.demo import write_demo_dataset

    write_demo_dataset(tmp_path / "data" / "small", format="v2.1", episodes=6, seed=3)
    with ServerProcess([tmp_path / "data"], tmp_path / "cache") as server, episerve.Client(server.url) as client:
        cold = client.cache_status("small")
        assert (cold["dataset"], cold["segments_built"], cold["segments_total"]) == ("small", 0, 6)
        started = client.warm("small", episodes=[4, 1])
        assert started["warming"]["segments_total"] == 2
        deadline = time.monotonic() + 30
        while (status := client.cache_status("small"))["warming"]["state"] == "running":
            assert time.monotonic() < deadline, status
            time.sleep(0.05)
        assert status["warming"]["state"] == "done" and status["segments_built"] == 2 and status["bytes"] > 0
        client.warm("small")
        while (status := client.cache_status("small"))["warming"]["state"] == "running":
            time.sleep(0.05)
        assert status["segments_built"] == 6


def test_public_names_print_as_the_package_and_datasets_describe_themselves(url: str) -> None:
    assert repr(episerve.NotFound) == "<class 'episerve.NotFound'>"
    assert episerve.ConnectionFailed.__module__ == episerve.EpisodeDataset.__module__ == "episerve"
    with pytest.raises(episerve.NotFound) as caught:
        episerve.Client(url).info("no-such")
    assert f"{type(caught.value).__module__}.{type(caught.value).__name__}" == "episerve.NotFound"
    mapped = episerve.EpisodeDataset(url, DEMO, episodes="0-2", columns=["index"], output="numpy")
    assert repr(mapped) == f"EpisodeDataset({url!r}, {DEMO!r}, episodes='0-2', rows={len(mapped)})"
    streamed = episerve.EpisodeIterableDataset(url, DEMO, episodes=[2, 0, 1], chunk_rows=64, output="numpy")
    assert repr(streamed) == (
        f"EpisodeIterableDataset({url!r}, {DEMO!r}, episodes='0-2', rows={len(mapped)}, "
        "chunk_rows=64, batch_size=None, shuffle=False, rank=0/1)"
    )
