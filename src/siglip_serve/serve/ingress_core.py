"""What every ingress route shares, for both towers: auth, readiness, the drain, the request's one
deadline, admission to the bounded queue, the encoder calls and the request metric.

A route takes the request's place and deadline first (`_deadline`: the deadline begins when the front end
had the request, serve/front_door.py; 503 at once when the ingress already works on and holds as many
requests as it may), reads its body, then for each tower it uses: `_admitted(tower, deadline)` (503 while
draining or while the tower is still loading; before any decoding or tokenizing), then
`_encode(tower, items, deadline)` (serve/encoder_client.py: a dead replica retried
once, a caller that leaves drops its own chunk, the call itself cancelled once nobody waits for it,
504 when the deadline passes). Image and text follow the same path; only their limits and what their
items are differ.
"""

# No `from __future__ import annotations`: FastAPI resolves route parameter types at runtime.
import asyncio
import contextlib
import hmac
import logging
import os
import time
from collections.abc import AsyncIterator, Awaitable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import numpy as np
from fastapi import Request, Response
from ray import serve
from ray.serve.handle import DeploymentHandle

from siglip_serve.core.front_door import REQUEST_START_HEADER, write_limits
from siglip_serve.models.device_decode import JpegFiles
from siglip_serve.models.image_errors import ImageRejected
from siglip_serve.models.loading import ModelInfo
from siglip_serve.serve import registry, tracing
from siglip_serve.serve.config import ServiceConfig
from siglip_serve.serve.encoder_client import EncoderClient
from siglip_serve.serve.encoder_deployment import encoder_max_ongoing
from siglip_serve.serve.errors import ApiError, ErrorType, image_error
from siglip_serve.serve.front_door import Deadline, RequestSlots, front_door_limits
from siglip_serve.serve.image_prep import ImagePrep
from siglip_serve.serve.metrics import IngressMetrics
from siglip_serve.serve.replica_grpc import bind_to_node_address
from siglip_serve.serve.replica_logging import configure_replica_logging
from siglip_serve.serve.text_deployment import text_max_ongoing
from siglip_serve.serve.tower_replica import DeadlineExceeded

log = logging.getLogger("siglip_serve.ingress")

# How often an ingress replica looks for the drain mark that `siglip-serve run` sets on SIGTERM.
DRAIN_POLL_S = 0.25


@dataclass
class Tower:
    """The ingress's side of one tower: its coalescing client of the tower's deployment."""

    client: EncoderClient


class IngressCore:
    def __init__(self, encoder: DeploymentHandle, config: ServiceConfig, replicas: int, model: ModelInfo,
                 text_encoder: DeploymentHandle | None = None, replica: tuple[str, str] | None = None) -> None:
        """`replica`: (application, replica id); read from Serve's replica context when not given."""
        configure_replica_logging(config.log_level)
        bind_to_node_address()
        tracing.configure(config.tracing, "ingress")
        self.config = config
        self.expected_replicas = replicas
        # Autoscaling: `replicas` is max_replicas (admission and the coalescing window are sized for the
        # most replicas, so a queue forms that Serve's autoscaler sees); readiness asks for no more than min.
        floor = config.autoscaling.min_replicas if config.autoscaling is not None else replicas
        self.min_ready = min(config.min_ready_replicas, replicas, floor)
        self.model = model
        self.image_size = model.image_size
        self.api_key = config.resolve_api_key(os.environ)
        self.metrics = IngressMetrics()
        self.images = ImagePrep(config, self.image_size, self.metrics.preprocess_seconds.observe)
        image_calls = replicas * encoder_max_ongoing(config)
        self.towers = {"image": Tower(EncoderClient(encoder, replicas, config.ingress_count, config.max_batch_size,
                                                    config.retry_after_s, max_in_flight=image_calls,
                                                    model_on_host_cores=config.model_on_host_cores,
                                                    grpc=config.serve_throughput_mode))}
        self.text_encoder = text_encoder
        if text_encoder is not None:
            text_calls = config.text_replica_count * text_max_ongoing(config)
            self.towers["text"] = Tower(EncoderClient(text_encoder, config.text_replica_count, config.ingress_count,
                                                      config.text_buckets[-1], config.retry_after_s,
                                                      max_in_flight=text_calls, tower="text",
                                                      grpc=config.serve_throughput_mode))
        self._text_info: dict[str, Any] | None = None
        if replica is None:
            context = serve.get_replica_context()
            replica = (context.app_name, context.replica_id.unique_id)
        self.app_name, self.replica_name = replica
        limits = front_door_limits(config, replicas)
        self.slots = RequestSlots(limits.max_ongoing_requests, limits.max_queued_requests, config.retry_after_s)
        # For HAProxy (launcher/haproxy_front.py), before this replica is its server: the same limits there.
        write_limits(limits, self.app_name)
        # Requests are accepted once `min_ready` replicas have been up once: a later replica
        # restart shows in /readyz's counts while the remaining replicas keep serving.
        self._accepting = False
        self._draining = False
        self._ready_check: asyncio.Future[list[dict[str, Any]]] | None = None
        self._drain_watch: asyncio.Task[None] | None = None
        self.requests_in_handler = 0

    # -- who may ask ------------------------------------------------------------------------

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

    def _retry_after(self) -> dict[str, str]:
        return {"Retry-After": str(self.config.retry_after_s)}

    # -- readiness and the drain ------------------------------------------------------------

    @property
    def modalities(self) -> list[str]:
        return ["image", "text"] if self.text_encoder is not None else ["image"]

    @property
    def text_off_reason(self) -> str | None:
        """Why this service serves no text (null when it does): the setting, or what the start found."""
        if self.text_encoder is not None:
            return None
        return self.config.text_off_reason or "text_replicas: 0"

    def _require_text(self) -> DeploymentHandle:
        if self.text_encoder is None:
            raise ApiError(404, ErrorType.NOT_FOUND,
                           f"this service serves no text tower ({self.text_off_reason}); send images, or set "
                           "tokenizer: DIR / text_replicas: N and restart")
        return self.text_encoder

    async def text_info(self, wait_s: float | None = None) -> dict[str, Any] | None:
        """The text replica's description (context length, tokenizer, logit scale and bias), cached."""
        if self.text_encoder is None:
            return None
        if self._text_info is None:
            try:
                # Bounded: /v1/models must answer while a text replica is still loading.
                self._text_info = await asyncio.wait_for(self.text_encoder.describe.remote(), timeout=wait_s)
            except TimeoutError:
                return None
        return self._text_info

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
            self.towers["image"].client.tune(full_batch_seconds(replicas, self.config.max_batch_size))
        self._accepting = self._accepting or ready
        return ready, live

    async def _tower_ready(self, tower: str, deadline: float) -> None:
        if tower == "text":
            # Waits for a loading text replica as long as the request may (its describe answers once warm).
            if await self.text_info(wait_s=max(0.0, deadline - time.monotonic())) is None:
                raise ApiError(503, ErrorType.NOT_READY, "the text encoder is still loading; retry later",
                               self._retry_after())
        elif not self._accepting:
            await self._ready()
            if not self._accepting:
                raise ApiError(503, ErrorType.NOT_READY, "encoder replicas are still loading; retry later",
                               self._retry_after())

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

    # -- one request ------------------------------------------------------------------------

    @asynccontextmanager
    async def _deadline(self, request: Request) -> AsyncIterator[float]:
        """The request's place among those this replica works on, and its one deadline (begun when the
        front end had it: X-Request-Start); yields the deadline as time.monotonic(). 503 at once when
        every place is taken and `max_queued_requests` wait; 504 when the deadline passes, waiting for a
        place included. With tracing on, the request's span (continuing the client's `traceparent`)
        is open meanwhile."""
        self._watch_for_drain()
        timeout = self.config.request_timeout_s
        deadline = Deadline(request.headers.get(REQUEST_START_HEADER), timeout)
        self.requests_in_handler += 1
        try:
            with self._request_span(request):
                async with asyncio.timeout(deadline.remaining()), self.slots.place():
                    yield deadline.at
        except TimeoutError:
            raise ApiError(504, ErrorType.DEADLINE_EXCEEDED, f"request did not finish within {timeout:g} s") from None
        finally:
            self.requests_in_handler -= 1

    def _request_span(self, request: Request) -> contextlib.AbstractContextManager[Any]:
        if not tracing.enabled():  # before the attributes below are computed
            return tracing.span("http.request")
        return tracing.span("http.request", parent=tracing.extract(dict(request.headers)),
                            attributes={"http.request.method": request.method, "http.route": request.url.path,
                                        "siglip.request_id": request_id(request)})

    async def _admitted(self, tower: str, deadline: float) -> None:
        """`tower` takes this request's work, or 503 now: while draining, or while the tower still loads."""
        if tower == "text":
            self._require_text()
        if self._draining:
            raise ApiError(503, ErrorType.NOT_READY, "server is shutting down; retry", self._retry_after())
        await self._tower_ready(tower, deadline)

    async def _encode(self, tower: str, items: np.ndarray | JpegFiles | Sequence[str], deadline: float) -> np.ndarray:
        """Admitted items -> float32 [n, D], within the request's deadline (time.monotonic())."""
        wall_deadline = time.time() + (deadline - time.monotonic())
        try:
            with tracing.span("encode", tower=tower, items=len(items)):
                return await self.towers[tower].client.embed(items, wall_deadline, tracing.inject())
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
            tracing.annotate(**{"http.response.status_code": int(status), "siglip.endpoint": endpoint})


def request_id(request: Request) -> str | None:
    """The id Serve logs the request under (its access log and replica logs), or the client's X-Request-Id."""
    given = request.headers.get("x-request-id")
    if given:
        return given
    try:
        from ray.serve.context import _get_serve_request_context

        return _get_serve_request_context().request_id or None
    except Exception:  # broad on purpose: a private API that may move; the id is an attribute, not a need
        return None


def full_batch_seconds(replicas: list[dict[str, Any]], max_batch_size: int) -> float | None:
    """The slowest warm replica's forward time of its largest bucket, from its warm-up."""
    times = [r.get("warmup_seconds", {}).get(str(max_batch_size)) for r in replicas]
    known = [float(t) for t in times if t is not None]
    return max(known) if known else None
