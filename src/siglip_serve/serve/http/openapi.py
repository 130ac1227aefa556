"""The OpenAPI document of the HTTP contract (docs/http-api.md): real request bodies, every error.

The routes read their bodies themselves (a byte limit comes before any parsing), so FastAPI sees
no body parameters and would publish none. Here each route gets the bodies it accepts (JSON, raw image
bytes, multipart) and the contract's error shape for every status it can answer, from the `Operation`
its row carries (serve/ingress/endpoints/: each endpoint's module says its own). `/docs` can then send
an image, and schemathesis checks the live app against this document (tests/integration/test_openapi.py).

Every JSON body's schema is its pydantic model's (the request and answer models each endpoint's module
holds, the error model of serve/http/errors.py); only what no model holds is written by hand: the raw-image
and multipart bodies (in the endpoint's `Operation`), and why each error status happens (here, shared).
Nothing here names an endpoint: the document is built from the operations it is given.

The limits a running service checks (its models' names and sizes, texts' length, items per request) are its
settings, not the contract's: a schema names the setting that bounds it (`service_limit`), and the document a
service serves (`served_document`) puts the values of its `ServiceLimits` there, so every body it calls valid
is one the service embeds. The document built without them keeps the names.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import partial
from itertools import groupby
from typing import Annotated, Any, Literal

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi
from pydantic import BaseModel, Field
from pydantic.json_schema import JsonSchemaMode, models_json_schema

from siglip_serve.core.lanes import MAX_PRIORITY
from siglip_serve.serve.http.errors import ErrorBody

_REF = "#/components/schemas/{model}"


@dataclass(frozen=True)
class Operation:
    """What the document says of one route beyond what FastAPI sees: its summary, its answer's model, the error
    statuses it can answer, and the bodies it accepts: `body`, a JSON request model, and `bodies`, media type ->
    content entry written by hand (raw bytes, multipart). `model_in`: where a request names its model outside
    JSON, the raw body's `?model=` query or a multipart `model` field (docs/http-api.md, Several models)."""

    summary: str
    answer: type[BaseModel]
    answer_text: str
    errors: tuple[int, ...]
    body: type[BaseModel] | None = None
    bodies: Mapping[str, Any] = field(default_factory=dict)
    model_in: Literal["query", "form"] | None = None


# (method, path) -> its operation: the document's view of the route table.
Operations = Mapping[tuple[str, str], Operation]

# The keyword of a schema whose values are the service's settings: JSON Schema keyword -> the setting's name, or
# [name, offset] for the setting plus a number. An `x-` keyword: in the document built without a service, it says
# which setting bounds the value; a validator reads it as an annotation.
SERVICE_LIMIT = "x-service-limit"
# The settings that are one model's: a document that serves several of different sizes says them per model.
_PER_MODEL = frozenset({"models", "dimensions", "fewest_dimensions"})


def service_limit(**keywords: str | tuple[str, int]) -> dict[str, Any]:
    """A schema's keywords whose values the service's settings give (`ServiceLimits.values` names them), for a
    model's `json_schema_extra`."""
    return {SERVICE_LIMIT: {keyword: list(named) if isinstance(named, tuple) else named
                            for keyword, named in keywords.items()}}


@dataclass(frozen=True)
class ModelLimits:
    """A served model, as the document states it: its name and the `dimensions` it answers."""

    name: str
    dimensions: int  # the model's embedding size
    truncation: bool  # allow_dimension_truncation: fewer dimensions too, down to 1
    patch_budgets: tuple[int, ...] = ()  # a SigLIP 2 NaFlex model's served budgets; () for a fixed-size model


@dataclass(frozen=True)
class ServiceLimits:
    """The settings of a running service its document states (docs/http-api.md, Limits): its models, the default
    first, and what one request may hold."""

    models: tuple[ModelLimits, ...]
    max_text_chars: int
    max_texts_per_request: int
    max_images_per_request: int

    def values(self, models: tuple[ModelLimits, ...]) -> dict[str, Any]:
        """Each setting a schema may name, with `models` (models of one size) for the per-model ones."""
        size = models[0]
        return {"max_text_chars": self.max_text_chars, "max_texts_per_request": self.max_texts_per_request,
                "max_images_per_request": self.max_images_per_request, "models": [model.name for model in models],
                "dimensions": size.dimensions, "fewest_dimensions": 1 if size.truncation else size.dimensions}


def _named(node: Any) -> set[str]:
    """The settings `node`'s schemas name."""
    if isinstance(node, dict):
        own = {named if isinstance(named, str) else named[0] for named in node.get(SERVICE_LIMIT, {}).values()}
        return own.union(*(_named(value) for value in node.values()))
    if isinstance(node, list):
        return set().union(*(_named(value) for value in node))
    return set()


def _filled(node: Any, values: Mapping[str, Any]) -> Any:
    """`node` with every service limit given its value."""
    if isinstance(node, list):
        return [_filled(value, values) for value in node]
    if not isinstance(node, dict):
        return node
    out = {key: _filled(value, values) for key, value in node.items() if key != SERVICE_LIMIT}
    for keyword, named in node.get(SERVICE_LIMIT, {}).items():
        out[keyword] = values[named] if isinstance(named, str) else values[named[0]] + named[1]
    return out


def _served_schema(schema: dict[str, Any], limits: ServiceLimits) -> dict[str, Any]:
    """A component's schema with the service's values. A request that names a model is checked against that model's
    size, so where the models differ in size the schema is one branch per size: the default model's where
    `model` is left out, every other's where `model` names one of its models."""
    sizes = [tuple(group) for _, group in groupby(sorted(limits.models, key=lambda m: (m.dimensions, m.truncation)),
                                                  key=lambda m: (m.dimensions, m.truncation))]
    if len(sizes) == 1 or not _named(schema) & _PER_MODEL:
        return _filled(schema, limits.values(limits.models))
    branches = []
    for models in sorted(sizes, key=lambda models: limits.models[0] not in models):
        branch = _filled(schema, limits.values(models))
        if limits.models[0] not in models:
            branch = {"allOf": [branch, {"required": ["model"],
                                         "properties": {"model": {"enum": [m.name for m in models]}}}]}
        branches.append(branch)
    return {"anyOf": branches}


# The request field a NaFlex model's budget is asked by (serve/http/embed_request.py PatchBudget).
PATCH_BUDGET = "patch_budget"


def _budget_choice(node: Any, budgets: list[int]) -> Any:
    """`node` with every `patch_budget` property narrowed to what the service serves: one of `budgets` or null, or
    null alone where no model served is NaFlex (the ingress answers 422 to any other). Several models' budgets
    are offered together, whichever model a request names."""
    if isinstance(node, list):
        return [_budget_choice(value, budgets) for value in node]
    if not isinstance(node, dict):
        return node
    out = {key: _budget_choice(value, budgets) for key, value in node.items()}
    field = out.get("properties", {}).get(PATCH_BUDGET)
    if isinstance(field, dict):
        kept = {key: value for key, value in field.items() if key in ("description", "title", "default")}
        choice = [{"type": "integer", "enum": budgets}, {"type": "null"}] if budgets else [{"type": "null"}]
        out["properties"] = {**out["properties"], PATCH_BUDGET: {**kept, "anyOf": choice}}
    return out


def _ref(model: type[BaseModel]) -> dict[str, str]:
    return {"$ref": _REF.format(model=model.__name__)}


def _json(model: type[BaseModel]) -> dict[str, Any]:
    return {"application/json": {"schema": _ref(model)}}


# Inline rather than a $ref, so every error answer shows its shape where it is listed; what it uses is in
# components/schemas with the rest.
_ERROR_SCHEMA = {key: value for key, value in ErrorBody.model_json_schema(ref_template=_REF).items() if key != "$defs"}


# Multipart bodies are read by hand (serve/http/http_body.py multipart_form); a model says what they hold for the
# document only (`form`). A file part is one with a filename, whatever its name; `format: binary` is what makes
# generators send one.
Files = Annotated[list[bytes], Field(min_length=1, json_schema_extra=service_limit(maxItems="max_images_per_request"),
                                     description="image files (JPEG, PNG, WebP, GIF, BMP, TIFF), each a part with a "
                                                 "filename")]


def form(model: type[BaseModel]) -> dict[str, Any]:
    """The multipart body `model` describes, as an `Operation`'s `bodies` entry."""
    return {"multipart/form-data": {"schema": model.model_json_schema()}}

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


# What a route that does work can answer.
WORK_ERRORS = (400, 401, 404, 408, 413, 415, 422, 429, 431, 500, 503, 504)
# The request's priority where the body has no field for it, or for HAProxy's queue (docs/http-api.md, Lanes).
_PRIORITY_HEADER = {"name": "X-Priority", "in": "header", "required": False,
                    "schema": {"type": "integer", "minimum": 0, "maximum": MAX_PRIORITY},
                    "description": "lower is handled earlier: 0 interactive, 1 default, 2 and above bulk; moves the "
                                   "request down from its API key's lane, never up"}


def _schemas(operations: Operations) -> dict[str, Any]:
    """Every model's schema (and the ones they use) under components/schemas, as the routes' $refs name them:
    requests as the server validates them, answers as the routes write them."""
    requests: dict[type[BaseModel], None] = dict.fromkeys(
        op.body for op in operations.values() if op.body is not None)
    answers: dict[type[BaseModel], None] = dict.fromkeys((ErrorBody, *(op.answer for op in operations.values())))
    models: list[tuple[type[BaseModel], JsonSchemaMode]] = [
        *((model, "validation") for model in requests), *((model, "serialization") for model in answers)]
    _, definitions = models_json_schema(models, ref_template=_REF)
    return dict(definitions.get("$defs", {}))


def _request_body(doc: Operation) -> dict[str, Any]:
    content = {**(_json(doc.body) if doc.body is not None else {}), **doc.bodies}
    return {"requestBody": {"required": True, "content": content}} if content else {}


def _model_choice(operation: dict[str, Any], doc: Operation, models: list[str]) -> None:
    """Where a request names its model outside JSON (`doc.model_in`): the names this service serves."""
    choice = {"type": "string", "enum": models, "description": "the served model (default: the first)"}
    if doc.model_in == "query":
        operation["parameters"] = [*operation.get("parameters", []),
                                   {"name": "model", "in": "query", "required": False, "schema": choice}]
    form = operation.get("requestBody", {}).get("content", {}).get("multipart/form-data", {}).get("schema", {})
    if doc.model_in == "form" and "properties" in form:
        form["properties"] = {**form["properties"], "model": choice}


def openapi_document(app: FastAPI, operations: Operations, limits: ServiceLimits | None = None) -> dict[str, Any]:
    """The contract's document for the routes `app` serves, each completed by its `operations` entry; `limits`:
    the settings of the service that serves it (without them, the schemas name the settings).

    FastAPI's document is completed here, path by path, rather than through the route objects: in
    a Serve replica the app answering requests is Serve's wrapper around a frozen copy of ours,
    whose generated routes do not carry attributes set on the originals."""
    schema = get_openapi(title=app.title, version=app.version, routes=app.routes,
                         description="The siglip-serve HTTP contract; see docs/http-api.md.")
    for (method, path), doc in operations.items():
        operation = schema.get("paths", {}).get(path, {}).get(method.lower())
        if operation is None:
            continue
        operation["summary"] = doc.summary
        operation.update(copy.deepcopy(_request_body(doc)))
        if method == "POST":
            operation["parameters"] = [*operation.get("parameters", []), dict(_PRIORITY_HEADER)]
        if limits is not None:
            _model_choice(operation, doc, [model.name for model in limits.models])
        operation["responses"] = {"200": {"description": doc.answer_text, "content": _json(doc.answer)},
                                  **{str(status): answer for status, answer in _errors(*doc.errors).items()}}
    components = schema.get("components", {})
    schemas = {**components.get("schemas", {}), **_schemas(operations)}
    if limits is not None:
        budgets = sorted({budget for model in limits.models for budget in model.patch_budgets})
        schemas = {name: _budget_choice(_served_schema(component, limits), budgets)
                   for name, component in schemas.items()}
        for path in schema.get("paths", {}).values():  # the hand-written bodies (multipart) name limits too
            for operation in path.values():
                if "requestBody" in operation:
                    operation["requestBody"] = _filled(operation["requestBody"], limits.values(limits.models))
    schema["components"] = {**components, "schemas": schemas,
                            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer",
                                                           "description": "only when the service has an api_key"}}}
    return schema


def _document(app: FastAPI, operations: Operations) -> dict[str, Any]:
    if app.openapi_schema is None:
        app.openapi_schema = openapi_document(app, operations)
    return app.openapi_schema


def install_openapi(app: FastAPI, operations: Operations) -> None:
    """The contract's document instead of FastAPI's bare one, from the operations of the routes `app` serves;
    kept in the app's state for the /openapi.json route (`served_document`)."""
    app.state.openapi_operations = operations
    app.openapi = partial(_document, app, operations)  # type: ignore[method-assign]


def served_document(app: FastAPI, limits: ServiceLimits) -> dict[str, Any]:
    """The document of an app `install_openapi` completed, with the settings of the service that serves it."""
    operations: Operations = app.state.openapi_operations
    return openapi_document(app, operations, limits)
