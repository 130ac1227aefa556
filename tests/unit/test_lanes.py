"""Lanes in every queue of the ingress and the replicas (core/lanes.py, core/lanes.py): the order, the ageing that
keeps a lower lane from starving, the tenants' weighted shares, and the lower lane shed first at admission."""

from __future__ import annotations

import asyncio
from collections import Counter
from typing import Any

import pytest

from siglip_serve.core import lanes
from siglip_serve.core.lanes import LANE_STEP_S, Lane, LaneQueue, Ticket, demoted, lane_of_priority, queue_share
from siglip_serve.serve.http.errors import ApiError
from siglip_serve.serve.ingress.fair_slots import FairSlots
from siglip_serve.serve.ingress.front_door import RequestSlots
from siglip_serve.serve.shared.batcher import Batcher

BULK = Ticket("backfill", Lane.BULK)
DEFAULT = Ticket("app", Lane.DEFAULT)
INTERACTIVE = Ticket("search", Lane.INTERACTIVE)


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_priority_moves_a_request_down_never_up() -> None:
    assert [lane_of_priority(p) for p in (0, 1, 2, 999, -5)] == [Lane.INTERACTIVE, Lane.DEFAULT, Lane.BULK,
                                                                 Lane.BULK, Lane.INTERACTIVE]
    assert demoted(Lane.DEFAULT, 0) == Lane.DEFAULT  # Cohere's default 0 changes nothing
    assert demoted(Lane.INTERACTIVE, 2) == Lane.BULK
    assert demoted(Lane.BULK, None) == Lane.BULK
    ticket = Ticket("t", Lane.DEFAULT)

    async def inside() -> Lane:
        lanes.enter(ticket)
        lanes.demote(0)
        lanes.demote(5)
        return lanes.current().lane

    assert asyncio.run(inside()) == Lane.BULK


def test_the_queue_takes_the_higher_lane_first() -> None:
    clock = Clock()
    queue: LaneQueue[str] = LaneQueue(clock=clock)
    queue.push("bulk", BULK)
    clock.now += 0.1
    queue.push("default", DEFAULT)
    clock.now += 0.1
    queue.push("interactive", INTERACTIVE)
    assert [queue.pop() for _ in range(3)] == ["interactive", "default", "bulk"]
    assert queue.pop() is None


def test_a_lower_lane_is_not_starved_it_ages_past_newcomers() -> None:
    """A never-empty interactive lane: a bulk entry goes once it has waited longer than the lanes' offsets
    differ, however many interactive entries keep arriving."""
    clock = Clock()
    queue: LaneQueue[str] = LaneQueue(clock=clock)
    queue.push("bulk", BULK)
    taken = []
    for i in range(1000):
        clock.now += 0.01
        queue.push(f"i{i}", INTERACTIVE)
        taken.append(queue.pop())
        if "bulk" in taken:
            break
    waited = taken.index("bulk") * 0.01
    assert 2 * LANE_STEP_S - 0.05 <= waited <= 2 * LANE_STEP_S + 0.05


def test_tenants_share_a_lane_by_weight_not_by_what_they_queue() -> None:
    queue: LaneQueue[str] = LaneQueue()
    big, small, heavy = Ticket("big"), Ticket("small"), Ticket("heavy", weight=2.0)
    for i in range(64):
        queue.push(f"big{i}", big)
    for i in range(2):
        queue.push(f"small{i}", small)
    first = [queue.pop() for _ in range(4)]
    assert sorted(first) == ["big0", "big1", "small0", "small1"]  # small's 2 do not wait behind big's 64
    for i in range(60):
        queue.push(f"heavy{i}", heavy)
    tenants = Counter((queue.pop() or "")[:3] for _ in range(30))
    assert tenants["hea"] == 20 and tenants["big"] == 10  # weight 2 against 1


def test_a_tenant_back_from_idle_saves_up_no_turns() -> None:
    queue: LaneQueue[str] = LaneQueue()
    a, b = Ticket("a"), Ticket("b")
    for i in range(50):
        queue.push(f"a{i}", a)
        queue.pop()
    for i in range(10):
        queue.push(f"a{i}", a)
        queue.push(f"b{i}", b)
    order = [(queue.pop() or "")[0] for _ in range(10)]
    assert order.count("a") == 5 and order.count("b") == 5


def test_fair_slots_grant_the_higher_lane_first() -> None:
    async def scenario() -> list[str]:
        slots = FairSlots(1)
        order: list[str] = []
        await slots.acquire("holder", ticket=BULK)

        async def wait(name: str, ticket: Ticket) -> None:
            async with slots.slot(name, ticket=ticket):
                order.append(name)

        tasks = [asyncio.ensure_future(wait("bulk", BULK))]
        await asyncio.sleep(0)
        tasks.append(asyncio.ensure_future(wait("default", DEFAULT)))
        await asyncio.sleep(0)
        tasks.append(asyncio.ensure_future(wait("interactive", INTERACTIVE)))
        await asyncio.sleep(0)
        assert slots.waiting_in(Lane.BULK) == 1
        slots.release("holder")
        await asyncio.gather(*tasks)
        return order

    assert asyncio.run(scenario()) == ["interactive", "default", "bulk"]


def test_the_batchers_batch_takes_the_higher_lane_first() -> None:
    """The tower link's coalescing and the replica's batch queue are both a Batcher: a batch of 2 taken while
    one runs holds the interactive input, not the bulk ones queued before it."""
    batches: list[list[str]] = []
    gate = asyncio.Event

    async def scenario() -> None:
        release = gate()

        async def run(items: list[Any], deadlines: list[float], traces: list[Any]) -> list[Any]:
            batches.append(list(items))
            if items == ["first"]:
                await release.wait()
            return items

        batcher = Batcher(run, max_size=2, size_of=lambda _: 1, wait_s=0.0)
        first = asyncio.ensure_future(batcher.submit("first", 0.0, ticket=BULK))
        await asyncio.sleep(0.01)
        rest = [asyncio.ensure_future(batcher.submit(name, 0.0, ticket=ticket))
                for name, ticket in (("bulk-1", BULK), ("bulk-2", BULK), ("bulk-3", BULK), ("now", INTERACTIVE))]
        await asyncio.sleep(0.01)
        release.set()
        await asyncio.gather(first, *rest)

    asyncio.run(scenario())
    assert batches == [["first"], ["now", "bulk-1"], ["bulk-2", "bulk-3"]]


def test_admission_sheds_the_lowest_lane_first_and_orders_waiters() -> None:
    async def scenario() -> tuple[list[str], list[str]]:
        slots = RequestSlots(ongoing=1, queued=4, retry_after_s=3)
        refused: list[str] = []
        order: list[str] = []
        hold = asyncio.Event()

        async def request(name: str, ticket: Ticket) -> None:
            try:
                async with slots.place(ticket):
                    order.append(name)
                    if name == "first":
                        await hold.wait()
            except ApiError as error:
                assert error.status == 503 and error.headers == {"Retry-After": "3"}
                refused.append(name)

        tasks = []
        for name, ticket in (("first", BULK), ("bulk-1", BULK), ("bulk-2", BULK), ("bulk-3", BULK),
                             ("default-1", DEFAULT), ("default-2", DEFAULT), ("interactive", INTERACTIVE)):
            tasks.append(asyncio.ensure_future(request(name, ticket)))
            await asyncio.sleep(0)
        hold.set()
        await asyncio.gather(*tasks)
        return refused, order

    refused, order = asyncio.run(scenario())
    assert queue_share(Lane.BULK, 4) == 2 and queue_share(Lane.DEFAULT, 4) == 3
    assert refused == ["bulk-3", "default-2"]
    assert order == ["first", "interactive", "default-1", "bulk-1", "bulk-2"]


def test_a_backfill_alone_takes_every_slot_and_beside_a_higher_lane_its_share() -> None:
    async def scenario() -> list[str]:
        clock = Clock()
        slots = RequestSlots(ongoing=4, queued=8, retry_after_s=1, beside_others=2, clock=clock)
        log: list[str] = []
        done = {name: asyncio.Event() for name in ("b1", "b2", "b3", "b4", "b5", "b6", "i1")}

        async def request(name: str, ticket: Ticket) -> None:
            async with slots.place(ticket):
                log.append(name)
                await done[name].wait()

        async def settle() -> None:
            for _ in range(5):
                await asyncio.sleep(0)

        tasks = [asyncio.ensure_future(request(name, BULK)) for name in ("b1", "b2", "b3")]
        await settle()
        assert not slots.capped(BULK.key) and slots.held(BULK.key) == 3  # alone: no cap
        tasks.append(asyncio.ensure_future(request("i1", INTERACTIVE)))
        await settle()
        assert slots.capped(BULK.key)
        tasks += [asyncio.ensure_future(request(name, BULK)) for name in ("b4", "b5")]
        await settle()
        # Four slots, three bulk and the interactive one at work: b4 and b5 wait.
        done["b1"].set()
        await settle()
        # b1's slot is free, but bulk holds 2 beside a higher lane: its share.
        assert slots.held(BULK.key) == 2 and slots.waiting == 2
        done["i1"].set()
        await settle()
        clock.now += 0.5  # the interactive request is gone, but arrived within the hold
        done["b2"].set()
        await settle()
        assert slots.capped(BULK.key) and slots.held(BULK.key) == 2
        clock.now += lanes.OTHERS_HOLD_S  # quiet for the hold: bulk takes every slot again
        done["b3"].set()
        await settle()
        assert not slots.capped(BULK.key) and slots.held(BULK.key) == 2 and slots.waiting == 0
        tasks.append(asyncio.ensure_future(request("b6", BULK)))
        await settle()
        assert slots.held(BULK.key) == 3
        for event in done.values():
            event.set()
        await asyncio.gather(*tasks)
        return log

    assert asyncio.run(scenario()) == ["b1", "b2", "b3", "i1", "b4", "b5", "b6"]


def test_a_large_tenant_beside_a_small_one_of_its_lane_holds_its_share_and_lanes_below_cap_no_one() -> None:
    async def scenario() -> dict[str, object]:
        slots = RequestSlots(ongoing=12, queued=16, retry_after_s=1, beside_others=3)
        hold = asyncio.Event()
        large, small, below = Ticket("large", Lane.DEFAULT), Ticket("small", Lane.DEFAULT), Ticket("small", Lane.BULK)
        seen: dict[str, object] = {}

        async def request(ticket: Ticket) -> None:
            async with slots.place(ticket):
                await hold.wait()

        async def settle() -> None:
            for _ in range(5):
                await asyncio.sleep(0)

        tasks = [asyncio.ensure_future(request(below))]  # a lower lane: caps no one above it
        tasks += [asyncio.ensure_future(request(large)) for _ in range(5)]
        await settle()
        seen["alone"] = slots.held(large.key)
        tasks += [asyncio.ensure_future(request(small)) for _ in range(2)]
        await settle()
        seen["small"] = slots.held(small.key)
        tasks.append(asyncio.ensure_future(request(large)))
        await settle()
        # Four slots are free, but the large tenant holds more than its share beside the small one: it waits.
        seen["large"], seen["waiting"] = slots.held(large.key), slots.waiting
        seen["capped"] = (slots.capped(large.key), slots.capped(small.key), slots.capped(below.key))
        hold.set()
        await asyncio.gather(*tasks)
        return seen

    seen = asyncio.run(scenario())
    # Nothing is taken back from the large tenant; the small one's two start at once; a sixth large one waits.
    assert seen == {"alone": 5, "small": 2, "large": 5, "waiting": 1, "capped": (True, True, True)}


def test_a_capped_bulk_lane_is_shed_at_its_share_of_the_queue() -> None:
    async def scenario() -> list[int]:
        slots = RequestSlots(ongoing=8, queued=4, retry_after_s=1, beside_others=1)
        hold = asyncio.Event()
        outcomes: list[int] = []

        async def request(ticket: Ticket) -> None:
            try:
                async with slots.place(ticket):
                    await hold.wait()
                outcomes.append(200)
            except ApiError as error:
                outcomes.append(error.status)

        tasks = [asyncio.ensure_future(request(INTERACTIVE))]
        tasks += [asyncio.ensure_future(request(BULK)) for _ in range(5)]
        for _ in range(5):
            await asyncio.sleep(0)
        # Slots are free, but bulk holds its one: two wait (half the queue's bound), the rest are refused.
        assert slots.working == 2 and slots.waiting == 2
        hold.set()
        await asyncio.gather(*tasks)
        return outcomes

    assert sorted(asyncio.run(scenario())) == [200] * 4 + [503] * 2


@pytest.mark.parametrize("lane", list(Lane))
def test_every_lane_may_queue_at_least_one(lane: Lane) -> None:
    assert queue_share(lane, 1) == 1


def test_the_priority_header_is_an_integer_from_0_to_999_or_absent() -> None:
    from siglip_serve.core.lanes import parse_priority

    assert parse_priority(None) is None
    assert parse_priority(" 2 ") == 2 and parse_priority("0") == 0 and parse_priority("999") == 999
    for bad in ("", "  ", "high", "-1", "1000", "1.5"):
        with pytest.raises(ValueError):
            parse_priority(bad)
