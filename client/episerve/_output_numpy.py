"""The numpy output: numeric columns as numpy arrays (views of the response where possible), others as lists."""

from __future__ import annotations

from typing import Any

import numpy as np

from episerve._columns import Columns

MISSING = ""  # numpy is always there


def available() -> bool:
    return True


class NumpyFormatter:
    """Numeric arrays as they are; object arrays (strings, bytes, lists, images of mixed shapes) as lists."""

    frames = None  # camera frames copied channels-first into plain numpy arrays
    empty = staticmethod(np.empty)

    def format(self, columns: Columns) -> dict[str, Any]:
        return {name: values.tolist() if values.dtype == object else values for name, values in columns.items()}
