"""The contract as types: the OpenAPI document's bodies are the pydantic models' schemas (serve/http/openapi.py), the
error body is one model (serve/http/errors.py), and the metrics' endpoint labels come from the route table."""

from __future__ import annotations

import json
from typing import Any

import jsonschema
from fastapi import FastAPI, Request, Response

from siglip_serve.serve.http.embed_request import IMAGE_FORMAT
from siglip_serve.serve.http.errors import ApiError, ErrorType, error_response
from siglip_serve.serve.http.openapi import openapi_document
from siglip_serve.serve.ingress.endpoints import ROUTES
from siglip_serve.serve.ingress.http_app import Probe, endpoint_labels, operations


def document() -> dict[str, Any]:
    app = FastAPI(title="siglip-serve", version="1", docs_url=None, redoc_url=None, openapi_url=None)
    for route in ROUTES:
        async def endpoint(request: Request) -> Response:
            raise NotImplementedError

        app.add_api_route(route.path, endpoint, methods=[route.method], name=route.handler.__name__,
                          include_in_schema=route.in_schema if isinstance(route, Probe) else True)
    return openapi_document(app, operations(ROUTES))


def validator(doc: dict[str, Any], schema: dict[str, Any]) -> jsonschema.Draft202012Validator:
    return jsonschema.Draft202012Validator({**schema, "components": doc["components"]})


def test_metrics_endpoint_labels_come_from_the_route_table() -> None:
    assert endpoint_labels(ROUTES) == (("image", "multipart", "embeddings", "v2_embed", "classify", "rerank"),
                                       ("embeddings", "v2_embed", "classify", "rerank"))


def test_json_bodies_are_the_request_models() -> None:
    doc = document()
    refs = {path: doc["paths"][path]["post"]["requestBody"]["content"]["application/json"]["schema"]["$ref"]
            for path in ("/v1/embeddings", "/v2/embed", "/v1/classify", "/v1/rerank", "/v2/rerank")}
    assert refs == {"/v1/embeddings": "#/components/schemas/EmbeddingsRequest",
                    "/v2/embed": "#/components/schemas/CohereEmbedRequest",
                    "/v1/classify": "#/components/schemas/ClassifyRequest",
                    "/v1/rerank": "#/components/schemas/RerankRequest",
                    "/v2/rerank": "#/components/schemas/RerankRequest"}
    schemas = doc["components"]["schemas"]
    # Field descriptions live on the models, and image strings carry the contract's format.
    assert "served model" in json.dumps(schemas["EmbeddingsRequest"]["properties"]["model"])
    assert schemas["ImageItem"]["properties"]["image"]["format"] == IMAGE_FORMAT
    embeddings = validator(doc, {"$ref": refs["/v1/embeddings"]})
    assert embeddings.is_valid({"input": ["a cat", {"type": "image", "image": "data:image/png;base64,AAAA"}],
                                "encoding_format": "int8"})
    assert not embeddings.is_valid({"input": []})
    assert not embeddings.is_valid({"input": "a cat", "encoding_format": "float16"})
    cohere = validator(doc, {"$ref": refs["/v2/embed"]})
    two = [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]
    assert not cohere.is_valid({"inputs": [{"content": two}]})


def test_every_error_status_publishes_the_error_model_that_error_response_writes() -> None:
    doc = document()
    body = json.loads(bytes(error_response(ApiError(422, ErrorType.INVALID_REQUEST, "input: bad")).body))
    assert body == {"error": {"message": "input: bad", "type": "invalid_request", "code": 422}}
    for path, methods in doc["paths"].items():
        for operation in methods.values():
            for status, answer in operation["responses"].items():
                if status.startswith(("4", "5")):
                    schema = answer["content"]["application/json"]["schema"]
                    assert schema == {key: value for key, value in doc["components"]["schemas"]["ErrorBody"].items()
                                      if key != "$defs"}, (path, status)
    error = validator(doc, {"$ref": "#/components/schemas/ErrorBody"})
    assert error.is_valid(body)
    assert not error.is_valid({**body, "detail": "x"})
    assert not error.is_valid({"error": {**body["error"], "type": "teapot"}})
