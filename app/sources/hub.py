"""Datasets from the Hugging Face Hub, by repo id: `lerobot/pusht` served without a manual download.

A Hub dataset is configured (`EPISERVE_HUB=lerobot/pusht@main,...`) or, where the operator allows it
(`EPISERVE_HUB_ALLOW=lerobot/*`), named by a client on first use. Its revision is resolved to a commit once, at first
use (a moving branch is re-resolved only at the server's next start), and its files are downloaded by
`huggingface_hub` into LeRobot's own place for them, `$HF_LEROBOT_HOME/<repo id>` (default
`$HF_HOME/lerobot/<repo id>`), so LeRobot and episerve never download a dataset twice. The download runs in the
background: until every file is there, a request is answered 503 with the progress. `huggingface_hub` writes each
file under a temporary name, checks it and only then moves it into place, so nothing half-downloaded is ever served;
a failed download is retried by the next request. `HF_TOKEN` reads gated and private repos; `HF_HUB_OFFLINE=1`
serves what is already there.

Once downloaded, the dataset is a local directory and is served like any other root.
"""

from __future__ import annotations

import fnmatch
import logging
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from app.errors import DoesNotExist, ProblemError, TryLater

log = logging.getLogger("episerve.hub")


class NotAllowed(ProblemError):
    """The Hub refuses the repo to this server (gated or private without a token that may read it)."""

    status = 403
    title = "Forbidden"


@dataclass
class _Download:
    """One repo's resolve and download: its state, progress, and the snapshot once it is complete."""

    repo_id: str
    revision: str
    commit: str | None = None
    files: int = 0
    done: int = 0
    path: Path | None = None
    error: ProblemError | None = None

    def describe(self) -> dict[str, Any]:
        state = "ready" if self.path is not None else "failed" if self.error is not None else "downloading"
        described: dict[str, Any] = {"repo_id": self.repo_id, "revision": self.revision, "commit": self.commit}
        described |= {"state": state, "files": self.files, "files_done": self.done}
        if self.error is not None:
            described["error"] = self.error.detail
        return described


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
    """The Hub datasets a server may serve, and their downloads (one per repo and process)."""

    def __init__(self, configured: dict[str, str], allow: list[str]) -> None:
        self.configured = configured
        self.allow = allow
        self._downloads: dict[str, _Download] = {}
        self._lock = threading.Lock()

    def offers(self, repo_id: str) -> bool:
        """Whether `repo_id` may be served from the Hub: configured, or allowed by a pattern."""
        return repo_id in self.configured or any(fnmatch.fnmatchcase(repo_id, p) for p in self.allow)

    def start_configured(self) -> None:
        """Start downloading every configured dataset (at the server's start)."""
        for repo_id in self.configured:
            self._download(repo_id)

    def ready(self) -> dict[str, Path]:
        """The Hub datasets downloaded whole, by repo id."""
        with self._lock:
            return {repo_id: d.path for repo_id, d in self._downloads.items() if d.path is not None}

    def path(self, repo_id: str) -> Path:
        """The local snapshot of `repo_id`; a 503 with the progress while it downloads; the problem of a failed
        download (a later request starts it again)."""
        download = self._download(repo_id)
        if download.path is not None:
            return download.path
        if download.error is not None:
            with self._lock:
                if self._downloads.get(repo_id) is download:
                    del self._downloads[repo_id]  # the next request tries again
            raise download.error
        progress = f"{download.done} of {download.files} files" if download.files else "resolving the revision"
        raise TryLater(
            f"dataset {repo_id!r} is being downloaded from the Hub ({progress}); retry shortly",
            headers={"Retry-After": "2"},
        )

    def describe(self, repo_id: str) -> dict[str, Any] | None:
        """Where the download of `repo_id` stands (None: not a Hub dataset of this process)."""
        with self._lock:
            download = self._downloads.get(repo_id)
        return None if download is None else download.describe()

    def _download(self, repo_id: str) -> _Download:
        with self._lock:
            download = self._downloads.get(repo_id)
            if download is None:
                download = _Download(repo_id, self.configured.get(repo_id, "main"))
                self._downloads[repo_id] = download
                thread = threading.Thread(target=self._run, args=(download,), name=f"episerve-hub-{repo_id}")
                thread.daemon = True
                thread.start()
        return download

    def _run(self, download: _Download) -> None:
        try:
            path = _fetch(download)
            download.done = download.files
            download.path = path
            log.info("Hub dataset %s@%s is downloaded (%d files)", download.repo_id, download.commit, download.files)
        except ProblemError as exc:
            download.error = exc
            log.warning("Hub dataset %s: %s", download.repo_id, exc.detail)
        except Exception as exc:  # the library's own errors: a problem to retry, never a crashed thread
            download.error = TryLater(f"downloading {download.repo_id!r} from the Hub failed: {exc}; retry later")
            log.warning("Hub dataset %s: download failed: %s", download.repo_id, exc)


def _fetch(download: _Download) -> Path:
    """Resolve the revision to a commit and download every file of it into the Hub cache."""
    from huggingface_hub import HfApi, snapshot_download
    from huggingface_hub.errors import (
        GatedRepoError,
        LocalEntryNotFoundError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    repo_id, revision = download.repo_id, download.revision
    try:
        try:
            info = HfApi().dataset_info(repo_id, revision=revision)
            download.commit = info.sha
            download.files = len(info.siblings or [])
        except (GatedRepoError, RepositoryNotFoundError, RevisionNotFoundError):
            raise
        except Exception as exc:  # offline (HF_HUB_OFFLINE=1) or unreachable: what the cache holds may do
            log.info("Hub dataset %s: the Hub cannot be asked (%s); looking in the cache", repo_id, exc)
            local = lerobot_home() / repo_id
            path = Path(
                snapshot_download(
                    repo_id, repo_type="dataset", revision=revision, local_dir=local, local_files_only=True
                )
            )
            download.files = download.done = sum(1 for p in path.rglob("*") if p.is_file() and ".cache" not in p.parts)
            return path
        log.info("Hub dataset %s@%s is commit %s: downloading %d files", repo_id, revision, info.sha, download.files)
        tqdm_class = _progress_of(download)
        local = lerobot_home() / repo_id
        return Path(
            snapshot_download(repo_id, repo_type="dataset", revision=info.sha, local_dir=local, tqdm_class=tqdm_class)
        )
    except GatedRepoError as exc:
        raise NotAllowed(
            f"the Hub dataset {repo_id!r} is gated or private: accept its terms on the Hub and give the server a "
            "token that may read it (HF_TOKEN)"
        ) from exc
    except RevisionNotFoundError as exc:
        raise DoesNotExist(f"the Hub dataset {repo_id!r} has no revision {revision!r}") from exc
    except RepositoryNotFoundError as exc:
        raise DoesNotExist(
            f"no Hub dataset {repo_id!r} (or it is private: give the server a token that may read it, HF_TOKEN)"
        ) from exc
    except LocalEntryNotFoundError as exc:
        raise TryLater(
            f"the Hub dataset {repo_id!r} cannot be downloaded now (the Hub is unreachable or failing, or "
            "HF_HUB_OFFLINE=1) and is not downloaded whole yet; retry later"
        ) from exc


def lerobot_home() -> Path:
    """Where LeRobot keeps datasets it downloads: `HF_LEROBOT_HOME`, else `$HF_HOME/lerobot`."""
    import os

    from huggingface_hub.constants import HF_HOME

    return Path(os.environ.get("HF_LEROBOT_HOME") or Path(HF_HOME) / "lerobot").expanduser()


def _progress_of(download: _Download) -> Any:
    """A tqdm class counting the snapshot's files done into `download` (huggingface_hub's progress hook)."""
    from tqdm.auto import tqdm

    class Progress(tqdm):  # type: ignore[misc]
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            kwargs["disable"] = True
            super().__init__(*args, **kwargs)

        def update(self, n: float | None = 1) -> bool | None:
            download.done += int(n or 0)
            return super().update(n)

    return Progress
