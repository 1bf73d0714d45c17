"""Request body deadlines: a body must have arrived `body_timeout_s` after its first reader started (the fast lane
or the route it hands the request on to), else 408 and the connection closed."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

import anyio

from app.errors import ProblemError

_BODY_DEADLINE = "episerve.body_deadline"


def body_deadline(scope: dict[str, Any], timeout_s: float) -> float:
    """When the request body must have arrived (event loop clock): `timeout_s` after its first reader started, be
    that the fast lane or the route it hands the request on to."""
    if _BODY_DEADLINE not in scope:
        scope[_BODY_DEADLINE] = asyncio.get_running_loop().time() + timeout_s
    return scope[_BODY_DEADLINE]


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
