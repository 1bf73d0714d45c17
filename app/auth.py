"""Bearer-token checks: constant-time, and tokens are never logged or echoed."""

from __future__ import annotations

import enum
import hashlib
import hmac


class TokenCheck(enum.Enum):
    OK = "ok"
    MISSING = "missing"
    INVALID = "invalid"


class TokenVerifier:
    """Accepts `Authorization: Bearer <token>` for any configured token; everything passes when none is."""

    def __init__(self, tokens: list[str]) -> None:
        # Digests have a fixed length, so compare_digest's time does not depend on the tokens' lengths.
        self._digests = [hashlib.sha256(t.encode()).digest() for t in tokens]

    @property
    def enabled(self) -> bool:
        return bool(self._digests)

    def check(self, authorization: str | None) -> TokenCheck:
        if not self.enabled:
            return TokenCheck.OK
        scheme, _, credentials = (authorization or "").partition(" ")
        if scheme.lower() != "bearer" or not credentials.strip():
            return TokenCheck.MISSING
        given = hashlib.sha256(credentials.strip().encode()).digest()
        accepted = False
        for digest in self._digests:  # no early exit: the time does not tell which token matched
            accepted |= hmac.compare_digest(digest, given)
        return TokenCheck.OK if accepted else TokenCheck.INVALID
