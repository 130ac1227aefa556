"""The ingress deployment: the HTTP contract (docs/http-api.md), on FastAPI.

It reads and limits the body, decodes and validates every image (a bad image fails only its own
request, before it can join a batch), sends uint8 chunks to the encoder deployment and turns the
result, or any failure, into the contract's JSON.
"""

# No `from __future__ import annotations`: FastAPI resolves route parameter types at runtime.
import asyncio
import base64
import hmac
import json
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Literal

import numpy as np
from fastapi import FastAPI, Request, Response
from pydantic import BaseModel, ConfigDict, ValidationError
from ray import serve
from ray.serve.handle import DeploymentHandle, DeploymentResponse
from starlette.datastructures import UploadFile
from starlette.formparsers import MultiPartException, MultiPartParser

from models.preprocess import ImageRejected, decode_base64_image, media_type_supported, preprocess_image
from serve import registry
from serve.config import ServiceConfig
from serve.encoder_deployment import DeadlineExceeded, count_images, encoder_max_ongoing
from serve.errors import ApiError, ErrorType, describe_validation, install_error_handlers
from serve.metrics import IngressMetrics
from serve.replica_logging import configure_replica_logging
from serve.text_routes import TextRoutes, input_kind

log = logging.getLogger("siglip_serve.ingress")

app = FastAPI(title="siglip-serve", version="1", docs_url="/docs", redoc_url=None)

# The replica in this process counts every error answer. `@serve.ingress` freezes the app with a
# cloudpickle round trip, which copies a closure's or lambda's globals, so the handlers reach the
# replica through a module-level function: pickled by reference, it reads this module's globals.
_count_error_in_replica: Callable[[ApiError], None] | None = None


def _on_error(error: ApiError) -> None:
    if _count_error_in_replica is not None:
        _count_error_in_replica(error)


install_error_handlers(app, _on_error)


class EmbeddingsRequest(BaseModel):
    """OpenAI's embeddings request shape, with images where OpenAI has text."""

    model_config = ConfigDict(extra="ignore")

    input: str | list[str]
    model: str | None = None
    encoding_format: Literal["float", "base64"] = "float"


async def read_body(request: Request, limit: int) -> bytes:
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise ApiError(413, ErrorType.PAYLOAD_TOO_LARGE, f"body is {int(declared)} bytes, over the {limit}-byte limit")
    body = bytearray()
    async for chunk in request.stream():
        body += chunk
        if len(body) > limit:
            raise ApiError(413, ErrorType.PAYLOAD_TOO_LARGE, f"body is over the {limit}-byte limit")
    if not body:
        raise ApiError(400, ErrorType.EMPTY_BODY, "request body is empty")
    return bytes(body)


async def multipart_files(request: Request, body: bytes) -> list[tuple[str, bytes]]:
    """(filename, bytes) of every file part, in order, from an already size-checked body."""

    async def replay() -> Any:
        yield body

    parser = MultiPartParser(request.headers, replay())
    # The body is already in memory and bounded by max_body_bytes: no spooling of parts to disk.
    parser.spool_max_size = len(body) + 1
    try:
        form = await parser.parse()
    except MultiPartException as exc:
        raise ApiError(400, ErrorType.INVALID_REQUEST, f"malformed multipart body: {exc.message}") from None
    files = []
    try:
        for _, value in form.multi_items():
            if isinstance(value, UploadFile):
                files.append((value.filename or "", await value.read()))
    finally:
        await form.close()
    if not files:
        raise ApiError(400, ErrorType.EMPTY_BODY, "multipart body has no file parts")
    return files


def render_embeddings(embeddings: np.ndarray, model: str, encoding_format: str) -> Response:
    rows: Sequence[Any]
    if encoding_format == "base64":
        rows = [base64.b64encode(row.astype("<f4").tobytes()).decode("ascii") for row in embeddings]
    else:
        rows = embeddings.astype(np.float32).tolist()
    body = {
        "object": "list",
        "data": [{"object": "embedding", "index": i, "embedding": row} for i, row in enumerate(rows)],
        "model": model,
        "usage": {"images": len(rows), "prompt_tokens": 0, "total_tokens": 0},
    }
    return Response(json.dumps(body, separators=(",", ":")), media_type="application/json")


class Ingress(TextRoutes):
    def __init__(self, encoder: DeploymentHandle, config: ServiceConfig, replicas: int, model: dict[str, Any],
                 text_encoder: DeploymentHandle | None = None) -> None:
        configure_replica_logging(config.log_level)
        self._init_text(text_encoder, config)
        self.encoder = encoder
        self.config = config
        self.expected_replicas = replicas
        self.model = model
        self.image_size = (int(model["image_size"][0]), int(model["image_size"][1]))
        self.limits = config.image_limits
        self.pool = ThreadPoolExecutor(config.decode_threads, thread_name_prefix="decode")
        self.metrics = IngressMetrics()
        self.app_name = serve.get_replica_context().app_name
        # Requests are accepted once every replica has been up once: a later replica restart makes
        # /readyz report 503 to probes, while the remaining replicas keep serving.
        self._accepting = False
        # The bounded queue: encoder calls this ingress has in flight, at most what the replicas
        # run at once plus `max_queued_requests` waiting. Past it a request is answered 503 at
        # once instead of queueing without bound.
        self.inflight_calls = 0
        self.max_inflight_calls = replicas * encoder_max_ongoing(config) + config.max_queued_requests
        # Chunks of concurrent requests travel to the encoder together: one Serve call per group
        # instead of one per request. With no wait, an idle ingress sends at once; under load, the
        # chunks that queue while every replica has two calls in flight form the next group.
        self._coalesced_embed = serve.batch(
            max_batch_size=config.max_batch_size, batch_wait_timeout_s=0.0,
            max_concurrent_batches=2 * replicas, batch_size_fn=count_images,
        )(self._send_group)
        # One replica per process: the latest one counts, so every error is counted exactly once.
        global _count_error_in_replica
        _count_error_in_replica = self._count_error

    # -- plumbing ---------------------------------------------------------------------------

    def _count_error(self, error: ApiError) -> None:
        self.metrics.rejected(error.error_type.value)
        level = logging.ERROR if error.status == 500 else logging.WARNING if error.status > 500 else logging.INFO
        log.log(level, "%d %s: %s", error.status, error.error_type.value, error.message)

    def _check_auth(self, request: Request) -> None:
        if self.config.api_key is None:
            return
        header = request.headers.get("authorization", "")
        scheme, _, token = header.partition(" ")
        expected = self.config.api_key.get_secret_value()
        if scheme.lower() != "bearer" or not hmac.compare_digest(token.strip().encode(), expected.encode()):
            raise ApiError(401, ErrorType.UNAUTHORIZED, "missing or wrong API key (Authorization: Bearer ...)",
                           {"WWW-Authenticate": "Bearer"})

    async def _replicas(self) -> list[dict[str, Any]]:
        return await asyncio.to_thread(registry.live_replicas, self.app_name)

    async def _all_ready(self) -> tuple[bool, int]:
        live = len(await self._replicas())
        ready = live >= self.expected_replicas
        self._accepting = self._accepting or ready
        return ready, live

    def _retry_after(self) -> dict[str, str]:
        return {"Retry-After": str(self.config.retry_after_s)}

    # -- the embedding path -----------------------------------------------------------------

    def _prepare(self, data: bytes | str) -> np.ndarray:
        began = time.perf_counter()
        raw = decode_base64_image(data, self.limits) if isinstance(data, str) else data
        array = preprocess_image(raw, self.image_size, self.limits, self.config.fast_jpeg_decode)
        self.metrics.preprocess_seconds.observe(time.perf_counter() - began)
        return array

    async def _prepare_all(self, items: Sequence[bytes | str], labels: Sequence[str]) -> np.ndarray:
        loop = asyncio.get_running_loop()
        futures = [loop.run_in_executor(self.pool, self._prepare, item) for item in items]
        arrays = []
        try:
            for future, label in zip(futures, labels):
                try:
                    arrays.append(await future)
                except ImageRejected as exc:
                    raise ApiError(exc.status, exc.error_type, f"{label}: {exc.message}") from None
        finally:
            # A rejected image, an error or a client gone: the request's other decodes are not needed.
            for future in futures:
                future.cancel()
        return np.stack(arrays)

    async def _encode(self, images: np.ndarray) -> np.ndarray:
        step = self.config.max_batch_size
        chunks = [images[start: start + step] for start in range(0, len(images), step)]
        if self.inflight_calls + len(chunks) > self.max_inflight_calls:
            raise ApiError(503, ErrorType.OVERLOADED, "server is at capacity; retry later", self._retry_after())
        self.inflight_calls += len(chunks)
        deadline = time.time() + self.config.request_timeout_s
        try:
            results = await asyncio.wait_for(
                asyncio.gather(*(self._coalesced_embed(chunk, deadline) for chunk in chunks)),
                timeout=self.config.request_timeout_s,
            )
        except (asyncio.TimeoutError, DeadlineExceeded):
            timed_out = True
        else:
            timed_out = False
        finally:
            self.inflight_calls -= len(chunks)
        if timed_out:
            raise ApiError(504, ErrorType.DEADLINE_EXCEEDED,
                           f"request did not finish within {self.config.request_timeout_s:g} s")
        return np.concatenate(results)

    async def _send_group(self, chunks: list[np.ndarray], deadlines: list[float]) -> list[Any]:
        # The latest deadline: a group is not dropped while any of its requests still waits.
        response = self.encoder.embed.remote(np.concatenate(chunks), max(deadlines))
        try:
            embeddings = await _awaited(response)
        except asyncio.CancelledError:
            response.cancel()
            raise
        # Any other error: Serve's batcher sets it on every waiting request of the group.
        out, offset = [], 0
        for chunk in chunks:
            out.append(embeddings[offset: offset + len(chunk)])
            offset += len(chunk)
        return out

    async def _serve_images(self, request: Request, endpoint: str, items: Sequence[bytes | str],
                            labels: Sequence[str], encoding_format: str = "float") -> Response:
        began = time.perf_counter()
        status = "200"
        try:
            if len(items) > self.config.max_images_per_request:
                raise ApiError(422, ErrorType.TOO_MANY_IMAGES,
                               f"{len(items)} images in one request; the limit is {self.config.max_images_per_request}")
            if not self._accepting:
                await self._all_ready()
                if not self._accepting:
                    raise ApiError(503, ErrorType.NOT_READY, "encoder replicas are still loading; retry later",
                                   self._retry_after())
            images = await self._prepare_all(items, labels)
            embeddings = await self._encode(images)
            response = render_embeddings(embeddings, self.model["name"], encoding_format)
            self.metrics.images_embedded.inc(len(embeddings), tags={"endpoint": endpoint})
            return response
        except ApiError as exc:
            status = str(exc.status)
            raise
        except asyncio.CancelledError:
            status = "499"  # the client went away; nginx's and Ray Serve's code for it
            raise
        except Exception:
            status = "500"
            raise
        finally:
            self.metrics.request_seconds.observe(time.perf_counter() - began,
                                                 tags={"endpoint": endpoint, "status": status})


async def _awaited(response: DeploymentResponse) -> np.ndarray:
    try:
        return await response
    except Exception as exc:  # noqa: BLE001 - Ray wraps replica errors; unwrap the one we answer
        if isinstance(exc, DeadlineExceeded) or isinstance(getattr(exc, "cause", None), DeadlineExceeded):
            raise DeadlineExceeded(str(exc)) from None
        raise


def _json_labels(count: int, single: bool) -> list[str]:
    return ["input"] if single else [f"input[{i}]" for i in range(count)]


@serve.ingress(app)
class IngressDeployment(Ingress):
    @app.post("/v1/embeddings")
    async def embeddings(self, request: Request) -> Response:
        self._check_auth(request)
        body = await read_body(request, self.config.max_body_bytes)
        try:
            parsed = EmbeddingsRequest.model_validate_json(body)
        except ValidationError as exc:
            raise ApiError(422, ErrorType.INVALID_REQUEST, describe_validation(exc.errors())) from None
        if parsed.model is not None and parsed.model != self.model["name"]:
            raise ApiError(422, ErrorType.INVALID_REQUEST,
                           f"model {parsed.model!r} is not served here; this service serves {self.model['name']!r}")
        single = isinstance(parsed.input, str)
        items = [parsed.input] if single else list(parsed.input)
        if not items:
            raise ApiError(422, ErrorType.INVALID_REQUEST, "input: at least one image or text is needed")
        labels = _json_labels(len(items), single)
        if input_kind(items, labels) == "text":
            return await self.serve_texts(items, labels, parsed.encoding_format)
        return await self._serve_images(request, "embeddings", items, labels, parsed.encoding_format)

    @app.post("/v1/classify")
    async def classify(self, request: Request) -> Response:
        return await self.classify_request(request)

    @app.post("/v1/embeddings/image")
    async def embeddings_image(self, request: Request) -> Response:
        self._check_auth(request)
        content_type = request.headers.get("content-type")
        is_multipart = (content_type or "").lower().startswith("multipart/form-data")
        if not is_multipart and not media_type_supported(content_type):
            raise ApiError(415, ErrorType.UNSUPPORTED_MEDIA_TYPE,
                           f"content type {content_type!r} is not a supported image type")
        body = await read_body(request, self.config.max_body_bytes)
        if not is_multipart:
            return await self._serve_images(request, "image", [body], ["image"])
        files = await multipart_files(request, body)
        labels = [f"file[{i}]" + (f" ({name})" if name else "") for i, (name, _) in enumerate(files)]
        return await self._serve_images(request, "multipart", [data for _, data in files], labels)

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
        ready, live = await self._all_ready()
        if not ready:
            raise ApiError(503, ErrorType.NOT_READY,
                           f"{live} of {self.expected_replicas} encoder replicas ready", self._retry_after())
        return Response(json.dumps({"status": "ready", "replicas": live}), media_type="application/json")
