"""The episode viewer (`/ui/`), in a real browser: headless Chromium (Debian's package) driven by Playwright, against
a real server over the two-camera demo datasets. The page's charts are compared with the parquet files, the frames
it draws with the server's frames of the same rows, pixel for pixel. Skips when Chromium is missing."""

from __future__ import annotations

import io
import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from app.api.ui import VENDOR_DIRECTORY
from app.demo import IMAGE, JOINT_NAMES, STATE, write_demo_dataset
from app.demo_cameras import TOP_CAMERA, WRIST_CAMERA
from tests.support import ROOT, ServerProcess, oracle, read_stream, source_files

CHROMIUM = Path("/usr/bin/chromium")
LIBRARIES = ("arrow.min.js", "uplot.min.js", "uplot.min.css")
TOKEN = "viewer-test-token"
TIMES, EN_DASH = "\u00d7", "\u2013"  # as the page writes shapes and ranges
PREFIX = "/episerve"  # where the proxy of the path-prefix tests serves the server
PLACEHOLDER_RGB = (0x8A, 0x93, 0xA3)  # the viewer's canvas for an image row without bytes


def test_viewer_libraries_ship_pinned_with_their_licences() -> None:
    """In git and so in the wheel: each bundle, every licence and notice of what it bundles, and the manifest."""
    manifest = json.loads((VENDOR_DIRECTORY / "manifest.json").read_text())
    pins = json.loads((ROOT / "ui" / "package-lock.json").read_text())["packages"]
    bundled = {"apache-arrow", "flatbuffers", "json-with-bigint", "tslib", "uplot"}
    assert {entry["package"] for entry in manifest} == bundled
    for entry in manifest:
        assert entry["version"] == pins[f"node_modules/{entry['package']}"]["version"]
        assert entry["license"] and any("LICENSE" in name for name in entry["files"])
        assert all((VENDOR_DIRECTORY / name).stat().st_size > 0 for name in entry["files"])
    assert {name for entry in manifest for name in entry["files"]} >= set(LIBRARIES) | {"arrow.NOTICE.txt"}


# ---- served without a browser ------------------------------------------------------------------------------------


def referenced_urls(page: str) -> list[str]:
    return re.findall(r"""(?:src|href)\s*=\s*["']([^"']+)["']""", page)


def test_viewer_page_loads_everything_by_relative_urls(http: httpx.Client) -> None:
    response = http.get("/ui/")
    assert response.status_code == 200 and response.headers["content-type"].startswith("text/html")
    urls = [url for url in referenced_urls(response.text) if not url.startswith(("data:", "#"))]
    assert {"vendor/arrow.min.js", "vendor/uplot.min.js", "vendor/uplot.min.css", "viewer.js", "viewer.css"} <= set(
        urls
    )
    assert [url for url in urls if url.startswith("/") or "://" in url] == []
    own = [url for url in urls if not url.startswith(("vendor/", "../"))]
    for url in own:
        asset = http.get(f"/ui/{url}")
        assert asset.status_code == 200 and len(asset.content) > 1000, url
    script = http.get("/ui/viewer.js").text
    # The page's API calls resolve against the server's root, whatever prefix a proxy adds.
    assert 'new URL("../", document.baseURI)' in script
    assert re.findall(r"""fetch\(\s*["'`]/""", script) == []


def test_viewer_libraries_are_served_by_the_server_itself(http: httpx.Client) -> None:
    for name, kind in {"arrow.min.js": "javascript", "uplot.min.js": "javascript", "uplot.min.css": "css"}.items():
        asset = http.get(f"/ui/vendor/{name}")
        assert asset.status_code == 200 and kind in asset.headers["content-type"], name
        assert asset.content == (VENDOR_DIRECTORY / name).read_bytes()


def test_ui_without_slash_and_root_lead_to_the_viewer_relatively(http: httpx.Client) -> None:
    redirect = http.get("/ui", follow_redirects=False)
    assert redirect.status_code == 308 and redirect.headers["location"] == "ui/"
    home = http.get("/", headers={"Accept": "text/html"})
    assert "href='ui/'" in home.text
    assert http.get("/").json()["links"]["viewer"]["href"] == "/ui/"


def test_unknown_viewer_file_is_404(http: httpx.Client) -> None:
    assert http.get("/ui/nope.js").status_code == 404


# ---- in the browser ----------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    if not CHROMIUM.exists():
        pytest.skip(f"no Chromium at {CHROMIUM} (apt-get install chromium): the viewer's browser tests need it")
    sync_api = pytest.importorskip("playwright.sync_api", reason="Playwright is not installed (pip install .[dev])")
    with sync_api.sync_playwright() as playwright:
        launched = playwright.chromium.launch(executable_path=str(CHROMIUM))
        yield launched
        launched.close()


@pytest.fixture(scope="module")
def viewer_server(video_root: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    with ServerProcess([video_root], tmp_path_factory.mktemp("viewer-cache")) as running:
        yield running


def write_lerobot_lists_dataset(path: Path) -> Path:
    """A LeRobot v3.0 dataset (3 episodes, no videos) as some writers store it: `observation.state` a variable-length
    list<float32> (shape 6 in meta/info.json), null where frame_index % 7 == 3 and 4 values long where
    frame_index % 5 == 1; and image cells holding only a `path`, no `bytes`, where frame_index % 4 == 2."""
    write_demo_dataset(path, format="v3.0", episodes=3, seed=5, files=1, cameras={})
    (data_file,) = source_files(path)
    table = pq.read_table(data_file)
    rows = zip(table["episode_index"].to_pylist(), table["frame_index"].to_pylist(), strict=True)
    states, images = [], []
    for (episode, frame), state, image in zip(rows, table[STATE].to_pylist(), table[IMAGE].to_pylist(), strict=True):
        states.append(None if frame % 7 == 3 else state[:4] if frame % 5 == 1 else state)
        path_only = {"bytes": None, "path": f"images/{IMAGE}/episode_{episode:06d}/frame_{frame:06d}.png"}
        images.append(path_only if frame % 4 == 2 else image)
    table = table.set_column(table.schema.get_field_index(STATE), STATE, pa.array(states, pa.list_(pa.float32())))
    table = table.set_column(table.schema.get_field_index(IMAGE), IMAGE, pa.array(images, table[IMAGE].type))
    pq.write_table(table.replace_schema_metadata(None), data_file)  # its Hugging Face schema names the old types
    return path


def write_generic_lists_dataset(path: Path) -> Path:
    """Plain parquet with no metadata: `state` list<float32> (at most 2 values in episode 0, 4 in episode 1, a null
    row), `effort` large_list<float64> (1 to 3 values) and `half` float16."""
    path.mkdir(parents=True)
    lengths = [(0, 1), (0, 2), (0, 0), (0, 2), (1, 3), (1, 4), (1, None), (1, 1), (1, 4), (1, 2)]
    rng = np.random.default_rng(11)
    table = pa.table(
        {
            "episode_index": pa.array([episode for episode, _ in lengths], pa.int64()),
            "timestamp": pa.array(np.arange(len(lengths)) / 10, pa.float32()),
            "state": pa.array(
                [None if n is None else rng.normal(size=n).tolist() for _, n in lengths], pa.list_(pa.float32())
            ),
            "effort": pa.array(
                [rng.normal(size=i % 3 + 1).tolist() for i in range(len(lengths))], pa.large_list(pa.float64())
            ),
            "half": pa.array(np.arange(len(lengths), dtype=np.float16) * np.float16(-1.25), pa.float16()),
        }
    )
    pq.write_table(table, path / "part-0.parquet", row_group_size=4)
    return path


@pytest.fixture(scope="module")
def lists_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("lists-root")
    write_lerobot_lists_dataset(root / "lerobot-lists")
    write_generic_lists_dataset(root / "generic-lists")
    return root


@pytest.fixture(scope="module")
def lists_server(lists_root: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    with ServerProcess([lists_root], tmp_path_factory.mktemp("lists-cache")) as running:
        yield running


@pytest.fixture()
def page(browser: Any) -> Iterator[Any]:
    context = browser.new_context(viewport={"width": 1300, "height": 1000})
    opened = context.new_page()
    errors: list[str] = []
    opened.on("pageerror", lambda error: errors.append(str(error)))
    yield opened
    context.close()
    assert errors == [], f"the page raised: {errors}"


def open_viewer(page: Any, server: ServerProcess, fragment: str = "") -> None:
    """Go to the viewer at `fragment` and wait until that view has rendered (or shown its message)."""
    page.goto(f"{server.url}/ui/{fragment}")
    rendered = "v && v.ready && (!v.route || v.route.hash === location.hash)"  # no route: the libraries are missing
    page.wait_for_function(f"(() => {{ const v = window.episerveViewer; return {rendered}; }})()", timeout=60_000)


def viewer_state(page: Any, expression: str) -> Any:
    return page.evaluate(f"(() => {{ const v = window.episerveViewer; return {expression}; }})()")


def canvas_pixels(page: Any, camera: str) -> np.ndarray:
    """The RGBA pixels a camera's canvas shows, (height, width, 4)."""
    width, height, data = page.evaluate(
        """(name) => {
            const canvas = document.querySelector(`figure.camera[data-camera="${name}"] canvas`);
            const image = canvas.getContext("2d").getImageData(0, 0, canvas.width, canvas.height);
            return [canvas.width, canvas.height, Array.from(image.data)];
        }""",
        camera,
    )
    return np.array(data, dtype=np.uint8).reshape(height, width, 4)


def server_frame(server: ServerProcess, dataset: str, episode: int, row: int, camera: str) -> np.ndarray:
    """The server's frame of a row of the episode, (height, width, 3), read the way any client reads it."""
    params = {"episodes": str(episode), "start": str(row), "stop": str(row + 1), "columns": camera}
    response = httpx.get(f"{server.url}/datasets/{dataset}/rows", params=params, timeout=60)
    assert response.status_code == 200, response.text
    return read_stream(response.content)[camera].combine_chunks().to_numpy_ndarray()[0]


def per_dimension(rows: list[list[float] | None], dims: int) -> list[list[float | None]]:
    """Variable-length rows as the charts hold them: one list per dimension, None where a row has no such value."""
    return [[None if row is None or d >= len(row) else row[d] for row in rows] for d in range(dims)]


def distinct_colours(png: bytes) -> int:
    from PIL import Image

    with Image.open(io.BytesIO(png)) as image:
        return len(image.convert("RGB").getcolors(maxcolors=1 << 24))


def test_catalog_lists_every_dataset_with_its_cameras_and_cache(page: Any, viewer_server: ServerProcess) -> None:
    open_viewer(page, viewer_server)
    page.wait_for_function("document.querySelectorAll('#datasets td.muted').length === 0")
    served = httpx.get(f"{viewer_server.url}/datasets").json()["datasets"]
    rows = page.locator("#datasets tbody tr")
    assert [rows.nth(i).get_attribute("data-id") for i in range(rows.count())] == [d["id"] for d in served]
    for i, dataset in enumerate(served):
        cells = rows.nth(i).locator("td").all_inner_texts()
        assert cells[:5] == [
            dataset["id"],
            dataset["format"],
            f"{dataset['rows']:,}",
            f"{dataset['episodes']:,}",
            f"{dataset['fps']:g}",
        ]
        for camera, shape in {
            TOP_CAMERA: (64, 96, 3),
            WRIST_CAMERA: (48, 64, 3),
            "observation.image": (16, 16, 3),
        }.items():
            assert f"{camera} ({TIMES.join(map(str, shape))})" in cells[5]
        assert re.fullmatch(r"\d+/\d+ segments, \d+ frame segments", cells[6]), cells[6]


def test_catalog_lists_the_named_mixtures_with_their_shares(
    page: Any, video_root: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    named = tmp_path_factory.mktemp("viewer-mixtures")
    components = [{"dataset": "cams-v3", "weight": 3}, {"dataset": "cams-v21", "episodes": "0-3"}]
    (named / "both.json").write_text(json.dumps({"components": components}))
    environment = {"EPISERVE_MIXTURES_DIR": str(named)}
    with ServerProcess([video_root], tmp_path_factory.mktemp("viewer-mixture-cache"), env=environment) as server:
        open_viewer(page, server)
        described = httpx.get(f"{server.url}/mixtures/both").json()
        cells = page.locator("#mixtures tbody tr").first.locator("td").all_inner_texts()
    assert cells[0] == "both" and cells[3] == described["version"]
    assert f"cams-v3 {TIMES}3: 75.0 %" in cells[1] and f"cams-v21 {TIMES}1: 25.0 %, episodes 0-3" in cells[1]
    assert cells[2] == f"{sum(c['rows'] for c in described['components']):,}"


def test_episode_list_filters_by_task_and_length(page: Any, viewer_server: ServerProcess) -> None:
    open_viewer(page, viewer_server, "#dataset=cams-v3")
    episodes = httpx.get(f"{viewer_server.url}/datasets/cams-v3/episodes").json()["episodes"]

    def listed() -> list[int]:
        cells = page.locator("#episodes tbody tr").evaluate_all("rows => rows.map(r => Number(r.dataset.episode))")
        return cells

    assert listed() == [e["episode_index"] for e in episodes]
    lengths = page.locator("#episodes tbody tr td:nth-child(2)").all_inner_texts()
    assert lengths == [f"{e['length']:,}" for e in episodes]
    task = episodes[0]["tasks"][0]
    page.select_option("#filter-task", task)
    assert listed() == [e["episode_index"] for e in episodes if task in e["tasks"]]
    median = sorted(e["length"] for e in episodes)[len(episodes) // 2]
    page.fill("#filter-min", str(median))
    wanted = [e["episode_index"] for e in episodes if task in e["tasks"] and e["length"] >= median]
    assert listed() == wanted
    page.fill("#filter-max", str(median))
    assert listed() == [e["episode_index"] for e in episodes if task in e["tasks"] and e["length"] == median]
    assert "of 9 episodes" in page.inner_text("#filter-count")
    page.fill("#filter-max", "")
    page.locator("#episodes tbody a").first.click()
    page.wait_for_function("window.episerveViewer.ready && window.episerveViewer.view")
    assert viewer_state(page, "v.view.episode") == wanted[0]


@pytest.mark.parametrize("dataset", ["cams-v3", "cams-v21"])
def test_episode_charts_hold_the_episodes_parquet_values(
    page: Any, viewer_server: ServerProcess, video_root: Path, dataset: str
) -> None:
    episode = 4
    open_viewer(page, viewer_server, f"#dataset={dataset}&episode={episode}")
    assert viewer_state(page, "v.message") is None
    expected = oracle(video_root / dataset, [episode])
    assert viewer_state(page, "v.view.length") == expected.num_rows
    assert viewer_state(page, "v.view.features") == ["observation.state", "action"]
    assert viewer_state(page, "v.view.x") == expected["timestamp"].to_pylist()
    for feature in ("observation.state", "action"):
        chart = viewer_state(page, f"v.view.charts[{feature!r}]")
        assert chart["labels"] == list(JOINT_NAMES)
        per_dimension = np.array(expected[feature].to_pylist(), dtype=np.float64).T
        assert chart["values"] == per_dimension.tolist()
    # The charts as drawn: one uPlot per feature, a legend entry per dimension named from the metadata.
    titles = page.locator(".chart .u-title").all_inner_texts()
    assert titles == ["observation.state", "action"]
    legend = page.locator(".chart[data-feature='action'] .u-legend .u-label").all_inner_texts()
    assert legend == ["time (s)", *JOINT_NAMES]
    tasks = httpx.get(f"{viewer_server.url}/datasets/{dataset}/episodes").json()["episodes"][episode]["tasks"]
    assert f"task: {tasks[0]}" in page.inner_text("#episode-summary")


def test_generic_dataset_charts_its_numeric_columns_with_nulls_as_gaps(
    page: Any, server: ServerProcess, datasets_root: Path
) -> None:
    # No LeRobot metadata: the numeric columns are found from their Arrow types, null rows are gaps (null).
    open_viewer(page, server, "#dataset=nullable&episode=1")
    assert viewer_state(page, "v.message") is None
    expected = oracle(datasets_root / "nullable", [1])
    assert viewer_state(page, "v.view.features") == ["pose", "reading", "count", "step"]
    pose = viewer_state(page, "v.view.charts.pose")
    assert pose["labels"] == ["pose[0]", "pose[1]", "pose[2]"]
    rows = expected["pose"].to_pylist()
    assert pose["values"] == [[None if row is None else row[d] for row in rows] for d in range(3)]
    for name in ("reading", "count", "step"):
        chart = viewer_state(page, f"v.view.charts[{name!r}]")
        assert chart == {"labels": [name], "values": [expected[name].to_pylist()]}
    assert None in viewer_state(page, "v.view.charts.reading.values[0]")
    # A dataset without an episode column is one episode, read without `episodes=`.
    open_viewer(page, server, "#dataset=plain&episode=0")
    assert viewer_state(page, "v.message") is None
    stored = pa.concat_tables([pq.read_table(path) for path in source_files(datasets_root / "plain")])
    assert viewer_state(page, "v.view.charts.y.values") == [stored["y"].to_pylist()]


def test_variable_length_list_columns_chart_one_trace_per_dimension_of_the_metadata_shape(
    page: Any, lists_server: ServerProcess, lists_root: Path
) -> None:
    open_viewer(page, lists_server, "#dataset=lerobot-lists&episode=1")
    assert viewer_state(page, "v.message") is None
    assert viewer_state(page, "v.view.features") == [STATE, "action"]
    chart = viewer_state(page, f"v.view.charts[{STATE!r}]")
    assert chart["labels"] == list(JOINT_NAMES)  # shape [6] in meta/info.json, though rows hold 4 or 6 values
    rows = oracle(lists_root / "lerobot-lists", [1])[STATE].to_pylist()
    assert any(row is None for row in rows) and any(row is not None and len(row) == 4 for row in rows)
    assert chart["values"] == per_dimension(rows, 6)
    legend = page.locator(f".chart[data-feature='{STATE}'] .u-legend .u-label").all_inner_texts()
    assert legend == ["time (s)", *JOINT_NAMES]


def test_variable_length_list_columns_without_a_shape_chart_the_episodes_longest_list(
    page: Any, lists_server: ServerProcess, lists_root: Path
) -> None:
    open_viewer(page, lists_server, "#dataset=generic-lists&episode=0")
    assert viewer_state(page, "v.message") is None
    assert viewer_state(page, "v.view.features") == ["state", "effort", "half"]
    expected = oracle(lists_root / "generic-lists", [0])
    half = viewer_state(page, "v.view.charts.half")  # float16: values, not their bit patterns
    assert half == {"labels": ["half"], "values": [[float(v) for v in expected["half"].to_numpy()]]}
    state = viewer_state(page, "v.view.charts.state")
    assert state == {"labels": ["state[0]", "state[1]"], "values": per_dimension(expected["state"].to_pylist(), 2)}
    effort = viewer_state(page, "v.view.charts.effort")  # large_list
    assert effort["labels"] == ["effort[0]", "effort[1]", "effort[2]"]
    assert effort["values"] == per_dimension(expected["effort"].to_pylist(), 3)
    open_viewer(page, lists_server, "#dataset=generic-lists&episode=1")
    rows = oracle(lists_root / "generic-lists", [1])["state"].to_pylist()
    assert viewer_state(page, "v.view.charts.state.labels") == [f"state[{d}]" for d in range(4)]
    assert viewer_state(page, "v.view.charts.state.values") == per_dimension(rows, 4)


@pytest.mark.parametrize("dataset", ["cams-v3", "cams-v21"])
def test_cursor_moves_the_frames_and_the_chart_marker_together(
    page: Any, viewer_server: ServerProcess, video_root: Path, dataset: str
) -> None:
    episode = 2
    open_viewer(page, viewer_server, f"#dataset={dataset}&episode={episode}")
    marker = page.locator(".chart[data-feature='observation.state'] .cursor-marker")
    left_at_start = float(marker.evaluate("m => parseFloat(m.style.left)"))
    for camera in (TOP_CAMERA, WRIST_CAMERA):
        shown = canvas_pixels(page, camera)
        assert (shown[..., :3] == server_frame(viewer_server, dataset, episode, 0, camera)).all(), camera

    page.fill("#scrub", "17")  # scrub
    page.wait_for_function("window.episerveViewer.view.shownFrame === 17")
    page.locator("body").press("ArrowRight")  # step
    page.wait_for_function("window.episerveViewer.view.shownFrame === 18")
    assert viewer_state(page, "v.view.cursor") == 18
    for camera in (TOP_CAMERA, WRIST_CAMERA):
        shown = canvas_pixels(page, camera)
        expected = server_frame(viewer_server, dataset, episode, 18, camera)
        assert shown.shape[:2] == expected.shape[:2]
        assert (shown[..., :3] == expected).all(), camera
        assert (shown[..., 3] == 255).all()
        assert not (expected == server_frame(viewer_server, dataset, episode, 0, camera)).all()
    x = viewer_state(page, "v.view.x")
    left = float(marker.evaluate("m => parseFloat(m.style.left)"))
    plot_width = marker.evaluate("m => m.parentElement.clientWidth")
    assert left > left_at_start
    assert left == pytest.approx(left_at_start + plot_width * (x[18] - x[0]) / (x[-1] - x[0]), abs=1.5)
    assert page.inner_text("#position").startswith("frame 18 / ")
    # The legends show the values at the cursor.
    row = oracle(video_root / dataset, [episode]).slice(18, 1)
    legend = page.locator(".chart[data-feature='action'] .u-legend .u-value").all_inner_texts()
    assert legend == [f"{row['timestamp'][0].as_py():.3f}", *(f"{v:.4f}" for v in row["action"][0].as_py())]


def frame_tiers_shown(page: Any) -> dict[str, str | None]:
    """Camera -> the frame tier its figure states (None for a camera that states none)."""
    return page.evaluate(
        """() => Object.fromEntries([...document.querySelectorAll("figure.camera")].map((figure) => {
            const tier = figure.querySelector(".frame-tier");
            return [figure.dataset.camera, tier ? tier.innerText : null];
        }))"""
    )


def test_each_video_camera_says_its_frames_are_exact_on_a_default_server(
    page: Any, viewer_server: ServerProcess
) -> None:
    open_viewer(page, viewer_server, "#dataset=cams-v3&episode=1")
    assert frame_tiers_shown(page) == {TOP_CAMERA: "exact frames", WRIST_CAMERA: "exact frames", IMAGE: None}


def test_each_video_camera_states_its_lossy_jpeg_tier_with_quality_and_psnr(
    page: Any, video_root: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    environment = {"EPISERVE_VIDEO_FRAME_TIER": "jpeg:90,cams-v21=raw"}
    with ServerProcess([video_root], tmp_path_factory.mktemp("viewer-jpeg-cache"), env=environment) as server:
        described = {c["name"]: c for c in httpx.get(f"{server.url}/datasets/cams-v3", timeout=60).json()["columns"]}
        open_viewer(page, server, "#dataset=cams-v3&episode=1")
        lossy = frame_tiers_shown(page)
        open_viewer(page, server, "#dataset=cams-v21&episode=1")
        exact = frame_tiers_shown(page)
    psnr = {camera: described[camera]["frames"]["psnr_db"] for camera in (TOP_CAMERA, WRIST_CAMERA)}
    assert all(30 < value < 60 for value in psnr.values()), psnr  # measured by the server (test_frame_tiers.py)
    assert lossy == {
        TOP_CAMERA: f"JPEG q90, lossy (PSNR ~{psnr[TOP_CAMERA]:.1f} dB)",
        WRIST_CAMERA: f"JPEG q90, lossy (PSNR ~{psnr[WRIST_CAMERA]:.1f} dB)",
        IMAGE: None,  # a parquet image column is drawn as stored: no frame tier applies
    }
    assert exact == {TOP_CAMERA: "exact frames", WRIST_CAMERA: "exact frames", IMAGE: None}


def test_parquet_image_column_is_drawn_as_stored(page: Any, viewer_server: ServerProcess, video_root: Path) -> None:
    from PIL import Image

    open_viewer(page, viewer_server, "#dataset=cams-v3&episode=1")
    page.locator("#step-forward").click()
    page.locator("#step-forward").click()
    page.wait_for_function("window.episerveViewer.view.shownFrame === 2")
    png = oracle(video_root / "cams-v3", [1])["observation.image"][2].as_py()["bytes"]
    with Image.open(io.BytesIO(png)) as image:
        expected = np.asarray(image.convert("RGB"))
    shown = canvas_pixels(page, "observation.image")
    assert (shown[..., :3] == expected).all()


def test_image_row_holding_only_a_path_shows_a_placeholder_not_the_previous_image(
    page: Any, lists_server: ServerProcess, lists_root: Path
) -> None:
    from PIL import Image

    open_viewer(page, lists_server, "#dataset=lerobot-lists&episode=1")
    images = oracle(lists_root / "lerobot-lists", [1])[IMAGE].to_pylist()
    caption = page.locator(f"figure.camera[data-camera='{IMAGE}'] figcaption")
    figure = page.locator(f"figure.camera[data-camera='{IMAGE}']")
    for row in (1, 2, 3):
        page.fill("#scrub", str(row))
        page.wait_for_function(f"window.episerveViewer.view.shownFrame === {row}")
        shown = canvas_pixels(page, IMAGE)
        if images[row]["bytes"] is None:  # frame_index 2
            assert row == 2 and shown.shape == (16, 16, 4)
            assert (shown[..., :3] == PLACEHOLDER_RGB).all()
            assert caption.inner_text() == (
                f"{IMAGE} · frame 2 · no image in this row, only its path ({images[row]['path']}), "
                "which the server does not serve"
            )
            assert figure.get_attribute("class") == "camera missing"
        else:
            with Image.open(io.BytesIO(images[row]["bytes"])) as image:
                assert (shown[..., :3] == np.asarray(image.convert("RGB"))).all()
            assert caption.inner_text() == f"{IMAGE} · frame {row}"
            assert figure.get_attribute("class") == "camera"


def test_previous_and_next_episode_links_open_the_neighbouring_episodes(
    page: Any, viewer_server: ServerProcess, video_root: Path
) -> None:
    open_viewer(page, viewer_server, "#dataset=cams-v21&episode=0")
    assert page.locator("#previous-episode").is_hidden()
    page.click("#next-episode")
    page.wait_for_function("window.episerveViewer.ready && window.episerveViewer.view?.episode === 1")
    expected = oracle(video_root / "cams-v21", [1])
    assert viewer_state(page, "v.view.x") == expected["timestamp"].to_pylist()
    assert viewer_state(page, "v.view.shownFrame") == 0
    assert page.locator(".chart").count() == 2  # the previous episode's charts are gone
    page.click("#previous-episode")
    page.wait_for_function("window.episerveViewer.ready && window.episerveViewer.view?.episode === 0")
    open_viewer(page, viewer_server, "#dataset=cams-v21&episode=8")
    assert page.locator("#next-episode").is_hidden() and page.inner_text("#previous-episode") == "\u2190 episode 7"


def test_play_advances_the_cursor_at_the_datasets_fps_and_pause_stops_it(
    page: Any, viewer_server: ServerProcess
) -> None:
    # Episode 6 runs 142 frames (4.7 s at 30 fps): playback is still under way, 4 s after frame 15, when the pause
    # is clicked, however slow the machine (a shorter episode could end first, and the click would play it again).
    open_viewer(page, viewer_server, "#dataset=cams-v3&episode=6")
    page.locator("#play").click()
    page.wait_for_function("window.episerveViewer.view.cursor >= 15", timeout=10_000)
    page.locator("#play").click()
    assert page.inner_text("#play") == "play"
    stopped = viewer_state(page, "v.view.cursor")
    page.wait_for_timeout(300)
    assert viewer_state(page, "v.view.cursor") == stopped
    page.wait_for_function(f"window.episerveViewer.view.shownFrame === {stopped}")
    # Frames were fetched as the cursor moved, not one request per row played and not all at once.
    assert 1 < viewer_state(page, "v.view.frameRequests") <= stopped + 1


def test_screenshots_of_the_pages_are_not_blank(page: Any, viewer_server: ServerProcess, tmp_path: Path) -> None:
    open_viewer(page, viewer_server)
    catalog = page.screenshot(path=tmp_path / "catalog.png", full_page=True)
    assert distinct_colours(catalog) > 50
    open_viewer(page, viewer_server, "#dataset=cams-v3&episode=3")
    page.fill("#scrub", "9")
    page.wait_for_function("window.episerveViewer.view.shownFrame === 9")
    episode = page.screenshot(path=tmp_path / "episode.png", full_page=True)
    assert (tmp_path / "episode.png").stat().st_size > 20_000
    assert distinct_colours(episode) > 1000
    camera = page.locator(f"figure.camera[data-camera='{TOP_CAMERA}'] canvas").screenshot(path=tmp_path / "top.png")
    assert distinct_colours(camera) > 200
    chart = page.locator(".chart[data-feature='action'] canvas").screenshot(path=tmp_path / "chart.png")
    assert distinct_colours(chart) > 20


@pytest.mark.parametrize(
    ("fragment", "message"),
    [
        ("#dataset=no-such-dataset", "Dataset 'no-such-dataset' was not found"),
        ("#dataset=no-such-dataset&episode=1", "Dataset 'no-such-dataset' was not found"),
        ("#dataset=cams-v3&episode=999", f"Episode 999 is not in dataset 'cams-v3' (its episodes are 0{EN_DASH}8)"),
        ("#dataset=cams-v3&episode=two", "'two' is not an episode number"),
    ],
)
def test_unknown_dataset_or_episode_in_the_url_shows_a_clear_message(
    page: Any, viewer_server: ServerProcess, fragment: str, message: str
) -> None:
    open_viewer(page, viewer_server, fragment)
    alert = page.locator("#message")
    assert alert.is_visible()
    assert message in alert.inner_text()
    assert page.locator("main:visible").count() == 0


@pytest.mark.parametrize(
    ("fragment", "dataset_id", "problem"),
    [
        ("#dataset=..%2Fetc&episode=1", "../etc", "it has an empty, '.' or '..' path part"),
        ("#dataset=..%2Fetc", "../etc", "it has an empty, '.' or '..' path part"),
        ("#dataset=.&episode=0", ".", "it has an empty, '.' or '..' path part"),
        ("#dataset=cams-v3%2F..&episode=0", "cams-v3/..", "it has an empty, '.' or '..' path part"),
        ("#dataset=%2Fetc%2Fpasswd", "/etc/passwd", "it has an empty, '.' or '..' path part"),
        ("#dataset=org%2F%2Fcams-v3&episode=0", "org//cams-v3", "it has an empty, '.' or '..' path part"),
        ("#dataset=&episode=0", "", "it is empty"),
        ("#dataset=a%2Fb%2Fc&episode=0", "a/b/c", "it has more than one '/' (expected 'name' or 'org/name')"),
        ("#dataset=..%5Cetc&episode=0", "..\\etc", "each part must start with a letter, digit or '_'"),
    ],
)
def test_dataset_id_the_server_would_refuse_is_named_and_never_requested(
    page: Any, viewer_server: ServerProcess, fragment: str, dataset_id: str, problem: str
) -> None:
    requested: list[str] = []
    page.on("request", lambda request: requested.append(urlsplit(request.url).path))
    open_viewer(page, viewer_server, fragment)
    alert = page.locator("#message")
    assert alert.is_visible()
    assert alert.inner_text().startswith(f"'{dataset_id}' is not a valid dataset id: {problem}")
    assert page.locator("main:visible").count() == 0
    # Only the page and its own files: no API request at all, let alone one outside `datasets/`.
    assert requested and all(path.startswith("/ui/") for path in requested), requested


def serve_under_prefix(page: Any, server: ServerProcess) -> list[str]:
    """Act as a proxy serving the server at PREFIX that strips it (no root_path reaches the server): the browser sees
    only prefixed URLs, forwarded without the prefix; a URL that escaped the prefix answers 404. Returns the paths
    requested, in order."""
    requested: list[str] = []

    def forward(route: Any) -> None:
        path = route.request.url.removeprefix(server.url)
        requested.append(path)
        if path.startswith(PREFIX + "/"):
            route.continue_(url=server.url + path.removeprefix(PREFIX))
        else:
            route.fulfill(status=404, body="outside the prefix")

    page.route(f"{server.url}/**", forward)
    return requested


def fetch_statuses(page: Any, urls: list[str]) -> dict[str, int]:
    """Each URL, resolved against the page's address, fetched by the page (so through its routes): path -> status."""
    return page.evaluate(
        """async (urls) => Object.fromEntries(await Promise.all(urls.map(async (url) => {
            const resolved = new URL(url, document.baseURI);
            return [resolved.pathname, (await fetch(resolved)).status];
        })))""",
        urls,
    )


def test_viewer_works_under_a_path_prefix(page: Any, viewer_server: ServerProcess) -> None:
    requested = serve_under_prefix(page, viewer_server)
    page.goto(f"{viewer_server.url}{PREFIX}/ui/#dataset=cams-v3&episode=2")
    page.wait_for_function("window.episerveViewer && window.episerveViewer.ready", timeout=60_000)
    page.fill("#scrub", "5")
    page.wait_for_function("window.episerveViewer.view.shownFrame === 5")
    assert viewer_state(page, "v.message") is None
    assert [path for path in requested if not path.startswith(PREFIX + "/")] == []
    assert {f"{PREFIX}/ui/vendor/arrow.min.js", f"{PREFIX}/datasets/cams-v3"} <= set(requested)
    assert (canvas_pixels(page, TOP_CAMERA)[..., :3] == server_frame(viewer_server, "cams-v3", 2, 5, TOP_CAMERA)).all()


@pytest.mark.parametrize(
    ("docs_page", "rendered", "assets"),
    [
        ("docs", ".swagger-ui .info .title", {"swagger-ui-bundle.js", "swagger-ui.css", "favicon.png"}),
        ("redoc", ".api-info h1", {"redoc.standalone.js", "favicon.png"}),
    ],
)
def test_api_docs_work_under_a_path_prefix(
    page: Any, viewer_server: ServerProcess, docs_page: str, rendered: str, assets: set[str]
) -> None:
    requested = serve_under_prefix(page, viewer_server)
    served = page.goto(f"{viewer_server.url}{PREFIX}/{docs_page}").text()
    page.wait_for_selector(f"{rendered}:has-text('episerve')", timeout=30_000)  # the schema loaded and rendered
    assert [path for path in requested if not path.startswith(PREFIX + "/")] == []
    assert f"{PREFIX}/openapi.json" in requested
    # Every URL the page as served refers to: attributes, and Swagger UI's `url:` in its inline script.
    referenced = re.findall(r"""(?:src|href|url|spec-url)\s*[:=]\s*["']([^"']+)["']""", served)
    expected = {f"{PREFIX}/docs-assets/{name}" for name in assets} | {f"{PREFIX}/openapi.json"}
    assert fetch_statuses(page, referenced) == dict.fromkeys(expected, 200)


def test_front_page_links_work_under_a_path_prefix(page: Any, viewer_server: ServerProcess) -> None:
    serve_under_prefix(page, viewer_server)
    page.goto(f"{viewer_server.url}{PREFIX}/")
    links = page.eval_on_selector_all("a", "anchors => anchors.map((a) => a.getAttribute('href'))")
    names = ["ui/", "docs", "redoc", "openapi.json", "datasets", "metrics", "healthz", "readyz"]
    assert links == names
    assert fetch_statuses(page, links) == {f"{PREFIX}/{name}": 200 for name in names}


def test_charts_follow_the_window_width(page: Any, viewer_server: ServerProcess) -> None:
    open_viewer(page, viewer_server, "#dataset=cams-v3&episode=2")
    width = "document.querySelector('.chart .uplot').offsetWidth"
    wide = page.evaluate(width)
    page.set_viewport_size({"width": 800, "height": 1000})
    page.wait_for_function(f"{width} < {wide - 300}")
    page.fill("#scrub", "10")
    marker = page.locator(".chart .cursor-marker").first.evaluate("m => parseFloat(m.style.left)")
    assert 0 < marker < 800


def test_page_asks_for_a_token_when_the_server_requires_one(
    browser: Any, video_root: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    env = {"EPISERVE_TOKENS": TOKEN}
    with ServerProcess([video_root], tmp_path_factory.mktemp("viewer-token-cache"), env=env) as server:
        context = browser.new_context()
        page = context.new_page()
        page.goto(f"{server.url}/ui/#dataset=cams-v3&episode=0")
        page.wait_for_selector("#token-form", state="visible")
        assert "requires a bearer token" in page.inner_text("#token-reason")
        page.fill("#token-input", "wrong")
        page.click("#token-form button")
        page.wait_for_function("document.getElementById('token-reason').textContent.includes('not accepted')")
        page.fill("#token-input", TOKEN)
        page.click("#token-form button")
        page.wait_for_function("window.episerveViewer.ready && window.episerveViewer.view", timeout=60_000)
        assert page.evaluate("window.episerveViewer.view.shownFrame") == 0
        assert page.evaluate("sessionStorage.getItem('episerve.token')") == TOKEN
        # The token stays for the tab: another view needs no new prompt.
        page.goto(f"{server.url}/ui/#dataset=cams-v21")
        page.wait_for_function("window.episerveViewer.ready")
        assert page.locator("#token-form").is_hidden()
        assert page.locator("#episodes tbody tr").count() == 9
        context.close()


def test_missing_libraries_show_how_to_build_them(page: Any, viewer_server: ServerProcess) -> None:
    # As on a broken install: the library files answer 404.
    page.route("**/vendor/*", lambda route: route.fulfill(status=404, body="not found"))
    open_viewer(page, viewer_server, "#dataset=cams-v3&episode=0")
    alert = page.locator("#message")
    assert alert.is_visible()
    assert "make ui" in alert.inner_text() and "not installed" in alert.inner_text()


def test_frames_arrive_as_arrow_tensors_the_page_reads(viewer_server: ServerProcess) -> None:
    # What the page relies on: a camera column is a fixed-shape uint8 tensor of (height, width, 3) per row.
    params = {"episodes": "2", "start": "0", "stop": "1", "columns": f"{TOP_CAMERA},{WRIST_CAMERA}"}
    table = read_stream(httpx.get(f"{viewer_server.url}/datasets/cams-v3/rows", params=params).content)
    assert isinstance(table[TOP_CAMERA].type, pa.FixedShapeTensorType)
    assert table[TOP_CAMERA].type.shape == [64, 96, 3] and table[WRIST_CAMERA].type.shape == [48, 64, 3]
    assert table[TOP_CAMERA].type.value_type == pa.uint8()


# ---- reading the viewer --------------------------------------------------------------------------------------


def test_home_page_is_styled_like_the_viewer(http: httpx.Client) -> None:
    home = http.get("/", headers={"Accept": "text/html"}).text
    assert "<link rel='stylesheet' href='ui/viewer.css'>" in home and "<body class='home'>" in home
    assert http.get("/ui/viewer.css").status_code == 200


def test_legends_show_the_values_at_the_cursor_before_it_first_moves(
    page: Any, viewer_server: ServerProcess, video_root: Path
) -> None:
    open_viewer(page, viewer_server, "#dataset=cams-v3&episode=1")
    row = oracle(video_root / "cams-v3", [1]).slice(0, 1)
    legend = page.locator(".chart[data-feature='action'] .u-legend .u-value").all_inner_texts()
    assert legend == [f"{row['timestamp'][0].as_py():.3f}", *(f"{v:.4f}" for v in row["action"][0].as_py())]


def test_breadcrumb_names_the_dataset_and_the_episode_as_separate_links(
    page: Any, viewer_server: ServerProcess
) -> None:
    open_viewer(page, viewer_server, "#dataset=cams-v3&episode=1")
    assert page.locator("#crumbs a").all_inner_texts() == ["cams-v3", "episode 1"]
    assert page.locator("#crumbs .separator").all_inner_texts() == ["\u203a", "\u203a"]


def test_the_address_points_at_the_frame_on_screen(page: Any, viewer_server: ServerProcess) -> None:
    open_viewer(page, viewer_server, "#dataset=cams-v3&episode=1&frame=5")
    assert page.inner_text("#position").startswith("frame 5 / ")
    page.locator("#step-forward").click()
    assert page.evaluate("location.hash") == "#dataset=cams-v3&episode=1&frame=6"
    shared = page.evaluate("location.href")
    page.goto("about:blank")
    page.goto(shared)
    page.wait_for_function("(() => { const v = window.episerveViewer; return v && v.ready; })()")
    assert page.inner_text("#position").startswith("frame 6 / ")
    assert page.locator("figure.camera .frame-label").first.inner_text().endswith("frame 6")


def test_a_frame_past_the_episode_shows_its_last_frame_and_says_so(page: Any, viewer_server: ServerProcess) -> None:
    open_viewer(page, viewer_server, "#dataset=cams-v3&episode=1&frame=100000")
    last = viewer_state(page, "v.view.length") - 1
    assert page.inner_text("#position").startswith(f"frame {last} / {last}")
    assert f"Frame 100000 is past the episode's last frame, {last}" in page.inner_text("#message")


def test_each_dimension_on_its_own_scale_draws_them_in_0_to_1_and_keeps_the_recorded_legend(
    page: Any, viewer_server: ServerProcess
) -> None:
    open_viewer(page, viewer_server, "#dataset=cams-v3&episode=1")
    chart = page.locator(".chart[data-feature='action']")
    legend_before = chart.locator(".u-legend .u-value").all_inner_texts()
    chart.locator(".scale-toggle input").check()
    drawn = page.evaluate(
        "(() => { const v = window.episerveViewer.view;"
        " return v.plots.find((e) => e.feature === 'action').plot.data.slice(1); })()"
    )
    for dimension in drawn:
        values = [v for v in dimension if v is not None]
        assert min(values) == 0 and max(values) == 1
    assert viewer_state(page, "v.view.plots.find((e) => e.feature === 'action').scaled") is True
    assert chart.locator(".u-legend .u-value").all_inner_texts() == legend_before
