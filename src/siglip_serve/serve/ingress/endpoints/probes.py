"""The probes, about the service rather than work: GET /v1/models, /healthz, /readyz, and the contract's document at
/openapi.json with its page at /docs (docs/http-api.md)."""

# No `from __future__ import annotations`: route modules keep FastAPI-facing types resolvable at runtime.
import json
from typing import Any, Literal

from fastapi import Request, Response
from fastapi.openapi.docs import get_swagger_ui_html
from fastapi.responses import JSONResponse
from pydantic import Field
from pydantic.json_schema import SkipJsonSchema

from siglip_serve.serve.http.errors import error_response
from siglip_serve.serve.http.openapi import ModelLimits, Operation, ServiceLimits, served_document
from siglip_serve.serve.http.responses import Answer
from siglip_serve.serve.ingress.http_app import Probe
from siglip_serve.serve.ingress.ingress import Ingress


class ModelsResponse(Answer):
    object: Literal["list"]
    data: list[dict[str, Any]] = Field(description="the served model, its replicas and its cache "
                                                   "(docs/http-api.md, GET /v1/models)")


class Health(Answer):
    status: str


class Ready(Answer):
    status: str
    replicas: int
    towers: dict[str, Any] | SkipJsonSchema[None] = Field(None, description="the counts per tower")


async def models(ingress: Ingress, _: Request) -> Response:
    return JSONResponse({"object": "list", "data": await ingress.describe()})


async def healthz(_: Ingress, __: Request) -> Response:
    return JSONResponse({"status": "ok"})


async def readyz(ingress: Ingress, _: Request) -> Response:
    # Probe answers are not counted as rejections: a 503 here is a state, not a refused request.
    refused, counts = await ingress.readiness()
    if refused is not None:
        return error_response(refused)
    return JSONResponse({"status": "ready", **counts})


def service_limits(ingress: Ingress) -> ServiceLimits:
    """What this service checks that its document states: its models' names and sizes, the per-request limits."""
    config = ingress.config
    return ServiceLimits(
        tuple(ModelLimits(name, served.model.embed_dim, served.config.allow_dimension_truncation)
              for name, served in ingress.served.items()),
        config.max_text_chars, config.max_texts_per_request, config.max_images_per_request)


async def openapi(ingress: Ingress, request: Request) -> Response:
    return Response(json.dumps(served_document(request.app, service_limits(ingress))), media_type="application/json")


async def docs(_: Ingress, request: Request) -> Response:
    # With an API key the browser's fetch of /openapi.json needs the header too (docs/http-api.md).
    root = request.scope.get("root_path", "").rstrip("/")
    return get_swagger_ui_html(openapi_url=f"{root}/openapi.json", title="siglip-serve")


ROWS = (
    Probe("GET", "/v1/models", models, doc=Operation(
        "The served model and every encoder replica", ModelsResponse, "model list", (401, 500))),
    Probe("GET", "/healthz", healthz, auth=False, doc=Operation(
        "200 while the process is up", Health, "up", (500,))),
    Probe("GET", "/readyz", readyz, auth=False, doc=Operation(
        "200 while every tower served has min_ready_replicas replicas warm; 503 before and while draining", Ready,
        "ready", (500, 503))),
    Probe("GET", "/openapi.json", openapi, in_schema=False),
    Probe("GET", "/docs", docs, in_schema=False),
)
