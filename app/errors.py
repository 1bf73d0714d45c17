"""The server's errors. Each names what was wrong and the HTTP status it is answered with, as a problem
document (see `app.api.problems`). The client has its own error classes (`episerve.NotFound`...), named after
what the client sees; these are named after what the server found."""

from __future__ import annotations

import re


class ProblemError(Exception):
    """Base of every error the server reports to a client: `status`, `title` and a `detail` saying what was
    wrong; `limit` (a configured maximum) and `headers` travel with the answer when given."""

    status = 400
    title = "Bad request"
    # A 503 that a retry cannot cure (the operator must fix a file first): answered without `Retry-After` and with
    # `"transient": false`, so that clients give up at once instead of retrying for their whole deadline.
    permanent = False

    def __init__(
        self,
        detail: str,
        *,
        status: int | None = None,
        headers: dict[str, str] | None = None,
        limit: int | None = None,
    ) -> None:
        super().__init__(detail)
        self.detail = detail
        if status is not None:
            self.status = status
            self.title = ""  # the status's own phrase
        self.headers = headers
        self.limit = limit

    def public_detail(self) -> str:
        """`detail` as a client gets it: in a server-side error (5xx), absolute paths of the server's files are cut
        to their last two components (`.../meta/info.json`); the server's log keeps them whole."""
        if self.status < 500:
            return self.detail
        return _ABSOLUTE_PATH.sub(_shortened, self.detail)


# An absolute POSIX path: a `/` that does not continue a word, a URL (`s3://`, `http://`) or a relative path.
_ABSOLUTE_PATH = re.compile(r"(?<![\w.:/~-])/[^\s'\"`:;,()<>\[\]{}]+")


def _shortened(match: re.Match[str]) -> str:
    parts = [part for part in match.group(0).split("/") if part]
    return ".../" + "/".join(parts[-2:])


class InvalidInput(ProblemError):
    """The request is well-formed but asks for something impossible (bad spec, unknown column...)."""

    status = 422
    title = "Invalid request"


class DoesNotExist(ProblemError):
    """A dataset, episode or route that does not exist."""

    status = 404
    title = "Not found"


class OverLimit(ProblemError):
    """The request exceeds a configured limit (`limit`, reported to the client as a number)."""

    status = 413
    title = "Request too large"

    def __init__(self, detail: str, limit: int) -> None:
        super().__init__(detail, limit=limit)


class TryLater(ProblemError):
    """A transient condition (e.g. a source file changed mid-build, a download under way); retrying may succeed."""

    status = 503
    title = "Service unavailable"


class DatasetError(ProblemError):
    """A dataset on disk is unreadable or inconsistent (an operator problem, not the client's): retrying does not
    help until the operator fixes it (`permanent`), unless a subclass says otherwise."""

    status = 503
    title = "Dataset unavailable"
    permanent = True


class WouldBlock(Exception):
    """A read asked not to block found it would have to: load an index, map or build a segment, read a source
    file, or gather more bytes than its budget. Not a client error: the caller runs the read where it may block."""
