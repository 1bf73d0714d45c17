"""Bearer tokens: 401 without one, 403 with a wrong one, when tokens are configured (`app.auth` compares them)."""

from __future__ import annotations

from fastapi import Request

from app.auth import TokenCheck, TokenVerifier
from app.errors import ProblemError


async def require_token(request: Request) -> None:
    """401 without a bearer token, 403 with a wrong one, when tokens are configured."""
    check_token(request)


def check_token(request: Request) -> None:
    """The check behind `require_token`, for callers outside dependency injection."""
    verifier: TokenVerifier = request.app.state.token_verifier
    result = verifier.check(request.headers.get("authorization"))
    if result is TokenCheck.MISSING:
        raise ProblemError(
            "this server requires a bearer token (Authorization: Bearer <token>)",
            status=401,
            headers={"WWW-Authenticate": "Bearer"},
        )
    if result is TokenCheck.INVALID:
        raise ProblemError("the bearer token is not accepted", status=403)
