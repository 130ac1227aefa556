"""The OpenAPI document of the HTTP contract (docs/http-api.md): real request bodies, every error.

The routes read their bodies themselves (a byte limit comes before any parsing), so FastAPI sees
no body parameters and would publish none. Here each route gets, through FastAPI's own
`openapi_extra` and `responses`, the bodies it accepts (JSON, raw image bytes, multipart) and the
contract's error shape for every status it can answer. `/docs` can then send an image, and
schemathesis checks the live app against this document (tests/integration/test_openapi.py).

Every JSON body's schema is its pydantic model's (the request models the routes parse with, the answer
models of serve/http/responses.py, the error model of serve/http/errors.py); only what no model holds is written
here: the raw-image and multipart bodies, and why each error status happens.
"""

from __future__ import annotations

import copy
from functools import partial
from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi
from pydantic import BaseModel
from pydantic.json_schema import JsonSchemaMode, models_json_schema

from siglip_serve.serve.http.embed_request import CohereEmbedRequest, EmbeddingsRequest
from siglip_serve.serve.http.errors import ErrorBody
from siglip_serve.serve.http.http_body import IMAGE_MEDIA_TYPES, ClassifyRequest
from siglip_serve.serve.http.rerank import RerankRequest
from siglip_serve.serve.http.responses import (
    ClassifyResponse,
    CohereEmbedResponse,
    EmbeddingsResponse,
    Health,
    ModelsResponse,
    Ready,
    RerankResponse,
)

_REF = "#/components/schemas/{model}"
# Requests as the server validates them, answers as the routes write them.
_MODELS: tuple[tuple[type[BaseModel], JsonSchemaMode], ...] = (
    *((model, "validation") for model in (EmbeddingsRequest, CohereEmbedRequest, ClassifyRequest, RerankRequest)),
    *((model, "serialization") for model in (ErrorBody, EmbeddingsResponse, CohereEmbedResponse, ClassifyResponse,
                                             RerankResponse, ModelsResponse, Health, Ready)),
)


def _ref(model: type[BaseModel]) -> dict[str, str]:
    return {"$ref": _REF.format(model=model.__name__)}


def _json(model: type[BaseModel]) -> dict[str, Any]:
    return {"application/json": {"schema": _ref(model)}}


# Inline rather than a $ref, so every error answer shows its shape where it is listed; what it uses is in
# components/schemas with the rest.
_ERROR_SCHEMA = {key: value for key, value in ErrorBody.model_json_schema(ref_template=_REF).items() if key != "$defs"}


# Multipart bodies are read by hand (serve/http/http_body.py multipart_form), so no model says them. A file part is
# one with a filename, whatever its name; `format: binary` is what makes generators send one.
_FILES = {"type": "array", "items": {"type": "string", "format": "binary"}, "minItems": 1,
          "description": "image files (JPEG, PNG, WebP, GIF, BMP, TIFF), each a part with a filename"}

_WHY = {
    400: "empty body, malformed multipart, an image that cannot be decoded (data with an image format's "
         "signature included), dimensions not served, an image URL not allowed (url_not_allowed) or that "
         "could not be fetched (url_fetch_failed)",
    401: "missing or wrong API key (only when the service has one)",
    404: "texts, classify or rerank where the model runs no text tower; a model the service does not serve",
    408: "the body stopped arriving for 10 s before its end (connection closed)",
    413: "body, image, request pixels or text over the configured limit; an image URL's body over the byte "
         "limit (url_too_large)",
    415: "content type, or data, that is not an image (SVG, PDF, text)",
    422: "JSON that does not match the request schema, too many images or texts, an empty or blank text, "
         "a typed item against modality",
    429: "the API key is past its request rate (rate_limited; Retry-After says when to retry)",
    431: "more than 100 headers, or more than 64 KiB of them",
    500: "unexpected server error (the message never echoes its cause)",
    503: "not ready yet, shutting down, at capacity, or a replica lost (Retry-After says when to retry)",
    504: "the request did not finish within its deadline; an image URL did not arrive in time (url_timeout)",
}


def _errors(*statuses: int) -> dict[int | str, dict[str, Any]]:
    out: dict[int | str, dict[str, Any]] = {}
    for status in statuses:
        out[status] = {"description": _WHY[status], "content": {"application/json": {"schema": _ERROR_SCHEMA}}}
        if status in (429, 503):
            out[status]["headers"] = {"Retry-After": {"schema": {"type": "integer"}, "description": "seconds"}}
    return out


def _ok(model: type[BaseModel], description: str) -> dict[int | str, dict[str, Any]]:
    return {200: {"description": description, "content": _json(model)}}


def _body(model: type[BaseModel], **more: dict[str, Any]) -> dict[str, Any]:
    return {"requestBody": {"required": True, "content": {**_json(model), **more}}}


_EMBED_ERRORS = (400, 401, 404, 408, 413, 415, 422, 429, 431, 500, 503, 504)
# The request's priority where the body has no field for it, or for HAProxy's queue (docs/http-api.md, Lanes).
_PRIORITY_HEADER = {"name": "X-Priority", "in": "header", "required": False,
                    "schema": {"type": "integer", "minimum": 0, "maximum": 999},
                    "description": "lower is handled earlier: 0 interactive, 1 default, 2 and above bulk; moves the "
                                   "request down from its API key's lane, never up"}

ROUTES: dict[tuple[str, str], dict[str, Any]] = {
    ("POST", "/v1/embeddings"): {
        "summary": "Embed images (base64) and texts in OpenAI's embeddings request shape",
        "openapi_extra": _body(EmbeddingsRequest),
        "responses": {**_ok(EmbeddingsResponse, "one embedding per input, in order"), **_errors(*_EMBED_ERRORS)},
    },
    ("POST", "/v2/embed"): {
        "summary": "Cohere's v2 embed shape (texts, images or inputs; embeddings by type), same path as /v1/embeddings",
        "openapi_extra": _body(CohereEmbedRequest),
        "responses": {**_ok(CohereEmbedResponse, "every asked type, one row per input, in order"),
                      **_errors(*_EMBED_ERRORS)},
    },
    ("POST", "/v1/embeddings/image"): {
        "summary": "Embed raw image bytes, or the file parts of a multipart form",
        "openapi_extra": {"requestBody": {"required": True, "content": {
            **{media: {"schema": {"type": "string", "format": "binary"}} for media in IMAGE_MEDIA_TYPES},
            "multipart/form-data": {"schema": {
                "type": "object", "required": ["file"], "properties": {"file": _FILES},
                "description": "every file part is an image; the part names do not matter",
            }},
        }}},
        "responses": {**_ok(EmbeddingsResponse, "one embedding per image, in order"), **_errors(*_EMBED_ERRORS)},
    },
    ("POST", "/v1/classify"): {
        "summary": "Zero-shot classification: SigLIP's sigmoid probability of every label for every image",
        "openapi_extra": _body(ClassifyRequest, **{"multipart/form-data": {"schema": {
            "type": "object", "required": ["file", "labels"],
            "properties": {"file": _FILES, "labels": {"type": "array", "items": {"type": "string"}, "minItems": 1},
                           "template": {"type": "string"}},
            "description": "image file parts, one `labels` field per label, optional `template`",
        }}}),
        "responses": {**_ok(ClassifyResponse, "per image, every label's probability"), **_errors(*_EMBED_ERRORS)},
    },
    **{("POST", path): {
        "summary": "Rerank (Cohere's v2 shape): documents, texts or images, ordered by SigLIP's probability for the "
                   "query" + (" (Cohere's path, as the cohere SDK calls it)" if path.startswith("/v2") else ""),
        "openapi_extra": _body(RerankRequest),
        "responses": {**_ok(RerankResponse, "the documents' indices and scores, highest first"),
                      **_errors(*_EMBED_ERRORS)},
    } for path in ("/v1/rerank", "/v2/rerank")},
    ("GET", "/v1/models"): {
        "summary": "The served model and every encoder replica",
        "responses": {**_ok(ModelsResponse, "model list"), **_errors(401, 500)},
    },
    ("GET", "/healthz"): {
        "summary": "200 while the process is up",
        "responses": {**_ok(Health, "up"), **_errors(500)},
    },
    ("GET", "/readyz"): {
        "summary": "200 while every tower served has min_ready_replicas replicas warm; 503 before and while draining",
        "responses": {**_ok(Ready, "ready"), **_errors(500, 503)},
    },
}


def _schemas() -> dict[str, Any]:
    """Every model's schema (and the ones they use) under components/schemas, as the routes' $refs name them."""
    _, definitions = models_json_schema(_MODELS, ref_template=_REF)
    return dict(definitions.get("$defs", {}))


def _model_choice(operation: dict[str, Any], path: str, models: list[str]) -> None:
    """Where a request names its model outside JSON: the raw image route's `?model=`, classify's multipart
    `model` field; the names this service serves (docs/http-api.md, Several models)."""
    choice = {"type": "string", "enum": models, "description": "the served model (default: the first)"}
    if path == "/v1/embeddings/image":
        operation["parameters"] = [*operation.get("parameters", []),
                                   {"name": "model", "in": "query", "required": False, "schema": choice}]
    form = operation.get("requestBody", {}).get("content", {}).get("multipart/form-data", {}).get("schema", {})
    if path == "/v1/classify" and "properties" in form:
        form["properties"] = {**form["properties"], "model": choice}


def openapi_document(app: FastAPI, models: list[str] | None = None) -> dict[str, Any]:
    """The contract's document for the routes `app` serves; `models`: the names of the models it serves.

    FastAPI's document is completed here, path by path, rather than through the route objects: in
    a Serve replica the app answering requests is Serve's wrapper around a frozen copy of ours,
    whose generated routes do not carry attributes set on the originals."""
    schema = get_openapi(title=app.title, version=app.version, routes=app.routes,
                         description="The siglip-serve HTTP contract; see docs/http-api.md.")
    for (method, path), doc in ROUTES.items():
        operation = schema.get("paths", {}).get(path, {}).get(method.lower())
        if operation is None:
            continue
        operation["summary"] = doc["summary"]
        operation.update(copy.deepcopy(doc.get("openapi_extra") or {}))
        if method == "POST":
            operation["parameters"] = [*operation.get("parameters", []), dict(_PRIORITY_HEADER)]
        if models:
            _model_choice(operation, path, models)
        operation["responses"] = {str(status): answer for status, answer in doc["responses"].items()}
    components = schema.get("components", {})
    schema["components"] = {**components, "schemas": {**components.get("schemas", {}), **_schemas()},
                            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer",
                                                           "description": "only when the service has an api_key"}}}
    return schema


def _document(app: FastAPI) -> dict[str, Any]:
    if app.openapi_schema is None:
        app.openapi_schema = openapi_document(app)
    return app.openapi_schema


def install_openapi(app: FastAPI) -> None:
    """Serve the contract's document at /openapi.json (and /docs) instead of FastAPI's bare one."""
    app.openapi = partial(_document, app)  # type: ignore[method-assign]
