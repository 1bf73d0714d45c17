"""The commit each Hub dataset is served at: pinned at its first resolve, in a small file per repo in the server's cache
directory, so every process that uses the cache (a server's workers, the server after a restart, `warm`) serves the
same commit; a moving branch is resolved again only when the operator asks (`episerve-server hub refresh`).

A pin is `<cache>/hub-pins/<repo id>.json`: the revision asked for, the commit it named and when. It is written
atomically (a temporary file, fsync'ed, renamed into place) under a file lock held while the revision is resolved, so
processes starting together resolve it once: the first resolves and writes, the others wait for the lock and read it.
A pin of another revision (the operator now asks for `v2.1`, not `main`) is replaced by resolving the new one.
"""

from __future__ import annotations

import contextlib
import json
import re
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

from filelock import FileLock, Timeout

from app.atomic_files import write_atomically
from app.errors import TryLater

LOCK_WAIT_S = 300.0  # how long a process waits for another's resolve before answering 503
_COMMIT = re.compile(r"[0-9a-f]{40}")


@dataclass(frozen=True)
class Pin:
    """A Hub dataset's revision as the commit it named when it was resolved."""

    repo_id: str
    revision: str
    commit: str
    pinned_at: str  # UTC, ISO 8601

    def as_json(self) -> dict[str, str]:
        return asdict(self)


class RevisionPins:
    """The pins of the Hub datasets served from one cache directory (`<cache>/hub-pins`)."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory

    def read(self, repo_id: str) -> Pin | None:
        """The pin of `repo_id`, if any (a damaged pin file counts as none: the revision is resolved again)."""
        try:
            pin = Pin(**json.loads(self._path(repo_id).read_text()))
        except (OSError, ValueError, TypeError):
            return None
        return pin if pin.repo_id == repo_id and _COMMIT.fullmatch(pin.commit) else None

    def all(self) -> list[Pin]:
        """Every readable pin, by repo id."""
        found = []
        for path in sorted(self.directory.glob("*/*.json")):
            pin = self.read(f"{path.parent.name}/{path.stem}")
            if pin is not None:
                found.append(pin)
        return found

    def pinned(self, repo_id: str, revision: str, resolve: Callable[[], str]) -> Pin:
        """The pin of `repo_id` at `revision`: the one on disk, else `resolve()` (the commit `revision` names now),
        pinned. Under the repo's lock, so processes asking at once resolve the revision once."""
        with self._locked(repo_id):
            pin = self.read(repo_id)
            if pin is not None and pin.revision == revision:
                return pin
            return self._write(repo_id, revision, resolve())

    def refresh(self, repo_id: str, revision: str, resolve: Callable[[], str]) -> tuple[Pin | None, Pin]:
        """Resolve `revision` again and pin the commit it names now: (the pin before, the pin now)."""
        with self._locked(repo_id):
            before = self.read(repo_id)
            return before, self._write(repo_id, revision, resolve())

    def _write(self, repo_id: str, revision: str, commit: str) -> Pin:
        pin = Pin(repo_id, revision, commit, time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()))
        write_atomically(self._path(repo_id), json.dumps(pin.as_json()).encode())
        return pin

    @contextlib.contextmanager
    def _locked(self, repo_id: str) -> Iterator[None]:
        """The repo's lock, waited for `LOCK_WAIT_S` (another process resolving), then a 503."""
        path = self._path(repo_id)
        path.parent.mkdir(parents=True, exist_ok=True)
        try:
            lock = FileLock(path.with_name(f"{path.name}.lock"), timeout=LOCK_WAIT_S)
            lock.acquire()
        except Timeout as exc:
            raise TryLater(
                f"the Hub dataset {repo_id!r} is being resolved by another process of the server; retry later"
            ) from exc
        try:
            yield
        finally:
            lock.release()

    def _path(self, repo_id: str) -> Path:
        return self.directory / f"{repo_id}.json"
