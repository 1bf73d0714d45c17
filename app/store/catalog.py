"""The catalog: which datasets the configured roots offer, by id.

A dataset id is its directory's path relative to a root, with at most one `/` (`pusht` or `lerobot/pusht`);
a root that is itself a dataset (a LeRobot dataset, or a directory with parquet files directly in it) is served
as that one dataset, under its directory's name. Ids are validated before they touch the filesystem, and a
dataset directory that resolves outside its root (a symlink escape) is never offered.
"""

from __future__ import annotations

import contextlib
import re
import threading
import time
from pathlib import Path

from app.errors import DatasetError, DoesNotExist, InvalidInput
from app.settings import Settings
from app.sources import DatasetPath, is_dataset_dir, is_dataset_root
from app.sources.object_store import ObjectStore, StoreOptions
from app.store.dataset import Dataset, SharedCaches

_ID_PART = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9._-]*$")


class ConfigurationError(Exception):
    """The server cannot start with this configuration (e.g. two roots offer the same id)."""


def validate_dataset_id(dataset_id: str) -> None:
    """Reject ids that could name anything but a directory below a root."""
    if not dataset_id:
        raise InvalidInput("dataset id is empty")
    if "\\" in dataset_id:
        raise InvalidInput(f"dataset id {dataset_id!r} must not contain backslashes")
    if dataset_id.startswith("/"):
        raise InvalidInput(f"dataset id {dataset_id!r} must be relative, not an absolute path")
    parts = dataset_id.split("/")
    if ".." in parts or "." in parts:
        raise InvalidInput(f"dataset id {dataset_id!r} must not contain '.' or '..' segments")
    if len(parts) > 2:
        raise InvalidInput(f"dataset id {dataset_id!r} has more than one '/' (expected 'name' or 'org/name')")
    for part in parts:
        if not _ID_PART.match(part):
            raise InvalidInput(f"dataset id {dataset_id!r} is invalid: each part must match {_ID_PART.pattern}")


def locate_roots(settings: Settings, roots: list[Path | str]) -> list[DatasetPath]:
    """The configured roots as the sources read them: directories as they are, `s3://` locations in one object store
    configured from the standard AWS environment, each listed once now so that an unreachable store or refused
    credentials stop the server at startup with the store's own words."""
    located: list[DatasetPath] = []
    store: ObjectStore | None = None
    for root in roots:
        if isinstance(root, Path):
            located.append(root)
            continue
        if store is None:
            options = StoreOptions(settings.remote_list_ttl, settings.remote_attempts, settings.remote_timeout_s)
            store = ObjectStore.from_environment(options)
        try:
            located.append(store.root(root))
        except DatasetError as exc:
            raise ConfigurationError(
                f"dataset root {root}: {exc.detail} (check the credentials, and for a store other than AWS S3 "
                "its endpoint in AWS_ENDPOINT_URL_S3 or AWS_ENDPOINT_URL)"
            ) from exc
    return located


class Catalog:
    """Datasets offered by the configured roots, opened lazily and shared by every request of a process."""

    def __init__(self, settings: Settings, roots: list[DatasetPath]) -> None:
        self.settings = settings
        self.roots = roots
        self.shared = SharedCaches.of(settings)
        self._lock = threading.Lock()
        self._paths: dict[str, DatasetPath] = {}
        self._datasets: dict[str, Dataset] = {}
        self._scanned_at = 0.0
        self.scan()

    def scan(self) -> dict[str, DatasetPath]:
        """Find every dataset below the roots; two roots offering the same id is a configuration error."""
        found: dict[str, DatasetPath] = {}
        for root in self.roots:
            if not root.is_dir():
                raise ConfigurationError(f"dataset root {root} is not a directory")
            for dataset_id, path in _datasets_below(root):
                if dataset_id in found:
                    raise ConfigurationError(
                        f"dataset id {dataset_id!r} is offered by two roots: {found[dataset_id]} and {path}"
                    )
                found[dataset_id] = path
        with self._lock:
            self._paths = found
            self._scanned_at = time.monotonic()
        return found

    def opened(self) -> list[Dataset]:
        """Datasets some request has opened in this process."""
        with self._lock:
            return list(self._datasets.values())

    def ids(self) -> list[str]:
        return sorted(self._paths)

    def get(self, dataset_id: str) -> Dataset:
        """The dataset with this id; DoesNotExist if no root offers it."""
        validate_dataset_id(dataset_id)
        if dataset_id not in self._paths and time.monotonic() - self._scanned_at >= self.settings.rescan_interval_s:
            with contextlib.suppress(ConfigurationError):  # keep serving what was valid until the next start
                self.scan()
        path = self._paths.get(dataset_id)
        if path is None:
            raise DoesNotExist(f"no dataset {dataset_id!r}; see GET /datasets for the catalog")
        with self._lock:
            dataset = self._datasets.get(dataset_id)
            if dataset is None or dataset.path != path:
                cache_dir = self.settings.cache_dir / "datasets" / Dataset.cache_key(dataset_id, path)
                dataset = Dataset(dataset_id, path, cache_dir, self.settings, self.shared)
                self._datasets[dataset_id] = dataset
            return dataset


def _datasets_below(root: DatasetPath) -> list[tuple[str, DatasetPath]]:
    """(id, resolved path) of datasets at depth one (`name`) or two (`org/name`) below `root`, or the root itself
    when it is a dataset (its subdirectories, such as a LeRobot dataset's data/ and meta/, are then not offered)."""
    real_root = root.resolve()
    if is_dataset_root(root):
        name = real_root.name
        if not _ID_PART.match(name):
            raise ConfigurationError(
                f"dataset root {root} is itself a dataset, but its name {name!r} is not a valid dataset id "
                f"(must match {_ID_PART.pattern}): rename it, or pass its parent directory as the root"
            )
        return [(name, real_root)]
    found = []
    for child in sorted(_subdirs(root)):
        if is_dataset_dir(child):
            candidates = [(child.name, child)]
        else:
            candidates = [(f"{child.name}/{g.name}", g) for g in sorted(_subdirs(child)) if is_dataset_dir(g)]
        for dataset_id, path in candidates:
            resolved = path.resolve()
            if resolved.is_relative_to(real_root) and all(_ID_PART.match(p) for p in dataset_id.split("/")):
                found.append((dataset_id, resolved))
    return found


def _subdirs(path: DatasetPath) -> list[DatasetPath]:
    try:
        return [p for p in path.iterdir() if p.is_dir() and not p.name.startswith(".")]
    except OSError:
        return []
