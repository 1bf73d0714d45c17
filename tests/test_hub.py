"""Datasets from the Hugging Face Hub by repo id, against a real server and a local server that speaks the Hub's API
(tests/hub_server.py, `HF_ENDPOINT`). What is fetched when: a dataset is served once its metadata and first data file
are downloaded (the pinned commit shown, its episodes and rows described from the metadata), and a data file or a
camera's video file is fetched when a read first needs it — a cold read of one episode (v2.1 and v3.0) downloads that
episode's data and video files and no other, a `/takes` over two episodes both ones' — with one 503 and the progress
meanwhile, and in `/cache` and the log. Rows and frames equal the files'; `RemoteLeRobotDataset` and `EpisodeDataset`
through DataLoader workers need no manual step, from a cold start too, and the client waits out a download that moves
however long it takes. The commit a revision names is pinned:
a restart and every worker of a server serve it though the branch moves, until the operator's `hub refresh`; `warm`
downloads a Hub dataset's files ahead of the first read (the data files of the episodes warmed, and no other), and
`cache prune` keeps Hub datasets' caches. Unknown repos, missing revisions, gated
repos without a token, repos the server may not fetch, a failing Hub, a connection dropped mid-download and a corrupt
download are each a clear problem, nothing half-downloaded or corrupt is served, and a retry later succeeds; offline,
what is downloaded is served."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import episerve
from app.demo import write_demo_dataset
from app.demo_cameras import TOP_CAMERA, WRIST_CAMERA
from tests.hub_server import FakeHub, HubRepo
from tests.support import ROOT, ServerProcess, eventually
from tests.test_errors import assert_problem
from tests.video_oracle import episode_video, frames_for_rows

COLUMNS = ["episode_index", "frame_index", "action"]
CAMERAS = [TOP_CAMERA, WRIST_CAMERA]


@pytest.fixture(scope="module")
def source(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("hub-source")
    write_demo_dataset(root / "pusht", format="v3.0", episodes=6, seed=11, video_files=3)
    return root / "pusht"


@pytest.fixture(scope="module")
def hub(source: Path, video_root: Path) -> Iterator[FakeHub]:
    with FakeHub() as running:
        for repo_id, directory in {
            "lerobot/pusht": source,
            "lerobot/other": source,
            "cams/v21": video_root / "cams-v21",
            "cams/v3": video_root / "cams-v3",
            "cams/slow": video_root / "cams-v21",
            "cams/loader": video_root / "cams-v21",
        }.items():
            running.repos[repo_id] = HubRepo()
            running.repos[repo_id].commit(directory)
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


def not_videos(dataset: Path) -> set[str]:
    """The files of a dataset but its camera videos."""
    files = {p.relative_to(dataset).as_posix() for p in dataset.rglob("*") if p.is_file()}
    return {path for path in files if not path.startswith("videos/")}


def before_serving(dataset: Path) -> set[str]:
    """The files of a LeRobot dataset fetched before it is served: all but the data files and camera videos, and its
    first data file (the schema of its rows)."""
    data = sorted(path for path in not_videos(dataset) if path.startswith("data/"))
    return {path for path in not_videos(dataset) if not path.startswith("data/")} | set(data[:1])


def data_of(dataset: Path, episodes: list[int]) -> set[str]:
    """The data files holding rows of `episodes` (read from the files themselves)."""
    held = set()
    for path in sorted((dataset / "data").rglob("*.parquet")):
        if set(pq.read_table(path, columns=["episode_index"])["episode_index"].to_pylist()) & set(episodes):
            held.add(path.relative_to(dataset).as_posix())
    return held


def videos_of(dataset: Path, episodes: list[int]) -> set[str]:
    """The video files holding the frames of `episodes`, every camera."""
    paths = {episode_video(dataset, key, e).path for key in CAMERAS for e in episodes}
    return {path.relative_to(dataset).as_posix() for path in paths}


def fetched(hub: FakeHub, repo_id: str) -> list[str]:
    """The files of `repo_id` the Hub was asked for (GET), in order."""
    return [path for repo, path in hub.fetched if repo == repo_id]


def assert_frames(table: pa.Table, dataset: Path, keys: list[str]) -> None:
    rows = list(zip(table["episode_index"].to_pylist(), table["frame_index"].to_pylist(), strict=True))
    for key in keys:
        served = table[key].combine_chunks().to_numpy_ndarray()
        np.testing.assert_array_equal(served, frames_for_rows(dataset, key, rows), err_msg=key)


# -- what is fetched when ----------------------------------------------------------------------------------------


def test_a_configured_dataset_is_pinned_and_served_once_its_metadata_and_data_are_downloaded(
    hub: FakeHub, source: Path, tmp_path: Path
) -> None:
    env = hub_env(hub, tmp_path / "hf", EPISERVE_HUB="lerobot/pusht@main,lerobot/gated", HF_TOKEN="hf_secret")
    with ServerProcess([empty_root(tmp_path)], tmp_path / "cache", env=env) as server, server.client() as http:
        described = ready(http, "lerobot/pusht")
        assert described.status_code == 200, described.text
        commit = hub.repos["lerobot/pusht"].branches["main"]
        files = hub.repos["lerobot/pusht"].files[commit]
        first = before_serving(source)
        pinned = described.json()["hub"]
        assert {key: pinned[key] for key in ("repo_id", "revision", "commit", "state")} == {
            "repo_id": "lerobot/pusht",
            "revision": "main",
            "commit": commit,
            "state": "ready",
        }
        assert (pinned["files"], pinned["bytes"]) == (len(files), sum(map(len, files.values())))
        assert (pinned["files_done"], pinned["bytes_done"]) == (len(first), sum(len(files[p]) for p in first))
        assert pinned["fetching"]["files"] == 0 and pinned["failed"] == []
        assert sorted(fetched(hub, "lerobot/pusht")) == sorted(first)  # no camera video before a read needs one
        assert http.get("/datasets/lerobot/pusht/cache").json()["hub"]["files_done"] == len(first)
        assert "lerobot/pusht" in [d["id"] for d in http.get("/datasets").json()["datasets"]]
        with episerve.Client(server.url) as client:
            assert client.rows("lerobot/pusht", episodes=[4, 1], columns=COLUMNS).equals(expected_rows(source, [1, 4]))
            assert ready(http, "lerobot/gated").status_code == 200  # gated: read with the server's HF_TOKEN
            assert client.rows("lerobot/gated", episodes=[2], columns=COLUMNS).equals(expected_rows(source, [2]))
    # The files are where LeRobot looks for a downloaded dataset ($HF_HOME/lerobot/<repo id>), byte for byte.
    snapshot = tmp_path / "hf" / "lerobot" / "lerobot" / "pusht"
    for path in first:
        assert hashlib.sha256((snapshot / path).read_bytes()).digest() == hashlib.sha256(files[path]).digest()
    assert not (snapshot / "videos").exists()


@pytest.fixture(scope="module")
def cams_server(hub: FakeHub, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """A server that may fetch `cams/*` from the Hub, logging at INFO."""
    home = tmp_path_factory.mktemp("cams-hub")
    env = hub_env(hub, home / "hf", EPISERVE_HUB_ALLOW="cams/*", EPISERVE_LOG_LEVEL="info")
    with ServerProcess([empty_root(home)], home / "cache", env=env) as server:
        yield server


@pytest.mark.parametrize(("repo_id", "name"), [("cams/v21", "cams-v21"), ("cams/v3", "cams-v3")])
def test_a_cold_read_of_one_episode_fetches_only_its_data_and_video_files(
    hub: FakeHub, cams_server: ServerProcess, video_root: Path, repo_id: str, name: str
) -> None:
    dataset = video_root / name
    with episerve.Client(cams_server.url) as client:  # it waits out the 503s while the files download
        table = client.rows(repo_id, episodes=[4], columns=["episode_index", "frame_index", *CAMERAS])
    assert table.num_rows == len(expected_rows(dataset, [4]))
    assert_frames(table, dataset, CAMERAS)
    videos = videos_of(dataset, [4])  # v2.1: the episode's own files; v3.0: the files holding it and others
    needed = before_serving(dataset) | data_of(dataset, [4]) | videos
    assert sorted(fetched(hub, repo_id)) == sorted(needed)
    with cams_server.client() as http:
        progress = http.get(f"/datasets/{repo_id}/cache").json()["hub"]
    assert progress["files_done"] == len(needed)
    assert progress["fetching"] == {"files": 0, "bytes": 0, "bytes_done": 0, "first": []}
    log = cams_server.log_path.read_text()
    for path in needed - before_serving(dataset):
        assert f"Hub dataset {repo_id}: fetched {path}" in log
    # Read again, nothing more is fetched.
    with episerve.Client(cams_server.url) as client:
        again = client.rows(repo_id, episodes=[4], columns=["episode_index", "frame_index", *CAMERAS])
    assert again.equals(table)
    assert sorted(fetched(hub, repo_id)) == sorted(needed)


@pytest.fixture(scope="module")
def data_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """LeRobot datasets without cameras, of several data files: `data-v3` (v3.0, 9 episodes in 3 files) and
    `data-v21` (v2.1, one file per episode)."""
    root = tmp_path_factory.mktemp("data-root")
    write_demo_dataset(root / "data-v3", format="v3.0", episodes=9, seed=5, files=3, cameras={})
    write_demo_dataset(root / "data-v21", format="v2.1", episodes=9, seed=5, cameras={})
    return root


def cold(hub: FakeHub, repo_id: str, dataset: Path) -> None:
    """`repo_id` on the Hub: `dataset`'s files, which no server has fetched yet."""
    hub.repos[repo_id] = HubRepo()
    hub.repos[repo_id].commit(dataset)


@pytest.mark.parametrize("name", ["data-v21", "data-v3"])
def test_a_cold_read_of_one_episode_fetches_its_data_files_and_the_metadata_only(
    hub: FakeHub, cams_server: ServerProcess, data_root: Path, name: str
) -> None:
    dataset, repo_id = data_root / name, f"cams/cold-{name}"
    cold(hub, repo_id, dataset)
    everything = expected_rows(dataset, list(range(9)))
    with cams_server.client() as http:
        described = ready(http, repo_id)  # answered from the metadata and the first data file alone
        assert described.status_code == 200, described.text
        assert (described.json()["rows"], described.json()["episodes"]) == (everything.num_rows, 9)
        assert sorted(fetched(hub, repo_id)) == sorted(before_serving(dataset))
        wanted = sorted(data_of(dataset, [4]))
        assert wanted and not set(wanted) & before_serving(dataset)  # not fetched yet
        first = http.get(f"/datasets/{repo_id}/rows", params={"episodes": "4", "columns": ",".join(COLUMNS)})
        assert_problem(first, 503, *wanted)  # one 503 naming the files, with the progress, before any row is read
        assert first.headers["Retry-After"] and "/" in first.headers["X-Download-Progress"]
    with episerve.Client(cams_server.url) as client:  # it waits out the 503s while the file downloads
        table = client.rows(repo_id, episodes=[4], columns=COLUMNS)
        assert table.equals(expected_rows(dataset, [4]))
        assert sorted(fetched(hub, repo_id)) == sorted(before_serving(dataset) | data_of(dataset, [4]))
        assert client.rows(repo_id, columns=COLUMNS).equals(everything)  # and the others, as a read needs them
    assert sorted(fetched(hub, repo_id)) == sorted(not_videos(dataset))


def test_takes_over_two_episodes_in_one_request_fetch_both_ones_data_files(
    hub: FakeHub, cams_server: ServerProcess, data_root: Path
) -> None:
    dataset, repo_id = data_root / "data-v3", "cams/takes-v3"
    cold(hub, repo_id, dataset)
    picks = [4, 7]
    assert len(data_of(dataset, picks)) == 2 and not data_of(dataset, picks) & before_serving(dataset)
    takes = [(episerve.Selection.of(repo_id, [episode], COLUMNS), [0, 3, 1]) for episode in picks]
    with episerve.Client(cams_server.url) as client:  # one POST /takes: both files fetched at once, waited out
        answers = client.read_takes(takes)
    for episode, pages in zip(picks, answers, strict=True):
        assert pages.table.equals(expected_rows(dataset, [episode]).take([0, 3, 1]))
    assert sorted(fetched(hub, repo_id)) == sorted(before_serving(dataset) | data_of(dataset, picks))


def test_a_take_whose_later_pieces_lie_in_a_data_file_fetched_since_the_index_was_read_is_answered_whole(
    hub: FakeHub, data_root: Path, tmp_path: Path
) -> None:
    dataset, repo_id = data_root / "data-v3", "lazy/pieces"
    cold(hub, repo_id, dataset)
    (first_file,) = data_of(dataset, [1]) & before_serving(dataset)  # fetched before serving
    (later_file,) = data_of(dataset, [7]) - before_serving(dataset)  # fetched by the take
    source = pq.read_table(sorted((dataset / "data").rglob("*.parquet")))
    source = source.filter(pa.compute.is_in(source["episode_index"], pa.array([1, 7], source["episode_index"].type)))
    lengths = [source["episode_index"].to_pylist().count(episode) for episode in (1, 7)]
    # Episode 1's rows, then episode 7's, each many times over: several pieces of 4 MiB, the later ones in episode 7.
    indices = [i % lengths[0] for i in range(6000)] + [lengths[0] + i % lengths[1] for i in range(6000)]
    columns = [*COLUMNS, "observation.image"]
    body = {"episodes": "1,7", "indices": indices, "columns": columns}
    # No look at the files but the reads' own: the index read before the later file came is the one a read finds.
    env = hub_env(hub, tmp_path / "hf", EPISERVE_HUB=repo_id, EPISERVE_RESCAN_INTERVAL_S="3600")
    with ServerProcess([empty_root(tmp_path)], tmp_path / "cache", env=env) as server, server.client() as http:
        assert ready(http, repo_id).status_code == 200
        assert_problem(http.post(f"/datasets/{repo_id}/rows/take", json=body), 503, later_file)
        eventually(lambda: http.get(f"/datasets/{repo_id}/cache").json()["hub"]["fetching"]["files"] == 0, 60)
        answer = http.post(f"/datasets/{repo_id}/rows/take", json=body)
        assert answer.status_code == 200, answer.text
        table = pa.ipc.open_stream(answer.content).read_all()
    assert table.select(columns).to_pylist() == source.select(columns).take(indices).to_pylist()
    assert first_file != later_file


def test_remote_lerobot_dataset_in_dataloader_workers_reads_a_cold_hub_dataset(
    hub: FakeHub, cams_server: ServerProcess, data_root: Path
) -> None:
    torch = pytest.importorskip("torch")
    from episerve.lerobot import RemoteLeRobotDataset
    from tests.client.test_lerobot import assert_same_sample, reference

    dataset, repo_id = data_root / "data-v3", "cams/loader-v3"
    cold(hub, repo_id, dataset)
    remote = RemoteLeRobotDataset(cams_server.url, repo_id, episodes=[1, 7])
    expected = reference(dataset, (1, 7))
    assert len(remote) == len(expected)
    assert not data_of(dataset, [1, 7]) <= set(fetched(hub, repo_id))  # no row read yet
    loader = torch.utils.data.DataLoader(remote, batch_size=None, num_workers=2)  # the workers' reads fetch
    seen = 0
    for i, sample in enumerate(loader):
        assert_same_sample(sample, expected.item(i), f"sample {i}")
        seen += 1
    assert seen == len(expected)
    assert sorted(fetched(hub, repo_id)) == sorted(before_serving(dataset) | data_of(dataset, [1, 7]))


def test_takes_of_several_hub_datasets_in_one_request_fetch_each_ones_video_files(
    hub: FakeHub, cams_server: ServerProcess, video_root: Path
) -> None:
    columns = ["episode_index", "frame_index", *CAMERAS]
    picks = {"cams/mix-v21": ("cams-v21", 1, [0, 3, 1]), "cams/mix-v3": ("cams-v3", 8, [2])}
    for repo_id, (name, _, _) in picks.items():
        hub.repos[repo_id] = HubRepo()
        hub.repos[repo_id].commit(video_root / name)
    takes = [(episerve.Selection.of(repo, [episode], columns), rows) for repo, (_, episode, rows) in picks.items()]
    with episerve.Client(cams_server.url) as client:  # one POST /takes, a mixture's batch
        answers = client.read_takes(takes)
    for (repo_id, (name, episode, rows)), pages in zip(picks.items(), answers, strict=True):
        assert pages.table["episode_index"].to_pylist() == [episode] * len(rows)
        assert pages.table["frame_index"].to_pylist() == rows
        assert_frames(pages.table, video_root / name, CAMERAS)
        assert {p for p in fetched(hub, repo_id) if p.startswith("videos/")} == videos_of(video_root / name, [episode])


def test_a_read_waits_out_a_download_that_outlasts_its_retry_deadline_while_it_moves(
    hub: FakeHub, cams_server: ServerProcess, video_root: Path
) -> None:
    hub.delays["cams/slow"] = 0.8  # 13 metadata and data files, then 18 video files, 4 at a time: about 6 s
    retries = episerve.Retries(attempts=3, deadline=4.0)
    started = time.monotonic()
    with episerve.Client(cams_server.url, retries=retries) as client:
        table = client.rows("cams/slow", columns=["episode_index", "frame_index", *CAMERAS])
    assert time.monotonic() - started > retries.deadline  # past the deadline, because the download kept moving
    assert table.num_rows == len(expected_rows(video_root / "cams-v21", list(range(9))))
    assert_frames(table, video_root / "cams-v21", CAMERAS)


def test_remote_lerobot_dataset_and_episode_datasets_in_dataloader_workers_read_a_hub_dataset(
    hub: FakeHub, cams_server: ServerProcess, video_root: Path
) -> None:
    torch = pytest.importorskip("torch")
    from episerve.lerobot import RemoteLeRobotDataset
    from tests.client.test_lerobot import assert_same_sample, reference

    dataset = video_root / "cams-v21"
    remote = RemoteLeRobotDataset(cams_server.url, "cams/loader", episodes=[2, 7])  # first use: nothing to do first
    expected = reference(dataset, (2, 7))
    assert len(remote) == len(expected)
    for i in (0, len(remote) - 1):
        assert_same_sample(remote[i], expected.item(i), f"sample {i}")
    episodes = episerve.EpisodeDataset(
        cams_server.url, "cams/loader", episodes=[0, 5], columns=["episode_index", "frame_index", *CAMERAS]
    )
    loader = torch.utils.data.DataLoader(
        episodes, batch_size=8, shuffle=True, num_workers=2, collate_fn=episerve.collate
    )
    seen = 0
    for batch in loader:
        rows = list(zip(batch["episode_index"].tolist(), batch["frame_index"].tolist(), strict=True))
        for key in CAMERAS:
            frames = torch.from_numpy(frames_for_rows(dataset, key, rows)).permute(0, 3, 1, 2)
            assert torch.equal(batch[key], frames), key
        seen += len(rows)
    assert seen == len(episodes)
    assert {p for p in fetched(hub, "cams/loader") if p.startswith("videos/")} == videos_of(dataset, [0, 2, 5, 7])


# -- the pinned commit ---------------------------------------------------------------------------------------------


def moving_branch(hub: FakeHub, repo_id: str, tmp_path: Path) -> tuple[HubRepo, Path, Path]:
    """A repo whose `main` is a first dataset (4 episodes), and a second dataset to move it to (6 other episodes)."""
    first = write_demo_dataset(tmp_path / "first" / "moving", format="v3.0", episodes=4, seed=1, cameras={})
    second = write_demo_dataset(tmp_path / "second" / "moving", format="v2.1", episodes=6, seed=2, cameras={})
    repo = hub.repos[repo_id] = HubRepo()
    repo.commit(first)
    return repo, first, second


def served(server: ServerProcess, repo_id: str) -> tuple[str, pa.Table]:
    """(the commit `/datasets/<id>` shows, every row) of a Hub dataset, through a fresh connection."""
    with server.client() as http:
        described = ready(http, repo_id)
    assert described.status_code == 200, described.text
    with episerve.Client(server.url) as client:
        return described.json()["hub"]["commit"], client.rows(repo_id, columns=COLUMNS)


def cli(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    """`episerve-server ARGS` in its own process (huggingface_hub reads `HF_ENDPOINT` as it is imported)."""
    environment = {k: v for k, v in os.environ.items() if not k.startswith("EPISERVE_")} | env
    command = [sys.executable, "-m", "app.cli", *args]
    return subprocess.run(command, cwd=ROOT, env=environment, capture_output=True, text=True, timeout=300)


def test_the_pinned_commit_outlives_a_restart_and_moves_only_when_the_operator_refreshes_it(
    hub: FakeHub, tmp_path: Path
) -> None:
    repo, first, second = moving_branch(hub, "lerobot/moving", tmp_path)
    old = repo.branches["main"]
    env = hub_env(hub, tmp_path / "hf", EPISERVE_HUB="lerobot/moving")
    cache = tmp_path / "cache"
    with ServerProcess([empty_root(tmp_path)], cache, env=env) as server:
        commit, rows = served(server, "lerobot/moving")
    assert commit == old and rows.equals(expected_rows(first, [0, 1, 2, 3]))
    new = repo.commit(second)  # the branch moves on the Hub
    with ServerProcess([empty_root(tmp_path)], cache, env=env) as server:
        commit, rows = served(server, "lerobot/moving")
    assert commit == old and rows.equals(expected_rows(first, [0, 1, 2, 3]))  # restarted: still the pinned commit
    assert cli(env, "hub", "pins", "--cache-dir", str(cache)).stdout.startswith(f"lerobot/moving@main: commit {old}")

    refreshed = cli(env, "hub", "refresh", "lerobot/moving", "--cache-dir", str(cache))
    assert refreshed.returncode == 0, refreshed.stderr
    assert f"lerobot/moving@main: commit {new} (was main at {old})" in refreshed.stdout
    with ServerProcess([empty_root(tmp_path)], cache, env=env) as server:
        commit, rows = served(server, "lerobot/moving")
    assert commit == new and rows.equals(expected_rows(second, [0, 1, 2, 3, 4, 5]))  # and the old commit's files gone
    local = tmp_path / "hf" / "lerobot" / "lerobot" / "moving"
    files = {p.relative_to(local).as_posix() for p in local.rglob("*") if p.is_file() and ".cache" not in p.parts}
    assert files == not_videos(second)  # every row was read: every data file fetched

    unknown = cli(env, "hub", "refresh", "lerobot/moving@v9", "--cache-dir", str(cache))
    assert unknown.returncode == 2 and "has no revision 'v9'" in unknown.stderr
    assert cli(env, "hub", "pins", "--cache-dir", str(cache)).stdout.startswith(f"lerobot/moving@main: commit {new}")


def test_every_worker_serves_the_commit_the_first_resolve_pinned_though_the_branch_moves_right_after(
    hub: FakeHub, tmp_path: Path
) -> None:
    repo, first, second = moving_branch(hub, "lerobot/workers", tmp_path)
    old = repo.branches["main"]
    hub.move_after_resolve["lerobot/workers"] = second  # a worker resolving `main` after the first finds a new commit
    env = hub_env(hub, tmp_path / "hf", EPISERVE_HUB="lerobot/workers", EPISERVE_LOG_LEVEL="info")
    with ServerProcess([empty_root(tmp_path)], tmp_path / "cache", workers=2, env=env) as server:
        eventually(lambda: len(server.worker_pids()) == 2, seconds=60)
        eventually(lambda: server.log_path.read_text().count("Hub dataset lerobot/workers@main is commit") == 2, 60)
        assert repo.branches["main"] != old  # the branch did move, right after the first resolve
        # `main` was resolved once; the other worker asked the Hub for the pinned commit's files only.
        assert [revision for repo_id, revision in hub.resolves if repo_id == "lerobot/workers"] == ["main", old]
        log = server.log_path.read_text()
        assert log.count(f"Hub dataset lerobot/workers@main is commit {old}") == 2
        for _ in range(6):  # fresh connections, answered by either worker
            commit, rows = served(server, "lerobot/workers")
            assert commit == old and rows.equals(expected_rows(first, [0, 1, 2, 3]))


def test_warm_downloads_a_hub_datasets_files_so_a_first_read_finds_them_there(
    hub: FakeHub, video_root: Path, data_root: Path, tmp_path: Path
) -> None:
    dataset = video_root / "cams-v3"
    hub.repos["cams/warm"] = HubRepo()
    hub.repos["cams/warm"].commit(dataset)
    env = hub_env(hub, tmp_path / "hf", EPISERVE_HUB_ALLOW="cams/*")
    cache = tmp_path / "cache"
    warmed = cli(
        env,
        "warm",
        "cams/warm",
        "--episodes",
        "2",
        "--videos",
        "--root",
        str(empty_root(tmp_path)),
        "--cache-dir",
        str(cache),
    )
    assert warmed.returncode == 0, warmed.stderr
    assert "downloading cams/warm (metadata)" in warmed.stderr  # the progress bars
    assert "downloading cams/warm data files" in warmed.stderr
    assert "downloading cams/warm videos" in warmed.stderr
    videos, data = videos_of(dataset, [2]), data_of(dataset, [2]) - before_serving(dataset)
    assert f"cams/warm: {len(data_of(dataset, [2]))} data files needed, {len(data)} downloaded" in warmed.stdout
    assert f"cams/warm: {len(videos)} video files needed, {len(videos)} downloaded" in warmed.stdout
    needed = before_serving(dataset) | data | videos
    assert sorted(fetched(hub, "cams/warm")) == sorted(needed)
    columns = ["episode_index", "frame_index", *CAMERAS]
    with ServerProcess([empty_root(tmp_path)], cache, env=env) as server:
        with episerve.Client(server.url) as client:  # it waits out the revision's lookup at first use
            table = client.rows("cams/warm", episodes=[2], columns=columns)
        with server.client() as http:
            progress = http.get("/datasets/cams/warm/cache").json()["hub"]
    assert progress["files_done"] == len(needed) and progress["fetching"]["files"] == 0
    assert table.num_rows == len(expected_rows(dataset, [2]))
    assert_frames(table, dataset, CAMERAS)
    assert sorted(fetched(hub, "cams/warm")) == sorted(needed)  # nothing fetched again

    # The data files of the episodes warmed, and no other.
    cold(hub, "cams/warm-data", data_root / "data-v3")
    location = ["--root", str(empty_root(tmp_path)), "--cache-dir", str(cache)]
    warmed = cli(env, "warm", "cams/warm-data", "--episodes", "7", *location)
    assert warmed.returncode == 0, warmed.stderr
    assert "cams/warm-data: 1 data files needed, 1 downloaded" in warmed.stdout
    assert "cams/warm-data: 1 segments needed, 1 built" in warmed.stdout
    needed = before_serving(data_root / "data-v3") | data_of(data_root / "data-v3", [7])
    assert sorted(fetched(hub, "cams/warm-data")) == sorted(needed)


def warmed(server: ServerProcess, repo_id: str) -> None:
    """Every segment of a Hub dataset built by the server (`POST /cache`, waited for)."""
    with server.client() as http:
        assert ready(http, repo_id).status_code == 200
        assert http.post(f"/datasets/{repo_id}/cache").status_code == 202
        eventually(lambda: (http.get(f"/datasets/{repo_id}/cache").json()["warming"] or {}).get("state") == "done", 60)


def test_cache_prune_keeps_the_caches_of_configured_and_pinned_hub_datasets(
    hub: FakeHub, source: Path, tmp_path: Path
) -> None:
    for repo_id in ("prune/configured", "prune/allowed"):
        hub.repos[repo_id] = HubRepo()
        hub.repos[repo_id].commit(source)
    env = hub_env(hub, tmp_path / "hf", EPISERVE_HUB="prune/configured", EPISERVE_HUB_ALLOW="prune/*")
    cache, root = tmp_path / "cache", empty_root(tmp_path)
    with ServerProcess([root], cache, env=env) as server:
        warmed(server, "prune/configured")
        warmed(server, "prune/allowed")  # named on first use: pinned, not configured
    segments = {p: p.stat().st_ino for p in (cache / "datasets").rglob("segments/*.arrow")}
    assert len(segments) == 2 * len(list((source / "data").rglob("*.parquet")))
    gone = cache / "datasets" / "gone-0123456789ab" / "segments"
    gone.mkdir(parents=True)
    (gone / "0.arrow").write_bytes(b"x" * 10)  # the cache of a dataset no root or pin offers

    pruned = cli({**env, "EPISERVE_HUB_ALLOW": ""}, "cache", "prune", "--root", str(root), "--cache-dir", str(cache))
    assert pruned.returncode == 0, pruned.stderr
    assert "gone-0123456789ab/segments/0.arrow (10 bytes)" in pruned.stdout and not gone.exists()
    assert {p: p.stat().st_ino for p in (cache / "datasets").rglob("segments/*.arrow")} == segments  # kept as they are
    with ServerProcess([root], cache, env=env) as server:
        for repo_id in ("prune/configured", "prune/allowed"):
            _, rows = served(server, repo_id)
            assert rows.equals(expected_rows(source, list(range(6))))
        with server.client() as http:
            assert http.get("/datasets/prune/allowed/cache").json()["segments_built"] == len(segments) // 2


# -- the local Hub ---------------------------------------------------------------------------------------------


def test_the_local_hub_lists_branches_and_tags_and_a_tag_resolves_as_lerobot_asks(
    hub: FakeHub, source: Path, tmp_path: Path
) -> None:
    from huggingface_hub import HfApi, hf_hub_download

    repo = hub.repos["lerobot/tagged"] = HubRepo()
    commit = repo.commit(source)
    repo.tag("v3.0")  # LeRobot's LeRobotDataset downloads the tag naming its codebase version
    api = HfApi(endpoint=hub.url)

    refs = api.list_repo_refs("lerobot/tagged", repo_type="dataset")

    assert [(r.name, r.ref, r.target_commit) for r in refs.branches] == [("main", "refs/heads/main", commit)]
    assert [(r.name, r.ref, r.target_commit) for r in refs.tags] == [("v3.0", "refs/tags/v3.0", commit)]
    assert api.dataset_info("lerobot/tagged", revision="v3.0").sha == commit
    info = hf_hub_download(
        "lerobot/tagged", "meta/info.json", repo_type="dataset", revision="v3.0", local_dir=tmp_path, endpoint=hub.url
    )
    assert Path(info).read_bytes() == (source / "meta/info.json").read_bytes()
    assert hub.served["lerobot/tagged"] == (source / "meta/info.json").stat().st_size


# -- problems ----------------------------------------------------------------------------------------------------


def test_repos_the_server_may_not_or_cannot_fetch_are_clear_problems(hub: FakeHub, tmp_path: Path) -> None:
    env = hub_env(hub, tmp_path / "hf", EPISERVE_HUB="lerobot/pusht@v9.9", EPISERVE_HUB_ALLOW="lerobot/*")
    with ServerProcess([empty_root(tmp_path)], tmp_path / "cache", env=env) as server, server.client() as http:
        assert_problem(http.get("/datasets/acme/thing"), 404, "EPISERVE_HUB_ALLOW")
        assert_problem(ready(http, "lerobot/nope"), 404, "no Hub dataset 'lerobot/nope'")
        assert_problem(ready(http, "lerobot/pusht"), 404, "has no revision 'v9.9'")
        gated = ready(http, "lerobot/gated")
        assert_problem(gated, 403, "gated or private", "HF_TOKEN")
        assert "hf_secret" not in gated.text


def test_a_failing_dropped_or_corrupt_download_is_never_served_and_a_retry_succeeds_offline_too(
    hub: FakeHub, source: Path, tmp_path: Path
) -> None:
    repo = hub.repos["lerobot/other"]
    files = repo.files[repo.branches["main"]]
    parquet = sorted(p for p in files if p.startswith("data/"))
    hub.fail_next[parquet[0]] = "drop"  # cut midway once: huggingface_hub resumes it with a range request
    hub.refusing.add(parquet[-1])  # and this one fails until the Hub recovers
    video = episode_video(source, TOP_CAMERA, 3).path.relative_to(source).as_posix()
    hub.fail_next[video] = "corrupt"  # the same size, one byte changed: only its hash tells
    local = tmp_path / "hf" / "lerobot" / "lerobot" / "other"
    env = hub_env(hub, tmp_path / "hf", EPISERVE_HUB_ALLOW="lerobot/other")
    with ServerProcess([empty_root(tmp_path)], tmp_path / "cache", env=env) as server, server.client() as http:
        failed = ready(http, "lerobot/other")
        assert_problem(failed, 503, "'lerobot/other' cannot be downloaded now", "retry later")
        assert not (local / parquet[-1]).exists()  # nothing half-written
        hub.refusing.clear()
        retried = ready(http, "lerobot/other")  # the next request starts over
        assert retried.status_code == 200, retried.text
        with episerve.Client(server.url) as client:
            assert client.rows("lerobot/other", columns=COLUMNS).equals(expected_rows(source, list(range(6))))
        # The corrupt video is found out by its hash, deleted and fetched again; its frames are never served.
        details = []
        deadline = time.monotonic() + 60
        while (answer := http.get("/datasets/lerobot/other/rows", params=_frames_of(3))).status_code == 503:
            assert time.monotonic() < deadline, details
            details.append(answer.json()["detail"])
            time.sleep(0.2)
        assert answer.status_code == 200, answer.text
        assert any(f"{video} as downloaded from the Hub has hash" in detail for detail in details), details
        assert_frames(pa.ipc.open_stream(answer.content).read_all(), source, [TOP_CAMERA])
    assert (local / parquet[0]).read_bytes() == files[parquet[0]]
    assert (local / video).read_bytes() == files[video]
    offline = hub_env(hub, tmp_path / "hf", EPISERVE_HUB="lerobot/other", HF_HUB_OFFLINE="1")
    with ServerProcess([empty_root(tmp_path)], tmp_path / "cache-2", env=offline) as server, server.client() as http:
        assert ready(http, "lerobot/other").status_code == 200
        answer = http.get("/datasets/lerobot/other/rows", params=_frames_of(3))  # downloaded: served
        assert answer.status_code == 200, answer.text
        assert_frames(pa.ipc.open_stream(answer.content).read_all(), source, [TOP_CAMERA])
        unfetched = episode_video(source, TOP_CAMERA, 0).path.relative_to(source).as_posix()
        assert unfetched != video
        assert_problem(
            http.get("/datasets/lerobot/other/rows", params=_frames_of(0)), 503, unfetched, "HF_HUB_OFFLINE=1"
        )


def _frames_of(episode: int) -> dict[str, str]:
    return {"episodes": str(episode), "columns": f"episode_index,frame_index,{TOP_CAMERA}"}
