"""The probes, about the service rather than work: GET /v1/models, /healthz, /readyz, and the contract's document at
/openapi.json with its page at /docs, whose Swagger UI script and style the service serves itself (docs/http-api.md)."""

# No `from __future__ import annotations`: route modules keep FastAPI-facing types resolvable at runtime.
import json
from functools import cache
from importlib.resources import files
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
    front = ingress.serving(None).plan.front  # the request limits are the service's: every model's the same
    return ServiceLimits(
        tuple(ModelLimits(name, served.model.embed_dim, served.plan.front.allow_dimension_truncation,
                          served.model.naflex.budgets if served.model.naflex is not None else ())
              for name, served in ingress.served.items()),
        front.max_text_chars, front.max_texts_per_request, front.max_images_per_request)


async def openapi(ingress: Ingress, request: Request) -> Response:
    return Response(json.dumps(served_document(request.app, service_limits(ingress))), media_type="application/json")


# Swagger UI 5 as fastapi-swagger ships it (a runtime dependency): FastAPI's page would load these from a CDN, and
# an air-gapped host would show a blank page. path under /docs/ -> (file in the package, media type).
SWAGGER_PACKAGE = "fastapi_swagger"
SWAGGER_ASSETS: dict[str, tuple[str, str]] = {
    "swagger-ui-bundle.js": ("swagger-ui-bundle.js", "text/javascript; charset=utf-8"),
    "swagger-ui.css": ("swagger-ui.css", "text/css; charset=utf-8"),
    "favicon.png": ("favicon-32x32.png", "image/png"),
}


@cache
def swagger_asset(name: str) -> bytes:
    """One of SWAGGER_ASSETS' files, read once per process."""
    return files(SWAGGER_PACKAGE).joinpath("resources", SWAGGER_ASSETS[name][0]).read_bytes()


async def docs(_: Ingress, request: Request) -> Response:
    # With an API key the browser's fetch of /openapi.json (and of the assets) needs the header too (docs/http-api.md).
    root = request.scope.get("root_path", "").rstrip("/")
    return get_swagger_ui_html(
        openapi_url=f"{root}/openapi.json", title="siglip-serve",
        swagger_js_url=f"{root}/docs/swagger-ui-bundle.js", swagger_css_url=f"{root}/docs/swagger-ui.css",
        swagger_favicon_url=f"{root}/docs/favicon.png",
        # No badge asking validator.swagger.io about the document: nothing on the page leaves the host.
        swagger_ui_parameters={"validatorUrl": None})


def _asset_route(name: str) -> Any:
    async def asset(_: Ingress, __: Request) -> Response:
        # The files change only with the installed package: a browser may keep them for a day.
        return Response(swagger_asset(name), media_type=SWAGGER_ASSETS[name][1],
                        headers={"Cache-Control": "public, max-age=86400"})

    asset.__name__ = "docs_" + name.replace("-", "_").replace(".", "_")
    return asset


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
    *(Probe("GET", f"/docs/{name}", _asset_route(name), in_schema=False) for name in SWAGGER_ASSETS),
)
