"""The front door: `GET /` links, and API docs pages that work offline (every asset served by the server)."""

from __future__ import annotations

import re

import httpx
import pytest

ASSET_TYPES = {".js": "javascript", ".css": "text/css", ".png": "image/png"}


def referenced_urls(page: str) -> list[str]:
    """Every URL an HTML page loads or links: src/href attributes and quoted URLs in its inline script."""
    attributes = re.findall(r"""(?:src|href)\s*=\s*["']([^"']+)["']""", page)
    scripted = re.findall(r"""(?:url|spec-url)\s*[:=]\s*["']([^"']+)["']""", page)
    return attributes + scripted


@pytest.mark.parametrize("page", ["/docs", "/redoc"])
def test_docs_pages_load_every_asset_from_the_server_itself(http: httpx.Client, page: str) -> None:
    response = http.get(page)
    assert response.status_code == 200 and response.headers["content-type"].startswith("text/html")
    urls = referenced_urls(response.text)
    assert "openapi.json" in urls
    # Relative, so that they resolve under a path prefix too (tests/test_viewer.py checks that through a proxy).
    assert [url for url in urls if url.startswith("/") or "://" in url] == []
    assets = [url for url in urls if url.startswith("docs-assets/")]
    assert {url.rsplit(".", 1)[-1] for url in assets} == ({"js", "css", "png"} if page == "/docs" else {"js", "png"})
    for url in assets:
        asset = http.get(f"/{url}")
        assert asset.status_code == 200, url
        assert ASSET_TYPES["." + url.rsplit(".", 1)[-1]] in asset.headers["content-type"], url
        assert len(asset.content) > 4000, url
    scripts = [http.get(f"/{url}").text for url in assets if url.endswith(".js")]
    assert any("SwaggerUIBundle" in script for script in scripts) == (page == "/docs")
    assert "openapi" in http.get("/openapi.json").json()


def test_root_lists_links_that_answer(http: httpx.Client) -> None:
    response = http.get("/")
    assert response.status_code == 200 and response.headers["content-type"] == "application/json"
    body = response.json()
    assert body["name"] == "episerve"
    hrefs = {name: link["href"] for name, link in body["links"].items()}
    assert hrefs == {
        "viewer": "/ui/",
        "docs": "/docs",
        "redoc": "/redoc",
        "openapi": "/openapi.json",
        "datasets": "/datasets",
        "metrics": "/metrics",
        "health": "/healthz",
        "ready": "/readyz",
    }
    for href in hrefs.values():
        assert http.get(href).status_code == 200, href


def test_root_is_an_html_page_of_links_for_browsers(http: httpx.Client) -> None:
    response = http.get("/", headers={"Accept": "text/html,application/xhtml+xml,*/*;q=0.8"})
    assert response.status_code == 200 and response.headers["content-type"].startswith("text/html")
    # Relative to where `/` is served, so that they resolve under a path prefix too.
    links = re.findall(r'href="([^"]+)"', response.text)
    assert links == ["docs", "redoc", "openapi.json", "datasets", "metrics", "healthz", "readyz"]
    assert re.findall(r"href='([^']+)'", response.text) == ["ui/viewer.css", "ui/"]  # its style, the viewer
    for link in links:
        assert http.get(f"/{link}").status_code == 200, link
