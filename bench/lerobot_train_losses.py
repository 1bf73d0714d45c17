"""LeRobot's own `lerobot_train` through the switch, in this process, with every training step's loss recorded.

    python -m bench.lerobot_train_losses OUT.json --episerve-url URL <lerobot-train arguments>

The training script is `python -m episerve.lerobot.train`'s `main()`, unchanged; only LeRobot's `update_policy` is
wrapped to note each step's loss (what the script logs as `loss`). When training ends, OUT.json gets
`{"losses": [one per step], "seconds": wall time of the whole run}`.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any


def main() -> None:
    out, *arguments = sys.argv[1:]
    from lerobot.scripts import lerobot_train

    from episerve.lerobot.train import main as train_main

    losses: list[float] = []
    original = lerobot_train.update_policy

    def update_policy(*args: Any, **kwargs: Any) -> Any:
        metrics, output = original(*args, **kwargs)
        losses.append(float(metrics.loss.val))
        return metrics, output

    lerobot_train.update_policy = update_policy
    started = time.monotonic()
    train_main(arguments)
    Path(out).write_text(json.dumps({"losses": losses, "seconds": time.monotonic() - started}))


if __name__ == "__main__":
    main()
