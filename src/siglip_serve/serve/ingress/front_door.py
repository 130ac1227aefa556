"""An ingress replica's front door: who may ask (the API key: its tenant and lane, serve/shared/tenants.py), how many
requests it works on at once, how many may wait and in which order (lane, then tenant: core/lanes.py), each
request's deadline from the moment the front end had it (core/front_door.py has what HAProxy shares), and the
drain. Every route passes it before its body is read (serve/ingress/http_app.py).

Under HAProxy (the default front end of `siglip-serve run`) no more than `max_ongoing_requests` reach a
replica at once and the waiting ones sit in HAProxy's queue, bounded there; under Serve's own proxy they
reach the replica, and `RequestSlots` bounds them here the same way. Either way a request beyond
ongoing + queued gets 503 at once (the lower lanes sooner: core/lanes.py SHED_SHARE), and one that waits past
its deadline gets 504 then, not later.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections import Counter
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from fastapi import Request

from siglip_serve.core import lanes
from siglip_serve.core.errors import ConfigError
from siglip_serve.core.front_door import REQUEST_START_HEADER, FrontDoorLimits, waited_seconds, write_limits
from siglip_serve.core.lanes import (
    MAX_PRIORITY,
    PRIORITY_HEADER,
    Lane,
    Ticket,
    TicketKey,
    demoted,
    parse_priority,
    queue_share,
)
from siglip_serve.serve.http.errors import ApiError, ErrorType
from siglip_serve.serve.ingress.fair_slots import FairSlots
from siglip_serve.serve.plan.replica_slices import FrontSettings
from siglip_serve.serve.shared import registry, tracing
from siglip_serve.serve.shared.tenants import Tenants, lane_map, load_keys

log = logging.getLogger("siglip_serve.ingress")

# How often an ingress replica looks for the drain mark that `siglip-serve run` sets on SIGTERM.
DRAIN_POLL_S = 0.25


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
    """At most `ongoing` requests at work, waiters served in lane and tenant order (core/lanes.py); a lane's
    newcomer is refused at once while its lane's share of `queued` waits (core/lanes.py SHED_SHARE: bulk
    first). A waiter gives up at its deadline (the request's own timeout).

    Every request at work shares this replica's event loop, its decode threads and the host's cores: the order
    decides who starts first, but a request that starts among a full house of a backfill's requests still shares
    every step with them. So with `beside_others`, one tenant's requests in one lane (its `Ticket.key`) hold at most
    that many while another tenant's requests of the same lane, or any of a higher lane, are at work or waiting
    here or arrived within OTHERS_HOLD_S (core/lanes.py): a backfill beside an interactive user, a tenant at 64
    concurrent requests beside one at 2. Alone, a tenant's lane takes every slot."""

    def __init__(self, ongoing: int, queued: int, retry_after_s: int, beside_others: int | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.ongoing = ongoing
        self.queued = queued
        self.retry_after_s = retry_after_s
        self.beside_others = beside_others
        self._clock = clock
        self._seen: dict[TicketKey, float] = {}  # when each key's request last arrived
        self._waiting: Counter[TicketKey] = Counter()
        self._slots = FairSlots(ongoing, admits=self._admits if beside_others is not None else None)
        self.working = 0

    def held(self, key: TicketKey) -> int:
        return self._slots.held_by_key.get(key, 0)

    def capped(self, key: TicketKey) -> bool:
        """Whether `key`'s requests are held to `beside_others` now: another key of the same or a higher lane is
        at work or waiting here, or arrived within OTHERS_HOLD_S."""
        if self.beside_others is None:
            return False
        now = self._clock()
        for other, seen in list(self._seen.items()):
            about = now - seen < lanes.OTHERS_HOLD_S or self._waiting[other] > 0 or self.held(other) > 0
            if not about:
                del self._seen[other]  # gone quiet: forgotten until it comes back
            elif other != key and other[0] <= key[0]:
                return True
        return False

    def _admits(self, ticket: Ticket) -> bool:
        return self.beside_others is None or self.held(ticket.key) < self.beside_others or not self.capped(ticket.key)

    @property
    def waiting(self) -> int:
        return self._slots.waiting()

    @asynccontextmanager
    async def place(self, ticket: Ticket | None = None) -> AsyncIterator[None]:
        ticket = ticket if ticket is not None else lanes.current()
        key = ticket.key
        tracked = self.beside_others is not None  # who is about matters only to the cap
        if tracked:
            self._seen[key] = self._clock()
        cannot_start = self._slots.held >= self.ongoing or not self._admits(ticket)
        if cannot_start and self.waiting >= queue_share(ticket.lane, self.queued):
            raise ApiError(503, ErrorType.OVERLOADED, "server is at capacity; retry later",
                           {"Retry-After": str(self.retry_after_s)})
        request = object()  # each request its own flow: first come, first served within its tenant
        if tracked:
            self._waiting[key] += 1
        try:
            await self._slots.acquire(request, ticket=ticket)
        finally:
            if tracked:
                self._waiting[key] -= 1
                if not self._waiting[key]:
                    del self._waiting[key]
        self.working += 1
        try:
            yield
        finally:
            self.working -= 1
            self._slots.release(request)


class FrontDoor:
    """What every request of one ingress replica passes before its body is read: the API key, its place among
    the requests the replica works on (`RequestSlots`) and its one deadline; and whether the replica drains."""

    def __init__(self, front: FrontSettings, limits: FrontDoorLimits, app_name: str, replica_name: str,
                 ingress_replicas: int = 1) -> None:
        """`front`, `limits`: the plan's (serve/plan/service_plan.py IngressPlan); `ingress_replicas`: how many share
        each key's rate (IngressPlan.sharing_replicas: not the one HAProxy keeps for the interactive lane)."""
        self.front = front
        self.app_name = app_name
        self.replica_name = replica_name
        self._share = 1.0 / max(1, ingress_replicas)
        self.tenants = self._tenants(front, limits)
        self.slots = RequestSlots(limits.max_ongoing_requests, limits.max_queued_requests, limits.retry_after_s,
                                  limits.ongoing_beside_others)
        # For HAProxy (launcher/haproxy_front.py), before this replica is its server: the same limits there.
        written = self._write_limits(front, limits)
        if written is None and limits.interactive_server:
            log.warning("interactive_ingress: no HAProxy front end of ours here (Serve's proxy spreads requests over "
                        "every ingress replica), so no replica is kept for the interactive lane")
        self.draining = False
        self.requests_in_handler = 0
        self._drain_watch: asyncio.Task[None] | None = None

    def _tenants(self, front: FrontSettings, limits: FrontDoorLimits) -> Tenants:
        return Tenants(front.live.api_keys_file, front.resolve_api_key(os.environ), self._share,
                       whole_lane=Lane.INTERACTIVE if limits.interactive_server else None)

    def _write_limits(self, front: FrontSettings, limits: FrontDoorLimits) -> Path | None:
        keys_file = front.live.api_keys_file
        return write_limits(limits, self.app_name, lane_map=lane_map(load_keys(keys_file)) if keys_file else None)

    def reconfigure(self, front: FrontSettings, limits: FrontDoorLimits) -> None:
        """The live settings (serve/plan/live_settings.py) in force for the next request: the keys (read first:
        a key file that cannot be read raises ConfigError with nothing changed), the queue's bound, the deadline
        and Retry-After. Requests at work keep the deadline they began with. The count at work is the
        deployment's (Serve's max_ongoing_requests), fixed at start."""
        try:  # tenants.py load_keys: ValueError for a keys file unreadable or invalid, before anything is written
            # The same file keeps its Tenants, which reads it again when it changes, and each key's rate state.
            same = front.live.api_keys_file == self.front.live.api_keys_file
            tenants = self.tenants if same else self._tenants(front, limits)
            self._write_limits(front, limits)
        except ValueError as exc:
            raise ConfigError(str(exc)) from None
        self.tenants, self.front = tenants, front
        self.slots.queued, self.slots.retry_after_s = limits.max_queued_requests, limits.retry_after_s

    def retry_after(self) -> dict[str, str]:
        return {"Retry-After": str(self.front.live.retry_after_s)}

    def check_auth(self, request: Request) -> Ticket:
        """The request's tenant and lane (its key's, moved down by X-Priority): 401 without a right key, 429
        past its rate, 422 for an X-Priority that is not an integer."""
        ticket = self.tenants.ticket(request.headers.get("authorization", ""))
        try:
            asked = parse_priority(request.headers.get(PRIORITY_HEADER))
        except ValueError:
            raise ApiError(422, ErrorType.INVALID_REQUEST,
                           f"X-Priority must be an integer from 0 to {MAX_PRIORITY} (lower is earlier)") from None
        ticket.lane = demoted(ticket.lane, asked)
        return ticket

    @asynccontextmanager
    async def deadline(self, request: Request) -> AsyncIterator[float]:
        """The request's place among those this replica works on, and its one deadline (begun when the
        front end had it: X-Request-Start); yields the deadline as time.monotonic(). 503 at once when
        every place is taken and `max_queued_requests` wait; 504 when the deadline passes, waiting for a
        place included. With tracing on, the request's span (continuing the client's `traceparent`)
        is open meanwhile."""
        self.watch_for_drain()
        timeout = self.front.live.request_timeout_s
        deadline = Deadline(request.headers.get(REQUEST_START_HEADER), timeout)
        self.requests_in_handler += 1
        try:
            with _request_span(request):
                async with asyncio.timeout(deadline.remaining()), self.slots.place(lanes.current()):
                    yield deadline.at
        except TimeoutError:
            raise ApiError(504, ErrorType.DEADLINE_EXCEEDED, f"request did not finish within {timeout:g} s") from None
        finally:
            self.requests_in_handler -= 1

    def check_open(self) -> None:
        """503 while the replica drains: no new work is taken."""
        if self.draining:
            raise ApiError(503, ErrorType.NOT_READY, "server is shutting down; retry", self.retry_after())

    async def drain_marked(self) -> bool:
        """Whether the drain has begun, asking the registry now (a probe must not wait for the next poll)."""
        self.watch_for_drain()
        if not self.draining and await asyncio.to_thread(registry.is_draining, self.app_name):
            self.draining = True
        return self.draining

    def watch_for_drain(self) -> None:
        if self._drain_watch is None:
            self._drain_watch = asyncio.get_running_loop().create_task(self._drain_loop())

    async def _drain_loop(self) -> None:
        while True:
            try:
                if await asyncio.to_thread(registry.is_draining, self.app_name):
                    self.draining = True
                    await asyncio.to_thread(registry.publish_in_flight, self.app_name, self.replica_name,
                                            self.requests_in_handler, time.time())
            except Exception:  # the GCS briefly unreachable: try again next period
                log.debug("drain poll failed", exc_info=True)
            await asyncio.sleep(DRAIN_POLL_S)


def _request_span(request: Request) -> contextlib.AbstractContextManager[Any]:
    if not tracing.enabled():  # before the attributes below are computed
        return tracing.span("http.request")
    return tracing.span("http.request", parent=tracing.extract(dict(request.headers)),
                        attributes={"http.request.method": request.method, "http.route": request.url.path,
                                    "siglip.request_id": request_id(request),
                                    "siglip.tenant": lanes.current().tenant})


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
