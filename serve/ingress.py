"""The ingress deployment: the HTTP contract (docs/http-api.md), on FastAPI.

It reads and limits the body (serve/http_body.py), admits the request to the bounded queue, has
every image checked and decoded (serve/image_prep.py: a bad image fails only its own request, before
it can join a batch), sends uint8 chunks to the encoder deployment and turns the result, or any
failure, into the contract's JSON. One deadline, from the moment the request arrives here, covers
all of it.
"""

# No `from __future__ import annotations`: FastAPI resolves route parameter types at runtime.
import asyncio
import hmac
import json
import logging
import math
import os
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from typing import Any

import numpy as np
from fastapi import FastAPI, Request, Response
from fastapi.openapi.docs import get_swagger_ui_html
from ray import serve
from ray.serve.handle import DeploymentHandle

from siglip_serve.models.device_decode import JpegFiles
from siglip_serve.models.image_errors import ImageRejected
from siglip_serve.serve import registry
from siglip_serve.serve.config import ServiceConfig
from siglip_serve.serve.encoder_client import EncoderClient
from siglip_serve.serve.encoder_deployment import DeadlineExceeded, encoder_max_ongoing
from siglip_serve.serve.errors import ApiError, ErrorType, error_response, image_error, install_error_handlers
from siglip_serve.serve.http_body import (
    EmbeddingsRequest,
    HeaderLimits,
    check_image_content_type,
    file_labels,
    is_multipart,
    multipart_files,
    parse_json_request,
    read_body,
    render_embeddings,
)
from siglip_serve.serve.image_prep import ImagePrep
from siglip_serve.serve.metrics import IngressMetrics
from siglip_serve.serve.openapi import install_openapi, openapi_document
from siglip_serve.serve.replica_logging import configure_replica_logging
from siglip_serve.serve.text_routes import TextRoutes, input_kind

log = logging.getLogger("siglip_serve.ingress")

# /docs and /openapi.json are routes of the deployment below, behind the API key like the rest.
app = FastAPI(title="siglip-serve", version="1", docs_url=None, redoc_url=None, openapi_url=None)
install_openapi(app)  # real request bodies and error responses (serve/openapi.py)

# How often an ingress replica looks for the drain mark that `siglip-serve run` sets on SIGTERM.
DRAIN_POLL_S = 0.25

# The replica in this process counts every error answer. `@serve.ingress` freezes the app with a
# cloudpickle round trip, which copies a closure's or lambda's globals, so the handlers reach the
# replica through a module-level function: pickled by reference, it reads this module's globals.
_count_error_in_replica: Callable[[ApiError], None] | None = None


def _on_error(error: ApiError) -> None:
    if _count_error_in_replica is not None:
        _count_error_in_replica(error)


install_error_handlers(app, _on_error)
app.add_middleware(HeaderLimits, on_error=_on_error)


class Ingress(TextRoutes):
    def __init__(self, encoder: DeploymentHandle, config: ServiceConfig, replicas: int, model: dict[str, Any],
                 text_encoder: DeploymentHandle | None = None) -> None:
        configure_replica_logging(config.log_level)
        self._init_text(text_encoder, config)
        self.encoder = encoder
        self.encoder_client = EncoderClient(encoder, replicas, config.ingress_count, config.max_batch_size,
                                            config.retry_after_s, max_in_flight=replicas * encoder_max_ongoing(config),
                                            model_on_host_cores=config.backend == "cpu")
        self.config = config
        self.expected_replicas = replicas
        self.min_ready = min(config.min_ready_replicas, replicas)
        self.model = model
        self.image_size = (int(model["image_size"][0]), int(model["image_size"][1]))
        self.api_key = config.resolve_api_key(os.environ)
        self.metrics = IngressMetrics()
        self.images = ImagePrep(config, self.image_size, self.metrics.preprocess_seconds.observe)
        context = serve.get_replica_context()
        self.app_name = context.app_name
        self.replica_name = context.replica_id.unique_id
        # Requests are accepted once `min_ready` replicas have been up once: a later replica
        # restart shows in /readyz's counts while the remaining replicas keep serving.
        self._accepting = False
        self._draining = False
        self._ready_check: asyncio.Future[list[dict[str, Any]]] | None = None
        self._drain_watch: asyncio.Task[None] | None = None
        self.requests_in_handler = 0
        # The bounded queue: encoder calls admitted requests will make, at most what the replicas
        # run at once plus `max_queued_requests` waiting. Checked when a request arrives, before
        # any decoding: past it the request is answered 503 at once.
        self.inflight_calls = 0
        self.max_inflight_calls = replicas * encoder_max_ongoing(config) + config.max_queued_requests
        # One replica per process: the latest one counts, so every error is counted exactly once.
        global _count_error_in_replica
        _count_error_in_replica = self._count_error

    # -- plumbing ---------------------------------------------------------------------------

    def _count_error(self, error: ApiError) -> None:
        self.metrics.rejected(error.error_type.value)
        # Quiet by default: client errors, not-ready (every probe during start-up) and overload
        # (every shed request) are counted by siglip_requests_rejected_total, logged at DEBUG.
        if error.status == 500:
            level = logging.ERROR
        elif error.status > 500 and error.error_type not in (ErrorType.NOT_READY, ErrorType.OVERLOADED):
            level = logging.WARNING
        else:
            level = logging.DEBUG
        log.log(level, "%d %s: %s", error.status, error.error_type.value, error.message)

    def _check_auth(self, request: Request) -> None:
        if self.api_key is None:
            return
        header = request.headers.get("authorization", "")
        scheme, _, token = header.partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(token.strip().encode(), self.api_key.encode()):
            raise ApiError(401, ErrorType.UNAUTHORIZED, "missing or wrong API key (Authorization: Bearer ...)",
                           {"WWW-Authenticate": "Bearer"})

    async def _replicas(self) -> list[dict[str, Any]]:
        return await asyncio.to_thread(registry.live_replicas, self.app_name)

    async def _ready(self) -> tuple[bool, int]:
        # One look at the replica registry at a time, shared by every request that waits for it:
        # a burst on a fresh ingress must not queue a GCS call per request.
        if self._ready_check is None or self._ready_check.done():
            self._ready_check = asyncio.ensure_future(self._replicas())
        replicas = await asyncio.shield(self._ready_check)
        live = len(replicas)
        ready = live >= self.min_ready
        if ready:
            self.encoder_client.tune(full_batch_seconds(replicas, self.config.max_batch_size))
        self._accepting = self._accepting or ready
        return ready, live

    def _retry_after(self) -> dict[str, str]:
        return {"Retry-After": str(self.config.retry_after_s)}

    def _watch_for_drain(self) -> None:
        if self._drain_watch is None:
            self._drain_watch = asyncio.get_running_loop().create_task(self._drain_loop())

    async def _drain_loop(self) -> None:
        while True:
            try:
                draining = await asyncio.to_thread(registry.is_draining, self.app_name)
                if draining:
                    self._draining = True
                    await asyncio.to_thread(registry.publish_in_flight, self.app_name, self.replica_name,
                                            self.requests_in_handler, time.time())
            except Exception:  # the GCS briefly unreachable: try again next period
                log.debug("drain poll failed", exc_info=True)
            await asyncio.sleep(DRAIN_POLL_S)

    @asynccontextmanager
    async def _deadline(self) -> AsyncIterator[float]:
        """The request's one deadline, from its arrival here; yields it as time.monotonic()."""
        self._watch_for_drain()
        timeout = self.config.request_timeout_s
        deadline = time.monotonic() + timeout
        self.requests_in_handler += 1
        try:
            async with asyncio.timeout(timeout):
                yield deadline
        except TimeoutError:
            raise ApiError(504, ErrorType.DEADLINE_EXCEEDED, f"request did not finish within {timeout:g} s") from None
        finally:
            self.requests_in_handler -= 1

    @asynccontextmanager
    async def _admitted(self, images: int) -> AsyncIterator[None]:
        """A place in the bounded queue for this request's encoder calls, or 503 now."""
        if self._draining:
            raise ApiError(503, ErrorType.NOT_READY, "server is shutting down; retry", self._retry_after())
        if not self._accepting:
            await self._ready()
            if not self._accepting:
                raise ApiError(503, ErrorType.NOT_READY, "encoder replicas are still loading; retry later",
                               self._retry_after())
        calls = math.ceil(images / self.config.max_batch_size)
        if self.inflight_calls + calls > self.max_inflight_calls:
            raise ApiError(503, ErrorType.OVERLOADED, "server is at capacity; retry later", self._retry_after())
        self.inflight_calls += calls
        try:
            yield
        finally:
            self.inflight_calls -= calls

    # -- the embedding path -----------------------------------------------------------------

    async def _encode(self, images: np.ndarray | JpegFiles, deadline: float) -> np.ndarray:
        wall_deadline = time.time() + (deadline - time.monotonic())
        try:
            return await self.encoder_client.embed(images, wall_deadline)
        except DeadlineExceeded:
            raise ApiError(504, ErrorType.DEADLINE_EXCEEDED,
                           f"request did not finish within {self.config.request_timeout_s:g} s") from None
        except ImageRejected as exc:  # a JPEG the device decoder refused (device_jpeg_decode)
            raise image_error(exc) from None

    async def _timed(self, endpoint: str, work: Awaitable[Response], deadline: float) -> Response:
        """Await a route's work and observe siglip_request_seconds with the status it ended in."""
        began = time.perf_counter()
        status = "200"
        try:
            return await work
        except ApiError as exc:
            status = str(exc.status)
            raise
        except asyncio.CancelledError:
            # The deadline (answered 504 by _deadline) or the client went away (499: nginx's and
            # Ray Serve's code for it).
            status = "504" if time.monotonic() >= deadline else "499"
            raise
        except Exception:
            status = "500"
            raise
        finally:
            self.metrics.request_seconds.observe(time.perf_counter() - began,
                                                 tags={"endpoint": endpoint, "status": status})

    async def _serve_images(self, request: Request, endpoint: str, items: Sequence[bytes | str],
                            labels: Sequence[str], deadline: float, encoding_format: str = "float") -> Response:
        async def work() -> Response:
            if len(items) > self.config.max_images_per_request:
                raise ApiError(422, ErrorType.TOO_MANY_IMAGES,
                               f"{len(items)} images in one request; the limit is {self.config.max_images_per_request}")
            async with self._admitted(len(items)):
                images = await self.images.prepare_all(items, labels)
                embeddings = await self._encode(images, deadline)
            response = render_embeddings(embeddings, self.model["name"], encoding_format)
            self.metrics.images_embedded.inc(len(embeddings), tags={"endpoint": endpoint})
            return response

        return await self._timed(endpoint, work(), deadline)


def full_batch_seconds(replicas: list[dict[str, Any]], max_batch_size: int) -> float | None:
    """The slowest warm replica's forward time of its largest bucket, from its warm-up."""
    times = [r.get("warmup_seconds", {}).get(str(max_batch_size)) for r in replicas]
    known = [float(t) for t in times if t is not None]
    return max(known) if known else None


@serve.ingress(app)
class IngressDeployment(Ingress):
    @app.post("/v1/embeddings")
    async def embeddings(self, request: Request) -> Response:
        self._check_auth(request)
        async with self._deadline() as deadline:
            body = await read_body(request, self.config.max_body_bytes)
            parsed, items, labels = parse_json_request(body, EmbeddingsRequest, self.model["name"])
            if not items:
                raise ApiError(422, ErrorType.INVALID_REQUEST, "input: at least one image or text is needed")
            if input_kind(items, labels) == "text":
                return await self.serve_texts(items, labels, parsed.encoding_format, deadline)
            return await self._serve_images(request, "embeddings", items, labels, deadline, parsed.encoding_format)

    @app.post("/v1/classify")
    async def classify(self, request: Request) -> Response:
        self._check_auth(request)
        async with self._deadline() as deadline:
            return await self.classify_request(request, deadline)

    @app.post("/v1/embeddings/image")
    async def embeddings_image(self, request: Request) -> Response:
        self._check_auth(request)
        multipart = is_multipart(request)
        if not multipart:
            check_image_content_type(request)
        async with self._deadline() as deadline:
            body = await read_body(request, self.config.max_body_bytes)
            if not multipart:
                return await self._serve_images(request, "image", [body], ["image"], deadline)
            files = await multipart_files(request, body)
            return await self._serve_images(request, "multipart", [data for _, data in files], file_labels(files),
                                            deadline)

    @app.get("/v1/models")
    async def models(self, request: Request) -> dict[str, Any]:
        self._check_auth(request)
        replicas = await self._replicas()
        lnc = next((r.get("lnc") or r.get("neuron_logical_nc_config") for r in replicas
                    if r.get("lnc") or r.get("neuron_logical_nc_config")), None)
        entry = {
            "id": self.model["name"],
            "object": "model",
            "owned_by": "siglip-serve",
            "embedding_dim": self.model["embed_dim"],
            "image_size": list(self.image_size),
            "backend": self.config.backend,
            "weights": self.config.weights_source,
            "lnc": int(lnc) if lnc is not None else None,
            "buckets": list(self.config.buckets),
            "replicas_expected": self.expected_replicas,
            "ingress_replicas": self.config.ingress_count,
            "ingress_replica": self.replica_name,
            "replicas_min_ready": self.min_ready,
            "replicas": replicas,
            "modalities": self.modalities,
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
