"""Catalog endpoints describe every layout the roots hold."""

from __future__ import annotations

import json
from pathlib import Path

import httpx

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


def test_health_and_readiness(http: httpx.Client) -> None:
    assert http.get("/healthz").json() == {"status": "ok"}
    assert http.get("/readyz").json() == {"status": "ready", "datasets": 5}
    assert "/datasets/{dataset_id}/rows" in http.get("/openapi.json").json()["paths"]
