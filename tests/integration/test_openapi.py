"""The published OpenAPI document against the live application (tiny-siglip under a real Ray).

schemathesis generates requests from /openapi.json (JSON, raw image and multipart bodies; valid
and invalid) and checks every answer against the document: status codes, content types, bodies,
and that no request makes the server fail. Bounded: EXAMPLES_PER_OPERATION cases per operation and mode.

The document marks image strings with the format `image-base64`, names image media types for raw
bodies, and gives file parts `format: binary`; the strategies registered here make those real small
image files, so a body the document calls valid is one the server must embed (positive_data_acceptance),
on every operation: the served document states the service's limits and the rules across fields.
"""

from __future__ import annotations

import base64
import io
import json
from typing import Any

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from PIL import Image
from pydantic import BaseModel, ValidationError
from schemathesis import GenerationMode
from schemathesis.specs.openapi.checks import negative_data_rejection, positive_data_acceptance

from siglip_serve.serve.http.embed_request import IMAGE_FORMAT
from siglip_serve.serve.http.http_body import IMAGE_MEDIA_TYPES
from siglip_serve.serve.ingress.endpoints.classify import ClassifyRequest
from siglip_serve.serve.ingress.endpoints.cohere_embed import CohereEmbedRequest
from siglip_serve.serve.ingress.endpoints.embeddings import EmbeddingsRequest
from siglip_serve.serve.ingress.endpoints.rerank import RerankRequest
from tests.helpers import AUTH

EXAMPLES_PER_OPERATION = 12
PIL_FORMATS = {"image/jpeg": "JPEG", "image/png": "PNG", "image/webp": "WEBP", "image/gif": "GIF",
               "image/bmp": "BMP", "image/tiff": "TIFF"}



JSON_MODELS: dict[str, type[BaseModel]] = {
    "POST /v1/embeddings": EmbeddingsRequest, "POST /v2/embed": CohereEmbedRequest,
    "POST /v1/classify": ClassifyRequest, "POST /v1/rerank": RerankRequest, "POST /v2/rerank": RerankRequest}


def coerced(case: schemathesis.Case) -> bool:
    """Whether the server's request model reads the JSON body only by pydantic's lax conversions (the string
    "2" as the integer 2, "true" or 1 as true), which the document's types do not allow."""
    model = JSON_MODELS.get(case.operation.label)
    if model is None or case.media_type != "application/json":
        return False
    try:
        body = json.dumps(case.body)
        model.model_validate_json(body)
    except (ValidationError, ValueError, TypeError):  # TypeError: a body that is no JSON value (raw bytes)
        return False
    try:
        model.model_validate_json(body, strict=True)
    except (ValidationError, ValueError):
        return True
    return False


def excluded_checks(case: schemathesis.Case) -> list[Any]:
    """The checks that cannot hold for `case`: negative_data_rejection for a multipart body, whose fields are all
    strings on the wire (a field mutated to another type arrives as text that may well be valid: a number sent as
    `labels` is one label; schemathesis allows for that only in paths and queries), and for a JSON body the server
    reads by lax conversion."""
    if case.media_type == "multipart/form-data" or coerced(case):
        return [negative_data_rejection]
    return []


def image_file(pil_format: str, mode: str = "RGB", size: tuple[int, int] = (8, 8), colour: int = 128) -> bytes:
    out = io.BytesIO()
    Image.new(mode, size, colour if mode == "L" else (colour, 255 - colour, colour // 2)).save(out, pil_format)
    return out.getvalue()


@st.composite
def image_files(draw: st.DrawFn, pil_format: str | None = None) -> bytes:
    """A small real image file: `pil_format`, or any format the contract names."""
    return image_file(pil_format or draw(st.sampled_from(sorted(set(PIL_FORMATS.values())))),
                      draw(st.sampled_from(["RGB", "L"])), (draw(st.integers(1, 40)), draw(st.integers(1, 40))),
                      draw(st.integers(0, 255)))


def image_string(media: str, data: bytes, data_uri: bool) -> str:
    encoded = base64.b64encode(data).decode()
    return f"data:{media};base64,{encoded}" if data_uri else encoded


@st.composite
def image_strings(draw: st.DrawFn) -> str:
    """An image as the contract's JSON bodies carry it: a data URI or bare base64."""
    media = draw(st.sampled_from(sorted(PIL_FORMATS)))
    return image_string(media, draw(image_files(PIL_FORMATS[media])), draw(st.booleans()))


schemathesis.openapi.format(IMAGE_FORMAT, image_strings())
# The document's binary strings are the multipart bodies' file parts, each an image file.
schemathesis.openapi.format("binary", image_files())
for _media in IMAGE_MEDIA_TYPES:
    schemathesis.openapi.media_type(_media, image_files(PIL_FORMATS.get(_media)))


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
    # schemathesis's own pytest loader (from_fixture) does not run on this pytest, so its strategies drive
    # plain Hypothesis tests: EXAMPLES_PER_OPERATION cases per operation and mode. One strategy over every
    # operation would draw each by chance, and rarely one whose schema is hard to satisfy.
    schema = schemathesis.openapi.from_url(f"{main_app}/openapi.json", headers=AUTH)
    # A text over max_text_chars (the document's maxLength) is answered 413 text_too_long (docs/http-api.md, Errors).
    rejection = schema.config.checks.negative_data_rejection
    rejection.expected_statuses = [*rejection.expected_statuses, "413"]
    operations = [result.ok() for result in schema.get_all_operations()]
    checked: set[str] = set()

    def check(case: schemathesis.Case) -> None:
        excluded = excluded_checks(case)
        if positive_data_acceptance not in excluded:
            checked.add(case.operation.label)
        case.call_and_validate(base_url=main_app, headers=AUTH, excluded_checks=excluded, timeout=60)

    for operation in operations:
        if mode is GenerationMode.NEGATIVE and not len(operation.body):
            assert not list(operation.iter_parameters()), operation.label  # a parameter could be made invalid
            continue  # nothing to make invalid: Hypothesis would find the strategy unsatisfiable

        @given(case=operation.as_strategy(generation_mode=mode))
        @settings(max_examples=EXAMPLES_PER_OPERATION, deadline=None, database=None,
                  suppress_health_check=list(HealthCheck))
        def conforms(case: schemathesis.Case) -> None:
            check(case)

        conforms()
    if mode is GenerationMode.POSITIVE:
        assert {operation.label for operation in operations} == checked, checked
        assert set(JSON_MODELS) | {"POST /v1/embeddings/image"} <= checked, checked


def test_generated_images_are_embedded(main_app: str) -> None:
    # The strategies behind positive_data_acceptance make files the server embeds, in every named format.
    for media, pil_format in PIL_FORMATS.items():
        for mode, size in (("RGB", (1, 1)), ("L", (40, 3))):
            answer = httpx.post(f"{main_app}/v1/embeddings/image", content=image_file(pil_format, mode, size),
                                timeout=60, headers={**AUTH, "Content-Type": media})
            assert answer.status_code == 200, (media, mode, size, answer.text)
        strings = [image_string(media, image_file(pil_format), data_uri) for data_uri in (True, False)]
        answer = httpx.post(f"{main_app}/v1/embeddings", json={"input": strings, "modality": "image"}, timeout=60,
                            headers=AUTH)
        assert answer.status_code == 200, (media, answer.text)
