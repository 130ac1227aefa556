"""The published OpenAPI document against the live application (tiny-siglip under a real Ray).

schemathesis generates requests from /openapi.json (JSON, raw image and multipart bodies; valid
and invalid) and checks every answer against the document: status codes, content types, bodies,
and that no request makes the server fail. Bounded: a few dozen cases per operation.
"""

from __future__ import annotations

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from schemathesis import GenerationMode
from schemathesis.specs.openapi.checks import positive_data_acceptance

from tests.helpers import AUTH


def test_document_describes_bodies_and_errors(main_app: str) -> None:
    # The document is behind the API key like every route but the probes (docs/http-api.md).
    assert httpx.get(f"{main_app}/openapi.json", timeout=30).status_code == 401
    doc = httpx.get(f"{main_app}/openapi.json", headers=AUTH, timeout=30).json()
    image = doc["paths"]["/v1/embeddings/image"]["post"]
    assert {"image/jpeg", "application/octet-stream", "multipart/form-data"} <= set(image["requestBody"]["content"])
    assert "application/json" in doc["paths"]["/v1/embeddings"]["post"]["requestBody"]["content"]
    for path, methods in doc["paths"].items():
        for operation in methods.values():
            errors = [code for code in operation["responses"] if code.startswith(("4", "5"))]
            assert errors, path
            for code in errors:
                body = operation["responses"][code]["content"]["application/json"]["schema"]
                assert body["required"] == ["error"], (path, code)


@pytest.mark.parametrize("mode", [GenerationMode.POSITIVE, GenerationMode.NEGATIVE])
def test_live_app_conforms_to_its_openapi_document(main_app: str, mode: GenerationMode) -> None:
    # schemathesis's own pytest loader (from_fixture) does not run on this pytest, so its
    # strategy drives a plain Hypothesis test; 100 cases per mode over all five operations.
    schema = schemathesis.openapi.from_url(f"{main_app}/openapi.json", headers=AUTH)

    @given(case=schema.as_strategy(generation_mode=mode))
    @settings(max_examples=100, deadline=None, database=None, suppress_health_check=list(HealthCheck))
    def conforms(case: schemathesis.Case) -> None:
        # positive_data_acceptance is off: the document can say "bytes" or "a base64 string", not
        # "a decodable image", so a schema-valid random body is rightly answered 400 invalid_image.
        case.call_and_validate(base_url=main_app, headers=AUTH, excluded_checks=[positive_data_acceptance],
                               timeout=60)

    conforms()
