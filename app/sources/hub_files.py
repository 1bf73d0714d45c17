"""The files of a Hub dataset: what the Hub lists at a commit, the download of one file with its progress, and the
check of its content before it is served.

`huggingface_hub` downloads a file into its place below the dataset's directory: under a temporary name first, its
size checked, and only then moved into place; a download cut midway resumes from where it stopped, now or at the next
try. episerve then checks the content against the hash the Hub lists for the file (SHA-256 for an LFS file, the git
blob id for the others) and records the check in its own cache with the file's size, mtime and inode. A file is
opened only once a check of it, as it is now, is recorded (by whichever process of the server made it): a file cut
short, corrupt or replaced since is never served. A file that fails its check is deleted, so the next fetch downloads
it again.
"""

from __future__ import annotations

import hashlib
import json
import os
import threading
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from app.errors import DatasetError, ProblemError

_READ_BYTES = 1 << 20


class CorruptFile(DatasetError):
    """A downloaded file whose content is not what the Hub lists (deleted; the next fetch downloads it again)."""


@dataclass(frozen=True)
class HubFile:
    """A file of a Hub dataset at one commit, as the Hub lists it: its path, size and content hash."""

    path: str
    size: int
    sha256: str | None = None  # an LFS file: the SHA-256 of its content
    blob_id: str | None = None  # any other: its git blob id (SHA-1 of `blob <size>\0` and the content)

    @classmethod
    def of(cls, sibling: Any) -> HubFile:
        """From a `huggingface_hub` `RepoSibling` listed with `files_metadata=True`."""
        if sibling.lfs is not None:
            return cls(sibling.rfilename, int(sibling.lfs.size), sha256=sibling.lfs.sha256)
        return cls(sibling.rfilename, int(sibling.size or 0), blob_id=sibling.blob_id)

    @property
    def expected(self) -> str:
        """The hash its content must have ("" when the Hub listed none: then its size is checked alone)."""
        return self.sha256 or self.blob_id or ""

    def hash_of(self, local: Path) -> str:
        """The hash of `local`'s content, of the kind the Hub lists for this file."""
        if self.sha256 is None and self.blob_id is None:
            return ""
        if self.sha256 is not None:
            digest = hashlib.sha256()
        else:
            digest = hashlib.sha1(usedforsecurity=False)  # git's blob id, not a security measure
            digest.update(b"blob %d\0" % local.stat().st_size)
        with open(local, "rb") as opened:
            while chunk := opened.read(_READ_BYTES):
                digest.update(chunk)
        return digest.hexdigest()


def _identity(stat: os.stat_result) -> list[int]:
    return [stat.st_size, stat.st_mtime_ns, stat.st_ino]


class CheckedFiles:
    """Which files of a dataset directory were checked against the Hub's hashes as they are now on disk: recorded in
    `records` (a small JSON per file, written atomically) for every process, remembered by this one."""

    def __init__(self, directory: Path, records: Path) -> None:
        self.directory = directory
        self.records = records
        self._known: dict[str, tuple[list[int], str]] = {}
        self._lock = threading.Lock()

    def holds(self, file: HubFile) -> bool:
        """Whether `file` is in the directory, as it was when it was checked (a `stat`, and the record read once)."""
        try:
            identity = _identity((self.directory / file.path).stat())
        except OSError:
            return False
        with self._lock:
            if self._known.get(file.path) == (identity, file.expected):
                return True
        try:
            recorded = json.loads(self._record(file.path).read_text())
        except (OSError, ValueError):
            return False
        if recorded != {"hash": file.expected, "file": identity}:
            return False
        with self._lock:
            self._known[file.path] = (identity, file.expected)
        return True

    def check(self, file: HubFile) -> None:
        """Check the file's size and content against the listing, and record it; a file that fails is deleted and
        `CorruptFile` raised."""
        local = self.directory / file.path
        identity = _identity(local.stat())
        wrong = None
        if identity[0] != file.size:
            wrong = f"has {identity[0]} bytes; the Hub lists {file.size}"
        elif (found := file.hash_of(local)) != file.expected:
            wrong = f"has hash {found}; the Hub lists {file.expected}"
        if wrong is not None:
            local.unlink(missing_ok=True)
            raise CorruptFile(
                f"{file.path} as downloaded from the Hub {wrong} (deleted: the next try fetches it again)"
            )
        record = self._record(file.path)
        record.parent.mkdir(parents=True, exist_ok=True)
        temporary = record.with_name(f"{record.name}.{os.getpid()}.{threading.get_ident()}.tmp")
        temporary.write_text(json.dumps({"hash": file.expected, "file": identity}))
        os.replace(temporary, record)
        with self._lock:
            self._known[file.path] = (identity, file.expected)

    def _record(self, path: str) -> Path:
        return self.records / f"{path}.json"


@dataclass
class FileFetch:
    """One file's fetch (download, then check), as progress reports show it."""

    file: HubFile
    state: str = "queued"  # queued, downloading, checking, done, failed
    bytes_done: int = 0
    problem: ProblemError | None = None
    future: Future[None] | None = field(default=None, repr=False)

    def as_json(self) -> dict[str, Any]:
        shown: dict[str, Any] = {"path": self.file.path, "state": self.state, "bytes": self.file.size}
        shown["bytes_done"] = self.bytes_done
        if self.problem is not None:
            shown["error"] = self.problem.detail
        return shown


def download(repo_id: str, commit: str, directory: Path, fetch: FileFetch) -> None:
    """Download `fetch.file` into its place below `directory` through `huggingface_hub` (which finds it there already
    when LeRobot or another process of the server downloaded it), counting its bytes into `fetch.bytes_done`."""
    from huggingface_hub import hf_hub_download

    hf_hub_download(
        repo_id,
        fetch.file.path,
        repo_type="dataset",
        revision=commit,
        local_dir=directory,
        tqdm_class=_counting_into(fetch),
    )


def _counting_into(fetch: FileFetch) -> Any:
    """A tqdm class that counts the bytes of a download into `fetch` (`huggingface_hub`'s progress hook) and shows
    nothing."""
    from tqdm.auto import tqdm

    class Counting(tqdm):  # type: ignore[misc]
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            kwargs["disable"] = True
            super().__init__(*args, **kwargs)
            fetch.bytes_done = int(kwargs.get("initial") or 0)  # resumed: what an earlier try left

        def update(self, n: float | None = 1) -> bool | None:
            fetch.bytes_done += int(n or 0)
            return super().update(n)

    return Counting


def human_bytes(count: float) -> str:
    """`1.2 MB`, `340 kB`, `12 B`."""
    for unit in ("B", "kB", "MB", "GB"):
        if count < 1000 or unit == "GB":
            return f"{count:.0f} {unit}" if unit == "B" else f"{count:.1f} {unit}"
        count /= 1000
    raise AssertionError("unreachable")
