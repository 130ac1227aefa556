"""An ingress replica's front door: how many requests it works on at once, how many may wait, and each
request's deadline from the moment the front end had it (core/front_door.py has what HAProxy shares).

Under HAProxy (the default front end of `siglip-serve run`) no more than `max_ongoing_requests` reach a
replica at once and the waiting ones sit in HAProxy's queue, bounded there; under Serve's own proxy they
reach the replica, and `RequestSlots` bounds them here the same way. Either way a request beyond
ongoing + queued gets 503 at once, and one that waits past its deadline gets 504 then, not later.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from siglip_serve.core.front_door import FrontDoorLimits, waited_seconds
from siglip_serve.serve.config import ServiceConfig
from siglip_serve.serve.encoder_client import calls_in_flight
from siglip_serve.serve.errors import ApiError, ErrorType

log = logging.getLogger("siglip_serve.ingress")

# Fewer than this and a burst of multi-image requests would leave decode threads idle.
MIN_ONGOING_REQUESTS = 8


def ingress_max_ongoing(config: ServiceConfig, replicas: int) -> int:
    """Requests one ingress replica works on at once: as set, or twice the images its share of the encoder
    calls in flight carries (one set running, the next gathering while it runs: serve/encoder_client.py)
    plus one per decode thread, so single-image requests keep every encoder busy."""
    if config.ingress_max_ongoing_requests != "auto":
        return config.ingress_max_ongoing_requests
    calls = calls_in_flight(replicas, config.ingress_count, config.model_on_host_cores)
    return max(MIN_ONGOING_REQUESTS, 2 * calls * config.max_batch_size + config.decode_threads)


def front_door_limits(config: ServiceConfig, replicas: int) -> FrontDoorLimits:
    return FrontDoorLimits(max_ongoing_requests=ingress_max_ongoing(config, replicas),
                           max_queued_requests=config.max_queued_requests,
                           request_timeout_s=config.request_timeout_s, retry_after_s=config.retry_after_s)


class Deadline:
    """A request's deadline in time.monotonic(), begun when the front end stamped it (or now, unstamped)."""

    _skew_reported = False

    def __init__(self, stamp: str | None, timeout_s: float) -> None:
        waited = waited_seconds(stamp, time.time(), timeout_s)
        if waited is None:
            if not Deadline._skew_reported:
                Deadline._skew_reported = True
                log.warning("X-Request-Start %s is more than %g s old: the front end's clock disagrees with this "
                            "node's (keep the nodes' clocks synchronised); such stamps are ignored", stamp,
                            timeout_s)
            waited = 0.0
        self.waited_s = waited
        self.at = time.monotonic() + timeout_s - waited

    def remaining(self) -> float:
        return max(0.0, self.at - time.monotonic())


class RequestSlots:
    """At most `ongoing` requests at work, at most `queued` waiting for a place (first come, first served);
    one more is refused at once. A waiter gives up at its deadline (the request's own timeout)."""

    def __init__(self, ongoing: int, queued: int, retry_after_s: int) -> None:
        self.ongoing = ongoing
        self.queued = queued
        self.retry_after_s = retry_after_s
        self._places = asyncio.Semaphore(ongoing)
        self.working = 0
        self.waiting = 0

    @asynccontextmanager
    async def place(self) -> AsyncIterator[None]:
        if self._places.locked():
            if self.waiting >= self.queued:
                raise ApiError(503, ErrorType.OVERLOADED, "server is at capacity; retry later",
                               {"Retry-After": str(self.retry_after_s)})
            self.waiting += 1
            try:
                await self._places.acquire()
            finally:
                self.waiting -= 1
        else:
            await self._places.acquire()
        self.working += 1
        try:
            yield
        finally:
            self.working -= 1
            self._places.release()
