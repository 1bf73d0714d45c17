"""A small server that speaks the Hugging Face Hub's HTTP API for the calls `huggingface_hub` makes to download a
dataset repository, over datasets the test suite writes: `HF_ENDPOINT` points the library at it.

- `GET /api/datasets/{repo}/revision/{revision}`: repo info (`sha`, `siblings`; with `blobs=true` each file's `size`,
  `blobId` and, for LFS files, `lfs` with its `sha256`), a branch resolved to its commit;
- `GET /api/datasets/{repo}/tree/{revision}?recursive=true`: the file listing (`type`, `path`, `size`, `oid`, `lfs`);
- `GET /api/datasets/{repo}/refs`: the branches and tags (`name`, `ref`, `targetCommit`), as `HfApi.list_repo_refs`
  reads them (LeRobot's `LeRobotDataset` looks for a tag naming its codebase version, `v3.0`, and downloads that);
- `HEAD`/`GET /datasets/{repo}/resolve/{revision}/{path}`: a file, with `X-Repo-Commit`, `ETag` (the git blob id) or,
  for an LFS file, `X-Linked-Etag` (its SHA-256) and `X-Linked-Size`, and `Content-Length` (what
  `file_download.get_hf_file_metadata` relies on), and `Range` requests (a resumed download).

As on the Hub, parquet and mp4 files are LFS files. Errors carry `X-Error-Code` as the Hub's do (`RepoNotFound`,
`RevisionNotFound`, `EntryNotFound`, `GatedRepo`), which `huggingface_hub.utils.hf_raise_for_status` turns into its
typed errors. Faults for tests: a gated repo (403 unless the request carries its token), a file whose next download is
cut midway or corrupted (same size, one byte changed), files whose downloads fail with a 500 until told otherwise, and
repos whose downloads are slow, and a branch that moves to a new commit right after it is first resolved.
`fetched` logs every GET of a file, as (repo id, path); `resolves` every repo info request, as (repo id, revision);
`served` counts the bytes of file bodies sent, by repo id.
"""

from __future__ import annotations

import asyncio
import hashlib
import threading
from dataclasses import dataclass, field
from pathlib import Path

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from tests.support import free_port


@dataclass
class HubRepo:
    """A dataset repository: its files at each commit, and branches naming commits."""

    files: dict[str, dict[str, bytes]] = field(default_factory=dict)  # commit -> path -> content
    branches: dict[str, str] = field(default_factory=dict)
    tags: dict[str, str] = field(default_factory=dict)
    token: str | None = None  # gated: only requests with this token may read it

    def commit(self, directory: Path, branch: str = "main") -> str:
        """Every file below `directory` as a new commit on `branch`; its hash."""
        files = {
            p.relative_to(directory).as_posix(): p.read_bytes() for p in sorted(directory.rglob("*")) if p.is_file()
        }
        digest = hashlib.sha1(repr(sorted((k, hashlib.sha1(v).hexdigest()) for k, v in files.items())).encode())
        sha = digest.hexdigest()
        self.files[sha] = files
        self.branches[branch] = sha
        return sha

    def tag(self, name: str, branch: str = "main") -> None:
        """Tag the commit `branch` names now as `name` (LeRobot tags a dataset with its codebase version)."""
        self.tags[name] = self.branches[branch]


class FakeHub:
    """The server, run in a thread on 127.0.0.1 and a free port; `url` is what `HF_ENDPOINT` takes."""

    def __init__(self) -> None:
        self.repos: dict[str, HubRepo] = {}
        self.fail_next: dict[str, str] = {}  # path -> "drop" (cut midway) or "corrupt": its next download (once)
        self.refusing: set[str] = set()  # paths whose downloads (GET) fail with a 500 until removed
        self.delays: dict[str, float] = {}  # repo id -> seconds every GET of one of its files waits first
        self.fetched: list[tuple[str, str]] = []  # (repo id, path) of every GET of a file, in order
        self.resolves: list[tuple[str, str]] = []  # (repo id, revision asked) of every repo info request, in order
        self.served: dict[str, int] = {}  # repo id -> bytes of whole file bodies sent (ranged GETs included)
        self.move_after_resolve: dict[str, Path] = {}  # repo id -> a new commit of its branch, once one is resolved
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        app = Starlette(
            routes=[
                Route("/api/datasets/{owner}/{name}/revision/{revision:path}", self._info),
                Route("/api/datasets/{owner}/{name}/tree/{revision:path}", self._tree),
                Route("/api/datasets/{owner}/{name}/refs", self._refs),
                Route("/datasets/{owner}/{name}/resolve/{revision}/{path:path}", self._file, methods=["GET", "HEAD"]),
            ]
        )
        self._server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=self.port, log_level="warning"))
        self._thread = threading.Thread(target=self._server.run, daemon=True)

    def __enter__(self) -> FakeHub:
        self._thread.start()
        while not self._server.started:
            threading.Event().wait(0.02)
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.should_exit = True
        self._thread.join(10)

    # -- the API ---------------------------------------------------------------------------------------------------

    def _repo(self, request: Request) -> tuple[str, HubRepo] | Response:
        repo_id = f"{request.path_params['owner']}/{request.path_params['name']}"
        repo = self.repos.get(repo_id)
        if repo is None:
            return _error(404, "RepoNotFound", "Repository not found")
        if repo.token is not None and request.headers.get("authorization") != f"Bearer {repo.token}":
            return _error(403, "GatedRepo", "Access to this repository is restricted")
        return repo_id, repo

    def _resolve(self, request: Request) -> tuple[str, HubRepo, str, dict[str, bytes]] | Response:
        found = self._repo(request)
        if isinstance(found, Response):
            return found
        repo_id, repo = found
        revision = request.path_params["revision"]
        sha = repo.branches.get(revision) or repo.tags.get(revision) or revision
        if sha not in repo.files:
            return _error(404, "RevisionNotFound", "Invalid rev id")
        return repo_id, repo, sha, repo.files[sha]

    async def _info(self, request: Request) -> Response:
        found = self._resolve(request)
        if isinstance(found, Response):
            return found
        repo_id, repo, sha, files = found
        revision = request.path_params["revision"]
        self.resolves.append((repo_id, revision))
        if revision in repo.branches and repo_id in self.move_after_resolve:  # the branch moves right after
            repo.commit(self.move_after_resolve.pop(repo_id), branch=revision)
        blobs = request.query_params.get("blobs", "").lower() == "true"
        siblings = [_sibling(path, content) if blobs else {"rfilename": path} for path, content in files.items()]
        return JSONResponse(
            {
                "_id": sha[:24],
                "id": repo_id,
                "author": repo_id.split("/")[0],
                "sha": sha,
                "private": False,
                "gated": repo.token is not None and "auto",
                "disabled": False,
                "downloads": 0,
                "likes": 0,
                "tags": [],
                "siblings": siblings,
                "lastModified": "2026-11-01T00:00:00.000Z",
            }
        )

    async def _tree(self, request: Request) -> Response:
        found = self._resolve(request)
        if isinstance(found, Response):
            return found
        _, _, _, files = found
        entries = []
        for path, content in files.items():
            entry = {"type": "file", "oid": _blob_id(_stored(path, content)), "size": len(content), "path": path}
            if _is_lfs(path):
                entry["lfs"] = {"oid": _sha256(content), "size": len(content), "pointerSize": len(_pointer(content))}
            entries.append(entry)
        directories = sorted({p.rsplit("/", 1)[0] for p in files if "/" in p})
        entries += [{"type": "directory", "oid": "0" * 40, "size": 0, "path": d} for d in directories]
        return JSONResponse(entries)

    async def _refs(self, request: Request) -> Response:
        found = self._repo(request)
        if isinstance(found, Response):
            return found
        _, repo = found
        refs: dict[str, list[dict[str, str]]] = {
            "branches": [_ref("heads", name, sha) for name, sha in repo.branches.items()],
            "converts": [],
            "tags": [_ref("tags", name, sha) for name, sha in repo.tags.items()],
        }
        if request.query_params.get("include_prs"):
            refs["pullRequests"] = []
        return JSONResponse(refs)

    async def _file(self, request: Request) -> Response:
        found = self._resolve(request)
        if isinstance(found, Response):
            return found
        repo_id, _, sha, files = found
        path = request.path_params["path"]
        if path not in files:
            return _error(404, "EntryNotFound", "Entry not found")
        content = files[path]
        headers = {"X-Repo-Commit": sha, "Accept-Ranges": "bytes", "Content-Length": str(len(content))}
        headers["ETag"] = f'"{_blob_id(_stored(path, content))}"'
        if _is_lfs(path):
            headers |= {"X-Linked-Etag": f'"{_sha256(content)}"', "X-Linked-Size": str(len(content))}
        if request.method == "HEAD":
            return Response(headers=headers)
        self.fetched.append((repo_id, path))
        if repo_id in self.delays:
            await asyncio.sleep(self.delays[repo_id])
        if path in self.refusing:
            return JSONResponse({"error": "the Hub is having a bad day"}, status_code=500)
        start = 0
        ranged = request.headers.get("range", "")
        if ranged.startswith("bytes="):
            start = int(ranged[6:].split("-")[0] or 0)
            headers["Content-Range"] = f"bytes {start}-{len(content) - 1}/{len(content)}"
            headers["Content-Length"] = str(len(content) - start)
        body = content[start:]
        fault = self.fail_next.pop(path, None)
        if fault == "drop":
            return StreamingResponse(_cut_midway(body), status_code=206 if start else 200, headers=headers)
        if fault == "corrupt":
            body = body[:-1] + bytes([body[-1] ^ 0xFF])
        self.served[repo_id] = self.served.get(repo_id, 0) + len(body)
        return Response(body, status_code=206 if start else 200, headers=headers)


def _ref(kind: str, name: str, sha: str) -> dict[str, str]:
    """A branch (`kind` "heads") or tag ("tags") as `GET /api/datasets/{repo}/refs` lists it."""
    return {"name": name, "ref": f"refs/{kind}/{name}", "targetCommit": sha}


def _is_lfs(path: str) -> bool:
    return path.endswith((".parquet", ".mp4"))


def _sha256(content: bytes) -> str:
    return hashlib.sha256(content).hexdigest()


def _pointer(content: bytes) -> bytes:
    """The git LFS pointer file that git stores in place of an LFS file."""
    return f"version https://git-lfs.github.com/spec/v1\noid sha256:{_sha256(content)}\nsize {len(content)}\n".encode()


def _stored(path: str, content: bytes) -> bytes:
    """What git stores for the file: its content, or its LFS pointer."""
    return _pointer(content) if _is_lfs(path) else content


def _blob_id(stored: bytes) -> str:
    """git's blob id: SHA-1 of `blob <size>\\0` and the content."""
    return hashlib.sha1(b"blob %d\0" % len(stored) + stored).hexdigest()


def _sibling(path: str, content: bytes) -> dict[str, object]:
    """A file as `GET /api/datasets/{repo}/revision/{revision}?blobs=true` lists it."""
    sibling: dict[str, object] = {"rfilename": path, "size": len(content), "blobId": _blob_id(_stored(path, content))}
    if _is_lfs(path):
        sibling["lfs"] = {"sha256": _sha256(content), "size": len(content), "pointerSize": len(_pointer(content))}
    return sibling


async def _cut_midway(body: bytes):  # type: ignore[no-untyped-def]
    yield body[: len(body) // 2]
    raise ConnectionResetError("the Hub dropped the connection")


def _error(status: int, code: str, message: str) -> Response:
    return JSONResponse(
        {"error": message}, status_code=status, headers={"X-Error-Code": code, "X-Error-Message": message}
    )
