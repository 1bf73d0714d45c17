"""app/api/http_protocol.py overrides hooks of uvicorn's httptools protocol and relies on what they do: this test
fails when uvicorn changes one of them, so a uvicorn release is taken only after the overrides are read against it
(then the recorded digests below are updated, and the cap in pyproject.toml raised)."""

from __future__ import annotations

import hashlib
import inspect

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from app.api.http_protocol import BoundedHttpToolsProtocol

# uvicorn 0.54.0: the source of every hook the protocol overrides, as sha256[:16].
RECORDED = {
    "__init__": "4f08999410347141",
    "connection_made": "6efb565ff3d36b91",
    "connection_lost": "c91a4c9bf2e29c55",
    "pause_writing": "17a8fd215d96a13c",
    "resume_writing": "7844bbaa8cceb1ef",
    "data_received": "010a7ae59a5d3b1a",
    "on_message_begin": "96d377fdc7c2baef",
    "on_message_complete": "1fbad42dc31fc01f",
    "on_response_complete": "64e254f28e389e76",
    "on_header": "65d62c044f61fdbd",
    "on_url": "37be44e962b04ca8",
    "on_headers_complete": "1ea8589acfad92d8",
    "send_400_response": "ae5a4a3782b646fd",
}


def _overridden() -> dict[str, str]:
    hooks = {}
    for name, value in vars(BoundedHttpToolsProtocol).items():
        base = getattr(HttpToolsProtocol, name, None)
        if callable(value) and base is not None:
            hooks[name] = hashlib.sha256(inspect.getsource(base).encode()).hexdigest()[:16]
    return hooks


def test_every_overridden_uvicorn_hook_is_unchanged() -> None:
    hooks = _overridden()
    assert set(hooks) == set(RECORDED), "the protocol overrides other hooks than recorded: record them"
    changed = sorted(name for name, digest in hooks.items() if RECORDED[name] != digest)
    assert not changed, f"uvicorn changed the hooks {changed} that app/api/http_protocol.py overrides"
