"""Property-based fuzzing over the OpenAPI schema: no input ever yields a 5xx, every response conforms to the schema
(status, content type, headers, body), every 4xx is a problem body."""

from __future__ import annotations

import os

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_headers_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from tests.support import ServerProcess

KNOWN_IDS = ["lerobot/demo-v3", "generic", "plain"]
EXAMPLES = int(os.environ.get("EPISERVE_FUZZ_EXAMPLES", "40"))
CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_headers_conformance,
    response_schema_conformance,
]


def operations(server: ServerProcess) -> list:
    schema = schemathesis.openapi.from_url(f"{server.url}/openapi.json")
    return [result.ok() for result in schema.get_all_operations()]


def check(case: schemathesis.Case) -> None:
    response = case.call(timeout=30)
    case.validate_response(response, checks=CHECKS)
    assert response.status_code < 500, f"{case.method} {case.formatted_path} -> {response.status_code}: {response.text}"
    if response.status_code >= 400:
        body = response.json()
        assert {"type", "title", "status", "detail"} <= set(body), body
        assert body["status"] == response.status_code


@pytest.mark.parametrize("known_id", [False, True], ids=["random-ids", "known-ids"])
def test_responses_conform_to_the_schema_and_none_is_a_5xx(server: ServerProcess, known_id: bool) -> None:
    found = operations(server)
    assert len(found) >= 9
    for operation in found:

        @given(case=operation.as_strategy())
        @settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
        def fuzz(case: schemathesis.Case) -> None:
            if known_id and case.path_parameters and "dataset_id" in case.path_parameters:
                case.path_parameters["dataset_id"] = KNOWN_IDS[len(str(case.query)) % len(KNOWN_IDS)]
            check(case)

        fuzz()


def test_schema_documents_problem_bodies_and_arrow_headers(server: ServerProcess) -> None:
    schema = httpx.get(f"{server.url}/openapi.json").json()
    assert set(schema["components"]["schemas"]) == {"Problem"}
    assert schema["components"]["schemas"]["Problem"]["required"] == ["type", "title", "status", "detail"]
    problem = {"application/problem+json": {"schema": {"$ref": "#/components/schemas/Problem"}}}
    rows = schema["paths"]["/datasets/{dataset_id}/rows"]
    for status in ("401", "403", "404", "413", "422", "503"):
        assert rows["get"]["responses"][status]["content"] == problem, status
    for status in ("400", "415"):
        assert rows["post"]["responses"][status]["content"] == problem, status
    ok = rows["get"]["responses"]["200"]
    assert list(ok["content"]) == ["application/vnd.apache.arrow.stream"]
    required = {name for name, header in ok["headers"].items() if header["required"]}
    assert required == {"X-Row-Count", "X-Total-Rows", "X-Start", "X-Stop", "ETag"}
    take = schema["paths"]["/datasets/{dataset_id}/rows/take"]["post"]["responses"]
    assert {name for name, header in take["200"]["headers"].items() if header["required"]} == {
        "X-Row-Count",
        "X-Total-Rows",
    }
    assert "422" in take and "304" not in take
    metrics = schema["paths"]["/metrics"]["get"]["responses"]
    assert list(metrics["200"]["content"]) == ["text/plain"] and {"401", "403"} <= set(metrics)
