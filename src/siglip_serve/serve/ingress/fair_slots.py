"""Slots shared fairly across requests: the ingress's decode threads (serve/ingress/decode_queue.py) and its URL
fetches (serve/ingress/url_fetch.py) both take turns through one FairSlots.

A first-come-first-served semaphore lets one request of many slow items hold every slot while another
client's single item waits behind all of them. Here each request has its own queue and a freed slot goes
to the head of the request whose turn it is, round-robin across requests; so a new request waits for one
slot to come free, not for everything queued before it. With a `budget`, a holder also takes its `cost`
(a decode's header-declared bytes) and a slot is given only while the holders' costs stay within it; one
that would not fit alone still gets a slot, but only when nothing else holds one. With a `reserve`, the
last `reserve` free slots go only to requests that hold none: round-robin alone bounds a newcomer's wait
by the time one running holder takes, which for a URL fetch from a slow origin is its whole timeout.

Everything here runs on one event loop. A waiter cancelled before its turn (deadline passed, client gone)
is skipped and takes nothing.
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict, deque
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass


@dataclass
class _Waiter:
    request: object
    cost: int
    granted: asyncio.Future[None]


class FairSlots:
    """At most `slots` holders at once (and, with `budget`, their costs within it), served round-robin across
    the requests (any hashable key) that wait."""

    def __init__(self, slots: int, budget: int | None = None, reserve: int = 0) -> None:
        self.slots = slots
        self.budget = budget
        self.reserve = reserve
        self.held = 0
        self.held_cost = 0
        self._held_by: dict[object, int] = {}
        self._by_request: OrderedDict[object, deque[_Waiter]] = OrderedDict()

    def waiting(self) -> int:
        return sum(len(waiters) for waiters in self._by_request.values())

    async def acquire(self, request: object, cost: int = 0) -> None:
        """Returns holding a slot (with `cost`), once `request`'s turn comes and its cost fits; release() it."""
        waiter = _Waiter(request, max(int(cost), 0), asyncio.get_running_loop().create_future())
        self._by_request.setdefault(request, deque()).append(waiter)
        self._grant()
        try:
            await waiter.granted
        except asyncio.CancelledError:
            if waiter.granted.done() and not waiter.granted.cancelled():
                self.release(request, waiter.cost)  # given the slot, then cancelled before it could use it
            raise

    def release(self, request: object, cost: int = 0) -> None:
        self.held -= 1
        self.held_cost -= max(int(cost), 0)
        if (left := self._held_by.pop(request) - 1) > 0:
            self._held_by[request] = left
        self._grant()

    @asynccontextmanager
    async def slot(self, request: object, cost: int = 0) -> AsyncIterator[None]:
        await self.acquire(request, cost)
        try:
            yield
        finally:
            self.release(request, cost)

    def _next(self) -> _Waiter | None:
        """The head waiter of the first request, in turn order, that may take a free slot now."""
        open_to_holders = self.slots - self.held > self.reserve
        for request, waiters in list(self._by_request.items()):
            while waiters and waiters[0].granted.done():  # cancelled while waiting
                waiters.popleft()
            if not waiters:
                del self._by_request[request]
            elif open_to_holders or request not in self._held_by:
                return waiters[0]
        return None

    def _grant(self) -> None:
        while self.held < self.slots:
            waiter = self._next()
            if waiter is None:
                return
            if self.budget is not None and self.held and self.held_cost + waiter.cost > self.budget:
                return  # wait for holders to free their cost; the turn stays with this waiter
            waiters = self._by_request[waiter.request]
            waiters.popleft()
            self._by_request.move_to_end(waiter.request)
            if not waiters:
                del self._by_request[waiter.request]
            self.held += 1
            self.held_cost += waiter.cost
            self._held_by[waiter.request] = self._held_by.get(waiter.request, 0) + 1
            waiter.granted.set_result(None)
