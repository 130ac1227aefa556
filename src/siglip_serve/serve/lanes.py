"""Who a request is (its tenant) and which lane it travels in, and the one order every waiting queue of the ingress
and the replicas takes from them (core/lanes.py has the lanes and the ageing rule).

A request's `Ticket` is set by the front door once its key is known (serve/front_door.py) and moved down by the
body's `priority` once the body is read (`demote`); it travels in a context variable, like the trace span,
so the decode queue, the URL fetches and the tower link's coalescing read it where the request waits without
every layer passing it on. The tower link sends each chunk's lane with its call, so the replica's batcher
orders by it too (serve/tower_replica.py).

`LaneQueue` is the order: entries by lane with ageing (arrival plus the lane's offset: a lower lane cannot
be starved, core/lanes.py argues it), within a lane by tenant in weighted shares (start-time fair queueing: a
tenant's virtual time advances by 1/weight per entry taken and the tenant with the least goes next; one that
comes back from idle starts at the least among those waiting, so it cannot save up a turn), within a tenant
round-robin across its flows (the decode queue's flows are requests, so one request of many images does not
hold a tenant's turn), and first come, first served within a flow. One tenant with 64 requests waiting and
another with 2, equal weights, take turns: the second waits for one of the first's entries, not for 64.
"""

from __future__ import annotations

import time
from collections import OrderedDict, deque
from collections.abc import Callable, Iterator
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Generic, TypeVar

from siglip_serve.core.lanes import Lane, demoted, offset_s

DEFAULT_TENANT = "default"


@dataclass
class Ticket:
    """A request's tenant (its key's name, never the key), that tenant's weight, and its lane."""

    tenant: str = DEFAULT_TENANT
    lane: Lane = Lane.DEFAULT
    weight: float = 1.0


_current: ContextVar[Ticket | None] = ContextVar("siglip_ticket", default=None)


def current() -> Ticket:
    """The ticket of the request this task works for (a default one outside any request)."""
    ticket = _current.get()
    return ticket if ticket is not None else Ticket()


def enter(ticket: Ticket) -> None:
    """`ticket` is this task's request's from now on (and its child tasks', which copy the context)."""
    _current.set(ticket)


def demote(priority: int | None) -> None:
    """The body's `priority`: the request's lane moves down to what it asks for, never up. The ticket is one
    object shared with every task that copied the context, so they all see the new lane."""
    ticket = _current.get()
    if ticket is not None:
        ticket.lane = demoted(ticket.lane, priority)


T = TypeVar("T")


@dataclass
class _Entry(Generic[T]):
    item: T
    ticket: Ticket
    queued_at: float = field(default_factory=time.monotonic)


class LaneQueue(Generic[T]):
    """Entries in lane order with ageing, tenants' weighted shares within a lane, round-robin across a tenant's
    flows, first come first served within a flow (the module's docstring)."""

    def __init__(self, dead: Callable[[T], bool] = lambda _: False,
                 clock: Callable[[], float] = time.monotonic) -> None:
        """`dead(item)`: an entry nobody waits for any more (cancelled), dropped when met."""
        self._dead = dead
        self._clock = clock
        # (lane, tenant, flow) -> its entries; the dict's order is the round-robin order of flows.
        self._flows: OrderedDict[tuple[Lane, str, object], deque[_Entry[T]]] = OrderedDict()
        self._vtime: dict[tuple[Lane, str], float] = {}

    def __len__(self) -> int:
        return sum(len(entries) for entries in self._flows.values())

    def __iter__(self) -> Iterator[T]:
        for entries in self._flows.values():
            for entry in entries:
                yield entry.item

    def push(self, item: T, ticket: Ticket, flow: object = None) -> None:
        key = (ticket.lane, ticket.tenant)
        waiting = {(lane, tenant) for lane, tenant, _ in self._flows if lane == ticket.lane}
        if key not in waiting:  # back from idle: no turns saved up, none owed
            floor = min((self._vtime[other] for other in waiting), default=self._vtime.get(key, 0.0))
            self._vtime[key] = max(self._vtime.get(key, 0.0), floor)
        self._flows.setdefault((ticket.lane, ticket.tenant, flow), deque()).append(
            _Entry(item, ticket, self._clock()))

    def peek(self, eligible: Callable[[T], bool] = lambda _: True) -> T | None:
        """The entry that goes next among those `eligible` says may (judged by each flow's head)."""
        found = self._next(eligible)
        return None if found is None else self._flows[found][0].item

    def pop(self, eligible: Callable[[T], bool] = lambda _: True) -> T | None:
        """Take the entry that goes next (as `peek`), charging its tenant's share."""
        found = self._next(eligible)
        if found is None:
            return None
        entries = self._flows[found]
        entry = entries.popleft()
        self._vtime[found[:2]] = self._vtime.get(found[:2], 0.0) + 1.0 / max(entry.ticket.weight, 1e-6)
        if entries:
            self._flows.move_to_end(found)
        else:
            del self._flows[found]
        return entry.item

    def drain(self) -> list[T]:
        """Every entry, removed."""
        items = list(self)
        self._flows.clear()
        return items

    def _next(self, eligible: Callable[[T], bool]) -> tuple[Lane, str, object] | None:
        heads: list[tuple[tuple[Lane, str, object], _Entry[T]]] = []
        for key, entries in list(self._flows.items()):
            while entries and self._dead(entries[0].item):
                entries.popleft()
            if not entries:
                del self._flows[key]
            elif eligible(entries[0].item):
                heads.append((key, entries[0]))
        if not heads:
            return None
        due: dict[Lane, float] = {}
        for (lane, _, _), entry in heads:
            due[lane] = min(due.get(lane, entry.queued_at), entry.queued_at)
        lane = min(due, key=lambda candidate: (due[candidate] + offset_s(candidate), candidate))
        in_lane = [key for key, _ in heads if key[0] == lane]
        # min() keeps the first of equals: the flows' round-robin order breaks ties between tenants.
        return min(in_lane, key=lambda key: self._vtime.get(key[:2], 0.0))
