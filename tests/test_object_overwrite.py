"""An object re-uploaded under a running server (`s3://` root, moto's real S3 server on 127.0.0.1) with the same
row count and another episode layout: never a row of another episode with 200, however old the listing.

Every read of an object checks its ETag against the one the index fingerprinted (at the HEAD that opens it, and
again after its ranged GETs); a replacement found rebuilds the index from the new object."""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests.support import ServerProcess, read_stream

pytest.importorskip("moto.server", reason="moto (a dev dependency) runs the S3 server of these tests")
from tests.test_object_store import BUCKET, S3Server

LENGTHS = {4: 50, 5: 60, 6: 70, 7: 80}  # episodes of the replaced file, the same lengths in both layouts


def _file(episodes: list[int], version: int) -> pa.Table:
    """Episodes in stored order; `value` names the episode and frame, `version` the upload."""
    ids = np.concatenate([np.full(LENGTHS.get(e, 40), e) for e in episodes])
    frames = np.concatenate([np.arange(LENGTHS.get(e, 40)) for e in episodes])
    return pa.table(
        {
            "episode_index": pa.array(ids, pa.int64()),
            "frame_index": pa.array(frames, pa.int64()),
            "value": pa.array(ids * 1000 + frames, pa.int64()),
            "version": pa.array(np.full(len(ids), version), pa.int64()),
        }
    )


LAYOUTS = [[4, 5, 6, 7], [7, 6, 5, 4]]  # the same 260 rows per upload, episode 7 first or last


@pytest.fixture(scope="module")
def s3() -> Iterator[S3Server]:
    server = S3Server()
    server.start()
    try:
        server.client().create_bucket(Bucket=BUCKET)
        yield server
    finally:
        server.stop()


def _upload(s3: S3Server, tmp: Path, key: str, table: pa.Table) -> None:
    path = tmp / f"upload-{time.monotonic_ns()}.parquet"
    pq.write_table(table, path, row_group_size=64)  # several row groups: reads of a few, as a cold take does
    s3.client().upload_file(str(path), BUCKET, key)
    path.unlink()


def _dataset(s3: S3Server, tmp: Path, prefix: str) -> str:
    """A generic dataset of two files below `prefix`; returns the key of the one replaced later."""
    _upload(s3, tmp, f"{prefix}/gen/data/part-000.parquet", _file([0, 1, 2, 3], 0))
    replaced = f"{prefix}/gen/data/part-001.parquet"
    _upload(s3, tmp, replaced, _file(LAYOUTS[0], 0))
    return replaced


def _take(http: httpx.Client, episodes: str, indices: list[int]) -> httpx.Response:
    return http.post("/datasets/gen/rows/take", json={"episodes": episodes, "indices": indices})


def _wrong_rows(table: pa.Table, expected: list[tuple[int, int]]) -> int:
    """Rows that are not the (episode, frame) asked for, or whose value belongs to another row."""
    found = list(zip(table["episode_index"].to_pylist(), table["frame_index"].to_pylist(), strict=True))
    wrong = sum(f != e for f, e in zip(found, expected, strict=True)) + abs(len(found) - len(expected))
    values = table["value"].to_pylist()
    return wrong + sum(v != e * 1000 + f for v, (e, f) in zip(values, found, strict=True))


def _view(episodes: list[int]) -> list[tuple[int, int]]:
    """(episode, frame) of every view position of `episodes`: the same in both layouts."""
    return [(e, f) for e in sorted(episodes) for f in range(LENGTHS.get(e, 40))]


def test_a_cold_take_after_a_re_upload_serves_the_new_object_s_episode_not_the_old_positions(
    s3: S3Server, tmp_path: Path
) -> None:
    replaced = _dataset(s3, tmp_path, "overwrite-once")
    # The listing is kept for 10 minutes: only the ETag check can notice the new object.
    env = s3.env(EPISERVE_REMOTE_LIST_TTL=600, EPISERVE_RESCAN_INTERVAL_S=600)
    server = ServerProcess([f"s3://{BUCKET}/overwrite-once"], tmp_path / "cache", env=env)
    with server, server.client() as http:
        first = _take(http, "0", [0, 1, 2])  # loads the index; the replaced file stays cold
        assert first.status_code == 200, first.text
        assert _wrong_rows(read_stream(first.content), _view([0])[:3]) == 0

        _upload(s3, tmp_path, replaced, _file(LAYOUTS[1], 1))  # episode 7 now stored first
        wanted = list(range(LENGTHS[7]))
        answer = _take(http, "7", wanted)
        assert answer.status_code == 200, answer.text
        table = read_stream(answer.content)
        assert _wrong_rows(table, _view([7])) == 0
        assert set(table["version"].to_pylist()) == {1}  # from the new object

        # A later take of every episode of the file: the new layout, still in view order.
        both = read_stream(_take(http, "4-7", list(range(260))).content)
        assert _wrong_rows(both, _view([4, 5, 6, 7])) == 0
        assert set(both["version"].to_pylist()) == {1}


def test_objects_re_uploaded_again_and_again_under_load_never_give_a_wrong_row(s3: S3Server, tmp_path: Path) -> None:
    replaced = _dataset(s3, tmp_path, "overwrite-load")
    env = s3.env(EPISERVE_REMOTE_LIST_TTL=1)  # uploads 0.7 s apart: some within one Last-Modified second
    stop = threading.Event()
    counts = {"answers": 0, "wrong": 0, "unavailable": 0, "versions": set()}
    lock = threading.Lock()
    failures: list[str] = []

    def trainer(seed: int, url: str) -> None:
        rng = random.Random(seed)
        with httpx.Client(base_url=url, timeout=60.0) as http:
            while not stop.is_set():
                episodes = sorted(rng.sample([0, 3, 4, 5, 6, 7], rng.randint(1, 3)))
                view = _view(episodes)
                indices = sorted(rng.sample(range(len(view)), min(len(view), rng.randint(1, 120))))
                spec = ",".join(map(str, episodes))
                answer = _take(http, spec, indices)
                with lock:
                    if answer.status_code == 200:
                        table = read_stream(answer.content)
                        counts["answers"] += 1
                        counts["wrong"] += _wrong_rows(table, [view[i] for i in indices])
                        counts["versions"] |= set(table["version"].to_pylist())
                    elif answer.status_code == 503:  # retryable, clearly: never a wrong row
                        counts["unavailable"] += 1
                    else:
                        failures.append(f"{answer.status_code}: {answer.text[:300]}")

    with ServerProcess([f"s3://{BUCKET}/overwrite-load"], tmp_path / "cache", env=env) as server:
        threads = [threading.Thread(target=trainer, args=(seed, server.url)) for seed in range(4)]
        for thread in threads:
            thread.start()
        try:
            for upload in range(1, 9):
                time.sleep(0.7)
                _upload(s3, tmp_path, replaced, _file(LAYOUTS[upload % 2], upload))
            time.sleep(1.0)
        finally:
            stop.set()
            for thread in threads:
                thread.join(timeout=120)
        with server.client() as http:
            last = read_stream(_take(http, "7", list(range(LENGTHS[7]))).content)
    assert not failures, failures[:3]
    assert counts["wrong"] == 0, counts
    assert counts["answers"] > 50, counts
    assert len(counts["versions"]) >= 3, counts  # the uploads were served as they came
    assert _wrong_rows(last, _view([7])) == 0
