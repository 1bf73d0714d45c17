"""P9's and P10's rows against the real peers (LeRobot 0.6.1's `LeRobotDataset`, Lance's `LanceDBDataset`): the
peers set up once per run, the identity checks they must pass before timing, their comparison rows, P10's disk
row, and the rows that say why they were skipped.

P9 reads the peers' frames as uint8 without action windows (`return_uint8=True`) and requires them equal, pixel
for pixel, to the decoded-frame reference. P10 reads the same sample subset through episerve and through each
peer and requires every key but `task` to be bit-identical (dtype, shape, values: the float32 frame, the action
window and its padding mask, the state, the standard columns). `task` may differ: on datasets whose
`meta/tasks.parquet` keeps `task` as a column rather than as the index (as these do), LeRobot 0.6.1 and Lance
return the task's integer index where episerve returns the text; a note records what each returned.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np

from bench.camera_datasets import CAMERA, CameraDataset
from bench.context import Context
from bench.peers.real import LABELS, PeerFailed, RealPeers, directory_bytes
from bench.report import Row

_PEERS: dict[str, RealPeers | str] = {}


def peers(ctx: Context) -> RealPeers | str:
    """The real peers (their environment built on the run's first call), or why they cannot run."""
    key = str(ctx.workdir)
    if key not in _PEERS:
        _PEERS[key] = RealPeers.ensure(ctx.workdir, ctx.logs / "real-peers.log")
        found = _PEERS[key]
        if isinstance(found, RealPeers):
            versions = ", ".join(f"{name} {version}" for name, version in found.versions.items())
            ctx.notes.append(f"The real peers ran in their own Python 3.12 venv: {versions}.")
    return _PEERS[key]


def ready(
    dataset: CameraDataset, found: RealPeers | str, check: Callable[[RealPeers], None]
) -> tuple[RealPeers | str, list[str]]:
    """The peers with their Lance copy of `dataset` made and `check` passed, and their keys; the reason instead
    when they fail to run (a check that finds different samples raises: that is an error, not a skip)."""
    if not isinstance(found, RealPeers):
        return found, []
    try:
        found.lance_copy(dataset)
        check(found)
    except (OSError, PeerFailed) as error:
        return str(error), []
    return found, list(LABELS)


def check_same_frames(dataset: CameraDataset, reference: Any, found: RealPeers, picked: list[int]) -> None:
    """P9: each peer's uint8 frames at `picked` equal the reference (n, C, H, W), pixel for pixel."""
    expected = np.asarray(reference)
    for key, label in LABELS.items():
        theirs = found.samples(key, dataset, picked, frames=True)
        frames = np.stack([theirs[index][CAMERA] for index in picked])
        if frames.dtype != expected.dtype or frames.shape != expected.shape or not np.array_equal(frames, expected):
            raise RuntimeError(f"P9 {dataset.name}: {label}'s frames differ from the decoded-frame file")


def frame_rows(
    case: str, ours: list[tuple[str, str]], speed: dict[str, float], spreads: dict[tuple[str, str], str], drawn: str
) -> list[Row]:
    """P9: each of `ours` (key, label) against each real peer, frames/s, for information."""
    return [
        _row("P9", case, "frames/s", key, label, peer, peer_label, speed, spreads, drawn)
        for key, label in ours
        for peer, peer_label in LABELS.items()
    ]


def _row(
    figure: str,
    case: str,
    unit: str,
    ours: str,
    label: str,
    peer: str,
    peer_label: str,
    speed: dict[str, float],
    spreads: dict[tuple[str, str], str],
    drawn: str,
) -> Row:
    """Our loader against a real peer (a peer whose runs failed shows no value)."""
    failed = not math.isfinite(speed[peer])
    return Row(
        figure,
        f"{case}, {label}",
        unit,
        speed[ours],
        f"{peer_label}: failed, see logs/real-peers.log" if failed else peer_label,
        None if failed else speed[peer],
        "info",
        None,
        "; ".join(filter(None, [drawn, spreads.get((ours, peer), "")])),
    )


MB = 1e6
# (our loader key, its label)
OURS = [
    ("on demand", "RemoteLeRobotDataset on demand"),
    ("cache", "RemoteLeRobotDataset from the decoded-frame cache over HTTP"),
    ("in place", "RemoteLeRobotDataset from the decoded-frame cache, same machine (`cache_dir`)"),
]


def check_same_samples(dataset: CameraDataset, ours: Any, found: RealPeers, picked: list[int]) -> str:
    """Every key but `task` bit-identical between episerve's samples and each real peer's; raises otherwise.
    Returns a note on `task`."""
    mine = {index: _as_numpy(ours[index]) for index in picked}
    tasks = []
    for key, label in LABELS.items():
        theirs = found.samples(key, dataset, picked)
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
    """P10: each of our loaders against each real peer, samples/s, for information."""
    return [
        _row("P10", case, "samples/s", ours, label, peer, peer_label, speed, spreads, drawn)
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


def skipped_row(figure: str, case: str, unit: str, reason: str) -> Row:
    return Row(figure, f"{case}, LeRobot 0.6.1 and Lance", unit, None, f"skipped: {reason}", None, "info")
