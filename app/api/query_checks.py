"""Query validation: a parameter the matched route does not declare is a 422 naming it, never silently ignored."""

from __future__ import annotations

import difflib
from collections.abc import Iterable

from fastapi import Request
from fastapi.routing import APIRoute

from app.errors import InvalidInput
from app.reads.requests import merged_query


async def reject_unknown_query(request: Request) -> None:
    """The dependency form of `check_query`."""
    check_query(request)


def check_query(request: Request) -> None:
    """422 when the query holds a parameter the matched route does not declare: a misspelled `episode=` must
    not silently select every episode. The detail names each one, the nearest declared name and all of them.
    Also 422 for a repeated parameter other than a list-valued one (see `merged_query`)."""
    if not request.scope.get("query_string"):
        return
    accepted = declared_query_names(request.scope["route"])
    unknown = [name for name in dict.fromkeys(request.query_params.keys()) if name not in accepted]
    if unknown:
        raise InvalidInput(unknown_query_detail(unknown, accepted))
    merged_query(request.query_params.multi_items())  # 422 for a repeated parameter that is not a list


def declared_query_names(route: APIRoute) -> frozenset[str]:
    """The query parameter names a route reads: those of its dependencies, and those it documents itself
    (`openapi_extra`, for routes that parse their query with a request model). Remembered per route."""
    known = _DECLARED_QUERY_NAMES.get(id(route))
    if known is not None:
        return known
    names: set[str] = set()
    pending = [route.dependant]
    while pending:
        dependant = pending.pop()
        names.update(field.alias for field in dependant.query_params)
        pending.extend(dependant.dependencies)
    extra = (route.openapi_extra or {}).get("parameters", [])
    names.update(p["name"] for p in extra if p.get("in") == "query")
    known = _DECLARED_QUERY_NAMES[id(route)] = frozenset(names)
    return known


_DECLARED_QUERY_NAMES: dict[int, frozenset[str]] = {}  # routes live as long as the process


def unknown_query_detail(unknown: Iterable[str], accepted: Iterable[str]) -> str:
    """ "unknown query parameter 'episode' (did you mean 'episodes'?); this endpoint accepts: ..."."""
    accepted = sorted(accepted)
    named = []
    for name in unknown:
        close = difflib.get_close_matches(name, accepted, n=1)
        named.append(repr(name) + (f" (did you mean {close[0]!r}?)" if close else ""))
    noun = "parameter" if len(named) == 1 else "parameters"
    takes = f"this endpoint accepts: {', '.join(accepted)}" if accepted else "this endpoint takes no query parameters"
    return f"unknown query {noun} {', '.join(named)}; {takes}"
