"""The catalog: which datasets the configured roots offer, by id.

A dataset id is its directory's path relative to a root, with at most one `/` (`pusht` or `lerobot/pusht`);
a root that is itself a dataset (a LeRobot dataset, or a directory with parquet files directly in it) is served
as that one dataset, under its directory's name. Ids are validated before they touch the filesystem, and a
dataset directory that resolves outside its root (a symlink escape) is never offered.

Nothing below a root is dropped silently: every directory the scan looks at and does not offer is kept as a
`SkippedDirectory` (its path relative to the root and the reason), logged once when first seen and listed by
`GET /datasets`. A root inside a LeRobot dataset (its `data/` folder, say) is refused, naming the dataset to use.
"""

from __future__ import annotations

import contextlib
import difflib
import logging
import re
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from app.errors import DatasetError, DoesNotExist, InvalidInput
from app.settings import Settings
from app.sources import LEROBOT_INFO, DatasetPath, is_dataset_dir, is_dataset_root
from app.sources.hub import HubDatasets, parse_hub_datasets
from app.sources.object_store import ObjectStore, StoreOptions
from app.store.dataset import Dataset, SharedCaches

_ID_PART = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9._-]*$")
DATASET_ID_PATTERN = r"^[A-Za-z0-9_][A-Za-z0-9._-]*(/[A-Za-z0-9_][A-Za-z0-9._-]*)?$"  # what validate_dataset_id takes
# How far up from a root to look for the LeRobot dataset it may be inside (`data/chunk-000` is two levels down).
_LEROBOT_DEPTH = 3

log = logging.getLogger("episerve.catalog")


@dataclass(frozen=True, order=True)
class SkippedDirectory:
    """A directory below a root that the catalog does not offer: its path relative to the root, and why."""

    path: str
    reason: str

    def as_json(self) -> dict[str, str]:
        return {"path": self.path, "reason": self.reason}


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
        self._skipped: list[SkippedDirectory] = []
        self._logged_skips: set[tuple[str, SkippedDirectory]] = set()
        self._datasets: dict[str, Dataset] = {}
        self._scanned_at = 0.0
        self.hub = HubDatasets(parse_hub_datasets(settings.hub), settings.hub_allow, settings.cache_dir)
        self.scan()

    def scan(self) -> dict[str, DatasetPath]:
        """Find every dataset below the roots; two roots offering the same id, or a root inside a LeRobot dataset,
        is a configuration error. Directories not offered are logged (each once) with the reason."""
        found: dict[str, DatasetPath] = {}
        skipped: list[tuple[str, SkippedDirectory]] = []
        for root in self.roots:
            if not root.is_dir():
                raise ConfigurationError(f"dataset root {root} is not a directory")
            _refuse_root_inside_lerobot_dataset(root)
            offered, passed_over = _datasets_below(root)
            for dataset_id, path in offered:
                if dataset_id in found:
                    raise ConfigurationError(
                        f"dataset id {dataset_id!r} is offered by two roots: {found[dataset_id]} and {path}"
                    )
                found[dataset_id] = path
            skipped += [(str(root), entry) for entry in passed_over]
        for repo_id, path in self.hub.ready().items():  # a root's dataset of the same id comes first
            found.setdefault(repo_id, path)
        for root, entry in skipped:
            if (root, entry) not in self._logged_skips:
                log.warning("skipped %s/%s: %s", root.rstrip("/"), entry.path, entry.reason)
        with self._lock:
            self._paths = found
            self._skipped = sorted(entry for _, entry in skipped)
            self._logged_skips = set(skipped)
            self._scanned_at = time.monotonic()
        return found

    def skipped(self) -> list[SkippedDirectory]:
        """Directories below the roots that are not offered, and why (as of the last scan)."""
        with self._lock:
            return list(self._skipped)

    def close_ids(self, dataset_id: str) -> list[str]:
        """Up to three offered ids like `dataset_id`, whole or by last component (`pusht` finds
        `lerobot/pusht`)."""
        offered = self.ids()
        by_name: dict[str, list[str]] = {}
        for candidate in offered:
            by_name.setdefault(candidate.rsplit("/", 1)[-1], []).append(candidate)
        close = difflib.get_close_matches(dataset_id, offered, n=3, cutoff=0.8)
        for name in difflib.get_close_matches(dataset_id.rsplit("/", 1)[-1], list(by_name), n=3, cutoff=0.8):
            close += [candidate for candidate in by_name[name] if candidate not in close]
        return close[:3]

    def why_not_offered(self, dataset_id: str) -> str | None:
        """Why a directory at `dataset_id` below a root is not offered, if the last scan skipped one there."""
        with self._lock:
            return next((entry.reason for entry in self._skipped if entry.path == dataset_id.strip("/")), None)

    def opened(self) -> list[Dataset]:
        """Datasets some request has opened in this process."""
        with self._lock:
            return list(self._datasets.values())

    def ids(self) -> list[str]:
        return sorted(self._paths)

    def cache_dir(self, dataset_id: str, path: DatasetPath) -> Path:
        """The cache directory of the dataset `dataset_id` at `path`."""
        return self.settings.cache_dir / "datasets" / Dataset.cache_key(dataset_id, path)

    def hub_cache_dirs(self) -> list[Path]:
        """The cache directories of the Hub datasets this cache serves (configured or pinned), which a process that
        has not opened them (the CLI's `cache prune`) must not take for caches of datasets gone."""
        return [self.cache_dir(repo_id, self.hub.directory(repo_id)) for repo_id in self.hub.known()]

    def get(self, dataset_id: str) -> Dataset:
        """The dataset with this id; DoesNotExist if no root offers it, saying why a directory of that name was
        skipped or which offered ids are close."""
        if dataset_id not in self._paths and time.monotonic() - self._scanned_at >= self.settings.rescan_interval_s:
            with contextlib.suppress(ConfigurationError):  # keep serving what was valid until the next start
                self.scan()
        # Before the id's own checks: a directory named `my robot` gets its reason, not just "invalid id".
        reason = self.why_not_offered(dataset_id)
        if reason is not None:
            raise DoesNotExist(f"the directory {dataset_id!r} below a root is not served: {reason}")
        validate_dataset_id(dataset_id)
        path = self._paths.get(dataset_id)
        if path is None and self.hub.offers(dataset_id):
            path = self.hub.path(dataset_id)  # a 503 with the progress until its metadata is there
            with self._lock:
                self._paths.setdefault(dataset_id, path)
        if path is None:
            close = self.close_ids(dataset_id)
            hint = f"did you mean {', '.join(map(repr, close))}? " if close else ""
            hub = (
                " (to serve a Hugging Face Hub dataset by its repo id, name it in EPISERVE_HUB or allow it with "
                "EPISERVE_HUB_ALLOW)"
                if dataset_id.count("/") == 1
                else ""
            )
            raise DoesNotExist(f"no dataset {dataset_id!r}{hub}; {hint}see GET /datasets for the catalog")
        with self._lock:
            dataset = self._datasets.get(dataset_id)
            if dataset is None or dataset.path != path:
                dataset = Dataset(dataset_id, path, self.cache_dir(dataset_id, path), self.settings, self.shared)
                dataset.supply = self.hub.supply(dataset_id, path)
                self._datasets[dataset_id] = dataset
            return dataset


def _datasets_below(root: DatasetPath) -> tuple[list[tuple[str, DatasetPath]], list[SkippedDirectory]]:
    """(id, resolved path) of datasets at depth one (`name`) or two (`org/name`) below `root`, or the root itself
    when it is a dataset (its subdirectories, such as a LeRobot dataset's data/ and meta/, are then not offered);
    and every directory looked at and not offered, with the reason."""
    real_root = root.resolve()
    if is_dataset_root(root):
        name = real_root.name
        if not _ID_PART.match(name):
            raise ConfigurationError(
                f"dataset root {root} is itself a dataset, but its name {name!r} is not a valid dataset id "
                f"(must match {_ID_PART.pattern}): rename it, or pass its parent directory as the root"
            )
        return [(name, real_root)], []
    found: list[tuple[str, DatasetPath]] = []
    skipped: list[SkippedDirectory] = []
    for child in sorted(_subdirs(root)):
        if child.name.startswith("."):
            skipped.append(SkippedDirectory(child.name, _HIDDEN))
            continue
        if is_dataset_dir(child):
            candidates = [(child.name, child)]
        else:
            candidates = []
            grandchildren = sorted(_subdirs(child))
            for grandchild in grandchildren:
                dataset_id = f"{child.name}/{grandchild.name}"
                if grandchild.name.startswith("."):
                    skipped.append(SkippedDirectory(dataset_id, _HIDDEN))
                elif is_dataset_dir(grandchild):
                    candidates.append((dataset_id, grandchild))
            if not candidates:
                skipped.append(SkippedDirectory(child.name, _NO_DATASET))
            else:
                offered = {grandchild for _, grandchild in candidates}
                skipped += [
                    SkippedDirectory(f"{child.name}/{g.name}", _NOT_A_DATASET)
                    for g in grandchildren
                    if g not in offered and not g.name.startswith(".")
                ]
        for dataset_id, path in candidates:
            resolved = path.resolve()
            invalid = [part for part in dataset_id.split("/") if not _ID_PART.match(part)]
            if not resolved.is_relative_to(real_root):
                skipped.append(SkippedDirectory(dataset_id, "it resolves outside its root (a symbolic link?)"))
            elif invalid:
                skipped.append(SkippedDirectory(dataset_id, _invalid_name(invalid[0])))
            else:
                found.append((dataset_id, resolved))
    return found, skipped


_HIDDEN = "hidden (its name starts with '.')"
_NOT_A_DATASET = "not a dataset: no meta/info.json and no parquet files in it or in its data/ folder"
_NO_DATASET = (
    "no dataset in it: it has no meta/info.json or parquet files, nor has any of its subdirectories "
    "(datasets are looked for one or two levels below a root)"
)


def _invalid_name(part: str) -> str:
    """Why a directory name cannot be (part of) a dataset id, and a name that could."""
    suggestion = re.sub(r"[^A-Za-z0-9._-]+", "-", part).lstrip(".-") or "dataset"
    return (
        f"{part!r} is not a valid dataset id: names hold letters, digits, '_', '-' and '.' (not first); "
        f"rename it, e.g. to {suggestion!r}"
    )


def _refuse_root_inside_lerobot_dataset(root: DatasetPath) -> None:
    """A root below a LeRobot dataset (its `data/` or `data/chunk-000` folder) would be served as generic parquet,
    without the dataset's fps, cameras or episodes: refuse it, naming the directory to pass instead."""
    if not isinstance(root, Path) or (root / LEROBOT_INFO).is_file():
        return
    for parent in list(root.resolve().parents)[:_LEROBOT_DEPTH]:
        if (parent / LEROBOT_INFO).is_file():
            raise ConfigurationError(
                f"dataset root {root} is inside the LeRobot dataset {parent} (it has {LEROBOT_INFO}): pass {parent} "
                "as the root to serve it as one dataset with its fps, cameras and episodes, or the directory "
                "holding it to serve it beside others"
            )


def _subdirs(path: DatasetPath) -> list[DatasetPath]:
    try:
        return [p for p in path.iterdir() if p.is_dir()]
    except OSError:
        return []
