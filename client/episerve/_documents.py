"""Mixture documents read from files as hostile input: at most `MAX_DOCUMENT_BYTES`, YAML without aliases (an alias
bomb expands a few lines into gigabytes), nesting bounded, and no error quoting the content."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

MAX_DOCUMENT_BYTES = 1024 * 1024


def read_document(path: Path) -> Any:
    """The JSON or YAML (`.yaml`/`.yml`, needs PyYAML) document in `path`; ValueError saying what is wrong."""
    with open(path, "rb") as handle:
        raw = handle.read(MAX_DOCUMENT_BYTES + 1)
    if len(raw) > MAX_DOCUMENT_BYTES:
        raise ValueError(f"{path.name} is larger than {MAX_DOCUMENT_BYTES:,} bytes")
    text = raw.decode("utf-8", errors="strict")
    try:
        if path.suffix.lower() not in (".yaml", ".yml"):
            return json.loads(text)
        return _yaml(path, text)
    except RecursionError:
        raise ValueError(f"{path.name} is nested too deeply") from None


def _yaml(path: Path, text: str) -> Any:
    try:
        import yaml
    except ImportError as exc:
        raise ImportError(f"reading {path} needs PyYAML: pip install 'episerve[yaml]'") from exc

    class NoAliases(yaml.SafeLoader):
        def compose_node(self, parent: Any, index: Any) -> Any:
            if self.check_event(yaml.AliasEvent):
                raise ValueError(f"{path.name}: YAML aliases are not allowed in a mixture")
            return super().compose_node(parent, index)

    try:
        return yaml.load(text, Loader=NoAliases)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        raise ValueError(f"{path.name}: YAML syntax error{where}: {getattr(exc, 'problem', '')}") from None
