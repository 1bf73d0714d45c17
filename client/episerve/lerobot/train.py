"""`python -m episerve.lerobot.train --episerve-url URL <lerobot-train arguments>`: LeRobot's own training script,
unchanged, with its datasets served by the episerve server at URL.

The URL may come from `$EPISERVE_URL` instead; `--episerve-token TOKEN` (or `$EPISERVE_TOKEN`) authenticates.
`--dataset.repo_id` names the dataset on the server, or several: `'[a,b]'` (a mixture weighted by the datasets'
rows), `mixture:NAME` (the server's named mixture) or `mixture:FILE.yaml` (a mixture document; see
`episerve.lerobot._mixture_repo`). Every other argument is LeRobot's (`lerobot-train --help`).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence

from episerve.lerobot._switch import use_server

USAGE = "usage: python -m episerve.lerobot.train --episerve-url URL [--episerve-token TOKEN] <lerobot-train arguments>"


def split_arguments(argv: Sequence[str]) -> tuple[dict[str, str], list[str]]:
    """episerve's options (`--episerve-url`, `--episerve-token`, as `--name value` or `--name=value`) and the rest,
    in order, for LeRobot."""
    ours: dict[str, str] = {}
    rest: list[str] = []
    arguments = list(argv)
    while arguments:
        argument = arguments.pop(0)
        name, equals, value = argument.partition("=")
        if name not in ("--episerve-url", "--episerve-token"):
            rest.append(argument)
            continue
        if not equals:
            if not arguments:
                raise SystemExit(f"{name} needs a value\n{USAGE}")
            value = arguments.pop(0)
        ours[name.removeprefix("--episerve-")] = value
    return ours, rest


def main(argv: Sequence[str] | None = None) -> None:
    """Switch LeRobot to the server, then run `lerobot.scripts.lerobot_train.main()` on the remaining arguments."""
    ours, rest = split_arguments(sys.argv[1:] if argv is None else argv)
    url = ours.get("url") or os.environ.get("EPISERVE_URL")
    if not url:
        raise SystemExit(f"no episerve server: pass --episerve-url URL or set EPISERVE_URL\n{USAGE}")
    use_server(url, ours.get("token"))
    from lerobot.scripts.lerobot_train import main as lerobot_train_main

    sys.argv = [sys.argv[0], *rest]
    lerobot_train_main()


if __name__ == "__main__":
    main()
