"""Hugging Face `datasets` as LeRobot uses it: `Dataset.from_parquet` over the data files (optionally with an
`episode_index` filter), cached in a directory of the benchmark's work dir, offline.

Image columns are kept encoded (`Image(decode=False)`), as every other reader in the benchmark returns the PNG
bytes undecoded; decoding would cost the same everywhere and hide the differences being measured.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pyarrow.dataset as pads

from bench.datasets import IMAGE, GeneratedDataset


def configure_offline(hf_home: Path) -> None:
    """Point HF at the work dir and forbid network access; call before `datasets` is imported."""
    os.environ["HF_HOME"] = str(hf_home)
    os.environ["HF_DATASETS_OFFLINE"] = "1"
    os.environ["HF_HUB_OFFLINE"] = "1"
    os.environ["HF_HUB_DISABLE_TELEMETRY"] = "1"
    os.environ["HF_DATASETS_DISABLE_PROGRESS_BARS"] = "1"


def _features(dataset: GeneratedDataset) -> Any:
    from datasets import Features, Image, Value
    from datasets import Sequence as HFSequence

    features: dict[str, Any] = {
        "observation.state": HFSequence(Value("float32"), length=14),
        "action": HFSequence(Value("float32"), length=14),
    }
    if dataset.has_image:
        features[IMAGE] = Image(decode=False)
    features["timestamp"] = Value("float32")
    for name in ("frame_index", "episode_index", "index", "task_index"):
        features[name] = Value("int64")
    return Features(features)


def load(dataset: GeneratedDataset, cache_dir: Path, episodes: Sequence[int] | None = None) -> Any:
    """The dataset (or its episode pick) as an HF `Dataset`, converted into `cache_dir` on first use."""
    import datasets

    datasets.disable_progress_bars()
    filters = None if episodes is None else pads.field("episode_index").isin(list(episodes))
    return datasets.Dataset.from_parquet(
        [str(f) for f in dataset.files],
        features=_features(dataset),
        cache_dir=str(cache_dir),
        filters=filters,
    )


def directory_bytes(path: Path) -> int:
    """Bytes of every file below `path` (0 if absent)."""
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file()) if path.exists() else 0
