"""Priority lanes: what the HTTP front end (HAProxy, launcher/haproxy_front.py) and the ingress
agree on, with neither importing the other.

A request travels in one of a small fixed set of lanes. Its API key names a default lane (serve/shared/tenants.py);
the request may move itself down, never up, with an integer `priority` (the body's field, or the X-Priority header)
read as vLLM and Cohere define it: lower means earlier. 0 asks for the interactive lane, 1 the default lane, 2 and
above (Cohere allows up to 999) the bulk lane; the lane is the lower of the two (the later one).

Every queue that orders by lane orders by the same key: the moment the request joined the queue plus its
lane's offset, `LANE_STEP_S` per lane below interactive. So a request waits behind every request of a higher
lane that arrived before it and behind those that arrived less than the lanes' difference in offsets after
it; one that has waited longer than that goes first. No lane, however busy, can hold a lower one back by more
than its offset difference (plus the time the queue needs to drain what was ahead anyway): ageing, not strict
priority. HAProxy orders its queue by the same key (its manual, "http-request set-priority-offset": "When a
request is queued, it is ordered first by the priority class, then by the current timestamp adjusted by the
given offset in milliseconds. Lower values have higher priority."); the class stays the health probes' alone
(their `set-priority-class int(-1)`), since a class is strict: "The priority class determines the order in
which queued requests are processed. Lower values have higher priority." A strict class per lane would let a
never-empty interactive lane starve bulk until its deadline.

Under overload the lowest lane is shed first: a queue holding `max_queued_requests` refuses a lane's request
once its waiters reach that lane's share of the bound (SHED_SHARE): bulk at half, default at three quarters,
interactive only when full. The space above a lane's share is kept for the lanes above it.

Who a request is (its tenant) and which lane it travels in: its `Ticket`. A request's `Ticket` is set by the front
door once its key is known (serve/ingress/front_door.py) and moved down by the body's `priority` once the body is
read (`demote`); it travels in a context variable, like the trace span, so the decode queue, the URL fetches and the
tower link's coalescing read it where the request waits without every layer passing it on. The tower link sends each
chunk's lane with its call, so the replica's batcher orders by it too (serve/towers/tower_replica.py).

`LaneQueue` is the order: entries by lane with ageing (the key above), within a lane by tenant in weighted shares
(start-time fair queueing: a tenant's virtual time advances by 1/weight per entry taken and the tenant with the
least goes next; one that comes back from idle starts at the least among those waiting, so it cannot save up a
turn), within a tenant round-robin across its flows (the decode queue's flows are requests, so one request of many
images does not hold a tenant's turn), and first come, first served within a flow. One tenant with 64 requests
waiting and another with 2, equal weights, take turns: the second waits for one of the first's entries, not for 64."""

from __future__ import annotations

import time
from collections import OrderedDict, deque
from collections.abc import Callable, Iterator
from contextvars import ContextVar
from dataclasses import dataclass, field
from enum import IntEnum
from typing import Generic, TypeVar

# The header a client sets its priority in when it cannot change the body (a raw image, multipart) or wants
# HAProxy's queue to know it (HAProxy does not read bodies: they stream to the ingress).
PRIORITY_HEADER = "x-priority"


class Lane(IntEnum):
    """Lower is earlier, as the `priority` integer."""

    INTERACTIVE = 0
    DEFAULT = 1
    BULK = 2


LANE_NAMES = tuple(lane.name.lower() for lane in Lane)
# How much earlier a request of one lane is ordered than one of the lane below that joined the queue at
# the same moment. Long against a request's ordinary wait (so lanes order as lanes under load), short
# against its deadline (so a bulk request that waits is served before its deadline under any interactive
# load), and with the queue's timeout within HAProxy's 524 s bound on the adjusted timestamp (its manual).
LANE_STEP_S = 2.0
# HAProxy's queue sees no tenant weights, only keys: within a lane it moves each request back by this much per
# request its key has in HAProxy at that moment (at work and queued), so a key with few requests passes a key
# with many, by at most their difference times this step. Small against a queue's ordinary wait per request,
# so that a burst's own requests stay in their order; its sum over a large tenant's requests stays below
# LANE_STEP_S up to a couple of hundred of them.
TENANT_STEP_S = 0.01
# How long after another tenant's request of the same lane, or any of a higher lane, arrived at an ingress replica a
# tenant's lane stays held to its share of the requests that replica works on (ServiceConfig.share_beside_others). The
# slots a backfill holds are freed only as its requests finish, so a cap raised only while the other request is
# present would come too late for it; an interactive user's next request comes within about a second (a page of
# results, the next query), so the cap holds that long after the last one, and a tenant alone has every slot again
# once the others have gone quiet.
OTHERS_HOLD_S = 1.0
# The share of a queue's bound a lane may fill: past it, that lane's newcomers are refused (503).
SHED_SHARE: dict[Lane, float] = {Lane.INTERACTIVE: 1.0, Lane.DEFAULT: 0.75, Lane.BULK: 0.5}


def lane_named(name: str) -> Lane:
    try:
        return Lane[name.upper()]
    except KeyError:
        raise ValueError(f"lane must be one of {', '.join(LANE_NAMES)}, got {name!r}") from None


def lane_of_priority(priority: int) -> Lane:
    """The lane a `priority` asks for: 0 interactive, 1 default, 2 and above bulk (negative: interactive)."""
    return Lane(min(max(priority, 0), Lane.BULK))


def demoted(lane: Lane, priority: int | None) -> Lane:
    """`lane` (the key's), moved down to what `priority` asks for; never up."""
    return lane if priority is None else max(lane, lane_of_priority(priority))


# The range of a priority, the body's field or the header: Cohere's.
MAX_PRIORITY = 999


def parse_priority(header: str | None) -> int | None:
    """The X-Priority header's integer; None when absent. ValueError when present but not an integer from 0 to
    MAX_PRIORITY (a blank one included: the contract documents an integer)."""
    if header is None:
        return None
    value = int(header.strip())
    if not 0 <= value <= MAX_PRIORITY:
        raise ValueError(f"X-Priority {value} is outside 0-{MAX_PRIORITY}")
    return value


def offset_s(lane: Lane) -> float:
    """The lane's offset to its arrival time in every queue's order (see the module's docstring)."""
    return LANE_STEP_S * int(lane)


def queue_share(lane: Lane, bound: int) -> int:
    """How many waiters a queue bounded by `bound` may hold before it refuses `lane`'s requests (at least one)."""
    return max(1, int(bound * SHED_SHARE[lane]))

DEFAULT_TENANT = "default"


@dataclass
class Ticket:
    """A request's tenant (its key's name, never the key), that tenant's weight, and its lane."""

    tenant: str = DEFAULT_TENANT
    lane: Lane = Lane.DEFAULT
    weight: float = 1.0

    @property
    def key(self) -> TicketKey:
        return self.lane, self.tenant


# A tenant's requests in one lane: what the ingress holds to a share of its slots beside the others (serve/ingress).
TicketKey = tuple[Lane, str]


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
