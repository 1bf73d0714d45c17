"""The fenced code blocks of the front page and the documentation pages, and how each one is to be checked.

A block is run, parsed or shown according to its language (see `RUNNABLE`, `PARSED`, `SHOWN`). A command block that
cannot run in a test carries a marker on the line before its fence, with its reason:

    <!-- docs-test: skip (needs Docker; tests/deploy/run.sh runs it) -->

and a block that quotes a file of the repository names it, so that it is compared with that file:

    <!-- docs-test: quotes docker-compose.yml -->
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from tests.support import ROOT

RUNNABLE = {"python", "bash"}
PARSED = {"json", "yaml", "toml"}
SHOWN = {"text", "dotenv", "ini", "nginx", "dockerfile"}  # outputs, layouts, diagrams and files shown as they are
MARKER = re.compile(r"<!--\s*docs-test:\s*(?P<what>[a-z]+)\s*(?P<rest>.*?)\s*-->")
FENCE = re.compile(r"^(?P<indent>\s*)(?P<fence>`{3,}|~{3,})(?P<lang>[^\s`]*)\s*$")


@dataclass(frozen=True)
class Block:
    """One fenced block: where it is, its language, its text (dedented to its fence), and its marker if any."""

    page: str  # path relative to the repository, e.g. "docs/client.md"
    line: int  # 1-based line of the opening fence
    lang: str
    text: str
    marker: str = ""  # "skip", "quotes", or "" for none
    argument: str = ""  # the skip's reason, or the quoted file

    @property
    def where(self) -> str:
        return f"{self.page}:{self.line}"


def doc_pages() -> list[Path]:
    """README.md, then every page of the documentation site, in path order."""
    return [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def blocks_of(path: Path) -> list[Block]:
    """The fenced blocks of one page, in order. Raises ValueError for a fence left open or a marker that is
    malformed or stands before no block."""
    page = path.relative_to(ROOT).as_posix()
    lines = path.read_text(encoding="utf-8").splitlines()
    found: list[Block] = []
    pending: tuple[str, str, int] | None = None  # a marker waiting for its block
    i = 0
    while i < len(lines):
        line = lines[i]
        marker = MARKER.fullmatch(line.strip())  # a marker is a line of its own
        if marker:
            if pending is not None:
                raise ValueError(f"{page}:{pending[2]}: a docs-test marker stands before no code block")
            pending = _parse_marker(page, i + 1, marker)
            i += 1
            continue
        fence = FENCE.match(line)
        if not fence:
            if pending is not None and line.strip():
                raise ValueError(f"{page}:{pending[2]}: a docs-test marker must stand on the line before a fence")
            i += 1
            continue
        indent, mark = len(fence["indent"]), fence["fence"]
        start = i
        body: list[str] = []
        i += 1
        while i < len(lines) and not re.match(rf"^\s*{re.escape(mark[0])}{{{len(mark)},}}\s*$", lines[i]):
            body.append(lines[i][indent:] if lines[i][:indent].strip() == "" else lines[i])
            i += 1
        if i == len(lines):
            raise ValueError(f"{page}:{start + 1}: a code fence is never closed")
        what, argument = (pending[0], pending[1]) if pending else ("", "")
        found.append(Block(page, start + 1, fence["lang"].lower(), "\n".join(body) + "\n", what, argument))
        pending = None
        i += 1
    if pending is not None:
        raise ValueError(f"{page}:{pending[2]}: a docs-test marker stands before no code block")
    return found


def _parse_marker(page: str, line: int, marker: re.Match[str]) -> tuple[str, str, int]:
    what, rest = marker["what"], marker["rest"]
    if what == "skip":
        reason = re.fullmatch(r"\((.+)\)", rest)
        if not reason:
            raise ValueError(f"{page}:{line}: a skip needs its reason in parentheses: <!-- docs-test: skip (why) -->")
        return what, reason[1], line
    if what == "quotes":
        if not rest or not (ROOT / rest).is_file():
            raise ValueError(f"{page}:{line}: `quotes` names no file of the repository: {rest!r}")
        return what, rest, line
    raise ValueError(f"{page}:{line}: unknown docs-test marker {what!r} (known: skip, quotes)")


def all_blocks() -> list[Block]:
    return [block for path in doc_pages() for block in blocks_of(path)]
