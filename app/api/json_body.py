"""JSON request bodies: content type, declared and actual size, arrival within the body deadline, decoding and
validation into a request model, with a problem (400/408/413/415/422) for each way a body can be wrong."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import orjson
from fastapi import Request
from pydantic import BaseModel, ValidationError

from app.api.body_deadline import body_deadline, body_timeout, until
from app.errors import InvalidInput, OverLimit, ProblemError
from app.reads.requests import validated, validation_detail

M = TypeVar("M", bound=BaseModel)


def json_body_schema(model: type[BaseModel], required: bool = True) -> dict[str, Any]:
    """`openapi_extra` documenting a JSON body that the route reads itself with `read_json_body`. Nested models
    are written out in place: pydantic refers to them under the schema's own `$defs`, which a reference from the
    document's root cannot reach."""
    schema = model.model_json_schema()
    definitions = schema.pop("$defs", {})
    content = {"application/json": {"schema": _inlined(schema, definitions)}}
    return {"requestBody": {"required": required, "content": content}}


def _inlined(node: Any, definitions: dict[str, Any]) -> Any:
    """`node` with every `{"$ref": "#/$defs/X"}` replaced by definition X (the models are not recursive)."""
    if isinstance(node, dict):
        reference = node.get("$ref")
        if isinstance(reference, str) and reference.startswith("#/$defs/"):
            return _inlined(definitions[reference.removeprefix("#/$defs/")], definitions)
        return {key: _inlined(value, definitions) for key, value in node.items()}
    if isinstance(node, list):
        return [_inlined(item, definitions) for item in node]
    return node


async def read_json_body(
    request: Request, model: type[M], max_bytes: int, precheck: Callable[[Any], None] | None = None
) -> M:
    """Parse and validate a JSON body, refusing wrong content types, oversize, slow and malformed bodies.
    `precheck` sees the parsed document before the model validates it: a cheap refusal of a document too big to
    be worth validating."""
    check_json_content_type(request.headers.get("content-type"))
    check_declared_length(request.headers.get("content-length"), max_bytes)
    timeout_s = request.app.state.settings.body_timeout_s
    body = bytearray()
    receive = request.receive
    try:
        async with until(body_deadline(timeout_s)):
            while True:  # straight from `receive`: Starlette's `stream()` is an async generator, dearer per request
                message = await receive()
                if message["type"] == "http.disconnect":  # nobody hears the answer; a problem, so no traceback
                    raise ProblemError("the client closed the connection before its whole body arrived")
                body += message.get("body", b"")
                if len(body) > max_bytes:
                    raise OverLimit(f"the body is larger than the limit of {max_bytes} bytes", max_bytes)
                if not message.get("more_body", False):
                    break
    except TimeoutError as exc:
        raise body_timeout(timeout_s) from exc
    return decode_json_body(body, model, precheck)


def check_declared_length(declared: str | None, max_bytes: int) -> None:
    """413 at once, before a byte of the body is read, when its Content-Length is over `max_bytes`."""
    if declared is not None and declared.isdigit() and (len(declared) > 18 or int(declared) > max_bytes):
        raise OverLimit(f"the body is {declared} bytes; the limit is {max_bytes} bytes", max_bytes)


def check_json_content_type(content_type: str | None) -> None:
    """415 unless the content type is JSON (`application/json` or `*+json`)."""
    media = (content_type or "").split(";")[0].strip().lower()
    if media != "application/json" and not media.endswith("+json"):
        raise ProblemError(f"the body must be application/json, got {content_type or 'no content type'!r}", status=415)


def decode_json_body(body: bytes | bytearray, model: type[M], precheck: Callable[[Any], None] | None = None) -> M:
    """The body as a validated `model`: 400 when it is not JSON, 422 when it does not validate (numbers out of
    range included)."""
    try:
        document = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        return _decode_with_big_numbers(body, model, exc)
    if precheck is not None:
        precheck(document)
    return validated(model, document, "body")


def _decode_with_big_numbers(body: bytes | bytearray, model: type[M], error: orjson.JSONDecodeError) -> M:
    """orjson refuses numbers past float64 (an integer of 400 digits is valid JSON all the same); pydantic's own
    parser reads them, so that the field's range check words the problem."""
    try:
        return model.model_validate_json(body)
    except ValidationError as exc:
        kinds = {e["type"] for e in exc.errors()}
        if kinds != {"json_invalid"}:
            raise InvalidInput(f"invalid body: {validation_detail(exc, 'body')}") from exc
        out_of_range = [e["msg"] for e in exc.errors() if "number out of range" in e["msg"]]
        if out_of_range:
            raise InvalidInput(f"invalid body: a number has too many digits ({out_of_range[0]})") from exc
        raise ProblemError(f"the body is not valid JSON: {error}", status=400) from error
