"""The pins of Hub datasets' revisions (`app.sources.hub_pins`), directly: processes asking at once resolve a revision
once and all get its commit; a pin outlives its process, is replaced for another revision or by a refresh, and a
damaged pin is resolved again. tests/test_hub.py covers the same through real servers and the local Hub."""

from __future__ import annotations

import multiprocessing
import time
from pathlib import Path

from app.sources.hub_pins import RevisionPins

COMMITS = [f"{n:040x}" for n in range(1, 9)]


def _pin_slowly(directory: str, commit: str, out: multiprocessing.Queue) -> None:  # type: ignore[type-arg]
    """In another process: pin `main`, resolving it (slowly) to `commit` if no pin is there."""

    def resolve() -> str:
        time.sleep(0.3)  # long enough for the others to ask meanwhile
        return commit

    out.put(RevisionPins(Path(directory)).pinned("org/name", "main", resolve).commit)


def test_processes_pinning_at_once_resolve_the_revision_once_and_agree_on_its_commit(tmp_path: Path) -> None:
    context = multiprocessing.get_context("spawn")
    out = context.Queue()
    processes = [context.Process(target=_pin_slowly, args=(str(tmp_path), c, out)) for c in COMMITS[:4]]
    for process in processes:
        process.start()
    commits = [out.get(timeout=60) for _ in processes]
    for process in processes:
        process.join(10)
    assert len(set(commits)) == 1 and commits[0] in COMMITS[:4]
    assert RevisionPins(tmp_path).read("org/name").commit == commits[0]  # type: ignore[union-attr]


def test_a_pin_is_kept_replaced_for_another_revision_refreshed_and_resolved_again_when_damaged(tmp_path: Path) -> None:
    resolved: list[str] = []

    def resolving_to(commit: str):  # type: ignore[no-untyped-def]
        def resolve() -> str:
            resolved.append(commit)
            return commit

        return resolve

    pins = RevisionPins(tmp_path)
    assert pins.pinned("org/name", "main", resolving_to(COMMITS[0])).commit == COMMITS[0]
    assert RevisionPins(tmp_path).pinned("org/name", "main", resolving_to(COMMITS[1])).commit == COMMITS[0]
    assert resolved == [COMMITS[0]]  # kept: not resolved again
    assert pins.pinned("org/name", "v2.1", resolving_to(COMMITS[2])).commit == COMMITS[2]  # another revision
    before, now = pins.refresh("org/name", "v2.1", resolving_to(COMMITS[3]))
    assert (before.commit, now.commit, now.revision) == (COMMITS[2], COMMITS[3], "v2.1")  # type: ignore[union-attr]
    (tmp_path / "org/name.json").write_text('{"repo_id": "org/name", "revision": "v2.1", "commit": "cut sh')
    assert pins.read("org/name") is None
    assert pins.pinned("org/name", "v2.1", resolving_to(COMMITS[4])).commit == COMMITS[4]
    assert [(p.repo_id, p.revision, p.commit) for p in pins.all()] == [("org/name", "v2.1", COMMITS[4])]
    assert sorted(p.name for p in (tmp_path / "org").iterdir()) == ["name.json", "name.json.lock"]  # no temporaries
