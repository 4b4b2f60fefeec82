"""Schemathesis fuzzes every operation of the gateway from its own /openapi.json, with a
valid token: no answer may be a server error and every answer must match the document.

Bounded (a few examples per operation) so the whole file stays well under a minute.
"""

from __future__ import annotations

import contextlib
from collections import Counter

import pytest

schemathesis = pytest.importorskip("schemathesis")
hypothesis = pytest.importorskip("hypothesis")

from hypothesis import HealthCheck, given, settings  # noqa: E402
from schemathesis.checks import not_a_server_error  # noqa: E402
from schemathesis.specs.openapi.checks import (  # noqa: E402
    content_type_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from tests.integration.gateway.conftest import Stack  # noqa: E402

pytestmark = pytest.mark.slow
EXAMPLES_PER_OPERATION = 12
CHECKS = [not_a_server_error, status_code_conformance, content_type_conformance,
          response_schema_conformance]


def test_the_document_is_valid_openapi(gateway_url: str) -> None:
    import requests
    from openapi_spec_validator import validate

    document = requests.get(f"{gateway_url}/openapi.json", timeout=10).json()
    validate(document)
    assert document["openapi"].startswith("3.")
    assert "/v1/records/{id}" in document["paths"]
    assert document["components"]["securitySchemes"]["bearer"]["scheme"] == "bearer"


def test_fuzz_every_operation(stack: Stack, gateway_url: str) -> None:
    schema = schemathesis.openapi.from_url(f"{gateway_url}/openapi.json", timeout=10)
    # Every role in its own fleet: most operations are allowed, so the fuzzer reaches the
    # services' validation rather than stopping at PERMISSION_DENIED.
    token = stack.tokens("fuzzer", "fleet-fuzz", ("agent", "governor", "admin"))
    headers = {"Authorization": f"Bearer {token}"}
    failures: list[str] = []
    statuses: Counter[int] = Counter()
    operations = 0
    for result in schema.get_all_operations():
        operation = result.ok()
        operations += 1
        label = operation.label

        @settings(max_examples=EXAMPLES_PER_OPERATION, deadline=None, database=None,
                  derandomize=True, suppress_health_check=list(HealthCheck), phases=[
                      hypothesis.Phase.explicit, hypothesis.Phase.generate])
        @given(case=operation.as_strategy())
        def fuzz(case: schemathesis.Case) -> None:
            response = case.call(base_url=gateway_url, headers=headers, timeout=20)
            statuses[response.status_code] += 1
            try:
                case.validate_response(response, checks=CHECKS)
            except (AssertionError, BaseExceptionGroup) as error:  # FailureGroup is a group
                failures.append(f"{label}: {error}")  # noqa: B023 (run at once)
                raise AssertionError(str(error)) from None

        with contextlib.suppress(AssertionError):  # collected above; go on to the next one
            fuzz()
    print(f"{operations} operations, answers by HTTP status: {sorted(statuses.items())}")
    assert operations >= 50
    # The fuzzer got through to the services, not only to the gateway's own refusals.
    assert sum(n for code, n in statuses.items() if 200 <= code < 300) >= operations // 2
    assert not failures, "\n\n".join(failures[:10])
