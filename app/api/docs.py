"""The front door: `GET /` lists where things are; `/docs` (Swagger UI) and `/redoc` run from assets this server
serves itself (the `fastapi-offline` package's copies), so the API docs work with no internet access. The HTML pages
refer to everything by relative URLs, so they also work under a path prefix that a proxy strips without telling the
server (no `root_path`)."""

from __future__ import annotations

from importlib.resources import files
from typing import Any

from fastapi import APIRouter, FastAPI, Request
from fastapi.openapi.docs import get_redoc_html, get_swagger_ui_html
from fastapi.responses import HTMLResponse
from fastapi.staticfiles import StaticFiles

from app.api.problems import OrjsonResponse

ASSETS_PATH = "/docs-assets"
# The pages are served at the root (`/`, `/docs`, `/redoc`): from there, these resolve below the same prefix.
RELATIVE_ASSETS = ASSETS_PATH.removeprefix("/")
ASSETS_DIRECTORY = files("fastapi_offline") / "static"

router = APIRouter(tags=["about"])

_LINKS = {
    "viewer": ("/ui/", "the episode viewer (a web page)"),
    "docs": ("/docs", "interactive API documentation (Swagger UI)"),
    "redoc": ("/redoc", "API reference (ReDoc)"),
    "openapi": ("/openapi.json", "the OpenAPI schema"),
    "datasets": ("/datasets", "the catalog of datasets"),
    "metrics": ("/metrics", "Prometheus metrics"),
    "health": ("/healthz", "liveness"),
    "ready": ("/readyz", "readiness"),
}


def install_docs(app: FastAPI) -> None:
    """Serve the docs assets and the `/`, `/docs` and `/redoc` pages (create the app with `docs_url=None`,
    `redoc_url=None`: FastAPI's own pages load their assets from a CDN)."""
    app.mount(ASSETS_PATH, StaticFiles(directory=str(ASSETS_DIRECTORY)), name="docs-assets")
    app.include_router(router)


def _prefix(request: Request) -> str:
    """The path the server is mounted under behind a proxy (`root_path`), so links work there too."""
    return request.scope.get("root_path", "").rstrip("/")


def _wants_html(request: Request) -> bool:
    accept = request.headers.get("accept", "")
    return "text/html" in accept and "application/json" not in accept.split(",")[0]


@router.get(
    "/",
    summary="Where things are: links to the docs, the datasets, metrics and health",
    responses={200: {"content": {"text/html": {}}, "description": "JSON links, or an HTML page for browsers"}},
)
def home(request: Request) -> Any:
    title = request.app.title
    if _wants_html(request):
        relative = {name: (path.removeprefix("/"), text) for name, (path, text) in _LINKS.items()}
        items = "".join(
            f'<li><a href="{href}">{href}</a>: {text}</li>'
            for name, (href, text) in relative.items()
            if name != "viewer"  # linked above the list
        )
        # Styled by the viewer's stylesheet (same header and colours); relative URLs, as everywhere.
        page = (
            "<!doctype html><html lang='en'><head><meta charset='utf-8'>"
            "<meta name='viewport' content='width=device-width, initial-scale=1'>"
            f"<title>{title}</title><link rel='stylesheet' href='ui/viewer.css'>"
            "</head><body class='home'><header><span class='brand'>episerve</span></header><main>"
            f"<h1>{title} {request.app.version}</h1><p>{request.app.description}</p>"
            f"<p><a href='ui/' class='open-viewer'>Open the episode viewer</a></p><ul>{items}</ul></main></body></html>"
        )
        return HTMLResponse(page)
    # JSON clients resolve no relative links: absolute paths, under `root_path` when the proxy sets one.
    prefix = _prefix(request)
    links = {name: {"href": prefix + path, "title": text} for name, (path, text) in _LINKS.items()}
    return OrjsonResponse({"name": title, "version": request.app.version, "links": links})


@router.get("/docs", include_in_schema=False)
def swagger_ui(request: Request) -> HTMLResponse:
    return get_swagger_ui_html(
        openapi_url=request.app.openapi_url.removeprefix("/"),
        title=f"{request.app.title} - Swagger UI",
        swagger_js_url=f"{RELATIVE_ASSETS}/swagger-ui-bundle.js",
        swagger_css_url=f"{RELATIVE_ASSETS}/swagger-ui.css",
        swagger_favicon_url=f"{RELATIVE_ASSETS}/favicon.png",
    )


@router.get("/redoc", include_in_schema=False)
def redoc(request: Request) -> HTMLResponse:
    return get_redoc_html(
        openapi_url=request.app.openapi_url.removeprefix("/"),
        title=f"{request.app.title} - ReDoc",
        redoc_js_url=f"{RELATIVE_ASSETS}/redoc.standalone.js",
        redoc_favicon_url=f"{RELATIVE_ASSETS}/favicon.png",
        with_google_fonts=False,
    )
