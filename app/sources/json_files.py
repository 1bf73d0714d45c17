"""Metadata files in JSON and JSON lines, with errors that name the file."""

from __future__ import annotations

import json
from typing import Any

from app.errors import DatasetError
from app.sources.files import DatasetPath


def read_json(path: DatasetPath) -> dict[str, Any]:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise DatasetError(f"{path}: unreadable JSON ({exc})") from exc


def read_jsonl(path: DatasetPath) -> list[dict[str, Any]]:
    """Every line of a JSON lines file (none when it does not exist)."""
    if not path.is_file():
        return []
    try:
        return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    except ValueError as exc:
        raise DatasetError(f"{path}: unreadable JSON lines ({exc})") from exc
