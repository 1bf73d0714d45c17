"""A small server that speaks the Hugging Face Hub's HTTP API for the calls `huggingface_hub` makes to download a
dataset repository, over datasets the test suite writes: `HF_ENDPOINT` points the library at it.

- `GET /api/datasets/{repo}/revision/{revision}`: repo info (`sha`, `siblings`), a branch resolved to its commit;
- `GET /api/datasets/{repo}/tree/{revision}?recursive=true`: the file listing (`type`, `path`, `size`, `oid`);
- `HEAD`/`GET /datasets/{repo}/resolve/{revision}/{path}`: a file, with `X-Repo-Commit`, `ETag` and
  `Content-Length` (what `file_download.get_hf_file_metadata` relies on) and `Range` requests (a resumed download).

Errors carry `X-Error-Code` as the Hub's do (`RepoNotFound`, `RevisionNotFound`, `EntryNotFound`, `GatedRepo`), which
`huggingface_hub.utils.hf_raise_for_status` turns into its typed errors. Faults for tests: a gated repo (403 unless the
request carries its token), a file whose next download is cut midway, and files that fail until told otherwise.
"""

from __future__ import annotations

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


class FakeHub:
    """The server, run in a thread on 127.0.0.1 and a free port; `url` is what `HF_ENDPOINT` takes."""

    def __init__(self) -> None:
        self.repos: dict[str, HubRepo] = {}
        self.fail_next: dict[str, str] = {}  # path -> "drop": its next download is cut midway (once)
        self.refusing: set[str] = set()  # paths whose downloads fail with a 500 until removed
        self.downloads: list[str] = []  # paths served whole, in order
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        app = Starlette(
            routes=[
                Route("/api/datasets/{owner}/{name}/revision/{revision:path}", self._info),
                Route("/api/datasets/{owner}/{name}/tree/{revision:path}", self._tree),
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

    def _resolve(self, request: Request) -> tuple[str, HubRepo, str, dict[str, bytes]] | Response:
        repo_id = f"{request.path_params['owner']}/{request.path_params['name']}"
        repo = self.repos.get(repo_id)
        if repo is None:
            return _error(404, "RepoNotFound", "Repository not found")
        if repo.token is not None and request.headers.get("authorization") != f"Bearer {repo.token}":
            return _error(403, "GatedRepo", "Access to this repository is restricted")
        revision = request.path_params["revision"]
        sha = repo.branches.get(revision, revision)
        if sha not in repo.files:
            return _error(404, "RevisionNotFound", "Invalid rev id")
        return repo_id, repo, sha, repo.files[sha]

    async def _info(self, request: Request) -> Response:
        found = self._resolve(request)
        if isinstance(found, Response):
            return found
        repo_id, repo, sha, files = found
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
                "siblings": [{"rfilename": path} for path in files],
                "lastModified": "2026-11-01T00:00:00.000Z",
            }
        )

    async def _tree(self, request: Request) -> Response:
        found = self._resolve(request)
        if isinstance(found, Response):
            return found
        _, _, _, files = found
        entries = [
            {"type": "file", "oid": hashlib.sha1(content).hexdigest(), "size": len(content), "path": path}
            for path, content in files.items()
        ]
        directories = sorted({p.rsplit("/", 1)[0] for p in files if "/" in p})
        entries += [{"type": "directory", "oid": "0" * 40, "size": 0, "path": d} for d in directories]
        return JSONResponse(entries)

    async def _file(self, request: Request) -> Response:
        found = self._resolve(request)
        if isinstance(found, Response):
            return found
        _, _, sha, files = found
        path = request.path_params["path"]
        if path not in files:
            return _error(404, "EntryNotFound", "Entry not found")
        content = files[path]
        headers = {
            "X-Repo-Commit": sha,
            "ETag": f'"{hashlib.sha1(content).hexdigest()}"',
            "Accept-Ranges": "bytes",
            "Content-Length": str(len(content)),
        }
        if path in self.refusing:
            return JSONResponse({"error": "the Hub is having a bad day"}, status_code=500)
        if request.method == "HEAD":
            return Response(headers=headers)
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
        self.downloads.append(path)
        return Response(body, status_code=206 if start else 200, headers=headers)


async def _cut_midway(body: bytes):  # type: ignore[no-untyped-def]
    yield body[: len(body) // 2]
    raise ConnectionResetError("the Hub dropped the connection")


def _error(status: int, code: str, message: str) -> Response:
    return JSONResponse(
        {"error": message}, status_code=status, headers={"X-Error-Code": code, "X-Error-Message": message}
    )
