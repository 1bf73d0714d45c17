"""Datasets from the Hugging Face Hub, by repo id: `lerobot/pusht` served without a manual download.

A Hub dataset is configured (`EPISERVE_HUB=lerobot/pusht@main,...`) or, where the operator allows it
(`EPISERVE_HUB_ALLOW=lerobot/*`), named by a client on first use. Its revision is resolved to a commit once, at first
use, and pinned in the cache directory (`app.sources.hub_pins`): every process using the cache serves that commit,
restarts included, and a moving branch is resolved again only when the operator asks (`episerve-server hub
refresh`). Its files are downloaded by
`huggingface_hub` into LeRobot's own place for them, `$HF_LEROBOT_HOME/<repo id>` (default
`$HF_HOME/lerobot/<repo id>`), so LeRobot and episerve never download a file twice.

What is fetched when:
- at first use, the metadata (`meta/`: info.json, episodes, tasks, stats), the other small files and, of a LeRobot
  dataset, its first data file (the schema of its rows); of any other dataset, every file but camera videos (its
  episodes are found by reading the episode column of every data file). Until they are there, requests for the
  dataset are answered 503 with the progress. From then on the dataset is that local directory, served like any
  other, its data files being the ones the Hub lists (`HubSnapshot.listed`).
- a LeRobot data file (`data/...`: in v3.0 one file holds several episodes, in v2.1 one episode) and a camera's
  video file (`videos/...`, likewise) when a read first needs rows or frames from it: the read lists every file it
  needs before it reads a row (`HubSnapshot.at_hand`, the dataset's `FileSupply`), those not there yet are
  downloaded in the background, all at once, and the read is answered 503 with `Retry-After` and the progress
  meanwhile. Until a data file is there, the episode index holds it by the row count the metadata gives it
  (`SourceFingerprint.of_absent`), and reads it for real once it is.

Every file is checked before it is served (`app.sources.hub_files`), and a failed download is a problem that the
next request retries. `HF_TOKEN` reads gated and private repos; `HF_HUB_OFFLINE=1` (or a Hub that cannot be reached
at first use) serves what is already there, unchecked: without the Hub there are no hashes to check against.
"""

from __future__ import annotations

import fnmatch
import logging
import threading
import time
from collections.abc import Callable, Collection
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import wait as wait_for
from pathlib import Path
from typing import Any

from app.errors import DatasetError, DoesNotExist, ProblemError, TryLater
from app.sources.files import ALL_THERE, DatasetPath, FileSupply
from app.sources.hub_files import CheckedFiles, FileFetch, HubFile, download, human_bytes
from app.sources.hub_pins import Pin, RevisionPins

log = logging.getLogger("episerve.hub")

FETCHED_ON_READ = ("videos/",)  # files below these are fetched when a read needs them; all others before serving
LEROBOT_FETCHED_ON_READ = ("videos/", "data/")  # likewise in a LeRobot dataset, but for its first data file
DOWNLOADS = 4  # files downloaded at once, per server process
RETRY_AFTER_S = 1
PROGRESS_HEADER = "X-Download-Progress"  # `<bytes done>/<bytes>` of the files a 503 waits for: fewer left, moving
_SHOWN = 20  # files listed by name in a progress report
_REPORT_S = 0.25  # how often a fetch waited for (`warm`) reports its progress

Progress = Callable[[int, int], None]  # called with (bytes done, bytes) of the files waited for


class NotAllowed(ProblemError):
    """The Hub refuses the repo to this server (gated or private without a token that may read it)."""

    status = 403
    title = "Forbidden"


def parse_hub_datasets(entries: list[str]) -> dict[str, str]:
    """`["lerobot/pusht@v2.1", "org/name"]` -> {repo id: revision} (`main` where none is given)."""
    parsed = {}
    for entry in entries:
        repo_id, _, revision = entry.strip().partition("@")
        if repo_id.count("/") != 1 or not all(repo_id.split("/")):
            raise ValueError(f"Hub dataset {entry!r} is not OWNER/NAME[@REVISION]")
        parsed[repo_id] = revision or "main"
    return parsed


class HubDatasets:
    """The Hub datasets a server may serve, and their snapshots (one per repo and process). Below the server's cache
    directory `cache_dir`: `hub/` records the checks of downloaded files, `hub-pins/` the commit each is served at."""

    def __init__(self, configured: dict[str, str], allow: list[str], cache_dir: Path) -> None:
        self.configured = configured
        self.allow = allow
        self.records = cache_dir / "hub"
        self.pins = RevisionPins(cache_dir / "hub-pins")
        self._snapshots: dict[str, HubSnapshot] = {}
        self._lock = threading.Lock()
        self._pool: ThreadPoolExecutor | None = None

    def offers(self, repo_id: str) -> bool:
        """Whether `repo_id` may be served from the Hub: configured, or allowed by a pattern."""
        return repo_id in self.configured or any(fnmatch.fnmatchcase(repo_id, p) for p in self.allow)

    def start_configured(self) -> None:
        """Start fetching every configured dataset (at the server's start)."""
        for repo_id in self.configured:
            self._snapshot(repo_id)

    def ready(self) -> dict[str, Path]:
        """The directories of the Hub datasets ready to serve, by repo id."""
        with self._lock:
            return {repo_id: s.directory for repo_id, s in self._snapshots.items() if s.state == "ready"}

    def path(self, repo_id: str) -> Path:
        """The local directory of `repo_id` once the files fetched before serving are there; a 503 with the progress
        until then; the problem of a failed resolve or download (a later request starts over)."""
        snapshot = self._snapshot(repo_id)
        if snapshot.state == "ready":
            return snapshot.directory
        if snapshot.state == "failed":
            with self._lock:
                if self._snapshots.get(repo_id) is snapshot:
                    del self._snapshots[repo_id]  # the next request tries again
            assert snapshot.error is not None
            raise snapshot.error
        raise snapshot.preparing()

    def supply(self, repo_id: str, path: DatasetPath) -> FileSupply:
        """How the files of the dataset `repo_id` at `path` come to be there: its Hub snapshot when `path` is that
        snapshot's directory, else (a dataset below a root) every file is."""
        with self._lock:
            snapshot = self._snapshots.get(repo_id)
        if snapshot is not None and snapshot.state == "ready" and snapshot.directory == path:
            return snapshot
        return ALL_THERE

    def refresh(self, entry: str) -> tuple[Pin | None, Pin]:
        """Resolve a Hub dataset's revision again and pin the commit it names now (the operator's
        `episerve-server hub refresh`): (the pin before, the pin now). `entry` is `OWNER/NAME[@REVISION]`; without a
        revision, the configured one, else the one pinned, else `main`. Servers using this cache directory serve the
        new commit from their next start."""
        from huggingface_hub import HfApi

        repo_id = next(iter(parse_hub_datasets([entry])))
        revision = entry.partition("@")[2] or self.configured.get(repo_id)
        if not revision:
            pinned = self.pins.read(repo_id)
            revision = pinned.revision if pinned is not None else "main"
        try:
            return self.pins.refresh(repo_id, revision, lambda: HfApi().dataset_info(repo_id, revision=revision).sha)
        except Exception as exc:
            raise hub_problem(exc, repo_id, revision) from exc

    def prepare(self, repo_id: str, progress: Progress | None = None) -> Path:
        """The local directory of `repo_id` once the files fetched before serving are there, waited for (`warm`),
        calling `progress(bytes done, bytes)` meanwhile; the problem of a failed resolve or download."""
        snapshot = self._snapshot(repo_id)
        while snapshot.state in ("resolving", "downloading"):
            if progress is not None:
                progress(*snapshot.progress())
            time.sleep(_REPORT_S)
        if progress is not None:
            progress(*snapshot.progress())
        return self.path(repo_id)

    def known(self) -> list[str]:
        """The Hub datasets this cache directory serves, as far as a process can tell without asking the Hub: the
        configured ones and every one pinned (a dataset a client named on first use is pinned then)."""
        return sorted(set(self.configured) | {pin.repo_id for pin in self.pins.all()})

    @staticmethod
    def directory(repo_id: str) -> Path:
        """The local directory of `repo_id`'s files (LeRobot's own place for them)."""
        return lerobot_home() / repo_id

    def revision(self, repo_id: str) -> str:
        """The revision `repo_id` is served at: the configured one, else `main`."""
        return self.configured.get(repo_id, "main")

    def _snapshot(self, repo_id: str) -> HubSnapshot:
        with self._lock:
            snapshot = self._snapshots.get(repo_id)
            if snapshot is None:
                if self._pool is None:
                    self._pool = ThreadPoolExecutor(DOWNLOADS, thread_name_prefix="episerve-hub")
                snapshot = HubSnapshot(
                    repo_id,
                    self.revision(repo_id),
                    self.directory(repo_id),
                    self.records / repo_id,
                    self.pins,
                    self._pool,
                )
                self._snapshots[repo_id] = snapshot
                snapshot.start()
        return snapshot


class HubSnapshot:
    """One Hub dataset at one commit in its local directory: what the Hub lists, which files are there and checked,
    and the fetches under way. Once ready (the files fetched before serving there), the dataset's `FileSupply`: a
    LeRobot data file or a camera's video file is fetched when a read needs it."""

    fetches = True

    def __init__(
        self,
        repo_id: str,
        revision: str,
        directory: Path,
        records: Path,
        pins: RevisionPins,
        pool: ThreadPoolExecutor,
    ) -> None:
        self.repo_id = repo_id
        self.revision = revision
        self.directory = directory
        self.commit: str | None = None  # the commit `revision` is pinned at
        self.pinned_at: str | None = None
        self.listing: dict[str, HubFile] | None = None  # None: not resolved yet, or the Hub could not be asked
        self.state = "resolving"  # resolving, downloading (the files before serving), ready, failed
        self.error: ProblemError | None = None
        self.checked = CheckedFiles(directory, records)
        self._pins = pins
        self._pool = pool
        self._fetches: dict[str, FileFetch] = {}  # files being fetched, and those whose last fetch failed
        self._before_serving: list[FileFetch] = []
        self._lock = threading.Lock()

    def start(self) -> None:
        """Resolve the revision and fetch the files needed before serving, in the background."""
        thread = threading.Thread(target=self._prepare, name=f"episerve-hub-{self.repo_id}", daemon=True)
        thread.start()

    # -- the supply ------------------------------------------------------------------------------------------------

    def listed(self, folder: str) -> dict[str, int] | None:
        """The files below `folder` at the pinned commit, with their sizes (None where the Hub could not be asked:
        then the files are what is downloaded)."""
        listing = self.listing
        if listing is None:
            return None
        return {path: file.size for path, file in listing.items() if path.startswith(folder)}

    def there(self, rel: str) -> bool:
        """Whether file `rel` is downloaded and checked (where the Hub could not be asked: downloaded)."""
        listing = self.listing
        file = listing.get(rel) if listing is not None else None
        return self.checked.holds(file) if file is not None else (self.directory / rel).is_file()

    def at_hand(self, rels: Collection[str]) -> None:
        """Return once every file of `rels` is there and checked; else fetch those that are not, all at once, and
        raise `TryLater` with the progress (a file whose last fetch failed is fetched again, and its problem told)."""
        listing = self.listing
        if listing is None:  # the Hub could not be asked: what is there is served as it is
            missing = sorted(rel for rel in rels if not (self.directory / rel).is_file())
            if missing:
                raise TryLater(
                    f"{_named(missing)} of the Hub dataset {self.repo_id!r} {_are(missing)} not downloaded, and the "
                    "Hub cannot be asked now (HF_HUB_OFFLINE=1, or unreachable); retry later",
                    headers={"Retry-After": "30"},
                )
            return
        wanted = [listing[rel] for rel in sorted(rels) if rel in listing]  # one the Hub lacks fails as it is opened
        if all(self.checked.holds(file) for file in wanted):
            return
        fetches, failed = self._fetch(wanted, reason="a read needs them")
        if not fetches:
            return
        done, total = sum(f.bytes_done for f in fetches), sum(f.file.size for f in fetches)
        detail = (
            f"dataset {self.repo_id!r}: {len(fetches)} {_files(fetches)} this read needs "
            f"{_are(fetches)} being downloaded from the Hub ({_named([f.file.path for f in fetches])}: "
            f"{human_bytes(done)} of {human_bytes(total)})"
        )
        if failed:
            detail += f"; the last try failed: {failed[0].problem.detail if failed[0].problem else 'unknown'}"
        raise TryLater(f"{detail}; retry shortly", headers=_progress_headers(done, total))

    def fetch_now(self, rels: Collection[str], progress: Progress | None = None) -> tuple[int, int]:
        """Fetch every file of `rels` not there and checked yet, all at once, and wait for them (`warm`), calling
        `progress(bytes done, bytes)` as they come; (files, bytes) fetched. The first failed fetch's problem is raised
        (the next call fetches it again). Where the Hub cannot be asked, a file not downloaded is a `TryLater`."""
        listing = self.listing
        if listing is None:
            self.at_hand(rels)
            return 0, 0
        wanted = [listing[rel] for rel in sorted(rels) if rel in listing]
        fetches, _ = self._fetch(wanted, reason="warming")
        _wait_for(fetches, progress)
        failed = next((fetch for fetch in fetches if fetch.state == "failed"), None)
        if failed is not None and failed.problem is not None:
            raise failed.problem
        return len(fetches), sum(fetch.file.size for fetch in fetches)

    def describe(self) -> dict[str, Any]:
        """The repo, revision and commit; the state; files and bytes listed, there and checked, and being fetched
        (the first few by name); files whose last fetch failed, with the problem."""
        listing = self.listing
        with self._lock:
            fetches = list(self._fetches.values())
        pending = [f for f in fetches if f.state != "failed"]
        described: dict[str, Any] = {"repo_id": self.repo_id, "revision": self.revision, "commit": self.commit}
        described["pinned_at"] = self.pinned_at
        described["state"] = self.state
        if listing is not None:
            there = [file for file in listing.values() if self.checked.holds(file)]
            described |= {"files": len(listing), "bytes": sum(f.size for f in listing.values())}
            described |= {"files_done": len(there), "bytes_done": sum(f.size for f in there)}
        described["fetching"] = {
            "files": len(pending),
            "bytes": sum(f.file.size for f in pending),
            "bytes_done": sum(f.bytes_done for f in pending),
            "first": [f.as_json() for f in pending[:_SHOWN]],
        }
        described["failed"] = [f.as_json() for f in fetches if f.state == "failed"]
        if self.error is not None:
            described["error"] = self.error.detail
        return described

    # -- before serving --------------------------------------------------------------------------------------------

    def progress(self) -> tuple[int, int]:
        """(bytes done, bytes) of the files fetched before serving ((0, 0) while resolving)."""
        return _progress_of(self._before_serving)

    def preparing(self) -> TryLater:
        """The 503 for a request while the revision is resolved and the files needed before serving are fetched."""
        fetches = self._before_serving
        if not fetches:
            return TryLater(
                f"dataset {self.repo_id!r} is being downloaded from the Hub (resolving the revision); retry shortly",
                headers=_progress_headers(0, 0),
            )
        finished = sum(f.state == "done" for f in fetches)
        done, total = _progress_of(fetches)
        later = "data files and camera videos are" if self.lerobot else "camera videos are"
        return TryLater(
            f"dataset {self.repo_id!r} is being downloaded from the Hub: {self._before_serving_named}, {finished} of "
            f"{len(fetches)} files ({human_bytes(done)} of {human_bytes(total)}); {later} fetched as reads need "
            "them; retry shortly",
            headers=_progress_headers(done, total),
        )

    @property
    def lerobot(self) -> bool:
        """Whether the dataset is in a LeRobot format (its data files are then fetched as reads need them)."""
        listing = self.listing
        return listing is not None and "meta/info.json" in listing

    @property
    def _before_serving_named(self) -> str:
        return "its metadata and first data file" if self.lerobot else "its metadata and data files"

    def _prepare(self) -> None:
        started = time.monotonic()
        try:
            self._resolve()
            if self.listing is not None:
                self._remove_unlisted()
                self._fetch_before_serving()
            self.state = "ready"
        except ProblemError as exc:
            self.error, self.state = exc, "failed"
            log.warning("Hub dataset %s: %s", self.repo_id, exc.detail)
            return
        except Exception as exc:  # the library's own errors: a problem to retry, never a crashed thread
            self.error = TryLater(f"the Hub dataset {self.repo_id!r} cannot be downloaded now: {exc}; retry later")
            self.state = "failed"
            log.warning("Hub dataset %s: download failed: %s", self.repo_id, exc)
            return
        log.info(
            "Hub dataset %s@%s is ready to serve (%.1f s); %s fetched as reads need them",
            self.repo_id,
            self.commit,
            time.monotonic() - started,
            "data files and camera videos are" if self.lerobot else "camera videos are",
        )

    def _resolve(self) -> None:
        """The commit the revision names, and the files listed there (with sizes and hashes)."""
        from huggingface_hub import HfApi
        from huggingface_hub.errors import GatedRepoError, RepositoryNotFoundError, RevisionNotFoundError

        api = HfApi()
        resolved: list[Any] = []  # the repo info of a resolve just now: the listing at the commit it pinned

        def resolve() -> str:
            resolved.append(api.dataset_info(self.repo_id, revision=self.revision, files_metadata=True))
            return resolved[0].sha

        try:
            pin = self._pins.pinned(self.repo_id, self.revision, resolve)
            self.commit = pin.commit
            self.pinned_at = pin.pinned_at
            info = resolved[0] if resolved else api.dataset_info(self.repo_id, revision=pin.commit, files_metadata=True)
        except ProblemError:  # another process resolving for too long
            raise
        except (GatedRepoError, RepositoryNotFoundError, RevisionNotFoundError) as exc:
            raise self._problem(exc) from exc
        except Exception as exc:  # offline (HF_HUB_OFFLINE=1) or unreachable: what is there may do
            if (self.directory / "meta/info.json").is_file():
                pin = self._pins.read(self.repo_id)
                if pin is not None and pin.revision == self.revision:
                    self.commit, self.pinned_at = pin.commit, pin.pinned_at
                log.info("Hub dataset %s: the Hub cannot be asked (%s); serving what is downloaded", self.repo_id, exc)
                return
            raise TryLater(
                f"the Hub dataset {self.repo_id!r} cannot be downloaded now (the Hub is unreachable or failing, or "
                "HF_HUB_OFFLINE=1) and its metadata is not downloaded yet; retry later"
            ) from exc
        self.listing = {sibling.rfilename: HubFile.of(sibling) for sibling in info.siblings or []}
        total = sum(file.size for file in self.listing.values())
        log.info(
            "Hub dataset %s@%s is commit %s (%s %s): %d files, %s",
            self.repo_id,
            self.revision,
            self.commit,
            "resolved and pinned" if resolved else "pinned",
            self.pinned_at,
            len(self.listing),
            human_bytes(total),
        )

    def _remove_unlisted(self) -> None:
        """Remove the files of the directory the pinned commit does not list (left there by an earlier commit, after
        `episerve-server hub refresh`): the dataset is the directory, and a file its commit dropped is no part of it.
        `huggingface_hub`'s own records (`.cache/`) stay."""
        assert self.listing is not None
        if not self.directory.is_dir():
            return
        for path in sorted(self.directory.rglob("*")):
            rel = path.relative_to(self.directory).as_posix()
            if rel.split("/", 1)[0] == ".cache" or rel in self.listing or not path.is_file():
                continue
            path.unlink(missing_ok=True)
            log.info("Hub dataset %s: removed %s (not in commit %s)", self.repo_id, rel, self.commit)

    def _fetch_before_serving(self) -> None:
        """Fetch the metadata first, then the other files but those fetched as reads need them (of a LeRobot
        dataset, its first data file too: the schema of its rows), and wait for them all."""
        assert self.listing is not None
        later = LEROBOT_FETCHED_ON_READ if self.lerobot else FETCHED_ON_READ
        files = [file for path, file in self.listing.items() if not path.startswith(later)]
        if self.lerobot:
            data = sorted(path for path in self.listing if path.startswith("data/") and path.endswith(".parquet"))
            files += [self.listing[path] for path in data[:1]]
        files.sort(key=lambda file: (not file.path.startswith("meta/"), file.path))
        self.state = "downloading"
        fetches, _ = self._fetch(files, reason=f"before serving: {self._before_serving_named}")
        self._before_serving = fetches
        wait_for([fetch.future for fetch in fetches if fetch.future is not None])
        failed = next((fetch for fetch in fetches if fetch.state == "failed"), None)
        if failed is not None and failed.problem is not None:
            raise failed.problem

    # -- fetching ----------------------------------------------------------------------------------------------------

    def _fetch(self, files: list[HubFile], reason: str) -> tuple[list[FileFetch], list[FileFetch]]:
        """Start fetching each of `files` that is not there and checked, unless its fetch is under way; the fetches
        the caller waits for, and those among them whose last try failed (started again)."""
        started: list[FileFetch] = []
        waited: list[FileFetch] = []
        failed: list[FileFetch] = []
        with self._lock:
            for file in files:
                fetch = self._fetches.get(file.path)
                if fetch is None and self.checked.holds(file):
                    continue
                if fetch is None or fetch.state == "failed":
                    if fetch is not None:
                        failed.append(fetch)
                    fetch = self._fetches[file.path] = FileFetch(file)
                    started.append(fetch)
                waited.append(fetch)
            for fetch in started:
                fetch.future = self._pool.submit(self._run, fetch)
        if started:
            total = sum(fetch.file.size for fetch in started)
            shown = _named([fetch.file.path for fetch in started])
            log.info("Hub dataset %s: fetching %s (%s), %s", self.repo_id, shown, human_bytes(total), reason)
        return waited, failed

    def _run(self, fetch: FileFetch) -> None:
        """Download one file and check it; once checked it is no longer a fetch (the directory holds it)."""
        assert self.commit is not None
        started = time.monotonic()
        try:
            fetch.state = "downloading"
            download(self.repo_id, self.commit, self.directory, fetch)
            fetch.state, fetch.bytes_done = "checking", fetch.file.size
            self.checked.check(fetch.file)
        except Exception as exc:
            fetch.problem = self._problem(exc)
            fetch.state = "failed"
            log.warning("Hub dataset %s: fetching %s failed: %s", self.repo_id, fetch.file.path, fetch.problem.detail)
            return
        fetch.state = "done"
        with self._lock:
            if self._fetches.get(fetch.file.path) is fetch:
                del self._fetches[fetch.file.path]
        log.info(
            "Hub dataset %s: fetched %s (%s in %.1f s)",
            self.repo_id,
            fetch.file.path,
            human_bytes(fetch.file.size),
            time.monotonic() - started,
        )

    def _problem(self, exc: BaseException) -> ProblemError:
        return hub_problem(exc, self.repo_id, self.revision, self.commit)


def hub_problem(exc: BaseException, repo_id: str, revision: str, commit: str | None = None) -> ProblemError:
    """What a failure of `huggingface_hub` (or of a check) on `repo_id` at `revision` (pinned at `commit`, if
    known) tells a client."""
    from huggingface_hub.errors import (
        EntryNotFoundError,
        GatedRepoError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    if isinstance(exc, ProblemError):
        return exc
    if isinstance(exc, GatedRepoError):
        return NotAllowed(
            f"the Hub dataset {repo_id!r} is gated or private: accept its terms on the Hub and give the server a "
            "token that may read it (HF_TOKEN)"
        )
    if isinstance(exc, RevisionNotFoundError) and commit is not None:
        return DoesNotExist(
            f"the Hub dataset {repo_id!r} no longer has the commit {commit} its revision {revision!r} is pinned at; "
            f"pin the commit the revision names now with `episerve-server hub refresh {repo_id}`"
        )
    if isinstance(exc, RevisionNotFoundError):
        return DoesNotExist(f"the Hub dataset {repo_id!r} has no revision {revision!r}")
    if isinstance(exc, RepositoryNotFoundError):
        return DoesNotExist(
            f"no Hub dataset {repo_id!r} (or it is private: give the server a token that may read it, HF_TOKEN)"
        )
    if isinstance(exc, EntryNotFoundError):
        return DatasetError(f"the Hub dataset {repo_id!r} at commit {commit} lacks a file it lists: {exc}")
    return TryLater(f"the Hub dataset {repo_id!r} cannot be downloaded now: {_reason(exc)}; retry later")


def _progress_of(fetches: list[FileFetch]) -> tuple[int, int]:
    """(bytes done, bytes) of `fetches`."""
    done = sum(f.file.size if f.state == "done" else f.bytes_done for f in fetches)
    return done, sum(f.file.size for f in fetches)


def _wait_for(fetches: list[FileFetch], progress: Progress | None) -> None:
    """Wait until every fetch of `fetches` is done or failed, reporting their progress every `_REPORT_S`."""
    futures = [fetch.future for fetch in fetches if fetch.future is not None]
    while True:
        _, pending = wait_for(futures, timeout=_REPORT_S)
        if progress is not None:
            progress(*_progress_of(fetches))
        if not pending:
            return


def _progress_headers(done: int, total: int) -> dict[str, str]:
    """`Retry-After`, and the bytes of the files a 503 waits for (a client waits as long as they grow)."""
    return {"Retry-After": str(RETRY_AFTER_S), PROGRESS_HEADER: f"{done}/{total}"}


def _named(paths: list[str]) -> str:
    shown = ", ".join(paths[:3])
    return shown if len(paths) <= 3 else f"{shown} and {len(paths) - 3} more"


def _files(items: Collection[Any]) -> str:
    return "file" if len(items) == 1 else "files"


def _are(items: Collection[Any]) -> str:
    return "is" if len(items) == 1 else "are"


def _reason(exc: BaseException) -> str:
    """The first line of an error's message (the library's messages go on with advice for its own users)."""
    text = str(exc).strip() or type(exc).__name__
    return text.splitlines()[0]


def lerobot_home() -> Path:
    """Where LeRobot keeps datasets it downloads: `HF_LEROBOT_HOME`, else `$HF_HOME/lerobot`."""
    import os

    from huggingface_hub.constants import HF_HOME

    return Path(os.environ.get("HF_LEROBOT_HOME") or Path(HF_HOME) / "lerobot").expanduser()
