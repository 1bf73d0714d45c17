"""Property-based fuzzing over the OpenAPI schema: no input ever yields a 5xx, every 4xx is a problem body."""

from __future__ import annotations

import os

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings

from tests.support import ServerProcess

KNOWN_IDS = ["lerobot/demo-v3", "generic", "plain"]
EXAMPLES = int(os.environ.get("EPISERVE_FUZZ_EXAMPLES", "40"))


def operations(server: ServerProcess) -> list:
    schema = schemathesis.openapi.from_url(f"{server.url}/openapi.json")
    return [result.ok() for result in schema.get_all_operations()]


def check(case: schemathesis.Case) -> None:
    response = case.call(timeout=30)
    assert response.status_code < 500, f"{case.method} {case.formatted_path} -> {response.status_code}: {response.text}"
    if response.status_code >= 400:
        body = response.json()
        assert {"type", "title", "status", "detail"} <= set(body), body
        assert body["status"] == response.status_code


@pytest.mark.parametrize("known_id", [False, True], ids=["random-ids", "known-ids"])
def test_no_input_causes_a_server_error(server: ServerProcess, known_id: bool) -> None:
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
