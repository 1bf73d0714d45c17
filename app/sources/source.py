"""What every source format gives the store: its files, their fingerprints and schemas, episode runs, and
record batches.

A `Source` is a snapshot of one dataset directory, read when the dataset's index is (re)loaded: the format's
metadata and the list of its data files. Everything else reads one file at a time, by its path relative to the
dataset directory, and never holds a whole file in memory.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field, replace
from typing import Any, Protocol

import numpy as np
import pyarrow as pa

from app.errors import DatasetError
from app.sources.files import DatasetPath
from app.sources.frame_tiers import RAW, FrameTier


class FileStat(Protocol):
    """The fields of a stat the fingerprints use: `os.stat_result`, or an object store's `ObjectStat`."""

    @property
    def st_size(self) -> int: ...
    @property
    def st_mtime_ns(self) -> int: ...
    @property
    def st_ctime_ns(self) -> int: ...
    @property
    def st_ino(self) -> int: ...


ABSENT = -1  # mtime, ctime and inode of a file not fetched yet: no stat gives a negative inode


@dataclass(frozen=True)
class EpisodeRun:
    """Rows [start, stop) of source file number `file` belong to `episode`."""

    episode: int
    file: int
    start: int
    stop: int


@dataclass(frozen=True)
class SourceFingerprint:
    """Identity of one source file's content: any change to it invalidates that file's segment.

    Freshness is decided from one `stat`, with no read: a file is unchanged while its size, mtime, inode and ctime
    all match. Size and mtime alone miss a same-size rewrite whose mtime was restored (`cp -p`, `rsync -t`);
    ctime cannot be set from user space and moves on every write, rename-over or `utime`, and the inode changes
    when a file is replaced by another one. The price: a `chmod`/`chown` of a source file also moves its ctime, so
    its segment is rebuilt once.

    An object in an object store has no inode or ctime (both are recorded as 0 and its modification time): it is
    unchanged while the store's listing gives the same size and Last-Modified and no read since found another ETag
    than `etag`, the ETag the store reported when the object was read (empty for local files).

    A file of a dataset whose files are fetched as reads need them (from the Hub) that is not there yet has an
    `absent` fingerprint: the size its supply lists, the row count its dataset's metadata gives it, the schema of the
    dataset's first data file, and `ABSENT` for mtime, ctime and inode, which no stat returns. Its rows are never read
    under it: a read fetches the file first, and the file once there is no longer what the fingerprint says
    (`ParquetSource.is_unchanged`), so the index is read again and fingerprints it for real.
    """

    path: str
    size: int
    mtime_ns: int
    ctime_ns: int
    inode: int
    rows: int
    schema_hash: str
    etag: str = ""

    @classmethod
    def of(cls, path: str, stat: FileStat, rows: int, schema: pa.Schema, etag: str = "") -> SourceFingerprint:
        size, mtime, ctime, inode = stat.st_size, stat.st_mtime_ns, stat.st_ctime_ns, stat.st_ino
        return cls(path, size, mtime, ctime, inode, rows, schema_hash(schema), etag)

    @classmethod
    def of_absent(cls, path: str, size: int, rows: int, schema: pa.Schema) -> SourceFingerprint:
        """The fingerprint of a file not fetched yet (see the class docstring)."""
        return cls(path, size, ABSENT, ABSENT, ABSENT, rows, schema_hash(schema))

    @property
    def absent(self) -> bool:
        """Whether it fingerprints a file not fetched yet."""
        return self.inode == ABSENT and self.ctime_ns == ABSENT

    def to_dict(self) -> dict[str, Any]:
        """As persisted in the index and the sidecars (`etag` only when there is one, so the caches of local
        datasets written before object stores were supported stay valid)."""
        fields = asdict(self)
        if not self.etag:
            del fields["etag"]
        return fields

    def same_file(self, stat: FileStat) -> bool:
        """Whether `stat` (of this fingerprint's path) describes the same content. The one freshness rule: index
        load, segment sidecars and per-request checks all use it."""
        return (
            stat.st_ctime_ns == self.ctime_ns
            and stat.st_mtime_ns == self.mtime_ns
            and stat.st_size == self.size
            and stat.st_ino == self.inode
            and not (self.etag and getattr(stat, "etag", "") not in ("", self.etag))
        )


@dataclass(frozen=True)
class VideoFeature:
    """A camera: its feature key, the frame geometry its files hold (as info.json records it), and the geometry
    it is served at (the same, unless the server downscales frames: `resized`)."""

    key: str
    height: int
    width: int
    channels: int
    codec: str | None
    pix_fmt: str | None
    fps: float | None
    file_height: int | None = None  # when served resized: the size of the frames in the files
    file_width: int | None = None
    tier: FrameTier = RAW  # how its decoded-frame segments keep frames (`app.sources.frame_tiers`)

    @property
    def shape(self) -> tuple[int, int, int]:
        """(height, width, channels) of the frames as served."""
        return (self.height, self.width, self.channels)

    @property
    def file_size(self) -> tuple[int, int]:
        """(height, width) of the frames in the video files."""
        return (self.file_height or self.height, self.file_width or self.width)

    def resized(self, height: int, width: int) -> VideoFeature:
        """The same camera served at `height` x `width`."""
        file_height, file_width = self.file_size
        if (height, width) == (file_height, file_width):
            return replace(self, height=height, width=width, file_height=None, file_width=None)
        return replace(self, height=height, width=width, file_height=file_height, file_width=file_width)

    @classmethod
    def of(cls, key: str, feature: dict[str, Any]) -> VideoFeature:
        shape = list(feature.get("shape") or [])
        info = feature.get("info") or {}
        names = feature.get("names") or []
        if len(shape) != 3:
            raise DatasetError(f"video feature {key!r} has shape {shape!r}; expected [height, width, channels]")
        if names[:1] == ["channels"] or (shape[0] in (1, 3) and shape[2] not in (1, 3)):
            shape = [shape[1], shape[2], shape[0]]  # recorded channels-first
        height = int(info.get("video.height", shape[0]))
        width = int(info.get("video.width", shape[1]))
        fps = info.get("video.fps")
        return cls(key, height, width, 3, info.get("video.codec"), info.get("video.pix_fmt"), fps and float(fps))

    @property
    def arrow_type(self) -> pa.DataType:
        """Raw RGB frames, (height, width, channels) row-major, as an Arrow fixed-shape tensor."""
        return pa.fixed_shape_tensor(pa.uint8(), [self.height, self.width, self.channels])

    def describe(self) -> dict[str, Any]:
        return {
            "name": self.key,
            "type": str(self.arrow_type),
            "video": {
                "shape": [self.height, self.width, self.channels],
                "layout": "HWC",
                "file_shape": [*self.file_size, self.channels],
                "codec": self.codec,
                "pix_fmt": self.pix_fmt,
                "fps": self.fps,
            },
            "frames": self.tier.describe(),
        }


@dataclass(frozen=True)
class EpisodeClip:
    """Where one episode's frames of one camera are: a file (relative to the dataset) and the episode's start
    time in it."""

    path: str
    from_timestamp: float


@dataclass
class DatasetInfo:
    """What a dataset's metadata says, as far as serving it needs."""

    format: str  # "lerobot-v3.0", "lerobot-v2.1" or "parquet"
    fps: float | None = None
    info: dict[str, Any] = field(default_factory=dict)
    tasks: dict[int, str] = field(default_factory=dict)
    episode_tasks: dict[int, list[str]] = field(default_factory=dict)
    episode_column: str | None = None  # overrides the server-wide default (generic datasets, `episerve.json`)
    videos: dict[str, VideoFeature] = field(default_factory=dict)  # camera key -> its frames' geometry


class RowGroups(Protocol):
    """Random access to one source file by row group (the unit a columnar file decodes)."""

    offsets: np.ndarray  # first row of each row group, plus the file's row count at the end
    sizes: np.ndarray  # decoded bytes of each row group

    def streams(self, groups: list[int]) -> bool:
        """Whether `take` decodes row groups `groups` (one list of `read_plan`) batch by batch; else whole, all of
        them at once (only ever a read of a bounded size: several small row groups of an object)."""
        ...

    def take(
        self, groups: list[int], wanted: pa.Schema, positions: np.ndarray, batch_rows: int
    ) -> list[pa.RecordBatch]:
        """Rows at `positions` (ascending, duplicates allowed) of the rows of row groups `groups` (ascending) one
        after the other, as batches of `wanted` (columns the file lacks are nulls), decoded no further than the
        last wanted row. When the read `streams`, `batch_rows` rows at a time, each batch let go (and its memory
        handed back) once its wanted rows are copied out: a read holds one batch, whatever the size of a row
        group."""
        ...

    def decoded_bytes(self, groups: list[int], columns: list[str]) -> int:
        """Uncompressed bytes of `columns` in row groups `groups` (what decoding them yields, about)."""
        ...

    def read_plan(self, groups: np.ndarray) -> list[list[int]]:
        """`groups` (ascending) cut into the lists that `take` is given at once: one group each for a local file;
        for an object, several small ones up to a size, so that their ranges are fetched together instead of one
        request after another, and a larger one alone (streamed)."""
        ...

    def fetched_bytes(self, groups: list[int], columns: list[str]) -> int:
        """Encoded bytes a read of `columns` of `groups` (one list of `read_plan`) of an object may fetch and hold
        besides what it decodes: the ranges it fetches whole, or a streamed read's buffer per column chunk."""
        ...


class Source(Protocol):
    """One dataset directory in one format. Implementations: `app.sources.parquet` and the LeRobot formats."""

    root: DatasetPath  # a local directory, or a prefix in an object store
    info: DatasetInfo
    files: list[str]  # data files, relative POSIX paths, in stored order

    def fingerprint(self, rel: str) -> tuple[SourceFingerprint, pa.Schema]:
        """The file's identity and schema, read from as little of it as the format allows."""
        ...

    def is_unchanged(self, source: SourceFingerprint) -> bool:
        """Whether the file still is what `source` fingerprinted (cheap: a stat)."""
        ...

    def schema(self, rel: str) -> pa.Schema:
        """The file's Arrow schema."""
        ...

    def metadata_runs(self, file_rows: list[int]) -> list[EpisodeRun] | None:
        """Episode runs from the format's metadata, checked against the files' row counts; None if unusable."""
        ...

    def scan_runs(self, number: int, rel: str, column: str, etag: str = "") -> list[EpisodeRun]:
        """Episode runs of file `number`, found by reading only its episode `column`. With an `etag` (objects in a
        store), `SourceReplaced` if the object read is no longer that version."""
        ...

    def read_batches(self, rel: str, schema: pa.Schema, batch_bytes: int, etag: str = "") -> Iterator[pa.RecordBatch]:
        """Every row of the file in stored order, as batches of about `batch_bytes` conformed to `schema`. With an
        `etag` (objects in a store), `SourceReplaced` if the object opened is no longer that version."""
        ...

    def row_groups(self, rel: str, etag: str = "") -> RowGroups:
        """The file's row groups, for reading a few rows without decoding the whole file. With an `etag` (objects
        in a store), every read checks the object is still that version (`SourceReplaced` if not)."""
        ...

    def episode_clip(self, key: str, episode: int) -> EpisodeClip:
        """Where camera `key`'s frames of `episode` are (formats with `info.videos` only)."""
        ...


class SourceReplaced(DatasetError):
    """The object read is not the version that was fingerprinted (re-uploaded since): nothing read from it may be
    kept under the old fingerprint. A retry reads the new version."""

    permanent = False


def schema_hash(schema: pa.Schema) -> str:
    """Stable digest of a schema, field metadata and schema metadata included."""
    return hashlib.sha256(schema.serialize().to_pybytes()).hexdigest()[:32]


def conform_batch(batch: pa.RecordBatch, schema: pa.Schema) -> pa.RecordBatch:
    """`batch` with exactly `schema`: columns reordered, cast where types differ, nulls for missing ones."""
    if batch.schema.equals(schema, check_metadata=False):
        return pa.RecordBatch.from_arrays(batch.columns, schema=schema)
    arrays = []
    for target in schema:
        index = batch.schema.get_field_index(target.name)
        if index < 0:
            arrays.append(pa.nulls(batch.num_rows, target.type))
        else:
            column = batch.column(index)
            arrays.append(column if column.type == target.type else column.cast(target.type))
    return pa.RecordBatch.from_arrays(arrays, schema=schema)
