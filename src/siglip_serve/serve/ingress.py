"""The ingress deployment: the HTTP contract (docs/http-api.md), on FastAPI.

It takes the request's place among those the replica works on, reads and limits the body
(serve/http_body.py), has every image checked and decoded (serve/image_prep.py: a bad image fails only its own request,
before it can join a batch) or every text checked (serve/text_routes.py), sends the chunks to the
tower's deployment and turns the result, or any failure, into the contract's JSON. One deadline, from
the moment the front end had the request, covers all of it; serve/ingress_core.py holds what both towers'
routes share.
"""

# No `from __future__ import annotations`: FastAPI resolves route parameter types at runtime.
import asyncio
import json
import logging
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
from fastapi import FastAPI, Request, Response
from fastapi.openapi.docs import get_swagger_ui_html
from ray import serve
from ray.serve.handle import DeploymentHandle

from siglip_serve.models.loading import ModelInfo
from siglip_serve.serve import registry, tracing
from siglip_serve.serve.config import ServiceConfig
from siglip_serve.serve.embed_request import (
    CohereEmbedRequest,
    EmbeddingsRequest,
    Item,
    read_cohere_items,
    read_items,
)
from siglip_serve.serve.embedding_output import check_dimensions, cut_dimensions
from siglip_serve.serve.errors import ApiError, ErrorType, error_response, install_error_handlers
from siglip_serve.serve.http_body import (
    HeaderLimits,
    check_image_content_type,
    file_labels,
    is_multipart,
    multipart_files,
    parse_json,
    read_body,
    render_cohere,
    render_embeddings,
)
from siglip_serve.serve.ingress_scaling import BUSY_CORES, BusyCores
from siglip_serve.serve.openapi import install_openapi, openapi_document
from siglip_serve.serve.text_routes import TextRoutes, check_texts

log = logging.getLogger("siglip_serve.ingress")

# /docs and /openapi.json are routes of the deployment below, behind the API key like the rest.
app = FastAPI(title="siglip-serve", version="1", docs_url=None, redoc_url=None, openapi_url=None)
install_openapi(app)  # real request bodies and error responses (serve/openapi.py)

# The replica in this process counts every error answer. `@serve.ingress` freezes the app with a
# cloudpickle round trip, which copies a closure's or lambda's globals, so the handlers reach the
# replica through a module-level function: pickled by reference, it reads this module's globals.
_count_error_in_replica: Callable[[ApiError], None] | None = None


def _on_error(error: ApiError) -> None:
    if _count_error_in_replica is not None:
        _count_error_in_replica(error)


install_error_handlers(app, _on_error)
app.add_middleware(HeaderLimits, on_error=_on_error)


# (rows in input order, images, texts) -> the route's answer.
Render = Callable[[np.ndarray, int, int], Response]


class Ingress(TextRoutes):
    def __init__(self, encoder: DeploymentHandle, config: ServiceConfig, replicas: int, model: ModelInfo,
                 text_encoder: DeploymentHandle | None = None) -> None:
        super().__init__(encoder, config, replicas, model, text_encoder)
        # One replica per process: the latest one counts, so every error is counted exactly once.
        global _count_error_in_replica
        _count_error_in_replica = self._count_error
        self._busy_cores = BusyCores()

    async def record_autoscaling_stats(self) -> dict[str, float]:
        """What Serve's controller gets for `ingress_autoscaling` (serve/ingress_scaling.py); Serve calls
        this only on an autoscaled deployment."""
        return {BUSY_CORES: self._busy_cores.read()}

    async def _serve(self, route: str, items: Sequence[Item], deadline: float, render: Render | None = None,
                     dimensions: int | None = None) -> Response:
        """Each item through its tower; the rows in input order, answered by
        `render(rows, images, texts)` (the route's shape; float JSON by default). Every limit is checked
        before any decoding or tokenizing; both towers' queues admit their part. `route` labels the
        embedded counters; the request metric says "text" for texts alone, as before mixed requests."""
        async def work() -> Response:
            cut = check_dimensions(dimensions, self.model.embed_dim, self.config.allow_dimension_truncation)
            images = [i for i, item in enumerate(items) if item.kind == "image"]
            texts = [i for i, item in enumerate(items) if item.kind == "text"]
            limit = self.config.max_images_per_request
            if len(images) > limit:
                raise ApiError(422, ErrorType.TOO_MANY_IMAGES,
                               f"{len(images)} images in one request; the limit is {limit}")
            text_values = [str(items[i].value) for i in texts]
            if texts:
                self._require_text()
                check_texts(text_values, [items[i].label for i in texts], self.config)
            for tower, count in (("image", len(images)), ("text", len(texts))):
                if count:
                    await self._admitted(tower, deadline)
            tasks = [asyncio.ensure_future(self._embed_images([items[i].value for i in images],
                                                              [items[i].label for i in images], deadline)),
                     asyncio.ensure_future(self._encode("text", text_values, deadline) if texts else _nothing())]
            try:
                parts = await asyncio.gather(*tasks)
            except BaseException:
                for task in tasks:  # one tower failed (a bad image): the other's work is not wanted
                    task.cancel()
                raise
            rows = _in_order(len(items), (images, parts[0]), (texts, parts[1]))
            if cut is not None:
                rows = cut_dimensions(rows, cut)
            with tracing.span("render", rows=len(rows)):
                if render is None:
                    response = render_embeddings(rows, self.model.name, "float", images=len(images), texts=len(texts))
                else:
                    response = render(rows, len(images), len(texts))
            if images:
                self.metrics.images_embedded.inc(len(images), tags={"endpoint": route})
            if texts:
                self.metrics.texts_embedded.inc(len(texts), tags={"endpoint": route})
            return response

        return await self._timed("text" if texts_only(items) else route, work(), deadline)

    async def _embed_images(self, values: Sequence[bytes | str], labels: Sequence[str],
                            deadline: float) -> np.ndarray | None:
        if not values:
            return None
        with tracing.span("decode", images=len(values)):
            pixels = await self.images.prepare_all(values, labels)
        return await self._encode("image", pixels, deadline)


def texts_only(items: Sequence[Item]) -> bool:
    return all(item.kind == "text" for item in items)


def image_items(values: Sequence[bytes], labels: Sequence[str]) -> list[Item]:
    return [Item("image", value, label) for value, label in zip(values, labels, strict=True)]


async def _nothing() -> None:
    return None


def _in_order(count: int, *parts: tuple[list[int], np.ndarray | None]) -> np.ndarray:
    """Each tower's rows put back at their items' places in the request."""
    width = next(rows.shape[1] for _, rows in parts if rows is not None)
    out = np.empty((count, width), dtype=np.float32)
    for places, rows in parts:
        if rows is not None:
            out[places] = rows
    return out


@serve.ingress(app)
class IngressDeployment(Ingress):
    @app.post("/v1/embeddings")
    async def embeddings(self, request: Request) -> Response:
        self._check_auth(request)
        async with self._deadline(request) as deadline:
            body = await read_body(request, self.config.max_body_bytes)
            parsed = parse_json(body, EmbeddingsRequest, self.model.name)
            items = read_items(parsed)
            encoding = parsed.encoding()

            def render(rows: np.ndarray, images: int, texts: int) -> Response:
                return render_embeddings(rows, self.model.name, encoding, images, texts,
                                         read_as=[item.kind for item in items])

            return await self._serve("embeddings", items, deadline, render, parsed.dimensions)

    @app.post("/v2/embed")
    async def embed_v2(self, request: Request) -> Response:
        """Cohere's v2 embed shape on the same path as /v1/embeddings (serve/embed_request.py)."""
        self._check_auth(request)
        async with self._deadline(request) as deadline:
            body = await read_body(request, self.config.max_body_bytes)
            parsed = parse_json(body, CohereEmbedRequest, self.model.name)
            items = read_cohere_items(parsed)
            texts = [str(item.value) for item in items if item.kind == "text"]

            def render(rows: np.ndarray, images: int, _: int) -> Response:
                return render_cohere(rows, self.model.name, parsed.embedding_types, texts, images)

            return await self._serve("v2_embed", items, deadline, render, parsed.output_dimension)

    @app.post("/v1/classify")
    async def classify(self, request: Request) -> Response:
        self._check_auth(request)
        async with self._deadline(request) as deadline:
            return await self.classify_request(request, deadline)

    @app.post("/v1/embeddings/image")
    async def embeddings_image(self, request: Request) -> Response:
        self._check_auth(request)
        multipart = is_multipart(request)
        if not multipart:
            check_image_content_type(request)
        async with self._deadline(request) as deadline:
            body = await read_body(request, self.config.max_body_bytes)
            if not multipart:
                return await self._serve("image", image_items([body], ["image"]), deadline)
            files = await multipart_files(request, body)
            return await self._serve("multipart", image_items([data for _, data in files], file_labels(files)),
                                     deadline)

    @app.get("/v1/models")
    async def models(self, request: Request) -> dict[str, Any]:
        self._check_auth(request)
        replicas = await self._replicas()
        lnc = next((r.get("lnc") or r.get("neuron_logical_nc_config") for r in replicas
                    if r.get("lnc") or r.get("neuron_logical_nc_config")), None)
        entry = {
            "id": self.model.name,
            "object": "model",
            "owned_by": "siglip-serve",
            "embedding_dim": self.model.embed_dim,
            "image_size": list(self.image_size),
            "backend": self.config.backend,
            "weights": self.config.weights_source,
            "lnc": int(lnc) if lnc is not None else None,
            "buckets": list(self.config.buckets),
            "replicas_expected": self.expected_replicas,
            "ingress_replicas": self.config.ingress_count,
            "ingress_autoscaling": (self.config.ingress_autoscaling.model_dump(include={"min_replicas", "max_replicas"})
                                    if self.config.ingress_autoscaling is not None else None),
            "ingress_replica": self.replica_name,
            "replicas_min_ready": self.min_ready,
            "replicas": replicas,
            "modalities": self.modalities,
            "text_off_reason": self.text_off_reason,
            "text": await self.text_info(wait_s=5.0),
        }
        return {"object": "list", "data": [entry]}

    @app.get("/healthz")
    async def healthz(self) -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/readyz")
    async def readyz(self) -> Response:
        # Probe answers are not counted as rejections: a 503 here is a state, not a refused request.
        self._watch_for_drain()
        ready, live = await self._ready()
        counts = {"replicas": live, "replicas_expected": self.expected_replicas, "replicas_min_ready": self.min_ready}
        if self._draining or await asyncio.to_thread(registry.is_draining, self.app_name):
            self._draining = True
            return error_response(ApiError(503, ErrorType.NOT_READY, "server is shutting down", self._retry_after()))
        if not ready:
            message = f"{live} of {self.expected_replicas} encoder replicas ready; {self.min_ready} needed"
            return error_response(ApiError(503, ErrorType.NOT_READY, message, self._retry_after()))
        return Response(json.dumps({"status": "ready", **counts}), media_type="application/json")

    @app.get("/openapi.json", include_in_schema=False)
    async def openapi(self, request: Request) -> Response:
        self._check_auth(request)
        # The app serving this request: in a replica, Serve's wrapper around a frozen copy of ours.
        return Response(json.dumps(openapi_document(request.app)), media_type="application/json")

    @app.get("/docs", include_in_schema=False)
    async def docs(self, request: Request) -> Response:
        # With an API key the browser's fetch of /openapi.json needs the header too (docs/http-api.md).
        self._check_auth(request)
        root = request.scope.get("root_path", "").rstrip("/")
        return get_swagger_ui_html(openapi_url=f"{root}/openapi.json", title="siglip-serve")
