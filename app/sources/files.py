"""Where a dataset's files are: a local directory (`pathlib.Path`) or a prefix in an object store
(`RemotePath`). Both are walked, stat'ed and read through the same `Path` methods; opening a file for a reader
that needs random access (parquet, video) is the one thing that differs, and it happens here, as does turning a
failure of the store during such a read into an `ObjectStoreError` naming the object.

How the files come to be there is a dataset's `FileSupply`: a local directory or an object store has every file
(`ALL_THERE`); a dataset from the Hugging Face Hub fetches a LeRobot data file or a camera's video file when a read
first needs it (`app.sources.hub.HubSnapshot`)."""

from __future__ import annotations

import contextlib
import io
from collections.abc import Callable, Collection, Iterator
from pathlib import Path
from typing import Any, BinaryIO, Protocol

from app.sources.object_store import RemotePath, etag_of, read_failure

DatasetPath = Path | RemotePath
VIDEO_READ_BYTES = 1 << 20  # a decoder's small reads become ranged GETs of this size


class FileSupply(Protocol):
    """How a dataset's files come to be there to open."""

    fetches: bool  # whether any file may be missing (False: `at_hand` never waits, and reads skip listing files)

    def listed(self, folder: str) -> dict[str, int] | None:
        """The files below `folder` (a relative path ending in `/`) as the supply lists them, there or not, with
        their sizes (None: the files are what is on disk)."""
        ...

    def there(self, rel: str) -> bool:
        """Whether file `rel` can be opened now, without fetching it."""
        ...

    def at_hand(self, rels: Collection[str]) -> None:
        """Return once every file of `rels` (paths relative to the dataset) can be opened; else start fetching all
        those that are not there yet, at once, in the background, and raise `TryLater` (a 503 with the progress)."""
        ...

    def fetch_now(self, rels: Collection[str], progress: Callable[[int, int], None] | None = None) -> tuple[int, int]:
        """Fetch every file of `rels` that is not there yet and wait for them (`warm`), calling `progress(bytes done,
        bytes)` as they come: (files, bytes) fetched."""
        ...

    def describe(self) -> dict[str, Any] | None:
        """Where the files come from and how their fetching stands, for `GET /datasets/{id}` and `/cache` (None:
        nothing to say)."""
        ...


class _AllThere:
    """The supply of a local directory or an object store: every file is there."""

    fetches = False

    def listed(self, folder: str) -> dict[str, int] | None:
        return None

    def there(self, rel: str) -> bool:
        return True

    def at_hand(self, rels: Collection[str]) -> None:
        return None

    def fetch_now(self, rels: Collection[str], progress: Callable[[int, int], None] | None = None) -> tuple[int, int]:
        return 0, 0

    def describe(self) -> dict[str, Any] | None:
        return None


ALL_THERE: FileSupply = _AllThere()


def is_remote_path(path: DatasetPath) -> bool:
    """Whether `path` is in an object store."""
    return isinstance(path, RemotePath)


def parquet_input(path: DatasetPath) -> Any:
    """What `pyarrow.parquet` opens: a local path as is, an object as a seekable file read by ranged GETs."""
    return path.open_input_file() if isinstance(path, RemotePath) else str(path)


def shown_path(root: DatasetPath, rel: str) -> str:
    """How messages name file `rel` of the dataset at `root`: the whole `s3://` object in a store (an operator
    looks for it there), the path relative to the dataset for a local file."""
    return str(root / rel) if isinstance(root, RemotePath) else rel


@contextlib.contextmanager
def store_reads(path: DatasetPath) -> Iterator[None]:
    """A block reading `path`. In an object store, an `OSError` from pyarrow's S3 filesystem (the store unreachable,
    refusing or failing, after its retries) becomes `ObjectStoreError` naming the object: a 503 to retry, which the
    store layer never mistakes for a changed file. A local file's errors pass as they are."""
    try:
        yield
    except OSError as exc:
        if not isinstance(path, RemotePath):
            raise
        raise read_failure(path, exc) from exc


@contextlib.contextmanager
def opened_parquet(path: DatasetPath) -> Iterator[Any]:
    """`parquet_input` for the duration of a block, whose store failures name the object (see `store_reads`)."""
    opened = parquet_input(path)
    try:
        with store_reads(path):
            yield opened
    finally:
        if not isinstance(opened, str):
            opened.close()


def opened_etag(handle: Any) -> str:
    """The ETag of an object opened by `parquet_input` ("" for a local file)."""
    return "" if isinstance(handle, str) else etag_of(handle)


def open_video(path: DatasetPath) -> str | BinaryIO:
    """What `av.open` opens: a local path as is (FFmpeg reads it natively), an object as a buffered, seekable
    Python file whose reads are ranged GETs of about `VIDEO_READ_BYTES`. Close it with `close_video`."""
    if not isinstance(path, RemotePath):
        return str(path)
    return io.BufferedReader(_ObjectReader(path.open_input_file()), buffer_size=VIDEO_READ_BYTES)


def close_video(opened: str | BinaryIO) -> None:
    if not isinstance(opened, str):
        opened.close()


@contextlib.contextmanager
def video_input(path: DatasetPath) -> Iterator[str | BinaryIO]:
    """`open_video` for the duration of a block."""
    opened = open_video(path)
    try:
        yield opened
    finally:
        close_video(opened)


class _ObjectReader(io.RawIOBase):
    """A pyarrow random-access file as a raw Python stream (what `io.BufferedReader` buffers)."""

    def __init__(self, handle: Any) -> None:
        self._handle = handle

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        data = self._handle.read(len(buffer))
        buffer[: len(data)] = data
        return len(data)

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        return self._handle.seek(offset, whence)

    def tell(self) -> int:
        return self._handle.tell()

    def close(self) -> None:
        self._handle.close()
        super().close()
