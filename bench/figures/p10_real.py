"""P10's rows against the real peers (LeRobot 0.6.1's `LeRobotDataset`, Lance's `LanceDBDataset`): the sample
identity check they must pass before timing, their comparison rows, the disk row, and the rows that say why they
were skipped.

The check reads the same sample subset through episerve and through each peer and requires every key but `task`
to be bit-identical (dtype, shape, values: the float32 frame, the action window and its padding mask, the state,
the standard columns). `task` may differ: on datasets whose `meta/tasks.parquet` keeps `task` as a column (as
these do, and as LeRobot 0.6.1 itself writes it when no pandas index is kept), LeRobot 0.6.1 and Lance return the
task's integer index where episerve returns the text; the note records what each returned.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from bench.camera_datasets import CameraDataset
from bench.peers.real import LABELS, RealPeers, directory_bytes
from bench.report import Row

MB = 1e6
# (our loader key, its label)
OURS = [
    ("on demand", "RemoteLeRobotDataset on demand"),
    ("cache", "RemoteLeRobotDataset from the decoded-frame cache over HTTP"),
    ("in place", "RemoteLeRobotDataset from the decoded-frame cache, same machine (`cache_dir`)"),
]


def check_same_samples(dataset: CameraDataset, ours: Any, peers: RealPeers, picked: list[int]) -> str:
    """Every key but `task` bit-identical between episerve's samples and each real peer's; raises otherwise.
    Returns a note on `task`."""
    mine = {index: _as_numpy(ours[index]) for index in picked}
    tasks = []
    for key, label in LABELS.items():
        theirs = peers.samples(key, dataset, picked)
        for index in picked:
            difference = _difference(mine[index], theirs[index])
            if difference:
                raise RuntimeError(
                    f"P10 {dataset.name}: sample {index} differs between episerve and {label}: {difference}"
                )
        first = picked[0]
        tasks.append(f"{label} {theirs[first]['task'].tolist()!r}")
    return f"`task` of sample {picked[0]}: episerve {mine[picked[0]]['task']!r}, " + ", ".join(tasks)


def _as_numpy(sample: dict[str, Any]) -> dict[str, Any]:
    return {key: value if isinstance(value, str) else value.numpy() for key, value in sample.items()}


def _difference(mine: dict[str, Any], theirs: dict[str, np.ndarray]) -> str:
    """What differs between two samples, `task` aside; empty when nothing does."""
    if set(mine) - {"task"} != set(theirs) - {"task"}:
        return f"keys {sorted(set(mine) ^ set(theirs))}"
    for key, value in theirs.items():
        if key == "task":
            continue
        ours = mine[key]
        if ours.dtype != value.dtype or ours.shape != value.shape:
            return f"{key}: {ours.dtype}{list(ours.shape)} against {value.dtype}{list(value.shape)}"
        if not np.array_equal(ours, value):
            return f"{key}: values"
    return ""


def comparison_rows(case: str, speed: dict[str, float], spreads: dict[tuple[str, str], str], drawn: str) -> list[Row]:
    """Each of our loaders against each real peer, for information (a peer whose runs failed shows no value)."""
    return [
        Row(
            "P10",
            f"{case}, {label}",
            "samples/s",
            speed[ours],
            peer_label if math.isfinite(speed[peer]) else f"{peer_label}: failed, see logs/real-peers.log",
            speed[peer] if math.isfinite(speed[peer]) else None,
            "info",
            None,
            "; ".join(filter(None, [drawn, spreads.get((ours, peer), "")])),
        )
        for ours, label in OURS
        for peer, peer_label in LABELS.items()
    ]


def summary(case: str, speed: dict[str, float]) -> str:
    """One line with every loader's samples/s, the issue's side-by-side view."""
    named = [(label, speed[peer]) for peer, label in LABELS.items()]
    named += [(label, speed[ours]) for ours, label in OURS]
    named.append(("the LeRobot-style per-sample path", speed["lerobot"]))
    return f"P10 {case}, samples/s: " + "; ".join(f"{label} {value:,.0f}" for label, value in named)


def disk_row(case: str, dataset: CameraDataset, lance_copy_bytes: int, cache_bytes: int) -> Row:
    """Disk beside the source: episerve's cache (decoded frames and table segments) against the Lance copy."""
    source = directory_bytes(dataset.path)
    return Row(
        "P10",
        f"{case}, disk beside the source ({source / MB:,.0f} MB): episerve's cache after `warm --videos`",
        "bytes / source",
        cache_bytes / source,
        f"Lance copy ({lance_copy_bytes / MB:,.0f} MB)",
        lance_copy_bytes / source,
        "info",
        None,
        f"episerve cache {cache_bytes / MB:,.0f} MB; LeRobot 0.6.1 reads the source as it is, no copy",
    )


def skipped_row(case: str, reason: str) -> Row:
    return Row("P10", f"{case}, LeRobot 0.6.1 and Lance", "samples/s", None, f"skipped: {reason}", None, "info")
