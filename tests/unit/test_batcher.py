"""The replicas' batcher (serve/shared/batcher.py): batches form when the model is free, every caller is answered."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

from siglip_serve.serve.shared.batcher import Batcher


class Model:
    """A stand-in forward pass with the real `run` signature: (inputs, deadlines, traces) -> one result each."""

    def __init__(self, seconds: float = 0.05, fail: Exception | None = None) -> None:
        self.seconds = seconds
        self.fail = fail
        self.batches: list[list[Any]] = []

    async def run(self, items: list[Any], deadlines: list[float], traces: list[Any]) -> list[Any]:
        self.batches.append(list(items))
        await asyncio.sleep(self.seconds)
        if self.fail is not None:
            raise self.fail
        return [ValueError(f"bad {item}") if item == "bad" else f"out-{item}" for item in items]


def one(_: object) -> int:
    return 1


def test_the_next_batch_is_what_queued_while_the_last_one_ran() -> None:
    """Ray's @serve.batch would form seven batches of one here (see the module docstring)."""
    model = Model(seconds=0.1)

    async def main() -> list[Any]:
        batcher = Batcher(model.run, max_size=8, size_of=one, wait_s=0.0)
        first = asyncio.ensure_future(batcher.submit(0, 0.0))
        await asyncio.sleep(0.02)  # the first batch is running
        rest = [asyncio.ensure_future(batcher.submit(i, 0.0)) for i in range(1, 8)]
        for _ in range(3):
            await asyncio.sleep(0.01)
        return await asyncio.gather(first, *rest)

    assert asyncio.run(main()) == [f"out-{i}" for i in range(8)]
    assert model.batches == [[0], list(range(1, 8))]


def test_batches_hold_at_most_max_size_inputs_in_arrival_order() -> None:
    model = Model(seconds=0.01)

    async def main() -> list[Any]:
        batcher = Batcher(model.run, max_size=8, size_of=len, wait_s=0.05)
        return await asyncio.gather(*(batcher.submit(chunk, 0.0) for chunk in ("aaa", "bbb", "ccc", "dd")))

    assert asyncio.run(main()) == ["out-aaa", "out-bbb", "out-ccc", "out-dd"]
    # ccc does not fit beside aaa and bbb; it leads the next batch, ahead of dd (no reordering).
    assert model.batches == [["aaa", "bbb"], ["ccc", "dd"]]


def test_wait_s_holds_a_partial_batch_for_late_arrivals_and_a_full_one_not_at_all() -> None:
    model = Model(seconds=0.0)

    async def main() -> float:
        batcher = Batcher(model.run, max_size=2, size_of=one, wait_s=0.5)
        loop = asyncio.get_running_loop()
        began = loop.time()
        first = asyncio.ensure_future(batcher.submit("a", 0.0))
        await asyncio.sleep(0.05)
        await asyncio.gather(first, batcher.submit("b", 0.0))
        return loop.time() - began

    took = asyncio.run(main())
    assert model.batches == [["a", "b"]]
    assert took < 0.4, took  # the batch was full at b: it did not sit out the rest of wait_s


def test_a_batch_with_an_interactive_input_does_not_wait_for_more() -> None:
    from siglip_serve.core.lanes import Lane, Ticket

    model = Model(seconds=0.0)

    async def main() -> tuple[float, float]:
        batcher = Batcher(model.run, max_size=8, size_of=one, wait_s=0.5)
        loop = asyncio.get_running_loop()
        began = loop.time()
        await batcher.submit("search", 0.0, ticket=Ticket("app", Lane.INTERACTIVE))
        interactive = loop.time() - began
        began = loop.time()
        await batcher.submit("backfill", 0.0, ticket=Ticket("app", Lane.BULK))
        return interactive, loop.time() - began

    interactive, bulk = asyncio.run(main())
    assert interactive < 0.25 <= bulk, (interactive, bulk)  # the bulk input alone sits out wait_s
    assert model.batches == [["search"], ["backfill"]]


def test_an_input_of_its_own_fails_alone() -> None:
    model = Model()

    async def main() -> list[Any]:
        batcher = Batcher(model.run, max_size=8, size_of=one, wait_s=0.01)
        return await asyncio.gather(*(batcher.submit(x, 0.0) for x in ("a", "bad", "c")), return_exceptions=True)

    a, bad, c = asyncio.run(main())
    assert (a, c) == ("out-a", "out-c")
    assert isinstance(bad, ValueError) and str(bad) == "bad bad"


def test_a_failing_batch_fails_every_waiter_and_the_next_batch_still_runs() -> None:
    model = Model(fail=RuntimeError("device lost"))

    async def main() -> tuple[list[Any], Any]:
        batcher = Batcher(model.run, max_size=8, size_of=one, wait_s=0.01)
        failed = await asyncio.gather(*(batcher.submit(x, 0.0) for x in "abc"), return_exceptions=True)
        model.fail = None
        return failed, await batcher.submit("d", 0.0)

    failed, after = asyncio.run(main())
    assert [str(e) for e in failed] == ["device lost"] * 3 and all(isinstance(e, RuntimeError) for e in failed)
    assert after == "out-d"


def test_a_caller_that_went_away_is_left_out_of_the_next_batch() -> None:
    model = Model(seconds=0.1)

    async def main() -> list[Any]:
        batcher = Batcher(model.run, max_size=8, size_of=one, wait_s=0.0)
        running = asyncio.ensure_future(batcher.submit("a", 0.0))
        await asyncio.sleep(0.02)
        gone, stays = asyncio.ensure_future(batcher.submit("b", 0.0)), asyncio.ensure_future(batcher.submit("c", 0.0))
        await asyncio.sleep(0.01)
        gone.cancel()
        return await asyncio.gather(running, stays)

    assert asyncio.run(main()) == ["out-a", "out-c"]
    assert model.batches == [["a"], ["c"]]


def test_stopping_the_batcher_answers_running_and_queued_callers() -> None:
    model = Model(seconds=10.0)

    async def main() -> list[Any]:
        batcher = Batcher(model.run, max_size=1, size_of=one, wait_s=0.0)
        callers = [asyncio.ensure_future(batcher.submit(x, 0.0)) for x in "ab"]
        await asyncio.sleep(0.02)
        assert batcher._task is not None
        batcher._task.cancel()  # what the replica's shutdown does to the loop
        return await asyncio.wait_for(asyncio.gather(*callers, return_exceptions=True), 2)

    assert all(isinstance(r, asyncio.CancelledError) for r in asyncio.run(main()))
    assert model.batches == [["a"]]


def test_a_call_larger_than_a_batch_is_refused_before_it_queues() -> None:
    async def main() -> None:
        await Batcher(Model().run, max_size=2, size_of=len, wait_s=0.0).submit("abc", 0.0)

    with pytest.raises(ValueError, match="at most 2"):
        asyncio.run(main())


def test_on_batch_hears_each_calls_queue_wait_and_what_is_left() -> None:
    model = Model(seconds=0.05)
    seen: list[tuple[list[float], int]] = []

    async def main() -> None:
        batcher = Batcher(model.run, max_size=2, size_of=one, wait_s=0.0,
                          on_batch=lambda waits, queued: seen.append((waits, queued)))
        first = asyncio.ensure_future(batcher.submit("a", 0.0))
        await asyncio.sleep(0.01)
        await asyncio.gather(first, *(batcher.submit(x, 0.0) for x in "bcd"))

    asyncio.run(main())
    assert model.batches == [["a"], ["b", "c"], ["d"]]
    assert [len(waits) for waits, _ in seen] == [1, 2, 1]
    assert [queued for _, queued in seen] == [0, 1, 0]
    assert seen[1][0][0] >= 0.03  # b waited for a's forward pass


def test_a_failing_on_batch_hook_does_not_strand_the_batch() -> None:
    model = Model(seconds=0.0)

    def broken(waits: list[float], queued: int) -> None:
        raise RuntimeError("metrics backend down")

    async def main() -> list[Any]:
        batcher = Batcher(model.run, max_size=8, size_of=one, wait_s=0.0, on_batch=broken)
        return await asyncio.wait_for(asyncio.gather(*(batcher.submit(x, 0.0) for x in "ab")), 2)

    assert asyncio.run(main()) == ["out-a", "out-b"]


def test_with_concurrency_batches_overlap_and_the_queue_forms_the_next_one_when_a_slot_frees() -> None:
    """The ingress's use (serve/ingress/tower_client.py): two calls in flight, no wait; the rest coalesce."""
    model = Model(seconds=0.1)

    async def main() -> list[Any]:
        batcher = Batcher(model.run, max_size=8, size_of=one, wait_s=0.0, concurrency=2)
        first = []
        for x in "ab":  # b arrives while a runs and a slot is free: it leaves at once, alone
            first.append(asyncio.ensure_future(batcher.submit(x, 0.0)))
            await asyncio.sleep(0.01)
        rest = [asyncio.ensure_future(batcher.submit(x, 0.0)) for x in "cdef"]
        return await asyncio.wait_for(asyncio.gather(*first, *rest), 2)

    began = time.monotonic()
    assert asyncio.run(main()) == [f"out-{x}" for x in "abcdef"]
    assert model.batches == [["a"], ["b"], ["c", "d", "e", "f"]]
    assert time.monotonic() - began < 0.35  # a and b overlapped: two rounds of 0.1 s, not three


def test_concurrency_must_be_positive() -> None:
    with pytest.raises(ValueError, match="concurrency"):
        Batcher(Model().run, max_size=1, size_of=one, wait_s=0.0, concurrency=0)


def test_with_slots_free_a_burst_is_shared_between_them_not_packed_into_one() -> None:
    """Eight arrivals at once with two idle encoder replicas: two calls of four, both replicas busy."""
    model = Model(seconds=0.05)

    async def main() -> list[Any]:
        batcher = Batcher(model.run, max_size=8, size_of=one, wait_s=0.0, concurrency=2)
        return await asyncio.wait_for(asyncio.gather(*(batcher.submit(i, 0.0) for i in range(8))), 2)

    assert asyncio.run(main()) == [f"out-{i}" for i in range(8)]
    assert model.batches == [[0, 1, 2, 3], [4, 5, 6, 7]]


def test_a_running_batch_is_cancelled_once_every_caller_has_gone_and_only_then() -> None:
    cancelled: list[list[Any]] = []

    class Slow(Model):
        async def run(self, items: list[Any], deadlines: list[float], traces: list[Any]) -> list[Any]:
            try:
                return await super().run(items, deadlines, traces)
            except asyncio.CancelledError:
                cancelled.append(list(items))
                raise

    model = Slow(seconds=0.2)

    async def main() -> Any:
        batcher = Batcher(model.run, max_size=8, size_of=one, wait_s=0.0, concurrency=2)
        alone = asyncio.ensure_future(batcher.submit("a", 0.0))
        await asyncio.sleep(0.02)  # ["a"] running
        pair = [asyncio.ensure_future(batcher.submit(x, 0.0)) for x in ("b", "c")]
        await asyncio.sleep(0.02)  # ["b", "c"] running beside it
        alone.cancel()
        pair[0].cancel()
        await asyncio.sleep(0.01)
        assert cancelled == [["a"]]  # nobody waits for it any more; ["b", "c"] still has "c"
        return await pair[1]

    assert asyncio.run(main()) == "out-c" and cancelled == [["a"]]


def test_each_input_carries_its_trace_to_the_batch() -> None:
    seen: list[list[Any]] = []

    async def run(items: list[Any], deadlines: list[float], traces: list[Any]) -> list[Any]:
        seen.append(traces)
        return items

    async def main() -> list[Any]:
        batcher = Batcher(run, max_size=8, size_of=one, wait_s=0.01)
        return await asyncio.gather(*(batcher.submit(x, 0.0, trace=f"t-{x}") for x in "ab"), batcher.submit("c", 0.0))

    assert asyncio.run(main()) == ["a", "b", "c"] and seen == [["t-a", "t-b", None]]
