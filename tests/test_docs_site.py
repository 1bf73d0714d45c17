"""The documentation site builds with `mkdocs build --strict` (as `make docs` does), and strict means strict: a link
to a missing page, an anchor no heading has, or a page left out of the nav fails the build. The front page's links
into docs/ lead to pages and headings that exist."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support import ROOT

pytest.importorskip("mkdocs", reason="MkDocs is in the dev extra (make venv)")
from markdown.extensions.toc import slugify  # Markdown comes with MkDocs


def build(config: Path, site: Path) -> subprocess.CompletedProcess[str]:
    command = [
        sys.executable,
        "-m",
        "mkdocs",
        "build",
        "--strict",
        "--config-file",
        str(config),
        "--site-dir",
        str(site),
    ]
    env = os.environ | {"NO_MKDOCS_2_WARNING": "1"}  # Material's banner about its successor
    return subprocess.run(command, capture_output=True, text=True, timeout=180, env=env)


def test_the_site_builds_strictly_with_every_page(tmp_path: Path) -> None:
    done = build(ROOT / "mkdocs.yml", tmp_path / "site")
    assert done.returncode == 0, done.stdout + done.stderr
    for page in (ROOT / "docs").rglob("*.md"):
        name = page.relative_to(ROOT / "docs").with_suffix("")
        built = tmp_path / "site" / ("index.html" if name.name == "index" else f"{name}/index.html")
        assert built.is_file(), f"{page} has no page in the site"
    client = (tmp_path / "site" / "client" / "index.html").read_text()
    assert 'id="training-with-episodedataset"' in client  # headings keep their anchors


def test_a_broken_link_a_bad_anchor_or_a_page_outside_the_nav_fails_the_build(tmp_path: Path) -> None:
    shutil.copytree(ROOT / "docs", tmp_path / "docs")
    shutil.copy(ROOT / "mkdocs.yml", tmp_path / "mkdocs.yml")
    with (tmp_path / "docs" / "client.md").open("a") as page:
        page.write("\nSee [the limits](http-api.md#no-such-heading) and [the recipes](no-such-page.md).\n")
    (tmp_path / "docs" / "orphan.md").write_text("# Orphan\n\nIn no nav.\n")
    done = build(tmp_path / "mkdocs.yml", tmp_path / "site")
    output = done.stdout + done.stderr
    assert done.returncode != 0, output
    assert "no-such-heading" in output
    assert "no-such-page.md" in output
    assert "orphan.md" in output


def headings(page: Path) -> set[str]:
    """The anchors of a page's headings, as MkDocs' table of contents makes them (fenced blocks skipped)."""
    text = re.sub(r"^```.*?^```", "", page.read_text(), flags=re.MULTILINE | re.DOTALL)
    titles = re.findall(r"^#{1,6} (.+)$", text, flags=re.MULTILINE)
    return {slugify(re.sub(r"[`*]", "", title), "-") for title in titles}


def test_the_front_page_links_to_pages_and_headings_that_exist() -> None:
    readme = ROOT / "README.md"
    targets = re.findall(r"\]\(([^)\s]+)\)", readme.read_text())
    local = [t for t in targets if not re.match(r"[a-z]+:", t)]
    assert any(t.startswith("docs/") for t in local)
    broken = []
    for target in local:
        path, _, anchor = target.partition("#")
        file = ROOT / path if path else readme
        if not file.exists():
            broken.append(f"{target}: no such file")
        elif anchor and anchor not in headings(file):
            broken.append(f"{target}: no such heading")
    assert broken == []


# The one sentence the two front pages word differently (GitHub shows README.md; the site shows docs/index.md).
README_ONLY = "The reference is a documentation site (`make docs` builds it into `site/`); its pages read as well here:"
INDEX_ONLY = "The reference, page by page:"


def test_the_sites_front_page_is_the_readme() -> None:
    """docs/index.md is README.md with its links made relative to docs/ (and one sentence about the site): an edit
    of one that is not made to the other fails here."""
    readme = (ROOT / "README.md").read_text()
    assert README_ONLY in readme
    expected = readme.replace("](docs/", "](").replace(README_ONLY, INDEX_ONLY)
    assert (ROOT / "docs" / "index.md").read_text() == expected
