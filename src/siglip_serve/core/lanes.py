"""Priority lanes: what the HTTP front end (HAProxy, launcher/haproxy_front.py) and the ingress (serve/lanes.py)
agree on, with neither importing the other.

A request travels in one of a small fixed set of lanes. Its API key names a default lane (serve/tenants.py); the
request may move itself down, never up, with an integer `priority` (the body's field, or the X-Priority
header) read as vLLM and Cohere define it: lower means earlier. 0 asks for the interactive lane, 1 the default
lane, 2 and above (Cohere allows up to 999) the bulk lane; the lane is the lower of the two (the later one).

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
"""

from __future__ import annotations

from enum import IntEnum

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


def parse_priority(header: str | None) -> int | None:
    """The X-Priority header's integer; None when absent. ValueError when it is not an integer."""
    if header is None or not header.strip():
        return None
    return int(header.strip())


def offset_s(lane: Lane) -> float:
    """The lane's offset to its arrival time in every queue's order (see the module's docstring)."""
    return LANE_STEP_S * int(lane)


def queue_share(lane: Lane, bound: int) -> int:
    """How many waiters a queue bounded by `bound` may hold before it refuses `lane`'s requests (at least one)."""
    return max(1, int(bound * SHED_SHARE[lane]))
