"""Every code block of the front page and the documentation, run as a reader would run it, against a real server.

Each fenced block of README.md and docs/**/*.md is checked (`tests/docs_blocks.py` finds them):
- `python` blocks run as scripts with this interpreter (the venv's python), `bash` blocks with `bash -euo
  pipefail` with the venv's bin first on PATH (`episerve-server`, `python`), where `curl` fails on an HTTP error;
  a page's blocks run in order in one working directory (a `curl` that writes rows.arrow, then the block that
  reads it), which holds `.venv` (this venv) as a checkout would: one test per page, but for the site's front
  page (docs/index.md), README.md with its links rewritten, whose commands are checked to be README's;
- `json`, `yaml` and `toml` blocks are parsed; a block marked `quotes FILE` must be a run of that file's lines;
  `text` blocks (outputs, layouts, diagrams) are shown only; any other language, or none, fails;
- a command block marked `<!-- docs-test: skip (reason) -->` is reported as skipped with its reason (`-ra` lists
  them); no other block is left out.

One server per session (per xdist worker) serves datasets under the ids the docs use: the built-in demo (`demo`),
`lerobot/pusht`, and the two robots of the mixtures page (`so100/pick`, 6 joints and camera `observation.images.top`;
`aloha/fold`, 14 joints and camera `observation.images.cam_high`). Before a block runs, the addresses and paths the
docs use are rewritten to the test's (`rewrites`): `http://127.0.0.1:8000`, `localhost:8000` and the deploy page's
`http://trainbox:8080` to the server, `--root /data` to its datasets root and `--cache-dir /cache` to a cache
directory of the page's own (so that one page's `cache clear` cannot race another's `verify`). A block that fails
shows its page and line, the script as run and its output.
"""

from __future__ import annotations

import ast
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pyarrow as pa
import pytest
import yaml

from app.demo import write_demo_dataset
from app.demo_cameras import TOP_CAMERA
from tests.docs_blocks import PARSED, RUNNABLE, SHOWN, Block, all_blocks
from tests.support import ROOT, ServerProcess, free_port, session_directory, written_once

if sys.version_info >= (3, 11):
    import tomllib
else:
    import tomli as tomllib

BLOCKS = all_blocks()
BLOCK_TIMEOUT_S = 300
VENV_BIN = Path(sys.executable).parent


def _id(block: Block) -> str:
    return f"{block.where}-{block.lang or 'none'}"


# --------------------------------------------------------------------------------------------------------------
# The datasets the docs name, and the server


def write_docs_datasets(root: Path, default_demo: Path) -> None:
    """The datasets the docs' examples read, under the ids they use."""
    shutil.copytree(default_demo, root / "demo", copy_function=os.link)  # the built-in demo, as `make serve` serves it
    write_demo_dataset(root / "lerobot" / "pusht", episodes=100, seed=11, cameras={})
    write_demo_dataset(root / "so100" / "pick", episodes=20, seed=12, cameras={TOP_CAMERA: (32, 64)})
    write_demo_dataset(
        root / "aloha" / "fold", episodes=200, seed=13, joints=14, cameras={"observation.images.cam_high": (32, 64)}
    )


@pytest.fixture(scope="session")
def docs_data(tmp_path_factory: pytest.TempPathFactory, default_demo: Path) -> tuple[Path, Path]:
    """(datasets root, cache directory), written once and shared by every xdist worker of the session."""
    root = written_once(tmp_path_factory, "docs-datasets", lambda root: write_docs_datasets(root, default_demo))
    cache = session_directory(tmp_path_factory) / "docs-cache"
    cache.mkdir(exist_ok=True)
    return root, cache


@pytest.fixture(scope="session")
def docs_server(docs_data: tuple[Path, Path], tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    root, cache = docs_data
    # Every worker's server shares the one cache directory, as replicas do; its log goes beside this worker's files.
    server = ServerProcess([root], cache)
    server.log_path = tmp_path_factory.mktemp("docs-server") / "server.log"
    with server as running:
        yield running


def rewrites(server: ServerProcess, root: Path, cache: Path) -> dict[str, str]:
    """What the docs say -> what the test runs."""
    return {
        "http://127.0.0.1:8000": server.url,
        "localhost:8000": server.url.removeprefix("http://"),
        "http://trainbox:8080": server.url,
        "--root /data": f"--root {root}",
        "--cache-dir /cache": f"--cache-dir {cache}",
    }


def rewritten(text: str, table: dict[str, str]) -> str:
    for said, meant in table.items():
        text = text.replace(said, meant)
    return text


# --------------------------------------------------------------------------------------------------------------
# Running a page's blocks in order

BASH_PRELUDE = """\
# The docs' curl commands, failing on an HTTP error as a reader would notice one.
curl() { command curl --fail-with-body --show-error "$@"; }
"""


def run_block(block: Block, workdir: Path, env: dict[str, str], table: dict[str, str]) -> str | None:
    """Run one block in `workdir`; None when it succeeds, else what failed: page, line, the script, its output."""
    script = rewritten(block.text, table)
    if block.lang == "python":
        path = workdir / f"block_{block.line}.py"
        path.write_text(script)
        command = [sys.executable, path.name]
    else:
        path = workdir / f"block_{block.line}.sh"
        path.write_text(BASH_PRELUDE + script)
        command = ["bash", "-euo", "pipefail", path.name]
    try:
        done = subprocess.run(
            command,
            cwd=workdir,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            timeout=BLOCK_TIMEOUT_S,
        )
    except subprocess.TimeoutExpired as exc:
        output = (exc.stdout or b"").decode(errors="replace")
        return _failure(block, script, f"did not finish within {BLOCK_TIMEOUT_S} s", output)
    if done.returncode != 0:
        return _failure(block, script, f"exit status {done.returncode}", done.stdout.decode(errors="replace"))
    return None


def _failure(block: Block, script: str, what: str, output: str) -> str:
    numbered = "\n".join(f"{block.line + n:5d}  {line}" for n, line in enumerate(script.splitlines(), start=1))
    return f"{block.where}: the {block.lang} block failed: {what}\n{numbered}\n--- output ---\n{output[-8000:]}"


@pytest.fixture(scope="session")
def block_env(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """The environment of every block: this venv first on PATH, no EPISERVE_* settings of the caller's."""
    home = tmp_path_factory.mktemp("docs-home")
    env = {k: v for k, v in os.environ.items() if not k.startswith("EPISERVE_")}
    return env | {
        "PATH": f"{VENV_BIN}{os.pathsep}{env.get('PATH', '')}",
        "PYTHONUNBUFFERED": "1",
        # LeRobot, through the switch, must not reach the Hub nor write into the real home's cache.
        "HF_HUB_OFFLINE": "1",
        "HF_DATASETS_OFFLINE": "1",
        "HF_LEROBOT_HOME": str(home / "lerobot"),
        "HF_HOME": str(home / "huggingface"),
    }


# --------------------------------------------------------------------------------------------------------------
# The tests

# The site's front page is README.md with its links rewritten (tests/test_docs_site.py): its commands are README's,
# as test_the_site_front_page_has_the_readmes_commands checks, and run once, as README's.
SITE_FRONT_PAGE = "docs/index.md"


def commands_of(page: str) -> list[Block]:
    """The blocks of `page` that run, in order."""
    return [b for b in BLOCKS if b.page == page and b.lang in RUNNABLE and b.marker != "skip"]


PAGES_WITH_COMMANDS = sorted({b.page for b in BLOCKS if b.lang in RUNNABLE and b.marker != "skip"} - {SITE_FRONT_PAGE})


@pytest.mark.parametrize("page", PAGES_WITH_COMMANDS)
def test_the_commands_of_a_page_run(
    page: str,
    docs_server: ServerProcess,
    docs_data: tuple[Path, Path],
    block_env: dict[str, str],
    tmp_path: Path,
) -> None:
    """The page's python and bash blocks, in order, in one working directory (with `.venv` as in a checkout), the
    command-line tools on a cache of their own; every failing block is reported with its page and line."""
    root, _ = docs_data
    (tmp_path / ".venv").symlink_to(VENV_BIN.parent)
    table = rewrites(docs_server, root, tmp_path / "cli-cache")
    failures = []
    for block in commands_of(page):
        failure = run_block(block, tmp_path, block_env, table)
        if failure is not None:
            failures.append(failure)
    if failures:
        pytest.fail("\n\n".join(failures), pytrace=False)


def test_the_site_front_page_has_the_readmes_commands() -> None:
    """The commands of docs/index.md are README.md's, in the same order (so README's run covers both pages)."""
    front, readme = commands_of(SITE_FRONT_PAGE), commands_of("README.md")
    assert [(b.lang, b.text) for b in front] == [(b.lang, b.text) for b in readme]
    assert front, "the site's front page has no command: the README's run covers nothing of it"


@pytest.mark.parametrize("block", [b for b in BLOCKS if b.marker == "skip"], ids=_id)
def test_a_command_marked_skip_is_reported_with_its_reason(block: Block) -> None:
    assert block.lang in RUNNABLE, f"{block.where}: only commands are skipped; a {block.lang} block is checked"
    pytest.skip(f"{block.where}: {block.argument}")


@pytest.mark.parametrize("block", [b for b in BLOCKS if b.lang in PARSED or b.marker == "quotes"], ids=_id)
def test_file_block_parses_and_matches_what_it_quotes(block: Block) -> None:
    try:
        if block.lang == "json":
            json.loads(block.text)
        elif block.lang == "yaml":
            list(yaml.safe_load_all(block.text))
        elif block.lang == "toml":
            tomllib.loads(block.text)
    except (ValueError, yaml.YAMLError) as exc:
        pytest.fail(f"{block.where}: the {block.lang} block does not parse: {exc}", pytrace=False)
    if block.marker == "quotes":
        quoted = (ROOT / block.argument).read_text(encoding="utf-8").splitlines()
        lines = block.text.splitlines()
        runs = (quoted[i : i + len(lines)] for i in range(len(quoted) - len(lines) + 1))
        assert any(run == lines for run in runs), f"{block.where}: the block is not a part of {block.argument}"


def test_every_block_has_a_language_this_test_knows() -> None:
    unknown = [f"{b.where}: {b.lang or '(none)'}" for b in BLOCKS if b.lang not in RUNNABLE | PARSED | SHOWN]
    assert unknown == [], f"blocks whose language says neither how to run nor how to check them: {unknown}"


def test_python_examples_ending_in_an_expression_print_it() -> None:
    """Pasted into a script, a last bare expression shows nothing: an example ends by printing what it shows."""

    def shows_something(statement: ast.stmt) -> bool:
        if not isinstance(statement, ast.Expr):
            return True
        call = statement.value
        if not isinstance(call, ast.Call):
            return False
        name = call.func.id if isinstance(call.func, ast.Name) else getattr(call.func, "attr", "")
        return name in {"print", "show"}

    silent = [b.where for b in BLOCKS if b.lang == "python" and not shows_something(ast.parse(b.text).body[-1])]
    assert silent == []


def test_make_serve_serves_the_demo_on_the_port_given(
    docs_data: tuple[Path, Path], tmp_path_factory: pytest.TempPathFactory
) -> None:
    """`make serve PORT=N` (the quick start's command, with this venv already installed) serves the demo on port N."""
    if shutil.which("make") is None:
        pytest.skip("no make")
    root, _ = docs_data
    cache = tmp_path_factory.mktemp("make-serve-cache")
    # The demo `make serve` generates on first start, already in place where the cache keeps it (docs/cache.md).
    shutil.copytree(root / "demo", cache / "demo-root" / "demo", copy_function=os.link)
    venv = VENV_BIN.parent
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("EPISERVE_")} | {"EPISERVE_CACHE_DIR": str(cache)}
    # -o: the venv is there already; make must not reinstall it even where a pinned file is newer than its stamp.
    command = ["make", "-s", "-o", f"{venv}/.serve-installed", "serve", f"PORT={port}", f"VENV={venv}"]
    log = cache.parent / "make-serve.log"
    with log.open("wb") as output:
        process = subprocess.Popen(
            command, cwd=ROOT, env=env, stdout=output, stderr=subprocess.STDOUT, start_new_session=True
        )
    try:
        deadline = time.monotonic() + 120
        with httpx.Client(timeout=2.0) as probe:  # one client for every poll: a new one costs its TLS context
            while True:
                assert process.poll() is None, log.read_text()
                try:
                    answer = probe.get(f"http://127.0.0.1:{port}/datasets")
                    if answer.status_code == 200:
                        break
                except httpx.TransportError:
                    pass
                assert time.monotonic() < deadline, log.read_text()
                time.sleep(0.2)
        assert [d["id"] for d in answer.json()["datasets"]] == ["demo"]
        rows = httpx.get(f"http://127.0.0.1:{port}/datasets/demo/rows?episodes=5,2&columns=episode_index", timeout=30)
        episodes = pa.ipc.open_stream(rows.content).read_all()["episode_index"].to_pylist()
        assert episodes == sorted(episodes) and set(episodes) == {2, 5}
    finally:
        os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
