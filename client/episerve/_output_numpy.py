"""The numpy output: numeric columns as numpy arrays (views of the response where possible), others as lists."""

from __future__ import annotations

from typing import Any

import numpy as np

from episerve._columns import Columns

MISSING = ""  # numpy is always there


def available() -> bool:
    return True


empty = np.empty  # where a batch's large copies go: plain numpy arrays


def convert(columns: Columns) -> dict[str, Any]:
    """Numeric arrays as they are; object arrays (strings, bytes, lists, images of mixed shapes) as lists."""
    return {name: values.tolist() if values.dtype == object else values for name, values in columns.items()}
