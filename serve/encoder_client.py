"""The ingress's side of the encoder deployment: its requests' chunks, coalesced into few calls.

Every call through a Serve handle costs host CPU on both sides whatever it carries (routing,
tracing hooks, Ray's task submission and reply, the replica's request wrapper): measured on
tiny-siglip, about 4 ms of CPU per single-image call, against ~1.5 ms to decode the image. So the
ingress keeps at most `CALLS_IN_FLIGHT_PER_REPLICA` calls per encoder replica in flight; while they
run, chunks queue here, and when one returns, what queued meanwhile (up to the largest bucket's
images) goes out as one call. At low load a chunk still goes out alone and at once.

Each chunk keeps its own answer: the replica returns one result per chunk (its embeddings, or the
error only it failed with, e.g. its deadline passed in the queue), a dead replica is retried once
for the whole call, and a caller that leaves drops only its own chunk.
"""

from __future__ import annotations

import asyncio
import logging
import math
from typing import Any, cast

import numpy as np
from ray.exceptions import RayActorError
from ray.serve.handle import DeploymentHandle, DeploymentResponse

from siglip_serve.models.device_decode import JpegFiles
from siglip_serve.serve.batcher import Batcher
from siglip_serve.serve.errors import ApiError, ErrorType

log = logging.getLogger("siglip_serve.ingress")

# On an accelerator one call runs on each replica while the next waits in its batch queue, so the
# device never waits for the round trip to the ingress between batches. On cpu the model runs on the
# host's own cores: a replica that waits gives its core back to the ingress, and the fewer, larger
# calls cost less CPU per image (tiny-siglip, c=32, alternating: 6.2 vs 7.0-8.5 ms per image).
CALLS_IN_FLIGHT_PER_REPLICA = 2
CALLS_IN_FLIGHT_PER_CPU_REPLICA = 1


def calls_in_flight(replicas: int, ingress_replicas: int, model_on_host_cores: bool = False) -> int:
    """This ingress's share of the calls the encoder replicas should have in flight (HAProxy spreads
    requests evenly over the ingress replicas: `balance leastconn`, Ray Serve 2.60's
    RAY_SERVE_HAPROXY_BALANCE_ALGORITHM), at least one call per replica's worth."""
    per_replica = CALLS_IN_FLIGHT_PER_CPU_REPLICA if model_on_host_cores else CALLS_IN_FLIGHT_PER_REPLICA
    wanted = per_replica * max(replicas, 1)
    return max(per_replica, math.ceil(wanted / max(ingress_replicas, 1)))


class EncoderClient:
    def __init__(self, handle: DeploymentHandle, replicas: int, ingress_replicas: int, max_images: int,
                 retry_after_s: int, model_on_host_cores: bool = False) -> None:
        self.handle = handle
        self.retry_after_s = retry_after_s
        self.calls = Batcher(self._call, max_images, len, wait_s=0.0,
                             concurrency=calls_in_flight(replicas, ingress_replicas, model_on_host_cores))

    async def embed(self, images: np.ndarray | JpegFiles, deadline: float) -> np.ndarray:
        """uint8 [n, 3, H, W] or n JPEG files (any n) -> float32 [n, D]; `deadline` in time.time() seconds."""
        step = self.calls.max_size
        chunks = [images[start: start + step] for start in range(0, len(images), step)]
        group = asyncio.gather(*(self.calls.submit(chunk, deadline) for chunk in chunks))
        # Retrieved even when the caller is cancelled (client gone, request deadline), so a chunk's
        # later error is not logged as "exception was never retrieved".
        group.add_done_callback(lambda done: done.cancelled() or done.exception())
        return np.concatenate(await group) if len(chunks) > 1 else (await group)[0]

    async def _call(self, chunks: list[np.ndarray | JpegFiles], deadlines: list[float]) -> list[Any]:
        """One encoder call for `chunks`; one result (array or exception) per chunk."""
        for attempt in (1, 2):
            response = cast(DeploymentResponse, self.handle.embed_chunks.remote(chunks, deadlines))
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
                log.warning("an encoder replica stopped during a call (attempt %d of 2)", attempt)
        raise ApiError(503, ErrorType.REPLICA_UNAVAILABLE,
                       "an encoder replica stopped while running this request; retry",
                       {"Retry-After": str(self.retry_after_s)})
