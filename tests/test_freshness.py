"""Source changes under a running server: rewrites that keep size and mtime, files added and removed."""

from __future__ import annotations

import json
import os
import shutil
from datetime import datetime
from pathlib import Path

import httpx
import pyarrow as pa
import pyarrow.parquet as pq

from app.demo import write_demo_dataset
from tests.support import (
    ServerProcess,
    assert_tables_equal,
    eventually,
    oracle,
    read_stream,
    write_generic_dataset,
)

FAST_LOOKS = {"EPISERVE_RESCAN_INTERVAL_S": "0.3"}


def moment(stamp: str) -> datetime:
    """An ISO 8601 time with a `Z` suffix, as the server writes them (Python 3.10's `fromisoformat` wants +00:00)."""
    return datetime.fromisoformat(stamp.removesuffix("Z") + "+00:00")


def write_same_size(path: Path, values: list[int]) -> None:
    """The same columns, row count and encoded size whatever the order of `values`; mtime and atime restored."""
    before = path.stat() if path.exists() else None
    table = pa.table({"episode_index": pa.array([0, 0, 1, 1], pa.int64()), "value": pa.array(values, pa.int64())})
    pq.write_table(table, path, compression="none", use_dictionary=False)
    if before is not None:
        assert path.stat().st_size == before.st_size
        os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))  # what `cp -p` and `rsync -t` do


def served_values(http: httpx.Client, dataset_id: str) -> list[int]:
    return read_stream(http.get(f"/datasets/{dataset_id}/rows").content)["value"].to_pylist()


def test_same_size_rewrite_with_restored_mtime_is_served_fresh_also_after_restart(tmp_path: Path) -> None:
    root, cache = tmp_path / "root", tmp_path / "cache"
    (root / "table").mkdir(parents=True)
    source = root / "table" / "rows.parquet"
    write_same_size(source, [1, 2, 3, 4])
    with ServerProcess([root], cache) as server, server.client() as http:
        assert served_values(http, "table") == [1, 2, 3, 4]  # index persisted, segment built
        write_same_size(source, [4, 3, 2, 1])
        assert served_values(http, "table") == [4, 3, 2, 1]
        taken = http.post("/datasets/table/rows/take", json={"indices": [0], "episodes": [1]})
        assert read_stream(taken.content)["value"].to_pylist() == [2]
    write_same_size(source, [2, 1, 4, 3])  # while no server runs
    with ServerProcess([root], cache) as server, server.client() as http:
        assert served_values(http, "table") == [2, 1, 4, 3]


def test_new_episode_file_of_a_v21_dataset_is_served_after_the_rescan_interval(tmp_path: Path) -> None:
    root, spare = tmp_path / "root", tmp_path / "spare"
    dataset = write_demo_dataset(root / "demo", format="v2.1", episodes=5, seed=3)
    episode_file = next(dataset.rglob("episode_000004.parquet"))
    episodes_jsonl = dataset / "meta/episodes.jsonl"
    spare.mkdir()
    shutil.move(episode_file, spare / episode_file.name)
    full_metadata = episodes_jsonl.read_text()
    episodes_jsonl.write_text("".join(full_metadata.splitlines(keepends=True)[:4]))

    with ServerProcess([root], tmp_path / "cache", env=FAST_LOOKS) as server, server.client() as http:
        assert http.get("/datasets/demo/rows", params={"episodes": "4"}).status_code == 404
        first_look = http.get("/datasets/demo").json()["checked_at"]
        assert len(read_stream(http.get("/datasets/demo/rows").content)) == len(oracle(dataset, range(4)))

        shutil.move(spare / episode_file.name, episode_file)  # a new episode lands: data file, then metadata
        episodes_jsonl.write_text(full_metadata)
        eventually(lambda: http.get("/datasets/demo/rows", params={"episodes": "4"}).status_code == 200)

        assert_tables_equal(read_stream(http.get("/datasets/demo/rows").content), oracle(dataset, None))
        assert_tables_equal(
            read_stream(http.get("/datasets/demo/rows", params={"episodes": "4"}).content), oracle(dataset, [4])
        )
        described = http.get("/datasets/demo").json()
        assert described["episodes"] == 5
        assert [e["episode_index"] for e in http.get("/datasets/demo/episodes").json()["episodes"]] == [0, 1, 2, 3, 4]
        assert moment(described["checked_at"]) > moment(first_look)
        assert (
            json.loads(full_metadata.splitlines()[4])["tasks"]
            == http.get("/datasets/demo/episodes").json()["episodes"][4]["tasks"]
        )


def test_parquet_files_added_to_and_removed_from_a_generic_dataset_are_noticed(tmp_path: Path) -> None:
    root = tmp_path / "root"
    dataset = write_generic_dataset(root / "generic")
    with ServerProcess([root], tmp_path / "cache", env=FAST_LOOKS) as server, server.client() as http:
        assert_tables_equal(read_stream(http.get("/datasets/generic/rows").content), oracle(dataset, None))
        assert http.get("/datasets/generic/rows", params={"episodes": "20"}).status_code == 404

        extra = pq.read_table(dataset / "part-2.parquet")
        extra = extra.set_column(0, "episode_index", pa.array([20] * extra.num_rows, pa.int64()))
        (dataset / "more").mkdir()
        pq.write_table(extra, dataset / "more" / ".part-3.parquet.tmp")  # published by rename, as writers should
        os.replace(dataset / "more" / ".part-3.parquet.tmp", dataset / "more" / "part-3.parquet")
        eventually(lambda: http.get("/datasets/generic/rows", params={"episodes": "20"}).status_code == 200)
        assert_tables_equal(read_stream(http.get("/datasets/generic/rows").content), oracle(dataset, None))

        (dataset / "part-1.parquet").unlink()
        eventually(lambda: len(read_stream(http.get("/datasets/generic/rows").content)) == len(oracle(dataset, None)))
        assert_tables_equal(read_stream(http.get("/datasets/generic/rows").content), oracle(dataset, None))
        assert http.get("/datasets/generic").json()["source_files"] == 3
