"""The release soak (`python -m bench.soak`) in half a minute, so CI keeps it working: a real server with supervised
workers, mixed trainers, slow and stalling readers, a truncated segment and a re-uploaded object, and its zeros."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from tests.support import ROOT

pytest.importorskip("moto.server", reason="moto (a dev dependency) runs the soak's S3 server")


def test_a_short_soak_has_no_wrong_row_no_5xx_no_client_error_and_no_unlogged_death() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "bench.soak", "--minutes", "0.5", "--trainers", "2"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=240,
    )
    report = done.stdout
    assert done.returncode == 0, report + done.stderr[-3000:]
    assert report.rstrip().endswith("**PASS**")
    total = re.search(r"\| \*\*all\*\* \| ([\d,]+) \| ([\d,]+) \| ([\d,]+) \|", report)
    assert total is not None, report
    requests, rows, wrong = (int(value.replace(",", "")) for value in total.groups())
    assert requests > 50 and rows > 1000 and wrong == 0, report
    for kind in ("rows", "take", "windows", "frames", "objects", "slow", "stall"):
        assert re.search(rf"^\| {kind} \| [1-9]", report, re.MULTILINE), f"no {kind} request:\n{report}"
    assert "5xx answers: 0 seen by clients, 0 in the server's log" in report
    assert "client errors by kind: 0" in report
    assert re.search(r"worker deaths: \d+ logged .*; 0 unlogged", report), report
