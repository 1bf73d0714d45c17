"""`RemoteLeRobotMixtureMetadata`: LeRobot's metadata, in its own shapes, for a mixture of served datasets.

What LeRobot's training script, policy factory and processors read from `dataset.meta` (`features`, `stats`,
`fps`, `camera_keys`, `episodes`, ...) describes the mixture's samples:

- **Features** are the mixture's names (after the feature maps): a component's feature (its `dtype`, `shape`,
  `names`); a vector padded to the mixture's width has the widest shape and the names of the first component
  with that width; a camera some component lacks is listed (its samples are zeros there). The masks and flags
  the mixture adds (`<name>_is_real`, `<camera>_is_missing`) and `dataset_index` come in every sample but are
  not features: LeRobot's policies would take every `observation.*`/`action*` feature as an input or target.
- **Which columns.** A column every component has is read; one only some components have is read if it is a
  camera or a vector in each of them (padded, or flagged missing); any other (a scalar, a parquet image, a
  string) is left out, as `MultiLeRobotDataset` keeps only the keys common to all, and named in
  `disabled_features`.
- **Statistics** are the components' own merged as LeRobot's `aggregate_stats` merges them (count-weighted
  means, pooled variances, min/max; a padded dimension's from the components that have it), as numpy arrays,
  None when no component has statistics.
- **fps**: the components' common fps. When they differ, `fps` is the first component's and `fps_by_component`
  lists each; windows (`delta_timestamps`, which LeRobot computes in seconds from `fps`) are resolved per
  component at its own fps, so an offset off any component's frame grid is an `episerve.MixtureError` naming it.
- **Episodes**: `episodes` describes the mixture's index space as LeRobot's samplers read it, one run of
  positions `[0, epoch_size)` (a mixture's positions do not follow episodes, so `EpisodeAwareSampler`'s
  `drop_n_last_frames` drops that many positions at the end of the epoch, not episode tails); each component's
  own episodes, tasks and statistics are in `components[k]` (a `RemoteLeRobotDatasetMetadata`).
- **Tasks** are per component: `tasks` is a DataFrame indexed by task with columns `dataset_index` and
  `task_index` (the component's own index, as in its samples), `tasks_by_component[k]` `{task_index: task}`.
"""

from __future__ import annotations

import os
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from episerve._client import Client
from episerve._episodes import episode_count
from episerve._mixture import Mixture
from episerve._mixture_schema import ResolvedMixture, resolve, vector_shape
from episerve._mixture_stats import merge_stats
from episerve.lerobot._metadata import EpisodeTable, LeRobotInfo, RemoteLeRobotDatasetMetadata, pandas_module

__all__ = ["RemoteLeRobotMixtureMetadata"]

_VECTOR_TYPE = re.compile(r"fixed_size_list<item: (?:halffloat|float|double|u?int(?:8|16|32|64))>\[\d+\]")


class RemoteLeRobotMixtureMetadata(LeRobotInfo):
    """LeRobot's `LeRobotDatasetMetadata` for a `Mixture` served by one server (see the module docstring).

    `info`, `fps`, `features`, `robot_type` (the components' common one, else None), `camera_keys`,
    `video_keys`, `image_keys`, `names`, `shapes`, `stats`, `episodes`, `tasks`, `total_episodes` and
    `total_frames` (the components' episode picks and rows together), `total_tasks` (distinct task strings);
    and the mixture's own: `components` (each component's metadata), `fps_by_component`, `tasks_by_component`,
    `columns` (the mixture's columns read, cameras aside), `disabled_features`, `resolved` (the mixture
    resolved against the server). `root` is kept and not read; `revision` is checked against every component.
    """

    def __init__(
        self,
        client: Client,
        mixture: Mixture,
        repo_id: str | None = None,
        *,
        root: str | os.PathLike[str] | None = None,
        revision: str | None = None,
        epoch_size: int | None = None,
    ) -> None:
        self.mixture = mixture
        self.repo_id = repo_id
        self.components = [
            RemoteLeRobotDatasetMetadata(client, c.dataset, root=None, revision=revision) for c in mixture.components
        ]
        self.root = Path(root) if root is not None else None
        self.revision = self.components[0].revision
        wanted, self.disabled_features = _readable_columns(mixture, self.components)
        self.resolved: ResolvedMixture = resolve(client, mixture, wanted)
        features = _features(mixture, self.components, self.resolved)
        cameras = {feature.name for feature in self.resolved.features if feature.kind == "camera"}
        self.columns = [name for name in wanted if name not in cameras]
        self.fps_by_component = tuple(component.fps for component in self.components)
        self.tasks_by_component = [dict(component.tasks_by_index) for component in self.components]
        self.total_frames = sum(self.resolved.sizes)
        self.total_episodes = sum(
            meta.total_episodes if c.episodes is None else episode_count(c.episodes)
            for c, meta in zip(mixture.components, self.components, strict=True)
        )
        self.epoch_size = self.total_frames if epoch_size is None else epoch_size
        positions = {"length": self.epoch_size, "dataset_from_index": 0, "dataset_to_index": self.epoch_size}
        self.episodes = EpisodeTable([{"episode_index": 0, **positions}])
        parts = [
            None if meta.stats is None else {c.name_of(key): value for key, value in meta.stats.items()}
            for c, meta in zip(mixture.components, self.components, strict=True)
        ]
        self.stats = merge_stats(parts) if any(part is not None for part in parts) else None
        robot_types = {meta.robot_type for meta in self.components}
        first = self.components[0].info
        self.info = {
            "codebase_version": first.get("codebase_version"),
            "robot_type": robot_types.pop() if len(robot_types) == 1 else None,
            "total_episodes": self.total_episodes,
            "total_frames": self.total_frames,
            "total_tasks": self.total_tasks,
            "fps": self.fps_by_component[0],
            "features": features,
        }
        self.subtasks = None
        self._tasks: Any = None

    @property
    def total_tasks(self) -> int:
        return len({task for tasks in self.tasks_by_component for task in tasks.values()})

    @property
    def tasks(self) -> Any:
        """The components' tasks: a pandas DataFrame indexed by task, columns `dataset_index` and `task_index`."""
        if self._tasks is None:
            rows = [(k, i, t) for k, tasks in enumerate(self.tasks_by_component) for i, t in sorted(tasks.items())]
            self._tasks = pandas_module().DataFrame(
                {
                    "dataset_index": np.array([k for k, _, _ in rows], dtype=np.int64),
                    "task_index": np.array([i for _, i, _ in rows], dtype=np.int64),
                },
                index=[task for _, _, task in rows],
            )
        return self._tasks

    def get_task_index(self, task: str) -> int | None:
        """The index of `task` in the first component that has it (None if none has)."""
        for tasks in self.tasks_by_component:
            for index, name in tasks.items():
                if name == task:
                    return index
        return None

    def __repr__(self) -> str:
        shares = ", ".join(f"{c.dataset!r}: {c.weight:g}" for c in self.mixture.components)
        return (
            f"RemoteLeRobotMixtureMetadata({{{shares}}}, episodes={self.total_episodes}, frames={self.total_frames}, "
            f"fps={self.fps_by_component}, cameras={self.camera_keys})"
        )


def _readable_columns(
    mixture: Mixture, components: Sequence[RemoteLeRobotDatasetMetadata]
) -> tuple[list[str], set[str]]:
    """The mixture's columns to read (cameras first, then the others, in the components' feature order) and
    those left out (see the module docstring)."""
    kinds: list[dict[str, str]] = []  # per component: mixture name -> camera / vector / value
    for component, meta in zip(mixture.components, components, strict=True):
        own = {key: "camera" for key in meta.video_keys}
        own |= {key: "vector" if _VECTOR_TYPE.fullmatch(kind) else "value" for key, kind in meta.column_types.items()}
        kinds.append({component.name_of(key): kind for key, kind in own.items()})
    order = _feature_order(mixture, components)
    for own in kinds:
        order.update(dict.fromkeys(own))
    wanted, disabled = [], set()
    for name in order:
        present = [own[name] for own in kinds if name in own]
        if not present:  # a feature of info.json that no component serves as a column
            continue
        if len(present) == len(kinds) or all(kind in ("camera", "vector") for kind in present):
            wanted.append(name)
        else:
            disabled.add(name)
    cameras = [name for name in wanted if any(own.get(name) == "camera" for own in kinds)]
    return [*cameras, *(name for name in wanted if name not in cameras)], disabled


def _features(
    mixture: Mixture, components: Sequence[RemoteLeRobotDatasetMetadata], resolved: ResolvedMixture
) -> dict[str, dict[str, Any]]:
    """LeRobot's features of the mixture's columns, in the components' feature order (shapes as tuples)."""
    features: dict[str, dict[str, Any]] = {}
    for feature in resolved.features:
        if feature.kind == "pad":
            continue
        sources = [
            (k, meta.features[own])
            for k, (own, meta) in enumerate(zip(feature.sources, components, strict=True))
            if own is not None and own in meta.features
        ]
        if not sources:  # a column without a LeRobot feature (a dataset that is not in LeRobot's format)
            continue
        if feature.kind == "vector" and feature.mask is not None:
            widest = feature.width
            chosen = next(own for k, own in sources if feature.widths[k] == widest)
            shape = tuple(chosen.get("shape") or vector_shape(feature.arrow_type)[0])
            features[feature.name] = {**chosen, "shape": (*shape[:-1], widest)}
        else:
            features[feature.name] = dict(sources[0][1])
    order = {name: n for n, name in enumerate(_feature_order(mixture, components))}
    return {name: features[name] for name in sorted(features, key=lambda name: order.get(name, len(order)))}


def _feature_order(mixture: Mixture, components: Sequence[RemoteLeRobotDatasetMetadata]) -> dict[str, None]:
    """The mixture's names of the components' LeRobot features, first component's first (an ordered set)."""
    return dict.fromkeys(
        component.name_of(key)
        for component, meta in zip(mixture.components, components, strict=True)
        for key in meta.features
    )
