"""Datasets in an S3-compatible object store (`--root s3://bucket/prefix`), against a real S3 server on 127.0.0.1
(moto's): the same bytes as from local disk, freshness by listing and ETag, and failures of the store."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from app.demo import write_demo_dataset
from app.settings import Settings
from app.sources.object_store import ObjectStore, ObjectStoreError, StoreOptions
from app.store.catalog import Catalog, ConfigurationError, locate_roots
from app.store.segments import SourceChanged
from tests.store_proxy import StoreProxy
from tests.support import ROOT, ServerProcess, assert_tables_equal, free_port, oracle, read_stream

moto_server = pytest.importorskip("moto.server", reason="moto (a dev dependency) runs the S3 server of these tests")
boto3 = pytest.importorskip("boto3")

BUCKET = "episerve"
CREDENTIALS = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_REGION": "us-east-1",
    "AWS_EC2_METADATA_DISABLED": "true",
}
TTL = 0.5  # seconds a listing is reused in these tests


class S3Server:
    """moto's S3 server in this process, on 127.0.0.1: stop and start it again on the same port, its objects
    kept (they live in this process)."""

    def __init__(self) -> None:
        self.port = free_port()
        self.server: moto_server.ThreadedMotoServer | None = None

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        logging.getLogger("werkzeug").setLevel(logging.WARNING)  # one line per request otherwise
        self.server = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=self.port, verbose=False)
        self.server.start()

    def stop(self) -> None:
        if self.server is not None:
            self.server.stop()
            self.server = None

    def env(self, **settings: object) -> dict[str, str]:
        """The environment of a server reading from this store."""
        base = {"EPISERVE_REMOTE_LIST_TTL": str(TTL), "EPISERVE_RESCAN_INTERVAL_S": "0"}
        return CREDENTIALS | {"AWS_ENDPOINT_URL_S3": self.endpoint} | base | {k: str(v) for k, v in settings.items()}

    def client(self):  # a boto3 S3 client
        return boto3.client("s3", endpoint_url=self.endpoint, **_boto_credentials())

    def upload(self, local: Path, prefix: str) -> None:
        client = self.client()
        for path in sorted(local.rglob("*")):
            if path.is_file():
                client.upload_file(str(path), BUCKET, f"{prefix}/{path.relative_to(local).as_posix()}")

    def keys(self, prefix: str) -> list[str]:
        pages = self.client().get_paginator("list_objects_v2").paginate(Bucket=BUCKET, Prefix=prefix + "/")
        return [item["Key"] for page in pages for item in page.get("Contents", [])]


def _boto_credentials() -> dict[str, str]:
    return {
        "aws_access_key_id": CREDENTIALS["AWS_ACCESS_KEY_ID"],
        "aws_secret_access_key": CREDENTIALS["AWS_SECRET_ACCESS_KEY"],
        "region_name": CREDENTIALS["AWS_REGION"],
    }


@pytest.fixture(scope="module")
def s3(datasets_root: Path, video_root: Path) -> Iterator[S3Server]:
    """The S3 server, with the test datasets uploaded below `datasets/` and the camera datasets below `videos/`."""
    server = S3Server()
    server.start()
    try:
        server.client().create_bucket(Bucket=BUCKET)
        server.upload(datasets_root, "datasets")
        server.upload(video_root, "videos")
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="module")
def remote_server(s3: S3Server, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    with ServerProcess([f"s3://{BUCKET}/datasets"], tmp_path_factory.mktemp("s3-cache"), env=s3.env()) as running:
        yield running


@contextlib.contextmanager
def _client(server: ServerProcess) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=server.url, timeout=60.0) as client:
        yield client


def _same_response(local: httpx.Client, remote: httpx.Client, method: str, url: str, **kwargs: object) -> bytes:
    """The request's answer from both servers: the same status and the same bytes."""
    expected = local.request(method, url, **kwargs)  # type: ignore[arg-type]
    actual = remote.request(method, url, **kwargs)  # type: ignore[arg-type]
    assert expected.status_code == 200, expected.text
    assert actual.status_code == 200, actual.text
    assert actual.content == expected.content
    return actual.content


# -- the same bytes as from local disk ------------------------------------------------------------------------------


def test_catalog_of_an_object_store_root_equals_the_local_one(http: httpx.Client, remote_server: ServerProcess) -> None:
    with _client(remote_server) as remote:
        local_catalog = {d["id"]: d for d in http.get("/datasets").json()["datasets"]}
        remote_catalog = {d["id"]: d for d in remote.get("/datasets").json()["datasets"]}
        assert sorted(remote_catalog) == sorted(local_catalog)
        for dataset_id, described in local_catalog.items():
            assert remote_catalog[dataset_id]["rows"] == described["rows"]
            assert remote_catalog[dataset_id]["episodes"] == described["episodes"]
            assert remote_catalog[dataset_id]["format"] == described["format"]


@pytest.mark.parametrize("dataset_id", ["lerobot/demo-v3", "lerobot/demo-v21", "generic", "plain", "nullable"])
def test_picks_from_the_object_store_are_byte_for_byte_the_local_ones(
    http: httpx.Client, remote_server: ServerProcess, datasets_root: Path, dataset_id: str
) -> None:
    rng = np.random.default_rng(7)
    with _client(remote_server) as remote:
        listed = http.get(f"/datasets/{dataset_id}/episodes")
        episodes = [e["episode_index"] for e in listed.json()["episodes"]] if listed.status_code == 200 else []
        picks: list[str | None] = [None]
        if len(episodes) > 1:
            for size in (1, 3, 7):
                chosen = rng.choice(episodes, size=min(size, len(episodes)), replace=False)
                picks.append(",".join(str(int(e)) for e in chosen))  # unsorted on purpose
        for pick in picks:
            query = "" if pick is None else f"?episodes={pick}"
            body = _same_response(http, remote, "GET", f"/datasets/{dataset_id}/rows{query}")
            if dataset_id == "generic" and pick is not None:
                picked = [int(e) for e in pick.split(",")]
                assert_tables_equal(read_stream(body), oracle(datasets_root / dataset_id, picked))


def test_takes_and_windows_from_the_object_store_are_byte_for_byte_the_local_ones(
    http: httpx.Client, remote_server: ServerProcess
) -> None:
    with _client(remote_server) as remote:
        total = int(http.get("/datasets/lerobot/demo-v3/rows?stop=0").headers["x-total-rows"])
        indices = np.random.default_rng(3).integers(0, total, size=300).tolist()
        _same_response(http, remote, "POST", "/datasets/lerobot/demo-v3/rows/take", json={"indices": indices})
        windows = {"action": [i / 30 for i in range(-2, 8)], "observation.state": [-1 / 30, 0.0]}
        _same_response(
            http,
            remote,
            "POST",
            "/datasets/lerobot/demo-v3/rows/take",
            json={"indices": [i % 1000 for i in indices[:64]], "episodes": "0-40", "delta_timestamps": windows},
        )
        _same_response(
            http,
            remote,
            "GET",
            "/datasets/lerobot/demo-v21/rows",
            params={"episodes": "9,2,5", "delta_timestamps": json.dumps(windows)},
        )


@pytest.mark.parametrize("policy", ["first-touch", "on-demand"])
def test_camera_frames_from_the_object_store_are_byte_for_byte_the_local_ones(
    s3: S3Server, video_root: Path, tmp_path_factory: pytest.TempPathFactory, policy: str
) -> None:
    env = {"EPISERVE_VIDEO_CACHE_POLICY": policy}
    local = ServerProcess([video_root], tmp_path_factory.mktemp("video-local"), env=env)
    remote = ServerProcess(
        [f"s3://{BUCKET}/videos"], tmp_path_factory.mktemp("video-s3"), env=s3.env(EPISERVE_VIDEO_CACHE_POLICY=policy)
    )
    with local, remote, _client(local) as here, _client(remote) as there:
        for dataset_id in ("cams-v3", "cams-v21"):
            cameras = [c["name"] for c in here.get(f"/datasets/{dataset_id}").json()["columns"] if "video" in c]
            assert cameras
            columns = ",".join(["episode_index", "frame_index", *cameras])
            body = _same_response(
                here, there, "GET", f"/datasets/{dataset_id}/rows", params={"episodes": "7,1,4", "columns": columns}
            )
            assert read_stream(body).num_rows > 0
            _same_response(
                here,
                there,
                "POST",
                f"/datasets/{dataset_id}/rows/take",
                json={"indices": [40, 3, 3, 25, 0], "columns": cameras},
            )


# -- freshness: listing and ETag ------------------------------------------------------------------------------------


def _sidecars(cache_dir: Path) -> dict[str, dict]:
    return {p.name: json.loads(p.read_bytes()) for p in sorted(cache_dir.glob("datasets/*/segments/*.json"))}


def test_reuploading_one_object_invalidates_exactly_its_segment(
    s3: S3Server, datasets_root: Path, tmp_path: Path
) -> None:
    prefix = "reupload"
    s3.upload(datasets_root / "generic", f"{prefix}/generic")
    cache = tmp_path / "cache"
    with ServerProcess([f"s3://{BUCKET}/{prefix}"], cache, env=s3.env()) as server, _client(server) as http:
        assert http.post("/datasets/generic/cache", json={}).status_code == 202
        deadline = time.monotonic() + 60
        while http.get("/datasets/generic/cache").json()["segments_built"] < 3 and time.monotonic() < deadline:
            time.sleep(0.1)
        before = _sidecars(cache)
        assert len(before) == 3
        assert all(s["source"]["etag"] for s in before.values())  # fingerprints carry the store's ETag

        changed = sorted((datasets_root / "generic").rglob("*.parquet"))[1]
        table = pq.read_table(changed)
        rewritten = table.set_column(
            table.schema.get_field_index("value"), "value", pa.compute.multiply(table["value"], 2)
        )
        replacement = tmp_path / changed.name
        pq.write_table(rewritten, replacement)
        key = f"{prefix}/generic/{changed.relative_to(datasets_root / 'generic').as_posix()}"
        time.sleep(1.1)  # a new Last-Modified second
        s3.client().upload_file(str(replacement), BUCKET, key)

        expected_value = None
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            served = read_stream(http.get("/datasets/generic/rows").content)
            expected = pa.concat_tables(
                [
                    pq.read_table(p) if p != changed else rewritten
                    for p in sorted((datasets_root / "generic").rglob("*.parquet"))
                ]
            )
            expected_value = served["value"].to_pylist() == _by_episode(expected)["value"].to_pylist()
            if expected_value:
                break
            time.sleep(0.2)
        assert expected_value, "the re-uploaded object's rows are not served"
        after = _sidecars(cache)
    assert sorted(after) == sorted(before)
    rebuilt = sorted(name for name in after if after[name] != before[name])
    assert len(rebuilt) == 1 and rebuilt[0].startswith(changed.stem)


def _by_episode(table: pa.Table) -> pa.Table:
    """Rows in view order: ascending episode, then stored order (a stable sort)."""
    order = np.argsort(table["episode_index"].to_numpy(), kind="stable")
    return table.take(pa.array(order))


# -- failures of the store ------------------------------------------------------------------------------------------


def test_deleted_objects_keep_cached_episodes_serving_and_uncached_ones_answer_503(
    s3: S3Server, datasets_root: Path, tmp_path: Path
) -> None:
    prefix = "deleted"
    dataset = datasets_root / "lerobot" / "demo-v3"
    s3.upload(dataset, f"{prefix}/demo-v3")
    env = s3.env(EPISERVE_COLD_READ_BYTES=0)  # reads wait for their segment: the first one builds it
    with ServerProcess([f"s3://{BUCKET}/{prefix}"], tmp_path / "cache", env=env) as server, _client(server) as http:
        warm = http.get("/datasets/demo-v3/rows", params={"episodes": "0-2"})
        assert warm.status_code == 200
        files = json.loads(next((tmp_path / "cache").glob("datasets/*/index.json")).read_bytes())["files"]
        assert len(files) == 3 and len(_sidecars(tmp_path / "cache")) == 1  # one of three files cached
        client = s3.client()
        for key in s3.keys(prefix):
            client.delete_object(Bucket=BUCKET, Key=key)
        time.sleep(2 * TTL)

        again = http.get("/datasets/demo-v3/rows", params={"episodes": "0-2"})
        assert again.status_code == 200
        assert again.content == warm.content
        assert_tables_equal(read_stream(again.content), oracle(dataset, [0, 1, 2]))

        last = http.get("/datasets/demo-v3/rows", params={"episodes": "59"})
        assert last.status_code == 503
        problem = last.json()
        assert problem["status"] == 503
        assert f"s3://{BUCKET}/{prefix}/demo-v3/data/" in problem["detail"]
        assert last.headers["retry-after"]
    assert not list((tmp_path / "cache").glob("datasets/*/segments/*.tmp"))


def test_while_the_store_is_down_cached_episodes_are_served_and_the_rest_answer_503_until_it_is_back(
    s3: S3Server, datasets_root: Path, tmp_path: Path
) -> None:
    prefix = "outage"
    dataset = datasets_root / "lerobot" / "demo-v3"
    s3.upload(dataset, f"{prefix}/demo-v3")
    env = s3.env(EPISERVE_COLD_READ_BYTES=0, EPISERVE_REMOTE_ATTEMPTS=2, EPISERVE_REMOTE_TIMEOUT_S=2)
    with ServerProcess([f"s3://{BUCKET}/{prefix}"], tmp_path / "cache", env=env) as server, _client(server) as http:
        warm = http.get("/datasets/demo-v3/rows", params={"episodes": "0-2"})
        assert warm.status_code == 200
        s3.stop()
        try:
            time.sleep(2 * TTL)
            for _ in range(3):  # the listing's renewal fails meanwhile: the last one keeps answering
                cached = http.get("/datasets/demo-v3/rows", params={"episodes": "0-2"})
                assert cached.status_code == 200
                assert cached.content == warm.content
            started = time.monotonic()
            missing = http.get("/datasets/demo-v3/rows", params={"episodes": "59"})
            assert time.monotonic() - started < 20  # bounded retries, no hang
            assert missing.status_code == 503
            assert f"s3://{BUCKET}/{prefix}/demo-v3/data/" in missing.json()["detail"]
        finally:
            s3.start()
        back = http.get("/datasets/demo-v3/rows", params={"episodes": "59"})
        assert back.status_code == 200, back.text
        assert_tables_equal(read_stream(back.content), oracle(dataset, [59]))
    assert not list((tmp_path / "cache").glob("datasets/*/segments/*.tmp"))


def test_a_store_stopped_mid_build_names_the_object_leaves_no_segment_and_the_next_build_is_correct(
    s3: S3Server, tmp_path: Path
) -> None:
    source = tmp_path / "big"
    rows = 40_000
    table = pa.table(
        {
            "episode_index": np.repeat(np.arange(40), rows // 40),
            "frame_index": np.tile(np.arange(rows // 40), 40),
            "observation.state": pa.FixedSizeListArray.from_arrays(
                pa.array(np.random.default_rng(0).random(rows * 16, dtype=np.float32)), 16
            ),
        }
    )
    source.mkdir()
    pq.write_table(table, source / "part-0.parquet", row_group_size=1_000)
    s3.upload(source, "midbuild/big")
    settings = Settings(
        roots=[f"s3://{BUCKET}/midbuild"],
        cache_dir=tmp_path / "cache",
        build_batch_bytes=64 * 1024,
        remote_list_ttl=60,
        remote_attempts=2,
        remote_timeout_s=2,
    )
    with _environment(s3.env()):
        catalog = Catalog(settings, locate_roots(settings, settings.roots))
        dataset = catalog.get("big")
        dataset.index()

        def stop_store(batch_rows: int, nbytes: int) -> None:
            if s3.server is not None:
                s3.stop()

        started = time.monotonic()
        try:
            with pytest.raises(Exception) as failed:
                dataset.build(0, progress=stop_store)
            assert time.monotonic() - started < 30
        finally:
            if s3.server is None:
                s3.start()  # back for what follows, whatever happened
        assert getattr(failed.value, "status", None) == 503
        assert f"cannot read s3://{BUCKET}/midbuild/big/part-0.parquet: " in str(failed.value)
        segments = tmp_path / "cache" / "datasets"
        assert not list(segments.glob("*/segments/*.arrow")), "a partial segment was published"
        assert not list(segments.glob("*/segments/*.tmp")), "a temporary file was left behind"

        server = ServerProcess([f"s3://{BUCKET}/midbuild"], tmp_path / "cache", env=s3.env(EPISERVE_COLD_READ_BYTES=0))
        with server, _client(server) as http:
            served = http.get("/datasets/big/rows", params={"episodes": "3,17"})
            assert served.status_code == 200, served.text
            assert_tables_equal(read_stream(served.content), oracle(source, [3, 17]))
        segment = dataset.build(0)  # the segment the server built from the store
        built = pa.Table.from_batches(segment.batches)
        assert built.equals(table.cast(built.schema))


def test_an_object_replaced_since_its_fingerprint_is_never_built_under_the_old_one(
    s3: S3Server, datasets_root: Path, tmp_path: Path
) -> None:
    s3.upload(datasets_root / "nullable", "replaced/nullable")
    settings = Settings(roots=[f"s3://{BUCKET}/replaced"], cache_dir=tmp_path / "cache", remote_list_ttl=600)
    with _environment(s3.env()):
        dataset = Catalog(settings, locate_roots(settings, settings.roots)).get("nullable")
        fingerprint = dataset.index().files[0]
        assert fingerprint.etag
        table = pq.read_table(datasets_root / "nullable" / "part-0.parquet")
        pq.write_table(table.slice(0, 6), tmp_path / "part-0.parquet")
        s3.client().upload_file(str(tmp_path / "part-0.parquet"), BUCKET, "replaced/nullable/part-0.parquet")
        # The listing (kept for 10 minutes) still shows the old object; opening it reveals the new ETag.
        with pytest.raises(SourceChanged, match="was replaced"):
            dataset.build(0)
    assert not list((tmp_path / "cache").glob("datasets/*/segments/*.arrow"))
    assert not list((tmp_path / "cache").glob("datasets/*/segments/*.tmp"))


@contextlib.contextmanager
def _behind_proxy(
    s3: S3Server, prefix: str, cache: Path, **settings: object
) -> Iterator[tuple[StoreProxy, httpx.Client]]:
    """A server of `s3://episerve/<prefix>` reaching the store through a fault-injecting proxy, and its client."""
    with StoreProxy(s3.port) as proxy:
        env = s3.env(**settings) | {"AWS_ENDPOINT_URL_S3": proxy.endpoint}
        with ServerProcess([f"s3://{BUCKET}/{prefix}"], cache, env=env) as server, _client(server) as http:
            yield proxy, http


def _upload_states(
    s3: S3Server, source: Path, key: str, *, episodes: int, rows: int, row_group_size: int, seed: int
) -> pa.Table:
    """A generic dataset of `rows` rows (8-float states, episodes of equal length) written to `source` in row
    groups of `row_group_size` and uploaded below `key`; returns its table."""
    table = pa.table(
        {
            "episode_index": np.repeat(np.arange(episodes), rows // episodes),
            "observation.state": pa.FixedSizeListArray.from_arrays(
                pa.array(np.random.default_rng(seed).random(rows * 8, dtype=np.float32)), 8
            ),
        }
    )
    source.mkdir()
    pq.write_table(table, source / "part-0.parquet", row_group_size=row_group_size)
    s3.upload(source, key)
    return table


def _data_files(dataset: Path) -> list[str]:
    return sorted(p.relative_to(dataset).as_posix() for p in (dataset / "data").rglob("*.parquet"))


def _eventually(check: Callable[[], bool], seconds: float = 30.0) -> None:
    deadline = time.monotonic() + seconds
    while not check():
        assert time.monotonic() < deadline, f"not true within {seconds} s"
        time.sleep(0.1)


def test_store_errors_mid_read_answer_503_naming_the_object_while_cached_rows_keep_serving(
    s3: S3Server, datasets_root: Path, tmp_path: Path
) -> None:
    prefix = "errors"
    dataset = datasets_root / "lerobot" / "demo-v3"
    s3.upload(dataset, f"{prefix}/demo-v3")
    everything = oracle(dataset, None)
    uncached = everything.num_rows - 1  # in the last data file, whose segment is never built here
    missing = f"s3://{BUCKET}/{prefix}/demo-v3/{_data_files(dataset)[-1]}"
    cached = [0, 7, 3]  # rows of episode 0, in the first data file

    with _behind_proxy(s3, prefix, tmp_path / "cache", EPISERVE_REMOTE_ATTEMPTS=2) as (proxy, http):

        def take(indices: list[int]) -> httpx.Response:
            return http.post("/datasets/demo-v3/rows/take", json={"indices": indices})

        def cached_rows_are_served() -> None:
            served = take(cached)
            assert served.status_code == 200, served.text
            assert_tables_equal(read_stream(served.content), everything.take(cached))

        def uncached_row_answers_503(reason: str) -> None:
            failed = take([uncached])
            assert failed.status_code == 503, failed.text
            assert failed.json()["detail"].startswith(f"cannot read {missing}: "), failed.json()
            assert reason in failed.json()["detail"]
            assert failed.headers["retry-after"]

        assert http.post("/datasets/demo-v3/cache", json={"episodes": "0"}).status_code == 202
        _eventually(lambda: http.get("/datasets/demo-v3/cache").json()["segments_built"] == 1)

        proxy.fail_row_groups = (500, "InternalError")  # footers arrive, the row groups after them do not
        for _ in range(2):  # a failed cold read keeps the index: the second one fails the same way, no worse
            uncached_row_answers_503("INTERNAL_FAILURE")
            cached_rows_are_served()

        # A re-uploaded object makes the dataset re-read its index, which fails too: the last index keeps serving.
        time.sleep(1.1)  # a new Last-Modified second
        middle = _data_files(dataset)[1]
        s3.client().upload_file(str(dataset / middle), BUCKET, f"{prefix}/demo-v3/{middle}")
        time.sleep(2 * TTL)
        cached_rows_are_served()
        assert http.get("/datasets/demo-v3").status_code == 200

        proxy.fail_row_groups, proxy.fail_reads = None, (403, "AccessDenied")  # e.g. credentials revoked
        uncached_row_answers_503("ACCESS_DENIED")
        cached_rows_are_served()

        proxy.heal()
        back = take([uncached, *cached])
        assert back.status_code == 200, back.text
        assert_tables_equal(read_stream(back.content), everything.take([uncached, *cached]))
        # The failed builds left no partial segment; the one the healed read queued may still be writing its own.
        _eventually(lambda: not list((tmp_path / "cache").glob("datasets/*/segments/*.tmp")), 60)


def test_a_slow_store_answers_503_naming_the_object_within_the_wait_bound_and_serves_once_fast_again(
    s3: S3Server, tmp_path: Path
) -> None:
    source = tmp_path / "slow"
    rows = 20_000
    table = _upload_states(s3, source, "slow/slow", episodes=20, rows=rows, row_group_size=500, seed=1)  # 40 groups
    name = f"s3://{BUCKET}/slow/slow/part-0.parquet"
    spread = list(range(0, rows, 500))  # a row of each row group: a cold take reads all 40
    requests = {
        "slice": ("GET", "/datasets/slow/rows", {"params": {"episodes": "7"}}),  # waits for the segment's build
        "take": ("POST", "/datasets/slow/rows/take", {"json": {"indices": spread}}),  # reads the rows cold
    }
    settings = {"EPISERVE_REMOTE_WAIT_S": 2, "EPISERVE_REMOTE_TIMEOUT_S": 10}
    with _behind_proxy(s3, "slow", tmp_path / "cache", **settings) as (proxy, http):
        assert http.get("/datasets/slow").status_code == 200  # the index is loaded
        proxy.delay_s = 2.5  # each store request is answered within its timeout, but after the wait bound
        for method, url, kwargs in requests.values():
            started = time.monotonic()
            slow = http.request(method, url, **kwargs)  # type: ignore[arg-type]
            assert time.monotonic() - started < 2 + 3
            assert slow.status_code == 503, slow.text
            assert slow.json()["detail"].startswith(f"cannot read {name}: the object store did not answer within 2 s")

        proxy.heal()
        method, url, kwargs = requests["slice"]
        _eventually(lambda: http.request(method, url, **kwargs).status_code == 200)  # type: ignore[arg-type]
        assert_tables_equal(read_stream(http.request(method, url, **kwargs).content), oracle(source, [7]))  # type: ignore[arg-type]
        method, url, kwargs = requests["take"]
        taken = http.request(method, url, **kwargs)  # type: ignore[arg-type]
        assert taken.status_code == 200, taken.text
        assert_tables_equal(read_stream(taken.content), table.take(spread))
    assert not list((tmp_path / "cache").glob("datasets/*/segments/*.tmp"))


def test_cold_reads_and_builds_fetch_many_row_groups_in_few_requests(s3: S3Server, tmp_path: Path) -> None:
    """LeRobot writes a row group per episode: reading an object's row groups one request each made a cold take
    of a shuffled batch, and a build, one round trip per row group."""
    source = tmp_path / "many"
    rows = 12_000
    table = _upload_states(s3, source, "many/many", episodes=60, rows=rows, row_group_size=200, seed=2)  # 60 groups
    spread = list(range(7, rows, 200))  # a row of every row group
    with _behind_proxy(s3, "many", tmp_path / "cache", EPISERVE_COLD_READ_BYTES=1 << 30) as (proxy, http):
        assert http.get("/datasets/many").status_code == 200  # the index is loaded
        before = len(proxy.seen)
        taken = http.post("/datasets/many/rows/take", json={"indices": spread})
        assert taken.status_code == 200, taken.text
        assert_tables_equal(read_stream(taken.content), table.take(spread))
        _eventually(lambda: http.get("/datasets/many/cache").json()["segments_built"] == 1)
        ranged = [seen for seen in proxy.seen[before:] if seen.method == "GET" and seen.range]
        assert len(ranged) < 20, len(ranged)  # the cold take and the build together, against 60 + 60 before
        served = http.get("/datasets/many/rows", params={"episodes": "0-59"})
        assert_tables_equal(read_stream(served.content), table)


def test_each_store_request_gives_up_after_the_configured_timeout(
    s3: S3Server, datasets_root: Path, tmp_path: Path
) -> None:
    s3.upload(datasets_root / "generic", "stalled/generic")
    settings = Settings(
        roots=[f"s3://{BUCKET}/stalled"], cache_dir=tmp_path / "cache", remote_timeout_s=1, remote_attempts=1
    )
    with StoreProxy(s3.port) as proxy, _environment(s3.env() | {"AWS_ENDPOINT_URL_S3": proxy.endpoint}):
        (root,) = locate_roots(settings, settings.roots)
        stalled = next(root.rglob("*.parquet"))
        proxy.delay_s = 5
        started = time.monotonic()
        with pytest.raises(ObjectStoreError, match=f"^cannot read {stalled}: "):
            stalled.read_bytes()
        assert time.monotonic() - started < 3


def test_without_a_region_in_the_environment_the_aws_profile_s_region_is_used(
    s3: S3Server, datasets_root: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in ("AWS_REGION", "AWS_DEFAULT_REGION", "AWS_PROFILE"):
        monkeypatch.delenv(name, raising=False)
    s3.upload(datasets_root / "generic", "region/generic")
    config = tmp_path / "aws-config"
    config.write_text("[default]\nregion = eu-west-3\n")
    with StoreProxy(s3.port) as proxy:
        env = {k: v for k, v in s3.env().items() if k != "AWS_REGION"}
        env |= {"AWS_ENDPOINT_URL_S3": proxy.endpoint, "AWS_CONFIG_FILE": str(config)}
        server = ServerProcess([f"s3://{BUCKET}/region"], tmp_path / "cache", env=env)
        with server, _client(server) as http:
            served = http.get("/datasets/generic/rows")
            assert served.status_code == 200, served.text
            assert_tables_equal(read_stream(served.content), oracle(datasets_root / "generic", None))
    signed = [seen.authorization for seen in proxy.seen if "Credential=" in seen.authorization]
    assert signed
    assert {scope.split("Credential=")[1].split("/")[2] for scope in signed} == {"eu-west-3"}


_NOT_UTF8_LISTING = (
    b'<?xml version="1.0" encoding="UTF-8"?><ListBucketResult xmlns="http://s3.amazonaws.com/doc/2006-03-01/">'
    b"<Name>episerve</Name><KeyCount>1</KeyCount><MaxKeys>1000</MaxKeys><IsTruncated>false</IsTruncated>"
    b"<Contents><Key>renew/plain/\xff.parquet</Key><LastModified>2024-01-01T00:00:00.000Z</LastModified>"
    b'<ETag>"0"</ETag><Size>5</Size><StorageClass>STANDARD</StorageClass></Contents></ListBucketResult>'
)


def test_a_listing_renewal_failing_in_any_way_keeps_the_last_listing_and_is_tried_again(
    s3: S3Server, datasets_root: Path, caplog: pytest.LogCaptureFixture
) -> None:
    s3.upload(datasets_root / "plain", "renew/plain")

    def listings_asked() -> int:
        return sum("list-type" in seen.path for seen in proxy.seen)

    with StoreProxy(s3.port) as proxy, _environment(s3.env() | {"AWS_ENDPOINT_URL_S3": proxy.endpoint}):
        store = ObjectStore.from_environment(StoreOptions(list_ttl_s=0.2, attempts=1, timeout_s=2))
        root = store.root(f"s3://{BUCKET}/renew")
        good = store.listing(root.key)
        for answer in (b"<not a listing/>", _NOT_UTF8_LISTING):  # an error; then a listing no path can hold
            proxy.listing_body = answer
            before = listings_asked()
            deadline = time.monotonic() + 10
            while listings_asked() < before + 3 and time.monotonic() < deadline:
                assert store.listing(root.key) is good  # the last good listing keeps answering
                time.sleep(0.05)
            assert listings_asked() >= before + 3, "the listing is no longer renewed"
        proxy.heal()
        _eventually(lambda: store.listing(root.key) is not good, seconds=10)
        assert [p.name for p in root.iterdir()] == ["plain"]
    assert f"cannot list s3://{BUCKET}/renew (serving what is cached)" in caplog.text


@contextlib.contextmanager
def _environment(values: dict[str, str]) -> Iterator[None]:
    saved = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def test_an_unreachable_store_or_missing_bucket_stops_the_server_at_startup_with_a_clear_error(
    s3: S3Server, tmp_path: Path
) -> None:
    cases = {
        f"s3://{BUCKET}-missing/datasets": "does not exist",
        f"s3://{BUCKET}/datasets@unreachable": "could not connect",
    }
    for root, reason in cases.items():
        endpoint = s3.endpoint if "unreachable" not in root else f"http://127.0.0.1:{free_port()}"
        env = {k: v for k, v in os.environ.items() if not k.startswith(("EPISERVE_", "AWS_"))}
        env |= s3.env(EPISERVE_REMOTE_ATTEMPTS=2, EPISERVE_REMOTE_TIMEOUT_S=2) | {"AWS_ENDPOINT_URL_S3": endpoint}
        started = time.monotonic()
        result = subprocess.run(
            [sys.executable, "-m", "app.cli", "warm", "x", "--root", root.split("@")[0], "--cache-dir", str(tmp_path)],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert result.returncode == 2, result.stderr
        assert time.monotonic() - started < 30
        assert f"dataset root {root.split('@')[0]}" in result.stderr
        assert reason in result.stderr.lower()
        assert "AWS_ENDPOINT_URL_S3" in result.stderr


def test_wrong_credentials_stop_the_server_at_startup_naming_the_store_s_refusal(tmp_path: Path) -> None:
    port = free_port()
    store = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        env=os.environ | {"INITIAL_NO_AUTH_ACTION_COUNT": "0"},  # moto then checks every request's credentials
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 30
        with httpx.Client(timeout=1.0) as probe:  # one client for every poll: a new one costs its TLS context
            while time.monotonic() < deadline:
                with contextlib.suppress(httpx.TransportError):
                    probe.get(f"http://127.0.0.1:{port}/")
                    break
                time.sleep(0.1)
        env = {k: v for k, v in os.environ.items() if not k.startswith(("EPISERVE_", "AWS_"))}
        env |= CREDENTIALS | {
            "AWS_ACCESS_KEY_ID": "AKIAWRONGWRONGWRONG0",
            "AWS_ENDPOINT_URL_S3": f"http://127.0.0.1:{port}",
        }
        result = subprocess.run(
            [
                sys.executable,
                "-m",
                "app.cli",
                "warm",
                "x",
                "--root",
                f"s3://{BUCKET}/data",
                "--cache-dir",
                str(tmp_path),
            ],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )
    finally:
        store.terminate()
        store.wait(timeout=15)
    assert result.returncode == 2, result.stderr
    assert f"dataset root s3://{BUCKET}/data: cannot list" in result.stderr
    assert "access key id you provided does not exist" in result.stderr.lower()


def test_listings_are_cached_for_the_ttl(s3: S3Server, datasets_root: Path) -> None:
    s3.upload(datasets_root / "plain", "ttl/plain")
    with _environment(s3.env()):
        store = ObjectStore.from_environment(StoreOptions(list_ttl_s=0.5))
        root = store.root(f"s3://{BUCKET}/ttl")
        first = store.listing(root.key)
        assert store.listing(root.key) is first  # within the TTL: no new listing
        time.sleep(0.6)
        assert store.listing(root.key) is first  # past it: still answered, renewed in the background
        deadline = time.monotonic() + 10
        while store.listing(root.key) is first and time.monotonic() < deadline:
            time.sleep(0.01)
        assert store.listing(root.key) is not first
        assert [p.name for p in root.iterdir()] == ["plain"]
        assert (root / "plain").is_dir() and not (root / "plain").is_file()
        files = [p.relative_to(root).as_posix() for p in (root / "plain").rglob("*.parquet")]
        assert files == sorted(
            f"plain/{p.relative_to(datasets_root / 'plain').as_posix()}"
            for p in (datasets_root / "plain").rglob("*.parquet")
        )


def test_roots_from_the_environment_keep_the_scheme_of_object_store_locations() -> None:
    with _environment({"EPISERVE_ROOTS": f"/data:s3://{BUCKET}/a/b:/more"}):
        assert Settings().roots == [Path("/data"), f"s3://{BUCKET}/a/b", Path("/more")]


def test_a_root_without_a_bucket_is_a_configuration_error() -> None:
    settings = Settings(roots=["s3://"])
    with pytest.raises(ConfigurationError, match="names no bucket"):
        locate_roots(settings, settings.roots)


def test_demo_written_and_uploaded_is_served_like_local(s3: S3Server, tmp_path: Path) -> None:
    """A dataset whose root is itself the dataset (`--root s3://bucket/prefix/name`) is served under its name."""
    write_demo_dataset(tmp_path / "solo", format="v3.0", episodes=5, seed=4, files=1, cameras=())
    s3.upload(tmp_path / "solo", "solo/solo")
    server = ServerProcess([f"s3://{BUCKET}/solo/solo"], tmp_path / "cache", env=s3.env())
    with server, _client(server) as http:
        assert [d["id"] for d in http.get("/datasets").json()["datasets"]] == ["solo"]
        body = http.get("/datasets/solo/rows", params={"episodes": "4,1"}).content
        assert_tables_equal(read_stream(body), oracle(tmp_path / "solo", [1, 4]))


# -- memory ---------------------------------------------------------------------------------------------------------


def _rss_anon(pids: list[int]) -> int:
    total = 0
    for pid in pids:
        with contextlib.suppress(OSError):
            for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                if line.startswith("RssAnon:"):
                    total += int(line.split()[1]) * 1024
    return total


def _build_growth(server: ServerProcess, dataset_id: str) -> tuple[int, pa.Table]:
    """Peak growth of the server's RssAnon while a request builds the dataset's one segment, and its rows."""
    with _client(server) as http:
        assert http.get(f"/datasets/{dataset_id}").status_code == 200  # index loaded: only the build remains
        pids = server.pids()
        base = peak = _rss_anon(pids)
        done = threading.Event()

        def sample() -> None:
            nonlocal peak
            while not done.is_set():
                peak = max(peak, _rss_anon(pids))
                time.sleep(0.002)

        sampler = threading.Thread(target=sample)
        sampler.start()
        try:
            response = http.get(f"/datasets/{dataset_id}/rows", params={"episodes": "0-4"})
        finally:
            done.set()
            sampler.join()
        assert response.status_code == 200, response.text
    return peak - base, read_stream(response.content)


def test_peak_memory_of_a_build_from_the_store_stays_within_the_local_builds(s3: S3Server, tmp_path: Path) -> None:
    rows = 400_000
    rng = np.random.default_rng(5)
    table = pa.table(
        {
            "episode_index": np.repeat(np.arange(100), rows // 100),
            "observation.state": pa.FixedSizeListArray.from_arrays(
                pa.array(rng.random(rows * 24, dtype=np.float32)), 24
            ),
        }
    )
    local_root = tmp_path / "local"
    (local_root / "wide").mkdir(parents=True)
    pq.write_table(table, local_root / "wide" / "part-0.parquet", row_group_size=8_000)  # ~40 MB, 50 row groups
    s3.upload(local_root / "wide", "memory/wide")
    env = {"EPISERVE_COLD_READ_BYTES": "0"}  # the request waits for the build
    with ServerProcess([local_root], tmp_path / "cache-local", env=env) as local:
        local_growth, local_rows = _build_growth(local, "wide")
    with ServerProcess([f"s3://{BUCKET}/memory"], tmp_path / "cache-s3", env=s3.env(**env)) as remote:
        remote_growth, remote_rows = _build_growth(remote, "wide")
    print(f"build growth: local {local_growth / 1e6:.1f} MB, store {remote_growth / 1e6:.1f} MB")
    assert remote_rows.equals(local_rows)
    assert remote_growth <= 1.25 * local_growth + 32e6, (remote_growth / 1e6, local_growth / 1e6)
    assert remote_growth < 256e6
