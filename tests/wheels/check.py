"""What tests/wheels/run.sh checks against a server installed from its wheel, one check per subcommand.

    python check.py installed SITE_PACKAGES      the server and the client import from SITE_PACKAGES (the fresh
                                                 venv), not from a source tree, and the viewer's libraries are there
    python check.py client URL                   the client wheel reads the demo's rows in ascending episode order
    python check.py viewer URL SCREENSHOT        /ui/ renders an episode in Chromium (needs Playwright: run it with
                                                 the test environment's python), and saves a screenshot

`installed` and `client` run with the fresh venv's python, from a directory with no source tree in it; this file
imports nothing of the project at module level, so running it by path adds no package of the project to sys.path.
"""

from __future__ import annotations

import sys
from pathlib import Path

CHROMIUM = Path("/usr/bin/chromium")


def installed(site_packages: Path) -> None:
    import app
    import app.api.ui
    import episerve

    for module in (app, episerve):
        assert Path(module.__file__).resolve().is_relative_to(site_packages.resolve()), module.__file__
    manifest = app.api.ui.VENDOR_DIRECTORY / "manifest.json"
    libraries = ("arrow.min.js", "uplot.min.js", "uplot.min.css", "arrow.LICENSE.txt", "uplot.LICENSE.txt")
    missing = [name for name in (*libraries, manifest.name) if not (manifest.parent / name).is_file()]
    assert not missing, f"the server's wheel lacks the viewer's {missing}"


def client(url: str) -> None:
    import numpy as np

    import episerve

    with episerve.Client(url) as connection:
        assert [d["id"] for d in connection.datasets()] == ["demo"]
        table = connection.rows("demo", episodes=[8, 2, 5], columns=["episode_index", "frame_index", "action"])
    episodes = table["episode_index"].to_numpy()
    assert table.num_rows > 0 and set(episodes.tolist()) == {2, 5, 8}
    assert np.all(np.diff(episodes) >= 0), "rows must come in ascending episode order"
    print(f"client wheel: {table.num_rows} rows of episodes 2, 5, 8, in order")


def viewer(url: str, screenshot: Path) -> None:
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM))
        page = browser.new_page(viewport={"width": 1300, "height": 1000})
        errors: list[str] = []
        page.on("pageerror", lambda error: errors.append(str(error)))
        page.goto(f"{url}/ui/#dataset=demo&episode=3")
        ready = "(() => { const v = window.episerveViewer; return v && v.ready && v.route; })()"
        page.wait_for_function(ready, timeout=60_000)
        page.screenshot(path=str(screenshot))
        message = page.locator("#message")
        assert not message.is_visible(), message.inner_text()
        assert "demo · episode 3" in page.locator("main:visible").inner_text()
        assert page.locator("main canvas").count() >= 4  # two cameras, two charts
        assert errors == [], errors
        browser.close()
    print(f"viewer: episode 3 of the demo rendered from the wheel's libraries ({screenshot.name})")


if __name__ == "__main__":
    command, *arguments = sys.argv[1:]
    if command == "installed":
        installed(Path(arguments[0]))
    elif command == "client":
        client(arguments[0])
    elif command == "viewer":
        viewer(arguments[0], Path(arguments[1]))
    else:
        raise SystemExit(f"unknown check {command!r}")
