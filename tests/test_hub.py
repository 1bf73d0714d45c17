"""Datasets from the Hugging Face Hub by repo id, against a real server and a local server that speaks the Hub's API
(tests/hub_server.py, `HF_ENDPOINT`): configured and allowed-on-first-use datasets are downloaded into the Hub cache
and served with the same rows as the files; the pinned commit is shown; unknown repos, missing revisions, gated repos
without a token, repos the server may not fetch and a connection dropped mid-download are each a clear problem, and a
retry later succeeds; offline, the cache is served."""

from __future__ import annotations

import hashlib
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import episerve
from app.demo import write_demo_dataset
from tests.hub_server import FakeHub, HubRepo
from tests.support import ServerProcess
from tests.test_errors import assert_problem

COLUMNS = ["episode_index", "frame_index", "action"]


@pytest.fixture(scope="module")
def source(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("hub-source")
    write_demo_dataset(root / "pusht", format="v3.0", episodes=6, seed=11)
    return root / "pusht"


@pytest.fixture(scope="module")
def hub(source: Path) -> Iterator[FakeHub]:
    with FakeHub() as running:
        for repo_id in ("lerobot/pusht", "lerobot/other"):
            running.repos[repo_id] = HubRepo()
            running.repos[repo_id].commit(source)
        running.repos["lerobot/gated"] = HubRepo(token="hf_secret")
        running.repos["lerobot/gated"].commit(source)
        yield running


def hub_env(hub: FakeHub, home: Path, **settings: str) -> dict[str, str]:
    return {"HF_ENDPOINT": hub.url, "HF_HOME": str(home), "HF_HUB_DISABLE_TELEMETRY": "1", **settings}


def ready(http: httpx.Client, dataset_id: str, seconds: float = 60) -> httpx.Response:
    """`/datasets/<id>` once the download is done or has failed (503s with the progress before)."""
    deadline = time.monotonic() + seconds
    while True:
        answer = http.get(f"/datasets/{dataset_id}")
        if answer.status_code != 503 or time.monotonic() > deadline:
            return answer
        detail = answer.json()["detail"]
        if "being downloaded from the Hub" not in detail:
            return answer  # a failed download
        time.sleep(0.2)


def empty_root(tmp_path: Path) -> Path:
    """A root with no dataset (a server without roots would serve its built-in demo, generated at start)."""
    root = tmp_path / "no-datasets"
    root.mkdir(exist_ok=True)
    return root


def expected_rows(source: Path, episodes: list[int]) -> pa.Table:
    table = pq.read_table(sorted((source / "data").rglob("*.parquet")), columns=COLUMNS)
    table = table.filter(pa.compute.is_in(table["episode_index"], pa.array(episodes, table["episode_index"].type)))
    return table.sort_by([("episode_index", "ascending"), ("frame_index", "ascending")])


def test_a_configured_hub_dataset_is_downloaded_pinned_and_served(hub: FakeHub, source: Path, tmp_path: Path) -> None:
    env = hub_env(hub, tmp_path / "hf", EPISERVE_HUB="lerobot/pusht@main")
    with ServerProcess([empty_root(tmp_path)], tmp_path / "cache", env=env) as server, server.client() as http:
        described = ready(http, "lerobot/pusht")
        assert described.status_code == 200, described.text
        commit = hub.repos["lerobot/pusht"].branches["main"]
        assert described.json()["hub"] == {
            "repo_id": "lerobot/pusht",
            "revision": "main",
            "commit": commit,
            "state": "ready",
            "files": len(hub.repos["lerobot/pusht"].files[commit]),
            "files_done": len(hub.repos["lerobot/pusht"].files[commit]),
        }
        assert "lerobot/pusht" in [d["id"] for d in http.get("/datasets").json()["datasets"]]
        with episerve.Client(server.url) as client:
            table = client.rows("lerobot/pusht", episodes=[4, 1], columns=COLUMNS)
        assert table.equals(expected_rows(source, [1, 4]))
    # The files are where LeRobot looks for a downloaded dataset ($HF_HOME/lerobot/<repo id>), byte for byte.
    snapshot = tmp_path / "hf" / "lerobot" / "lerobot" / "pusht"
    for path in source.rglob("*"):
        if path.is_file():
            cached = snapshot / path.relative_to(source)
            assert hashlib.sha256(cached.read_bytes()).digest() == hashlib.sha256(path.read_bytes()).digest()


def test_allowed_repos_are_served_on_first_use_and_others_are_clear_problems(hub: FakeHub, tmp_path: Path) -> None:
    env = hub_env(hub, tmp_path / "hf", EPISERVE_HUB_ALLOW="lerobot/*")
    with ServerProcess([empty_root(tmp_path)], tmp_path / "cache", env=env) as server, server.client() as http:
        assert ready(http, "lerobot/other").status_code == 200
        assert_problem(http.get("/datasets/acme/thing"), 404, "EPISERVE_HUB_ALLOW")
        assert_problem(ready(http, "lerobot/nope"), 404, "no Hub dataset 'lerobot/nope'")
        gated = ready(http, "lerobot/gated")
        assert_problem(gated, 403, "gated or private", "HF_TOKEN")
        assert "hf_secret" not in gated.text


def test_a_missing_revision_is_a_404_naming_it(hub: FakeHub, tmp_path: Path) -> None:
    env = hub_env(hub, tmp_path / "hf", EPISERVE_HUB="lerobot/pusht@v9.9")
    with ServerProcess([empty_root(tmp_path)], tmp_path / "cache", env=env) as server, server.client() as http:
        assert_problem(ready(http, "lerobot/pusht"), 404, "has no revision 'v9.9'")


def test_a_gated_repo_is_served_with_a_token(hub: FakeHub, source: Path, tmp_path: Path) -> None:
    env = hub_env(hub, tmp_path / "hf", EPISERVE_HUB="lerobot/gated", HF_TOKEN="hf_secret")
    with ServerProcess([empty_root(tmp_path)], tmp_path / "cache", env=env) as server, server.client() as http:
        assert ready(http, "lerobot/gated").status_code == 200
        with episerve.Client(server.url) as client:
            assert client.rows("lerobot/gated", episodes=[2], columns=COLUMNS).equals(expected_rows(source, [2]))


def test_a_dropped_connection_resumes_and_a_failing_hub_is_a_problem_a_retry_later_succeeds(
    hub: FakeHub, source: Path, tmp_path: Path
) -> None:
    repo = hub.repos["lerobot/other"]
    files = sorted(repo.files[repo.branches["main"]])
    parquet = next(p for p in files if p.endswith(".parquet"))
    video = next(p for p in files if p.endswith(".mp4"))
    hub.fail_next[video] = "drop"  # cut midway once: huggingface_hub resumes it with a range request
    hub.refusing.add(parquet)  # and this one fails until the Hub recovers
    env = hub_env(hub, tmp_path / "hf", EPISERVE_HUB_ALLOW="lerobot/other")
    with ServerProcess([empty_root(tmp_path)], tmp_path / "cache", env=env) as server, server.client() as http:
        failed = ready(http, "lerobot/other", seconds=120)
        assert_problem(failed, 503, "'lerobot/other' cannot be downloaded now", "retry later")
        assert not (tmp_path / "hf" / "lerobot" / "lerobot" / "other" / parquet).exists()  # nothing half-written
        hub.refusing.clear()
        retried = ready(http, "lerobot/other")  # the next request downloads again
        assert retried.status_code == 200, retried.text
        with episerve.Client(server.url) as client:
            assert client.rows("lerobot/other", columns=COLUMNS).equals(expected_rows(source, list(range(6))))
    local = tmp_path / "hf" / "lerobot" / "lerobot" / "other"
    assert (local / video).read_bytes() == (source / video).read_bytes()
    offline = hub_env(hub, tmp_path / "hf", EPISERVE_HUB="lerobot/other", HF_HUB_OFFLINE="1")
    with ServerProcess([empty_root(tmp_path)], tmp_path / "cache-2", env=offline) as server, server.client() as http:
        assert ready(http, "lerobot/other").status_code == 200
        with episerve.Client(server.url) as client:
            assert client.rows("lerobot/other", episodes=[3], columns=COLUMNS).equals(expected_rows(source, [3]))
