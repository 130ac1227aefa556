"""The OpenAPI document of the HTTP contract (docs/http-api.md): real request bodies, every error.

The routes read their bodies themselves (a byte limit comes before any parsing), so FastAPI sees
no body parameters and would publish none. Here each route gets, through FastAPI's own
`openapi_extra` and `responses`, the bodies it accepts (JSON, raw image bytes, multipart) and the
contract's error shape for every status it can answer. `/docs` can then send an image, and
schemathesis checks the live app against this document (tests/integration/test_openapi.py).
"""

from __future__ import annotations

from functools import partial
from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi

from siglip_serve.serve.errors import ErrorType
from siglip_serve.serve.http_body import IMAGE_MEDIA_TYPES

ERROR_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["error"],
    "additionalProperties": False,
    "properties": {"error": {
        "type": "object",
        "required": ["message", "type", "code"],
        "properties": {
            "message": {"type": "string"},
            "type": {"type": "string", "enum": [t.value for t in ErrorType]},
            "code": {"type": "integer"},
        },
    }},
}

EMBEDDINGS_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["object", "data", "model", "usage"],
    "properties": {
        "object": {"type": "string", "enum": ["list"]},
        "data": {"type": "array", "items": {
            "type": "object",
            "required": ["object", "index", "embedding"],
            "properties": {
                "object": {"type": "string", "enum": ["embedding"]},
                "index": {"type": "integer", "minimum": 0},
                "embedding": {"oneOf": [
                    {"type": "array", "items": {"type": "number"},
                     "description": "float; integers for int8, uint8, binary, ubinary"},
                    {"type": "string", "description": "encoding_format base64: little-endian float32"},
                ]},
                "scale": {"type": "number", "description": "int8 / uint8 only: the vector is ~ q / scale "
                                                          "(uint8: (q - 128) / scale)"},
            },
        }},
        "model": {"type": "string"},
        "usage": {"type": "object", "properties": {
            "images": {"type": "integer"}, "texts": {"type": "integer"},
            "prompt_tokens": {"type": "integer"}, "total_tokens": {"type": "integer"},
            "read_as": {"type": "array", "items": {"type": "string", "enum": ["image", "text"]},
                        "description": "/v1/embeddings: how each input item was read, in order"},
        }},
    },
}

_IMAGE_STRINGS = {"oneOf": [
    {"type": "string", "description": "an image: a data URI (data:image/png;base64,...) or bare base64 of the file"},
    {"type": "array", "items": {"type": "string"}, "minItems": 1},
]}
_URL_TEXT = ("a data URI, or an http(s) URL the service fetches where url_fetch_allowlist allows it "
             "(docs/http-api.md, Images by URL)")
_CACHE = {"type": "boolean", "default": True,
          "description": "false: neither read nor fill the embedding cache (embedding_cache_mib) for this request"}
_TYPED_ITEM: dict[str, Any] = {"oneOf": [
    {"type": "object", "required": ["type", "image"], "additionalProperties": False,
     "properties": {"type": {"type": "string", "enum": ["image"]},
                    "image": {"type": "string", "description": "a data URI or bare base64 of the image file, or "
                                                               "an http(s) URL (as image_url's)"}}},
    {"type": "object", "required": ["type", "text"], "additionalProperties": False,
     "properties": {"type": {"type": "string", "enum": ["text"]}, "text": {"type": "string"}}},
    {"type": "object", "required": ["type", "image_url"], "additionalProperties": False,
     "description": "OpenAI's image content part",
     "properties": {"type": {"type": "string", "enum": ["image_url"]},
                    "image_url": {"type": "object", "required": ["url"],
                                  "properties": {"url": {"type": "string", "description": _URL_TEXT}}}}},
]}
_ITEM: dict[str, Any] = {"oneOf": [
    {"type": "string", "description": "an image or a text: read by `modality`, else an image when it is a data "
                                      "URI or base64 (whitespace such as MIME line breaks skipped) of an image "
                                      "file's bytes, else a text (docs/http-api.md)"},
    _TYPED_ITEM,
]}
_ENCODINGS = ["float", "base64", "int8", "uint8", "binary", "ubinary"]

JSON_REQUEST_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["input"],
    "properties": {
        "input": {"oneOf": [_ITEM, {"type": "array", "items": _ITEM, "minItems": 1}]},
        "model": {"type": "string", "description": "optional; must name the served model"},
        "modality": {"type": "string", "enum": ["image", "text"],
                     "description": "optional: read every string item as this (a broken image then fails as one)"},
        "encoding_format": {"type": "string", "enum": _ENCODINGS, "default": "float"},
        "embedding_types": {"description": "Cohere's name for encoding_format (one type per request)",
                            "oneOf": [{"type": "string", "enum": _ENCODINGS},
                                      {"type": "array", "items": {"type": "string", "enum": _ENCODINGS}}]},
        "dimensions": {"type": "integer", "minimum": 1,
                       "description": "the model's size, or fewer where the operator allows truncation"},
        "cache": _CACHE,
    },
}

_COHERE_CONTENT: dict[str, Any] = {"oneOf": [
    {"type": "object", "required": ["type", "text"], "additionalProperties": False,
     "properties": {"type": {"type": "string", "enum": ["text"]}, "text": {"type": "string"}}},
    {"type": "object", "required": ["type", "image_url"], "additionalProperties": False,
     "properties": {"type": {"type": "string", "enum": ["image_url"]},
                    "image_url": {"type": "object", "required": ["url"],
                                  "properties": {"url": {"type": "string", "description": _URL_TEXT}}}}},
]}

COHERE_REQUEST_SCHEMA: dict[str, Any] = {
    "type": "object",
    "description": "exactly one of texts, images, inputs",
    "properties": {
        "model": {"type": "string", "description": "optional; must name the served model"},
        "texts": {"type": "array", "items": {"type": "string"}, "minItems": 1},
        "images": {"type": "array", "items": {"type": "string", "description": "a data URI or base64, or an "
                                                                             "http(s) URL (as image_url's)"},
                   "minItems": 1},
        "inputs": {"type": "array", "minItems": 1, "items": {
            "type": "object", "required": ["content"],
            "properties": {"content": {"type": "array", "items": _COHERE_CONTENT, "minItems": 1, "maxItems": 1,
                                       "description": "one text or one image per input (SigLIP fuses none)"}}}},
        "input_type": {"type": "string", "enum": ["search_document", "search_query", "classification", "clustering",
                                                  "image"], "description": "accepted; no effect on SigLIP"},
        "embedding_types": {"type": "array", "items": {"type": "string", "enum": _ENCODINGS}, "minItems": 1,
                            "default": ["float"]},
        "output_dimension": {"type": "integer", "minimum": 1},
        "truncate": {"type": "string", "enum": ["END"], "description": "texts are cut at the end, as open_clip"},
        "cache": _CACHE,
    },
}

COHERE_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["id", "response_type", "embeddings", "texts", "meta"],
    "properties": {
        "id": {"type": "string"},
        "response_type": {"type": "string", "enum": ["embeddings_by_type"]},
        "embeddings": {"type": "object", "description": "per asked type, one row per input in order",
                       "additionalProperties": {"type": "array", "items": {"type": "array"}}},
        "scales": {"type": "object", "description": "int8 / uint8: each row's scale (row ~ q / scale)"},
        "texts": {"type": "array", "items": {"type": "string"}},
        "model": {"type": "string"},
        "meta": {"type": "object"},
    },
}

CLASSIFY_REQUEST_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["input", "labels"],
    "properties": {
        "input": _IMAGE_STRINGS,
        "labels": {"type": "array", "items": {"type": "string"}, "minItems": 1, "description": "distinct labels"},
        "template": {"type": "string", "default": "{}", "description": "with exactly one {}, e.g. 'a photo of {}'"},
        "model": {"type": "string", "description": "optional; must name the served model"},
    },
}

CLASSIFY_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["object", "data", "model"],
    "properties": {
        "object": {"type": "string", "enum": ["list"]},
        "data": {"type": "array", "items": {
            "type": "object",
            "required": ["index", "labels"],
            "properties": {
                "index": {"type": "integer", "minimum": 0},
                "labels": {"type": "array", "description": "every label with its sigmoid probability, highest first",
                           "items": {"type": "object", "properties": {"label": {"type": "string"},
                                                                      "score": {"type": "number"}}}},
            },
        }},
        "model": {"type": "string"},
    },
}

RERANK_REQUEST_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["query", "documents"],
    "description": "Cohere's v2 rerank shape; other Cohere fields (max_tokens_per_doc, priority) are ignored",
    "properties": {
        "model": {"type": "string", "description": "optional; must name the served model"},
        "query": {"oneOf": [{"type": "string", "description": "a text"}, _TYPED_ITEM]},
        "documents": {"type": "array", "minItems": 1, "items": {"oneOf": [
            {"type": "string", "description": "a text (as Cohere's documents)"}, _TYPED_ITEM]},
            "description": "texts and images count against max_texts_per_request / max_images_per_request, "
                           "the query included"},
        "top_n": {"type": "integer", "minimum": 1, "description": "at most this many results; default all"},
        "return_documents": {"type": "boolean", "default": False,
                             "description": "each result carries its document: {text} or {image} as sent"},
        "cache": _CACHE,
    },
}

RERANK_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["id", "results", "model", "meta"],
    "properties": {
        "id": {"type": "string"},
        "results": {"type": "array", "description": "highest relevance_score first; ties in the documents' order",
                    "items": {"type": "object", "required": ["index", "relevance_score"], "properties": {
                        "index": {"type": "integer", "minimum": 0, "description": "the document's place in the "
                                                                                  "request"},
                        "relevance_score": {"type": "number", "minimum": 0, "maximum": 1,
                                            "description": "SigLIP's sigmoid probability, as classify's score"},
                        "document": {"type": "object", "description": "return_documents only",
                                     "properties": {"text": {"type": "string"}, "image": {"type": "string"}}},
                    }}},
        "model": {"type": "string"},
        "meta": {"type": "object"},
        "usage": {"type": "object", "properties": {"images": {"type": "integer"}, "texts": {"type": "integer"}}},
    },
}

_WHY = {
    400: "empty body, malformed multipart, an image that cannot be decoded (data with an image format's "
         "signature included), dimensions not served, an image URL not allowed (url_not_allowed) or that "
         "could not be fetched (url_fetch_failed)",
    401: "missing or wrong API key (only when the service has one)",
    404: "texts, classify or rerank where the service runs no text tower",
    408: "the body stopped arriving for 10 s before its end (connection closed)",
    413: "body, image, request pixels or text over the configured limit; an image URL's body over the byte "
         "limit (url_too_large)",
    415: "content type, or data, that is not an image (SVG, PDF, text)",
    422: "JSON that does not match the request schema, too many images or texts, an empty or blank text, "
         "a typed item against modality",
    431: "more than 100 headers, or more than 64 KiB of them",
    500: "unexpected server error (the message never echoes its cause)",
    503: "not ready yet, shutting down, at capacity, or a replica lost (Retry-After says when to retry)",
    504: "the request did not finish within its deadline; an image URL did not arrive in time (url_timeout)",
}


def _errors(*statuses: int) -> dict[int | str, dict[str, Any]]:
    out: dict[int | str, dict[str, Any]] = {}
    for status in statuses:
        out[status] = {"description": _WHY[status], "content": {"application/json": {"schema": ERROR_SCHEMA}}}
        if status == 503:
            out[status]["headers"] = {"Retry-After": {"schema": {"type": "integer"}, "description": "seconds"}}
    return out


def _ok(schema: dict[str, Any], description: str) -> dict[int | str, dict[str, Any]]:
    return {200: {"description": description, "content": {"application/json": {"schema": schema}}}}


_EMBED_ERRORS = (400, 401, 404, 408, 413, 415, 422, 431, 500, 503, 504)

ROUTES: dict[tuple[str, str], dict[str, Any]] = {
    ("POST", "/v1/embeddings"): {
        "summary": "Embed images (base64) and texts in OpenAI's embeddings request shape",
        "openapi_extra": {"requestBody": {"required": True, "content": {
            "application/json": {"schema": JSON_REQUEST_SCHEMA}}}},
        "responses": {**_ok(EMBEDDINGS_SCHEMA, "one embedding per input, in order"), **_errors(*_EMBED_ERRORS)},
    },
    ("POST", "/v2/embed"): {
        "summary": "Cohere's v2 embed shape (texts, images or inputs; embeddings by type), same path as /v1/embeddings",
        "openapi_extra": {"requestBody": {"required": True, "content": {
            "application/json": {"schema": COHERE_REQUEST_SCHEMA}}}},
        "responses": {**_ok(COHERE_SCHEMA, "every asked type, one row per input, in order"),
                      **_errors(*_EMBED_ERRORS)},
    },
    ("POST", "/v1/embeddings/image"): {
        "summary": "Embed raw image bytes, or the file parts of a multipart form",
        "openapi_extra": {"requestBody": {"required": True, "content": {
            **{media: {"schema": {"type": "string", "format": "binary"}} for media in IMAGE_MEDIA_TYPES},
            "multipart/form-data": {"schema": {
                "type": "object",
                "properties": {"file": {"type": "array", "items": {"type": "string", "format": "binary"}}},
                "description": "every file part is an image; the part names do not matter",
            }},
        }}},
        "responses": {**_ok(EMBEDDINGS_SCHEMA, "one embedding per image, in order"), **_errors(*_EMBED_ERRORS)},
    },
    ("POST", "/v1/classify"): {
        "summary": "Zero-shot classification: SigLIP's sigmoid probability of every label for every image",
        "openapi_extra": {"requestBody": {"required": True, "content": {
            "application/json": {"schema": CLASSIFY_REQUEST_SCHEMA},
            "multipart/form-data": {"schema": {
                "type": "object",
                "properties": {"file": {"type": "array", "items": {"type": "string", "format": "binary"}},
                               "labels": {"type": "array", "items": {"type": "string"}},
                               "template": {"type": "string"}},
                "description": "image file parts, one `labels` field per label, optional `template`",
            }},
        }}},
        "responses": {**_ok(CLASSIFY_SCHEMA, "per image, every label's probability"), **_errors(*_EMBED_ERRORS)},
    },
    **{("POST", path): {
        "summary": "Rerank (Cohere's v2 shape): documents, texts or images, ordered by SigLIP's probability for the "
                   "query" + (" (Cohere's path, as the cohere SDK calls it)" if path.startswith("/v2") else ""),
        "openapi_extra": {"requestBody": {"required": True, "content": {
            "application/json": {"schema": RERANK_REQUEST_SCHEMA}}}},
        "responses": {**_ok(RERANK_SCHEMA, "the documents' indices and scores, highest first"),
                      **_errors(*_EMBED_ERRORS)},
    } for path in ("/v1/rerank", "/v2/rerank")},
    ("GET", "/v1/models"): {
        "summary": "The served model and every encoder replica",
        "responses": {**_ok({"type": "object", "required": ["object", "data"]}, "model list"),
                      **_errors(401, 500)},
    },
    ("GET", "/healthz"): {
        "summary": "200 while the process is up",
        "responses": {**_ok({"type": "object", "properties": {"status": {"type": "string"}}}, "up"),
                      **_errors(500)},
    },
    ("GET", "/readyz"): {
        "summary": "200 while every tower served has min_ready_replicas replicas warm; 503 before and while draining",
        "responses": {**_ok({"type": "object", "required": ["status", "replicas"],
                             "properties": {"status": {"type": "string"}, "replicas": {"type": "integer"},
                                            "towers": {"type": "object", "description": "the counts per tower"}}},
                            "ready"), **_errors(500, 503)},
    },
}


def openapi_document(app: FastAPI) -> dict[str, Any]:
    """The contract's document for the routes `app` serves.

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
        operation.update(doc.get("openapi_extra") or {})
        operation["responses"] = {str(status): answer for status, answer in doc["responses"].items()}
    schema["components"] = {**schema.get("components", {}), "securitySchemes": {
        "bearer": {"type": "http", "scheme": "bearer", "description": "only when the service has an api_key"}}}
    return schema


def _document(app: FastAPI) -> dict[str, Any]:
    if app.openapi_schema is None:
        app.openapi_schema = openapi_document(app)
    return app.openapi_schema


def install_openapi(app: FastAPI) -> None:
    """Serve the contract's document at /openapi.json (and /docs) instead of FastAPI's bare one."""
    app.openapi = partial(_document, app)  # type: ignore[method-assign]
