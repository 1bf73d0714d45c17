"""The regression guard: the same figures at another commit and at the working tree, interleaved in one run.

    python -m bench.run --compare REF [--only P1,P2,P3,P9,P12] [--rounds 3] [--quick]

REF's `app` (the server) and `client` (the `episerve` package) are exported with `git archive` into a scratch
directory; the benchmark harness, the datasets and the peers are this working tree's, so only the code under test
differs. Each round runs `python -m bench.run --only ...` once per side, the sides alternating which goes first
(A B, B A, ...), so drift of the machine lands on both. A row is compared by its ratio to the peer measured in the
same run (episerve ÷ peer), which cancels most of the machine's noise; rows without a peer by their own value.

A row *lost* when the working tree's median is worse than REF's by more than the row's spread: the larger relative
range ((max - min) ÷ median) of the two sides' rounds, and never less than `MIN_SPREAD`. The guard exits 1 when a
row with a target lost, so a change that costs speed shows before it lands.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import shutil
import statistics
import subprocess
import sys
import tarfile
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from bench.processes import REPO
from bench.report import fmt

DEFAULT_FIGURES = "P1,P2,P3,P9,P12"
MIN_SPREAD = 0.05  # below this, a difference is within what two runs of the same code show here
Key = tuple[str, str, str, str]  # figure, case, unit, peer


@dataclass(frozen=True)
class Side:
    """One side of the comparison: a label and the directory holding its `app` and `client` packages."""

    label: str
    root: Path


@dataclass(frozen=True)
class Compared:
    """One row of the comparison: the medians of both sides over the rounds, and the verdict."""

    key: Key
    gated: bool  # the row has a target, so a loss fails the guard
    lower_is_better: bool
    ref: list[float]
    work: list[float]

    @property
    def change(self) -> float | None:
        """Working tree ÷ REF of the medians, oriented so that below 1 is always a loss."""
        ref, work = statistics.median(self.ref), statistics.median(self.work)
        if not ref or not work:
            return None
        return ref / work if self.lower_is_better else work / ref

    @property
    def spread(self) -> float:
        return max(MIN_SPREAD, _relative_range(self.ref), _relative_range(self.work))

    @property
    def lost(self) -> bool:
        return self.change is not None and self.change < 1.0 - self.spread

    @property
    def verdict(self) -> str:
        if self.change is None:
            return "-"
        if self.lost:
            return "**lost**" if self.gated else "lost (info)"
        return "gained" if self.change > 1.0 + self.spread else "same"


def _relative_range(values: Sequence[float]) -> float:
    middle = statistics.median(values)
    return (max(values) - min(values)) / abs(middle) if len(values) > 1 and middle else 0.0


def _lower_is_better(unit: str) -> bool:
    """Times and memory: the figures' units that are better when smaller."""
    return unit.endswith(" ms") or unit == "s" or unit.startswith("s ") or "RssAnon" in unit or "memory" in unit


def export(ref: str, into: Path) -> Side:
    """REF's `app` and `client` directories, written under `into` (raises ValueError for an unknown REF)."""
    found = subprocess.run(
        ["git", "rev-parse", "--verify", "--quiet", f"{ref}^{{commit}}"], cwd=REPO, capture_output=True, text=True
    )
    if found.returncode != 0:
        raise ValueError(f"--compare: {ref!r} is not a commit of this repository")
    commit = found.stdout.strip()
    into.mkdir(parents=True, exist_ok=True)
    archive = subprocess.run(["git", "archive", commit, "app", "client"], cwd=REPO, capture_output=True, check=True)
    with tempfile.TemporaryFile() as spooled:
        spooled.write(archive.stdout)
        spooled.seek(0)
        with tarfile.open(fileobj=spooled) as tar:
            tar.extractall(into, filter="data")
    return Side(f"{ref} ({commit[:8]})", into)


def _run_side(side: Side, figures: str, quick: bool, workdir: Path, rows_json: Path, log: Path) -> list[dict]:
    """One `python -m bench.run` over `figures` with `side`'s server and client; its rows as dicts."""
    command = [sys.executable, "-m", "bench.run", "--only", figures, "--workdir", str(workdir)]
    command += ["--output", str(rows_json.with_suffix(".md")), "--rows-json", str(rows_json)]
    command += ["--app-path", str(side.root)] + (["--quick"] if quick else [])
    env = dict(os.environ)
    # The side's client comes before the installed one (the editable install points at this working tree).
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(side.root / "client"), env.get("PYTHONPATH", "")]))
    with open(log, "ab") as out:
        done = subprocess.run(command, cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT)
    if done.returncode != 0:
        raise RuntimeError(f"the run of {side.label} failed (exit {done.returncode}); its output is in {log}")
    return json.loads(rows_json.read_text())


def _client_of(side: Side) -> str:
    """Where `import episerve` resolves for `side` (a check that the side's client is the one measured)."""
    env = dict(os.environ, PYTHONPATH=str(side.root / "client"))
    probe = [sys.executable, "-c", "import episerve; print(episerve.__file__)"]
    return subprocess.run(probe, cwd=REPO, env=env, capture_output=True, text=True).stdout.strip()


def _value(row: dict) -> float | None:
    """What a row is compared by: its ratio to the peer of the same run, else its own value."""
    ours, peer = row.get("episerve"), row.get("peer_value")
    if ours is None:
        return None
    return ours / peer if peer else ours


def _collect(runs: dict[str, list[list[dict]]]) -> list[Compared]:
    order: list[Key] = []
    values: dict[Key, dict[str, list[float]]] = {}
    meta: dict[Key, tuple[bool, bool]] = {}
    for side, side_runs in runs.items():
        for rows in side_runs:
            for row in rows:
                key = (row["figure"], row["case"], row["unit"], row["peer"])
                value = _value(row)
                if value is None:
                    continue
                if key not in values:
                    order.append(key)
                    values[key] = {"ref": [], "work": []}
                    gated = bool(row.get("target")) and row.get("target") != "info"
                    meta[key] = (gated, _lower_is_better(row["unit"]))
                values[key][side].append(value)
    return [
        Compared(key, *meta[key], values[key]["ref"], values[key]["work"])
        for key in order
        if values[key]["ref"] and values[key]["work"]
    ]


def table(compared: Sequence[Compared], ref_label: str) -> str:
    lines = [
        f"| # | case | unit | compared by | {ref_label} | working tree | change | spread | verdict |",
        "|---|---|---|---|---:|---:|---:|---:|---|",
    ]
    for row in compared:
        figure, case, unit, peer = row.key
        by = f"÷ {peer}" if peer else "value"
        change = "-" if row.change is None else f"{row.change:.2f}x"
        lines.append(
            f"| {figure} | {case} | {unit} | {by} | {fmt(statistics.median(row.ref))} "
            f"| {fmt(statistics.median(row.work))} | {change} | ±{row.spread:.0%} | {row.verdict} |"
        )
    return "\n".join(lines)


def compare(ref: str, figures: str | None, rounds: int, quick: bool, workdir: Path, output: Path | None) -> int:
    """Run the guard; print and write the table; 0 when no gated row lost, 1 when one did, 2 on a failed run."""
    figures = figures or DEFAULT_FIGURES
    scratch = Path(tempfile.mkdtemp(prefix="episerve-compare-"))
    try:
        try:
            ref_side = export(ref, scratch / "ref")
        except ValueError as error:
            print(error, file=sys.stderr)
            return 2
        sides = {"ref": ref_side, "work": Side("working tree", REPO)}
        for name, side in sides.items():
            print(f"# {name}: {side.label}: client {_client_of(side)}", file=sys.stderr)
        runs: dict[str, list[list[dict]]] = {"ref": [], "work": []}
        log = workdir / "compare.log"
        workdir.mkdir(parents=True, exist_ok=True)
        for round_number in range(rounds):
            order = ["ref", "work"] if round_number % 2 == 0 else ["work", "ref"]
            for name in order:
                print(f"# round {round_number + 1}/{rounds}: {sides[name].label} ...", file=sys.stderr)
                rows_json = scratch / f"{name}-{round_number}.json"
                try:
                    runs[name].append(_run_side(sides[name], figures, quick, workdir, rows_json, log))
                except RuntimeError as error:
                    print(error, file=sys.stderr)
                    return 2
        compared = _collect(runs)
        mode = "quick" if quick else "full"
        lost = [row for row in compared if row.lost and row.gated]
        text = "\n".join(
            [
                f"## Compare ({mode} mode, {dt.date.today().isoformat()}): {ref_side.label} vs the working tree",
                "",
                f"Figures {figures}, {rounds} interleaved round(s) a side; medians over the rounds. change = working "
                "tree ÷ REF, oriented so that below 1 is a loss; spread = the larger relative range of the two sides' "
                f"rounds (at least {MIN_SPREAD:.0%}).",
                "",
                table(compared, ref_side.label),
                "",
                f"{len(lost)} row(s) with a target lost more than their spread."
                if lost
                else "No row with a target lost more than its spread.",
            ]
        )
        print(text)
        output = output or REPO / "bench" / "results" / f"{dt.date.today().isoformat()}-compare-{mode}.md"
        output.parent.mkdir(parents=True, exist_ok=True)
        output.write_text(text + "\n")
        print(f"# written to {output}", file=sys.stderr)
        return 1 if lost else 0
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
