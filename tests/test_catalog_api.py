"""Catalog endpoints describe every layout the roots hold."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from tests.support import oracle


def test_catalog_lists_every_layout(http: httpx.Client) -> None:
    listing = {d["id"]: d for d in http.get("/datasets").json()["datasets"]}
    assert set(listing) == {"lerobot/demo-v3", "lerobot/demo-v21", "generic", "plain", "nullable"}
    assert listing["lerobot/demo-v3"]["format"] == "lerobot-v3.0"
    assert listing["lerobot/demo-v21"]["format"] == "lerobot-v2.1"
    assert listing["generic"]["format"] == "parquet"
    assert listing["generic"]["episodes"] == 7
    assert listing["plain"]["episodes"] is None


def test_dataset_info_matches_lerobot_metadata(http: httpx.Client, datasets_root: Path) -> None:
    info = json.loads((datasets_root / "lerobot/demo-v3/meta/info.json").read_text())
    described = http.get("/datasets/lerobot/demo-v3").json()
    assert described["rows"] == info["total_frames"]
    assert described["episodes"] == info["total_episodes"]
    assert described["fps"] == info["fps"]
    assert described["features"] == info["features"]
    assert [c["name"] for c in described["columns"]][:3] == ["observation.state", "action", "observation.image"]
    assert described["cache"]["segments_total"] == 3


def test_episodes_endpoint_gives_lengths_and_tasks(http: httpx.Client, datasets_root: Path) -> None:
    episodes = http.get("/datasets/lerobot/demo-v21/episodes").json()["episodes"]
    on_disk = [json.loads(line) for line in (datasets_root / "lerobot/demo-v21/meta/episodes.jsonl").open()]
    assert [(e["episode_index"], e["length"], e["tasks"]) for e in episodes] == [
        (e["episode_index"], e["length"], e["tasks"]) for e in on_disk
    ]


def test_generic_episode_lengths_count_rows_across_files(http: httpx.Client, datasets_root: Path) -> None:
    episodes = http.get("/datasets/generic/episodes").json()["episodes"]
    table = oracle(datasets_root / "generic", None)
    counts = {e: table["episode_index"].to_pylist().count(e) for e in set(table["episode_index"].to_pylist())}
    assert {e["episode_index"]: e["length"] for e in episodes} == counts


def test_episode_row_ranges_match_the_v30_episode_metadata(http: httpx.Client, datasets_root: Path) -> None:
    episodes = http.get("/datasets/lerobot/demo-v3/episodes").json()["episodes"]
    files = sorted((datasets_root / "lerobot/demo-v3/meta/episodes").glob("*/*.parquet"))
    columns = ["episode_index", "length", "dataset_from_index", "dataset_to_index", "tasks"]
    on_disk = pa.concat_tables([pq.read_table(f, columns=columns) for f in files]).to_pylist()
    assert [{k: e[k] for k in columns} for e in episodes] == on_disk


def test_stats_endpoint_serves_the_v30_stats_file(http: httpx.Client, datasets_root: Path) -> None:
    answer = http.get("/datasets/lerobot/demo-v3/stats").json()
    on_disk = json.loads((datasets_root / "lerobot/demo-v3/meta/stats.json").read_text())
    assert answer == {"dataset": "lerobot/demo-v3", "stats": on_disk, "source": "meta/stats.json"}
    assert list(answer["stats"]) == list(on_disk)


def test_stats_endpoint_merges_v21_episode_stats_by_count(http: httpx.Client, datasets_root: Path) -> None:
    answer = http.get("/datasets/lerobot/demo-v21/stats").json()
    lines = (datasets_root / "lerobot/demo-v21/meta/episodes_stats.jsonl").read_text().splitlines()
    episodes = [json.loads(line)["stats"] for line in lines]
    assert answer["source"] == "meta/episodes_stats.jsonl"
    for feature, merged in answer["stats"].items():
        parts = [e[feature] for e in episodes]
        counts = np.array([p["count"][0] for p in parts], dtype=np.float64)
        means = np.array([p["mean"] for p in parts], dtype=np.float64)
        weights = counts.reshape(-1, *[1] * (means.ndim - 1))
        mean = (means * weights).sum(axis=0) / counts.sum()
        second = ((np.array([p["std"] for p in parts]) ** 2 + means**2) * weights).sum(axis=0) / counts.sum()
        assert merged["count"] == [int(counts.sum())]
        np.testing.assert_allclose(merged["mean"], mean, rtol=1e-12)
        np.testing.assert_allclose(merged["std"], np.sqrt(second - mean**2), rtol=1e-6, atol=1e-9)
        np.testing.assert_array_equal(merged["min"], np.min([p["min"] for p in parts], axis=0))
        np.testing.assert_array_equal(merged["max"], np.max([p["max"] for p in parts], axis=0))


def test_stats_of_a_dataset_without_statistics_are_null(http: httpx.Client) -> None:
    assert http.get("/datasets/generic/stats").json() == {"dataset": "generic", "stats": None, "source": None}
    assert http.get("/datasets/nope/stats").status_code == 404


def test_health_and_readiness(http: httpx.Client) -> None:
    alive = http.get("/healthz")
    assert (alive.status_code, alive.headers["content-type"], alive.json()) == (
        200,
        "application/json",
        {"status": "ok"},
    )
    assert http.get("/openapi.json").json()["paths"]["/healthz"]["get"]["responses"]["200"]["content"] == {
        "application/json": {
            "schema": {
                "additionalProperties": {"type": "string"},
                "type": "object",
                "title": "Response Healthz Healthz Get",
            }
        }
    }
    assert http.get("/readyz").json() == {"status": "ready", "datasets": 5}
    paths = http.get("/openapi.json").json()["paths"]
    assert "/datasets/{dataset_id}/rows" in paths
    assert "/datasets/{dataset_id}/stats" in paths
