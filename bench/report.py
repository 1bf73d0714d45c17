"""Results as rows of one Markdown table: episerve and a peer side by side, their ratio, the target, and whether
the target is met."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Row:
    """One comparison. `ratio` is episerve ÷ peer in the row's unit (so for times, below 1 means faster)."""

    figure: str
    case: str
    unit: str
    episerve: float | None
    peer: str
    peer_value: float | None
    target: str = ""
    met: bool | None = None
    note: str = ""

    @property
    def ratio(self) -> float | None:
        if self.episerve is None or not self.peer_value:
            return None
        return self.episerve / self.peer_value


def fmt(value: float | None) -> str:
    """Readable numbers: thousands separators for large values, three significant digits for small ones."""
    if value is None:
        return "-"
    if abs(value) >= 100:
        return f"{value:,.0f}"
    if abs(value) >= 10:
        return f"{value:.1f}"
    return f"{value:.2f}"


def markdown(rows: Sequence[Row]) -> str:
    """The table, one line per row, in the order given."""
    lines = [
        "| # | case | unit | episerve | peer | peer value | ratio | target | met |",
        "|---|---|---|---:|---|---:|---:|---|:-:|",
    ]
    for row in rows:
        ratio = "-" if row.ratio is None else f"{row.ratio:.2f}x"
        met = {True: "yes", False: "**no**", None: ""}[row.met]
        case = f"{row.case} ({row.note})" if row.note else row.case
        lines.append(
            f"| {row.figure} | {case} | {row.unit} | {fmt(row.episerve)} | {row.peer} | {fmt(row.peer_value)} "
            f"| {ratio} | {row.target} | {met} |"
        )
    return "\n".join(lines)
