"""Dataset roots in an S3-compatible object store (`s3://bucket/prefix`): S3, MinIO, Ceph, R2...

A `RemotePath` is the object-store counterpart of a `pathlib.Path` below a configured root: the source formats
walk, stat and read it exactly as they do a local directory (see `app.sources.files` for opening files). Reads go
through pyarrow's S3 filesystem, with ranged GETs, so a parquet file is read footer first and then row group by row
group (a large one in ranges of its column chunks: `app.sources.parquet`), and a video by the byte ranges its
decoder asks for: nothing is downloaded whole.

Every question about which objects exist and what they are (size, modification time) is answered from one
recursive listing of the root, renewed in the background once it is `EPISERVE_REMOTE_LIST_TTL` seconds old: requests
never list the bucket, nor wait for a listing. When the store cannot be listed, the last listing keeps being used
(cached segments keep serving) and the store is asked again one TTL later.

Endpoint, region and credentials come from the standard AWS environment and configuration (`AWS_ENDPOINT_URL_S3`
or `AWS_ENDPOINT_URL` for S3-compatible stores, `AWS_REGION`, `AWS_ACCESS_KEY_ID`..., `~/.aws/`), as for any AWS
tool.

A read the store fails (unreachable, refusing, erring) raises `ObjectStoreError` naming the `s3://` object: a 503
to retry, never taken for a changed source file.
"""

from __future__ import annotations

import fnmatch
import logging
import os
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import PurePosixPath
from typing import Any
from urllib.parse import urlsplit

from pyarrow import fs

from app.errors import DatasetError

SCHEME = "s3://"
log = logging.getLogger("episerve.store")


class ObjectStoreError(DatasetError):
    """The object store could not be read (unreachable, slow, refusing): a 503 naming the object, to retry."""

    permanent = False


@dataclass(frozen=True)
class ObjectStat:
    """What a listing says of an object, shaped like the fields of `os.stat_result` the fingerprints use: an
    object has no inode or change time, so those are 0 and its modification time."""

    st_size: int
    st_mtime_ns: int
    etag: str = ""  # the ETag this process last saw the object open with ("" if not opened yet)

    @property
    def st_ctime_ns(self) -> int:
        return self.st_mtime_ns

    @property
    def st_ino(self) -> int:
        return 0


@dataclass(frozen=True)
class StoreOptions:
    """How patient to be with the store: attempts per request (with the AWS SDK's exponential backoff), and
    the connect and per-request timeouts, which together bound the time one read can take."""

    list_ttl_s: float = 30.0
    attempts: int = 3
    timeout_s: float = 10.0


class ObjectStore:
    """One S3 filesystem and the cached listings of the roots configured in it."""

    def __init__(self, filesystem: fs.FileSystem, options: StoreOptions) -> None:
        self.fs = filesystem
        self.options = options
        self._lock = threading.Lock()
        self._listings: dict[str, _Listing] = {}
        self._renewing: set[str] = set()
        self._etags: dict[str, tuple[float, str]] = {}  # key -> (when its HEAD was sent, the ETag it reported)

    @classmethod
    def from_environment(cls, options: StoreOptions) -> ObjectStore:
        """An S3 filesystem configured the standard AWS way: endpoint from `AWS_ENDPOINT_URL_S3` or
        `AWS_ENDPOINT_URL`; region from `AWS_REGION` or `AWS_DEFAULT_REGION`, else the AWS SDK's own chain (the
        profile in `~/.aws/config` or `AWS_CONFIG_FILE`, instance metadata, then us-east-1); credentials from the
        SDK's chain."""
        kwargs: dict[str, Any] = {
            "retry_strategy": fs.AwsStandardS3RetryStrategy(max_attempts=options.attempts),
            "connect_timeout": options.timeout_s,
            "request_timeout": options.timeout_s,
        }
        region = os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION")
        if region:
            kwargs["region"] = region  # the SDK would prefer AWS_DEFAULT_REGION; AWS tools prefer AWS_REGION
        endpoint = os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL")
        if endpoint:
            parts = urlsplit(endpoint if "://" in endpoint else f"https://{endpoint}")
            kwargs.update(endpoint_override=parts.netloc, scheme=parts.scheme or "https")
        return cls(fs.S3FileSystem(**kwargs), options)

    def root(self, uri: str) -> RemotePath:
        """The root `s3://bucket/prefix`, listed now: an unreachable store or refused credentials fail here, at
        startup, with the store's own explanation."""
        key = uri[len(SCHEME) :].strip("/")
        if not key or key.startswith("/"):
            raise DatasetError(f"dataset root {uri!r} names no bucket (expected s3://bucket/prefix)")
        root = RemotePath(self, key, key)
        self.listing(key, strict=True)
        bucket = key.split("/", 1)[0]
        try:
            found = self.fs.get_file_info(bucket).type != fs.FileType.NotFound
        except OSError as exc:
            raise ObjectStoreError(f"cannot look up bucket {bucket!r}: {_reason(exc)}") from exc
        if not found:
            raise ObjectStoreError(f"bucket {bucket!r} does not exist")
        return root

    def listing(self, root: str, strict: bool = False) -> _Listing:
        """The objects below `root`. A listing older than the TTL is renewed in the background while this one is
        still answered (stale while revalidating), so no request, on the event loop or off it, ever waits for the
        store to list; only the first listing of a root (`strict`, at startup) is taken in the caller's thread,
        and raises when the store cannot be listed."""
        with self._lock:
            listing = self._listings.get(root)
            if listing is not None and not strict:
                if time.monotonic() - listing.taken_at >= self.options.list_ttl_s and root not in self._renewing:
                    self._renewing.add(root)
                    threading.Thread(target=self._renew, args=(root,), name="episerve-list", daemon=True).start()
                return listing
        try:
            fresh = _Listing.of(self.fs, root, time.monotonic())
        except OSError as exc:
            raise ObjectStoreError(f"cannot list {SCHEME}{root}: {_reason(exc)}") from exc
        with self._lock:
            self._listings[root] = fresh
        return fresh

    def _renew(self, root: str) -> None:
        """Take a new listing of `root`; when the store cannot be listed, or answers something that is not a
        listing, keep the last one (what is cached keeps serving) and try again one TTL later."""
        try:
            fresh = _Listing.of(self.fs, root, time.monotonic())
        except Exception as exc:  # whatever went wrong, the root must not stay marked as being renewed
            odd = not isinstance(exc, OSError)  # e.g. a listing that is not UTF-8: worth a traceback
            log.warning("cannot list %s%s (serving what is cached): %s", SCHEME, root, _reason(exc), exc_info=odd)
            with self._lock:
                self._listings[root].taken_at = time.monotonic()
                self._renewing.discard(root)
            return
        with self._lock:
            self._listings[root] = fresh
            self._renewing.discard(root)

    def renew_now(self, root: str) -> None:
        """Take a new listing of `root` in this thread (an object was found replaced: its size and time are due),
        unless one is being taken; when the store cannot be listed, the last listing stays."""
        with self._lock:
            if root in self._renewing or root not in self._listings:
                return
            self._renewing.add(root)
        self._renew(root)

    def open_input_file(self, key: str) -> Any:
        """A seekable, random-access pyarrow file over the object (ranged GETs; the HEAD is done here). The ETag
        the HEAD reports becomes the object's `known_etag`."""
        sent = time.monotonic()
        try:
            handle = self.fs.open_input_file(key)
        except OSError as exc:
            raise read_failure(SCHEME + key, exc) from exc
        self._saw(key, etag_of(handle), sent)
        return handle

    def current_etag(self, key: str) -> str:
        """The object's ETag now (one HEAD, no GET)."""
        handle = self.open_input_file(key)
        handle.close()
        return self.known_etag(key)

    def known_etag(self, key: str) -> str:
        """The ETag of the object as of the latest HEAD this process sent for it ("" before the first)."""
        with self._lock:
            seen = self._etags.get(key)
        return seen[1] if seen is not None else ""

    def _saw(self, key: str, etag: str, sent: float) -> None:
        if not etag:
            return
        with self._lock:
            seen = self._etags.get(key)
            if seen is None or seen[0] <= sent:  # an answer to an older HEAD never overrides a newer one
                self._etags[key] = (sent, etag)


class _Listing:
    """Every object below a root: key -> (size, modification time), and the directories the keys imply."""

    def __init__(self, objects: dict[str, ObjectStat], taken_at: float) -> None:
        self.objects = objects
        self.taken_at = taken_at
        self.directories: set[str] = set()
        for key in objects:
            parent = key.rpartition("/")[0]
            while parent and parent not in self.directories:
                self.directories.add(parent)
                parent = parent.rpartition("/")[0]
        self.signature = hash(tuple(sorted((k, s.st_size, s.st_mtime_ns) for k, s in objects.items())))

    @classmethod
    def of(cls, filesystem: fs.FileSystem, root: str, now: float) -> _Listing:
        infos = filesystem.get_file_info(fs.FileSelector(root, recursive=True, allow_not_found=True))
        objects = {
            info.path: ObjectStat(int(info.size), int(info.mtime_ns or 0))
            for info in infos
            if info.type == fs.FileType.File
        }
        return cls(objects, now)

    def below(self, key: str) -> Iterator[str]:
        prefix = key + "/"
        return (k for k in self.objects if k.startswith(prefix))


class RemotePath:
    """An object or a "directory" (a key prefix) below a root in an object store, with the part of the
    `pathlib.Path` interface the source formats use."""

    def __init__(self, store: ObjectStore, root: str, key: str) -> None:
        self.store = store
        self.root = root  # the configured root's key, whose listing answers every question
        self.key = key.strip("/")

    def __str__(self) -> str:
        return SCHEME + self.key

    def __repr__(self) -> str:
        return f"RemotePath({str(self)!r})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, RemotePath) and other.store is self.store and other.key == self.key

    def __hash__(self) -> int:
        return hash(self.key)

    def __lt__(self, other: RemotePath) -> bool:
        return self.key < other.key

    def __truediv__(self, rel: str | PurePosixPath) -> RemotePath:
        return RemotePath(self.store, self.root, f"{self.key}/{PurePosixPath(rel).as_posix()}")

    @property
    def name(self) -> str:
        return PurePosixPath(self.key).name

    @property
    def suffix(self) -> str:
        return PurePosixPath(self.key).suffix

    def resolve(self) -> RemotePath:
        return self  # keys have no symlinks

    def is_relative_to(self, other: RemotePath) -> bool:
        return self.key == other.key or self.key.startswith(other.key + "/")

    def relative_to(self, other: RemotePath) -> PurePosixPath:
        return PurePosixPath(self.key).relative_to(other.key)

    def _listing(self) -> _Listing:
        return self.store.listing(self.root)

    def is_file(self) -> bool:
        return self.key in self._listing().objects

    def is_dir(self) -> bool:
        return self.key == self.root or self.key in self._listing().directories

    def exists(self) -> bool:
        return self.is_file() or self.is_dir()

    def iterdir(self) -> Iterator[RemotePath]:
        """The objects and directories directly below this one."""
        listing = self._listing()
        names = {k[len(self.key) + 1 :].split("/", 1)[0] for k in listing.below(self.key)}
        return (self / name for name in sorted(names))

    def rglob(self, pattern: str) -> Iterator[RemotePath]:
        """Objects at any depth below this one whose name matches `pattern`."""
        listing = self._listing()
        return (RemotePath(self.store, self.root, k) for k in sorted(listing.below(self.key)) if _matches(k, pattern))

    def glob(self, pattern: str) -> Iterator[RemotePath]:
        """Objects below this one whose relative key matches `pattern` part by part (`*/*.parquet`)."""
        parts = pattern.split("/")
        found = []
        for key in self._listing().below(self.key):
            rel = key[len(self.key) + 1 :].split("/")
            if len(rel) == len(parts) and all(fnmatch.fnmatchcase(r, p) for r, p in zip(rel, parts, strict=True)):
                found.append(RemotePath(self.store, self.root, key))
        return iter(sorted(found, key=str))

    def stat(self) -> ObjectStat:
        """Size and modification time, from the listing (FileNotFoundError if the listing has no such object), and
        the ETag the latest HEAD of the object reported: a re-upload a read found is a change at once, however old
        the listing."""
        found = self._listing().objects.get(self.key)
        if found is None:
            raise FileNotFoundError(f"no object {self}")
        etag = self.store.known_etag(self.key)
        return ObjectStat(found.st_size, found.st_mtime_ns, etag) if etag else found

    def current_etag(self) -> str:
        """The object's ETag now, asked of the store (a HEAD)."""
        return self.store.current_etag(self.key)

    def listing_signature(self) -> int:
        """Changes whenever an object below the root is added, removed, resized or rewritten."""
        return self._listing().signature

    def read_bytes(self) -> bytes:
        with self.store.open_input_file(self.key) as handle:
            try:
                return handle.read()
            except OSError as exc:
                raise read_failure(self, exc) from exc

    def read_text(self) -> str:
        return self.read_bytes().decode()

    def open_input_file(self) -> Any:
        """A seekable pyarrow file over the object, read by ranged GETs."""
        return self.store.open_input_file(self.key)


def _matches(key: str, pattern: str) -> bool:
    return fnmatch.fnmatchcase(key.rpartition("/")[2], pattern)


def read_failure(what: object, exc: BaseException) -> ObjectStoreError:
    """The error of a read of object `what` (an `s3://` location) that the store failed."""
    return ObjectStoreError(f"cannot read {what}: {_reason(exc)}")


def _reason(exc: BaseException) -> str:
    """The store's explanation, without pyarrow's request ids."""
    text = str(exc) or type(exc).__name__
    return text.split(" (Request ID:")[0]


def etag_of(handle: Any) -> str:
    """The ETag the store reported when the object was opened ("" if it reported none)."""
    try:
        value = handle.metadata().get("ETag", b"")
    except (OSError, AttributeError):
        return ""
    return value.decode(errors="replace").strip('"') if isinstance(value, bytes) else str(value).strip('"')
