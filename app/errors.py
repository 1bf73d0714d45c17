"""Domain errors. Each names what was wrong; the API layer maps each kind to an HTTP status."""

from __future__ import annotations


class EpiserveError(Exception):
    """Base of every error the server reports to a client."""

    title = "Bad request"

    def __init__(self, detail: str) -> None:
        super().__init__(detail)
        self.detail = detail


class InvalidRequest(EpiserveError):
    """The request is well-formed but asks for something impossible (bad spec, unknown column...)."""

    title = "Invalid request"


class NotFound(EpiserveError):
    """A dataset or episode that does not exist."""

    title = "Not found"


class TooLarge(EpiserveError):
    """The request exceeds a configured limit (`limit`, reported to the client as a number)."""

    title = "Request too large"

    def __init__(self, detail: str, limit: int) -> None:
        super().__init__(detail)
        self.limit = limit


class Unavailable(EpiserveError):
    """A transient condition (e.g. a source file changed mid-build); retrying may succeed."""

    title = "Service unavailable"


class DatasetError(EpiserveError):
    """A dataset on disk is unreadable or inconsistent (an operator problem, not the client's)."""

    title = "Dataset unavailable"


class WouldBlock(Exception):
    """A read asked to run without waiting found it would have to: load an index, map or build a segment, read
    parquet, or gather more bytes than its budget. Not a client error: the caller runs the read normally."""
