"""The episode viewer: `GET /ui/` serves its page and `/ui/<file>` its scripts, styles and libraries, all from the
`app/ui` directory of this package. The page is public; the data it shows comes through the token-protected API,
with the token the page asks for. Every URL is relative, so the viewer works under a path prefix behind a proxy."""

from __future__ import annotations

from pathlib import Path

from fastapi import APIRouter, FastAPI
from fastapi.responses import FileResponse, RedirectResponse
from fastapi.staticfiles import StaticFiles

UI_DIRECTORY = Path(__file__).resolve().parent.parent / "ui"
# The third-party libraries (uPlot, apache-arrow) with their licences and manifest.json: kept built in git (and so
# in the wheel), from the pins in ui/package-lock.json by `make ui`.
VENDOR_DIRECTORY = UI_DIRECTORY / "vendor"

router = APIRouter(tags=["viewer"])


def install_viewer(app: FastAPI) -> None:
    """`GET /ui` and `/ui/` (the page) and the static files under `/ui/`."""
    app.include_router(router)
    # check_dir=False: a checkout without built libraries still starts; the page then says how to build them.
    app.mount("/ui", StaticFiles(directory=UI_DIRECTORY, check_dir=False), name="viewer")


@router.get("/ui", include_in_schema=False)
def viewer_without_slash() -> RedirectResponse:
    # Relative, so that it resolves under whatever prefix a proxy serves the server at.
    return RedirectResponse("ui/", status_code=308)


@router.get("/ui/", include_in_schema=False)
def viewer_page() -> FileResponse:
    # no-cache: the page is tiny, and a stale one could load scripts of another version.
    return FileResponse(UI_DIRECTORY / "index.html", media_type="text/html", headers={"Cache-Control": "no-cache"})
