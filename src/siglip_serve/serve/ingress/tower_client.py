"""The ingress's side of a tower's deployment (image or text): its requests' chunks, coalesced into few calls.

Every call through a Serve handle costs host CPU on both sides whatever it carries (routing,
tracing hooks, Ray's task submission and reply, the replica's request wrapper): measured on
tiny-siglip, about 4 ms of CPU per single-image call, against ~1.5 ms to decode the image. Where the
model is that fast (a full batch in less than the CPU its calls would cost one by one, read from the
replicas' warm-up), the ingress keeps only a few calls in flight per tower replica; while they run,
chunks queue here, and when one returns, what queued meanwhile (up to the largest bucket's images,
shared fairly when several calls are free) goes out as one call. At low load a chunk still goes out
alone and at once. Behind a slow model every chunk goes at once, as before: held back here, it would
miss the replica's next batch.

Each chunk keeps its own answer: the replica returns one result per chunk (its embeddings, or the
error only it failed with, e.g. its deadline passed in the queue), a dead replica is retried once
for the whole call, and a caller that leaves drops only its own chunk. Chunks queue here in their requests'
lane order (serve/shared/batcher.py), and each call carries its chunks' tickets (lane, tenant, weight) so the
replica's own batch queue orders them the same way.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from typing import Any, cast

import numpy as np
from ray.exceptions import RayActorError
from ray.serve.handle import DeploymentHandle, DeploymentResponse

from siglip_serve.core import lanes
from siglip_serve.core.lanes import Lane, Ticket
from siglip_serve.models.device_decode import JpegFiles
from siglip_serve.serve.http.errors import ApiError, ErrorType
from siglip_serve.serve.plan.planner import calls_in_flight
from siglip_serve.serve.shared.batcher import Batcher
from siglip_serve.serve.shared.tracing import Carrier

log = logging.getLogger("siglip_serve.ingress")

# Host CPU one tower call costs on both sides, whatever it carries (tiny-siglip on the dev VM).
CALL_CPU_SECONDS = 0.004
_PLAIN = (int(Ticket().lane), Ticket().tenant, Ticket().weight)


def worth_coalescing(full_batch_seconds: float, max_images: int) -> bool:
    """Whether holding requests back to share calls pays: only while the calls a full batch would take
    one by one cost more host CPU than the batch's own forward pass. Behind a slow model (ViT-B-16 on
    cpu, 1.7 s a batch of 8) requests held back at the ingress miss the replica's next batch and leave
    a replica idle (3.3-3.6 img/s against 4.5 sending each at once, alternating); there a call's few
    ms of CPU do not matter."""
    return full_batch_seconds < CALL_CPU_SECONDS * max_images


class TowerClient:
    """Sends each request's chunks at once (up to `max_in_flight` calls) until `tune` learns the model
    is fast enough for coalescing to pay; then at most `calls_in_flight` calls, the rest coalesced."""

    def __init__(self, handle: DeploymentHandle, replicas: int, ingress_replicas: int, max_images: int,
                 retry_after_s: int, max_in_flight: int, model_on_host_cores: bool = False,
                 tower: str = "image", grpc: bool = False) -> None:
        # Serve picks a call's transport from options pickled into the handle by whichever process built
        # the app (ray/serve/_private/handle_options.py: `_by_reference = not RAY_SERVE_USE_GRPC_BY_DEFAULT`,
        # read at import there), not from this replica's environment: so the choice is made here. gRPC
        # skips Ray's task path (ray/serve/_private/replica_result.py gRPCReplicaResult).
        self.handle = handle.options(_by_reference=False) if grpc else handle
        self.tower = tower
        self.replica_kind = "a text encoder replica" if tower == "text" else "an encoder replica"
        self.retry_after_s = retry_after_s
        self.coalescing_window = calls_in_flight(replicas, ingress_replicas, model_on_host_cores)
        self.tuned = False
        self.coalescing = False
        self.express_in_flight = 0
        self.calls = Batcher(self._call, max_images, len, wait_s=0.0, concurrency=max(1, max_in_flight))

    def tune(self, full_batch_seconds: float | None) -> None:
        """Given the replicas' forward time of a full batch (their warm-up), coalesce if that pays."""
        if self.tuned or full_batch_seconds is None:
            return
        self.tuned = True
        coalesce = worth_coalescing(full_batch_seconds, self.calls.max_size)
        if coalesce:
            self.coalescing = True
            self.calls.set_concurrency(self.coalescing_window)
        log.info("%s encoder calls (%s): a full batch runs in %.1f ms; %s", self.tower, self.transport,
                 full_batch_seconds * 1e3,
                 f"coalescing, {self.coalescing_window} call(s) in flight" if coalesce
                 else "each request's chunks sent at once")

    @property
    def transport(self) -> str:
        by_reference = getattr(self.handle.handle_options, "_by_reference", True)
        return "Ray actor tasks" if by_reference else "gRPC"

    async def embed(self, images: np.ndarray | JpegFiles | Sequence[str], deadline: float,
                    trace: Carrier | None = None) -> np.ndarray:
        """uint8 [n, 3, H, W], n JPEG files or n texts (any n) -> float32 [n, D]; `deadline` in time.time();
        `trace`: the request's span for the replica (serve/shared/tracing.py), None when tracing is off."""
        step = self.calls.max_size
        chunks = [images[start: start + step] for start in range(0, len(images), step)]
        ticket = lanes.current()
        if ticket.lane == Lane.INTERACTIVE and self.coalescing and self.express_in_flight < self.coalescing_window:
            self.express_in_flight += 1  # taken now, before its calls start: the next request must see it
            group = asyncio.gather(*(self._express(chunk, deadline, trace, ticket) for chunk in chunks))
            group.add_done_callback(self._express_done)
        else:
            group = asyncio.gather(*(self.calls.submit(chunk, deadline, (trace, ticket), ticket) for chunk in chunks))
        # Retrieved even when the caller is cancelled (client gone, request deadline), so a chunk's
        # later error is not logged as "exception was never retrieved".
        group.add_done_callback(lambda done: done.cancelled() or done.exception())
        return np.concatenate(await group) if len(chunks) > 1 else (await group)[0]

    async def _express(self, chunk: Any, deadline: float, trace: Carrier | None, ticket: Ticket) -> Any:
        """An interactive chunk's own call, past the calls that coalesce the other lanes' chunks: it waits for
        no call slot and no call of others' chunks (the replica's batcher still puts it first in its next
        batch). At most `coalescing_window` requests at once go so (`embed`), each call costing its own CPU: past
        that, a busy interactive lane (a flooding tenant whose default lane it is) coalesces like the others,
        first in their queue."""
        (result,) = await self._call([chunk], [deadline], [(trace, ticket)])
        if isinstance(result, BaseException):
            raise result
        return result

    def _express_done(self, _: asyncio.Future[Any]) -> None:
        self.express_in_flight -= 1

    async def _call(self, chunks: list[Any], deadlines: list[float],
                    carried: list[tuple[Carrier | None, Ticket]]) -> list[Any]:
        """One tower call for `chunks`; one result (array or exception) per chunk. `carried`: each chunk's
        trace and ticket."""
        traces = [trace for trace, _ in carried]
        traced = [traces] if any(traces) else []  # nothing more to send when tracing is off
        # Sent only where some chunk is not the default ticket: the replica orders by them (core/lanes.py).
        tickets = [(int(t.lane), t.tenant, t.weight) for _, t in carried]
        sent = {"tickets": tickets} if any(t != _PLAIN for t in tickets) else {}
        for attempt in (1, 2):
            response = cast(DeploymentResponse, self.handle.embed_chunks.remote(chunks, deadlines, *traced, **sent))
            try:
                return cast(list[Any], await response)
            except asyncio.CancelledError:
                response.cancel()
                raise
            except Exception as exc:  # Ray wraps a replica's errors; the ones answered here are unwrapped
                cause = getattr(exc, "cause", None)
                if not isinstance(exc, RayActorError) and not isinstance(cause, RayActorError):
                    raise
                # The replica died under this call: once more on whichever replica Serve picks now.
                log.warning("%s stopped during a call (attempt %d of 2)", self.replica_kind, attempt)
        raise ApiError(503, ErrorType.REPLICA_UNAVAILABLE,
                       f"{self.replica_kind} stopped while running this request; retry",
                       {"Retry-After": str(self.retry_after_s)})
