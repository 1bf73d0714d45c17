"""The front door: `GET /` lists where things are; `/docs` (Swagger UI) and `/redoc` run from assets this server
serves itself (the `fastapi-offline` package's copies), so the API docs work with no internet access."""

from __future__ import annotations

from importlib.resources import files
from typing import Any

from fastapi import APIRouter, FastAPI, Request
from fastapi.openapi.docs import get_redoc_html, get_swagger_ui_html
from fastapi.responses import HTMLResponse
from fastapi.staticfiles import StaticFiles

from app.api.problems import OrjsonResponse

ASSETS_PATH = "/docs-assets"
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
    prefix = _prefix(request)
    title = request.app.title
    links = {name: {"href": prefix + path, "title": text} for name, (path, text) in _LINKS.items()}
    if _wants_html(request):
        items = "".join(
            f'<li><a href="{link["href"]}">{link["href"]}</a>: {link["title"]}</li>'
            for name, link in links.items()
            if name != "viewer"  # linked above the list, relatively
        )
        page = (
            f"<!doctype html><html><head><meta charset='utf-8'><title>{title}</title></head><body>"
            f"<h1>{title} {request.app.version}</h1><p>{request.app.description}</p>"
            # Relative, so that it resolves under whatever prefix a proxy serves the server at.
            f"<p><a href='ui/'>Open the episode viewer</a></p><ul>{items}</ul></body></html>"
        )
        return HTMLResponse(page)
    return OrjsonResponse({"name": title, "version": request.app.version, "links": links})


@router.get("/docs", include_in_schema=False)
def swagger_ui(request: Request) -> HTMLResponse:
    prefix = _prefix(request)
    return get_swagger_ui_html(
        openapi_url=prefix + request.app.openapi_url,
        title=f"{request.app.title} - Swagger UI",
        swagger_js_url=f"{prefix}{ASSETS_PATH}/swagger-ui-bundle.js",
        swagger_css_url=f"{prefix}{ASSETS_PATH}/swagger-ui.css",
        swagger_favicon_url=f"{prefix}{ASSETS_PATH}/favicon.png",
    )


@router.get("/redoc", include_in_schema=False)
def redoc(request: Request) -> HTMLResponse:
    prefix = _prefix(request)
    return get_redoc_html(
        openapi_url=prefix + request.app.openapi_url,
        title=f"{request.app.title} - ReDoc",
        redoc_js_url=f"{prefix}{ASSETS_PATH}/redoc.standalone.js",
        redoc_favicon_url=f"{prefix}{ASSETS_PATH}/favicon.png",
        with_google_fonts=False,
    )
