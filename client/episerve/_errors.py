"""The exceptions the client raises: one base class, server-reported problems, and exhausted retries."""

from __future__ import annotations

from typing import Any


class EpiserveError(Exception):
    """Base class of every error the episerve client raises."""


class ServerError(EpiserveError):
    """The server answered with an error status; carries its problem details (`title`, `detail`)."""

    def __init__(
        self,
        status: int,
        title: str,
        detail: str,
        *,
        method: str = "",
        url: str = "",
        body: dict[str, Any] | None = None,
    ) -> None:
        self.status = status
        self.title = title
        self.detail = detail
        self.method = method
        self.url = url
        self.body = body or {}
        super().__init__(f"{status} {title}: {detail} ({method} {url})" if url else f"{status} {title}: {detail}")


class InvalidRequest(ServerError):
    """400, 415 or 422: the request is malformed (bad episode spec, unknown column, index out of range...)."""


class Unauthorized(ServerError):
    """401 or 403: the bearer token is missing or not accepted."""


class NotFound(ServerError):
    """404: the dataset or some of the requested episodes do not exist."""


class TooLarge(ServerError):
    """413: the request exceeds a server limit (rows per response, indices per take, body size)."""


class Unavailable(ServerError):
    """502, 503 or 504 (or 429) still answered when the retry budget was spent."""


class ConnectionFailed(EpiserveError):
    """The server could not be reached (connect, read or protocol errors) within the retry budget."""

    def __init__(self, message: str, *, attempts: int, elapsed: float) -> None:
        super().__init__(message)
        self.attempts = attempts
        self.elapsed = elapsed


_BY_STATUS: dict[int, type[ServerError]] = {
    400: InvalidRequest,
    401: Unauthorized,
    403: Unauthorized,
    404: NotFound,
    413: TooLarge,
    415: InvalidRequest,
    422: InvalidRequest,
    429: Unavailable,
    502: Unavailable,
    503: Unavailable,
    504: Unavailable,
}


def server_error(status: int, body: Any, *, reason: str, method: str, url: str) -> ServerError:
    """The typed exception for an error response, from its problem-details body when it has one."""
    problem = body if isinstance(body, dict) else {}
    title = str(problem.get("title") or reason or "Error")
    detail = problem.get("detail")
    if detail is None:
        detail = body if isinstance(body, str) and body else f"HTTP {status}"
    cls = _BY_STATUS.get(status, ServerError)
    return cls(status, title, str(detail), method=method, url=url, body=problem)
