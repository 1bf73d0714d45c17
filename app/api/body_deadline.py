"""Request body deadlines: a body must have arrived `body_timeout_s` after its reader started, else 408 and the
connection closed."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

import anyio

from app.errors import ProblemError


def body_deadline(timeout_s: float) -> float:
    """When a request body whose reading starts now must have arrived (event loop clock)."""
    return asyncio.get_running_loop().time() + timeout_s


def until(deadline: float) -> contextlib.AbstractAsyncContextManager[Any]:
    """A block that raises `TimeoutError` at `deadline` (event loop clock). asyncio's own timeout is one timer;
    anyio's (Python 3.10) costs a few more microseconds per request."""
    if hasattr(asyncio, "timeout_at"):
        return asyncio.timeout_at(deadline)
    return _anyio_until(deadline)


@contextlib.asynccontextmanager
async def _anyio_until(deadline: float) -> AsyncIterator[None]:
    with anyio.fail_after(max(0.0, deadline - asyncio.get_running_loop().time())):
        yield


def body_timeout(timeout_s: float) -> ProblemError:
    """408 for a body slower than `timeout_s`; the connection is closed, since the rest of the body may follow."""
    detail = f"the request body did not arrive within {timeout_s:g} s"
    return ProblemError(detail, status=408, headers={"Connection": "close"})
