"""Slots shared fairly across requests: the ingress's decode threads (serve/ingress/decode_queue.py) and its URL
fetches (serve/ingress/url_fetch.py) both take turns through one FairSlots.

A first-come-first-served semaphore lets one request of many slow items hold every slot while another
client's single item waits behind all of them. Here each request has its own queue and a freed slot goes
to the head of the request whose turn it is (core/lanes.py `LaneQueue`: the higher lane first, with ageing;
within a lane the tenants by weight; within a tenant round-robin across its requests); so a new request waits
for one slot to come free, not for everything queued before it. With a `budget`, a holder also takes its `cost`
(a decode's header-declared bytes) and a slot is given only while the holders' costs stay within it; one
that would not fit alone still gets a slot, but only when nothing else holds one. With a `reserve`, the
last `reserve` free slots go only to requests that hold none: round-robin alone bounds a newcomer's wait
by the time one running holder takes, which for a URL fetch from a slow origin is its whole timeout. With
`admits`, a waiter whose ticket it refuses at the moment is passed over (`held_by_key` counts the slots each lane's
tenant holds), so one tenant's lane can be held to a share of the slots while the others take theirs.

Everything here runs on one event loop. A waiter cancelled before its turn (deadline passed, client gone)
is skipped and takes nothing.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass

from siglip_serve.core import lanes
from siglip_serve.core.lanes import LaneQueue, Ticket


@dataclass
class _Waiter:
    request: object
    cost: int
    granted: asyncio.Future[None]
    ticket: Ticket


class FairSlots:
    """At most `slots` holders at once (and, with `budget`, their costs within it), served round-robin across
    the requests (any hashable key) that wait."""

    def __init__(self, slots: int, budget: int | None = None, reserve: int = 0,
                 admits: Callable[[Ticket], bool] | None = None) -> None:
        self.slots = slots
        self.budget = budget
        self.reserve = reserve
        self.admits = admits
        self.held = 0
        self.held_cost = 0
        self._held_by: dict[object, int] = {}
        self.held_by_key: dict[lanes.TicketKey, int] = {}
        # The key each slot of a request was given under (a request's lane can move down while it holds slots).
        self._keys_of: dict[object, list[lanes.TicketKey]] = {}
        self._queue: LaneQueue[_Waiter] = LaneQueue(dead=lambda waiter: waiter.granted.done())

    def waiting(self) -> int:
        return sum(1 for waiter in self._queue if not waiter.granted.done())

    def waiting_in(self, lane: lanes.Lane) -> int:
        """Waiters of `lane`'s requests (cancelled ones not yet dropped excluded)."""
        return sum(1 for waiter in self._queue if not waiter.granted.done() and waiter.ticket.lane == lane)

    async def acquire(self, request: object, cost: int = 0, ticket: Ticket | None = None) -> None:
        """Returns holding a slot (with `cost`), once `request`'s turn comes and its cost fits; release() it.
        `ticket`: the request's tenant and lane (None: the running request's, core/lanes.py)."""
        ticket = ticket if ticket is not None else lanes.current()
        waiter = _Waiter(request, max(int(cost), 0), asyncio.get_running_loop().create_future(), ticket)
        self._queue.push(waiter, ticket, flow=request)
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
        key = self._keys_of[request].pop()
        if (held := self.held_by_key[key] - 1) > 0:
            self.held_by_key[key] = held
        else:
            del self.held_by_key[key]
        if (left := self._held_by.pop(request) - 1) > 0:
            self._held_by[request] = left
        else:
            del self._keys_of[request]
        self._grant()

    @asynccontextmanager
    async def slot(self, request: object, cost: int = 0, ticket: Ticket | None = None) -> AsyncIterator[None]:
        await self.acquire(request, cost, ticket)
        try:
            yield
        finally:
            self.release(request, cost)

    def _grant(self) -> None:
        while self.held < self.slots:
            open_to_holders = self.slots - self.held > self.reserve

            def eligible(waiter: _Waiter, open_to_holders: bool = open_to_holders) -> bool:
                if self.admits is not None and not self.admits(waiter.ticket):
                    return False
                return open_to_holders or waiter.request not in self._held_by

            waiter = self._queue.peek(eligible)
            if waiter is None:
                return
            if self.budget is not None and self.held and self.held_cost + waiter.cost > self.budget:
                return  # wait for holders to free their cost; the turn stays with this waiter
            self._queue.pop(eligible)
            self.held += 1
            self.held_cost += waiter.cost
            self._held_by[waiter.request] = self._held_by.get(waiter.request, 0) + 1
            key = waiter.ticket.key
            self._keys_of.setdefault(waiter.request, []).append(key)
            self.held_by_key[key] = self.held_by_key.get(key, 0) + 1
            waiter.granted.set_result(None)
