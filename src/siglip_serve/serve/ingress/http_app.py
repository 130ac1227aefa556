"""The ingress's FastAPI application, built in each replica from its routes (serve/ingress/endpoints/' table, plus any a
caller adds: `build(config, routes=...)` in serve/app.py), and its OpenAPI document from theirs.

A route is a thin function of the replica's `Ingress`; what every route gets without writing it is here: the
contract's errors for anything raised, counted once (serve/http/errors.py), the header limits, the API key, the
capabilities it `needs` checked before its body is read (serve/ingress/schedule.py `require`), its tenant and lane
(core/lanes.py), and, for a `Route`, its place among the requests the replica works on and its one deadline
(serve/ingress/front_door.py) around the whole handler. Its work then goes through the scheduling call
(serve/ingress/schedule.py `Scheduler.answer`), which admits each tower (drain, readiness), and observes the request
metric.

The app is built per replica (Serve calls `__serve_build_asgi_app__` once the deployment's constructor ran:
ray/serve/_private/replica.py `_initialize_asgi_callable`), so the handlers close over the replica's objects.
"""

# No `from __future__ import annotations`: FastAPI resolves the endpoint's parameter types at runtime.
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

from fastapi import FastAPI, Request, Response

from siglip_serve.core import lanes
from siglip_serve.serve.http.errors import install_error_handlers
from siglip_serve.serve.http.http_body import HeaderLimits
from siglip_serve.serve.http.openapi import Operation, Operations, install_openapi
from siglip_serve.serve.ingress.ingress import Ingress

# (the replica's ingress, the request, its deadline in time.monotonic()) -> the answer.
Handler = Callable[[Ingress, Request, float], Awaitable[Response]]
# A probe or description: no place, no deadline.
ProbeHandler = Callable[[Ingress, Request], Awaitable[Response]]


@dataclass(frozen=True)
class Route:
    """A route that does work: the API key checked, `needs` (serve/ingress/schedule.py's capabilities) checked before
    the body is read, the request's place and deadline around `handler`."""

    method: str
    path: str
    handler: Handler
    needs: tuple[str, ...] = ()
    # The `endpoint` label values its `Work` is counted under (serve/shared/metrics.py), and whether its items may be
    # texts; every ingress exports each label's series from zero.
    endpoints: tuple[str, ...] = ()
    texts: bool = False
    # What the OpenAPI document says of it (serve/http/openapi.py); without one, FastAPI's bare entry.
    doc: Operation | None = None


@dataclass(frozen=True)
class Probe:
    """A route that only answers about the service (health, readiness, the model, the document)."""

    method: str
    path: str
    handler: ProbeHandler
    auth: bool = True
    in_schema: bool = True
    doc: Operation | None = None


def endpoint_labels(routes: Sequence[Route | Probe]) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """The `endpoint` label values of the routes' work: every one, and those of routes whose items may be texts."""
    work = [route for route in routes if isinstance(route, Route)]
    return (tuple(dict.fromkeys(label for route in work for label in route.endpoints)),
            tuple(dict.fromkeys(label for route in work if route.texts for label in route.endpoints)))


def operations(routes: Sequence[Route | Probe]) -> Operations:
    """The document's entry of every route that has one."""
    return {(route.method, route.path): route.doc for route in routes if route.doc is not None}


def http_app(ingress: Ingress, routes: Sequence[Route | Probe]) -> FastAPI:
    # /docs and /openapi.json are routes like the others (serve/ingress/endpoints/probes.py), behind the API key.
    app = FastAPI(title="siglip-serve", version="1", docs_url=None, redoc_url=None, openapi_url=None)
    install_openapi(app, operations(routes))  # real request bodies and error responses (serve/http/openapi.py)
    install_error_handlers(app, ingress.count_error)
    app.add_middleware(HeaderLimits, on_error=ingress.count_error)
    for route in routes:
        in_schema = route.in_schema if isinstance(route, Probe) else True
        app.add_api_route(route.path, _endpoint(ingress, route), methods=[route.method], include_in_schema=in_schema,
                          name=route.handler.__name__)
    return app


def _endpoint(ingress: Ingress, route: Route | Probe) -> Callable[[Request], Awaitable[Response]]:
    if isinstance(route, Probe):
        probe = route

        async def answer(request: Request) -> Response:
            if probe.auth:
                ingress.door.check_auth(request)
            return await probe.handler(ingress, request)

        return answer

    work = route

    async def endpoint(request: Request) -> Response:
        # The request's tenant and lane, for every queue it waits in from here on (core/lanes.py).
        lanes.enter(ingress.door.check_auth(request))
        ingress.require(*work.needs)
        async with ingress.door.deadline(request) as deadline:
            return await work.handler(ingress, request, deadline)

    return endpoint
