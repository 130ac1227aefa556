"""One batch at a time, taken when the model is free: whatever queued while the last batch ran.

Ray Serve's `@serve.batch` forms a batch when its first input arrives (plus its wait), before the batch ahead
of it has finished: its semaphore bounds running batches, not forming ones, so a busy replica runs a queue of
small batches (most of a cpu replica's forward passes ran a single image while more waited; README,
Benchmarks). Here the next batch is formed only when the previous one has returned, up to `max_size` inputs,
waiting up to `wait_s` for more only when fewer than that are queued.

Every input gets an answer: its result, its own error, the batch's error (every waiter of a batch
that fails), or, when the replica stops the loop, a cancellation. A batch whose callers have all gone
away (cancelled) is cancelled too: in the ingress that cancels the encoder call, which Serve then
cancels in the replica, best effort (`DeploymentResponse.cancel`, ray/serve/handle.py, Ray 2.60).

The same queue coalesces the ingress's encoder calls (serve/ingress/tower_client.py), with `concurrency` batches
in flight at once and no wait: at low load each request's chunk goes out alone at once; past
`concurrency` calls in flight, what queued meanwhile goes out as one call when one returns.

Inputs wait in lane order (core/lanes.py `LaneQueue`): a batch takes the higher lane's inputs first, with
ageing, and within a lane the tenants' inputs in weighted turns; each input's ticket is its caller's
request's (or the lane the ingress sent with a replica's call). A batch that holds an interactive input does not
wait for more: somebody waits on it, and the wait is for throughput, which that lane does not trade for.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from siglip_serve.core import lanes
from siglip_serve.core.lanes import LaneQueue, Ticket

log = logging.getLogger("siglip_serve.batcher")

# (inputs, deadlines, traces) -> one result per input: its output, or the exception it alone failed with.
# A trace is what its caller submitted with the input (serve/shared/tracing.py; None when tracing is off).
RunBatch = Callable[[list[Any], list[float], list[Any]], Awaitable[list[Any]]]


@dataclass
class _Waiter:
    item: Any
    deadline: float
    size: int
    future: asyncio.Future[Any]
    trace: Any = None
    lane: lanes.Lane = lanes.Lane.DEFAULT
    queued_at: float = field(default_factory=time.monotonic)


class Batcher:
    """Queue inputs from concurrent calls; run them in batches of at most `max_size` (by `size_of`)."""

    def __init__(self, run: RunBatch, max_size: int, size_of: Callable[[Any], int], wait_s: float,
                 on_batch: Callable[[list[float], int], None] | None = None, concurrency: int = 1) -> None:
        if max_size < 1:
            raise ValueError(f"max_size must be at least 1, got {max_size}")
        if concurrency < 1:
            raise ValueError(f"concurrency must be at least 1, got {concurrency}")
        self.run = run
        self.max_size = max_size
        self.size_of = size_of
        self.wait_s = wait_s
        # Called as each batch starts: the seconds each of its inputs waited, and what still waits.
        self.on_batch = on_batch
        self.concurrency = concurrency
        self._queue: LaneQueue[_Waiter] = LaneQueue(dead=lambda waiter: waiter.future.done())
        self._arrived = asyncio.Event()
        self._slot_freed = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    @property
    def queued(self) -> int:
        """Inputs (by size) waiting, not yet in a running batch."""
        return sum(w.size for w in self._queue if not w.future.done())

    async def submit(self, item: Any, deadline: float, trace: Any = None, ticket: Ticket | None = None) -> Any:
        """Queue `item` and return its result (or raise its error) once its batch has run; `trace` goes
        with it to the batch (tracing); `ticket`: its tenant and lane (None: the running request's)."""
        size = self.size_of(item)
        if size > self.max_size:
            raise ValueError(f"{size} inputs in one call; a batch holds at most {self.max_size}")
        loop = asyncio.get_running_loop()
        if self._task is None or self._task.done():
            self._task = loop.create_task(self._serve_forever())
        ticket = ticket if ticket is not None else lanes.current()
        waiter = _Waiter(item, deadline, size, loop.create_future(), trace, ticket.lane)
        self._queue.push(waiter, ticket)
        self._arrived.set()
        # A caller that goes away (cancelled) leaves its waiter done: the next batch skips it.
        return await waiter.future

    def set_concurrency(self, concurrency: int) -> None:
        """Batches in flight from now on (at least 1); running ones are not touched."""
        self.concurrency = max(1, concurrency)
        self._slot_freed.set()

    async def _serve_forever(self) -> None:
        running: set[asyncio.Task[None]] = set()

        def finished(task: asyncio.Task[None]) -> None:
            running.discard(task)
            self._slot_freed.set()

        try:
            while True:
                # The next batch forms only once a slot is free: what queues meanwhile joins it.
                while len(running) >= self.concurrency:
                    self._slot_freed.clear()
                    await self._slot_freed.wait()
                batch = await self._next_batch(free_slots=self.concurrency - len(running))
                task = asyncio.get_running_loop().create_task(self._run(batch))
                running.add(task)
                task.add_done_callback(finished)
        except BaseException:
            # Stopped (the replica is shutting down) or broken: nobody is left waiting forever.
            for task in running:
                task.cancel()
            self._cancel_queued()
            raise

    async def _next_batch(self, free_slots: int = 1) -> list[_Waiter]:
        batch: list[_Waiter] = []
        size = self._take(batch, 0, free_slots)
        while not batch:
            self._arrived.clear()
            await self._arrived.wait()
            size = self._take(batch, 0, free_slots)
        deadline = time.monotonic() + self.wait_s
        while (size < self.max_size and self._fits_next(size) and not self._urgent(batch)
               and (remaining := deadline - time.monotonic()) > 0):
            self._arrived.clear()
            try:
                await asyncio.wait_for(self._arrived.wait(), remaining)
            except TimeoutError:
                pass
            size = self._take(batch, size)
        return batch

    @staticmethod
    def _urgent(batch: list[_Waiter]) -> bool:
        return any(waiter.lane == lanes.Lane.INTERACTIVE for waiter in batch)

    def _fits_next(self, size: int) -> bool:
        """False when the input at the head of the queue would not fit: waiting cannot fill the batch."""
        head = self._queue.peek()
        return head is None or size + head.size <= self.max_size

    def _take(self, batch: list[_Waiter], size: int, free_slots: int = 1) -> int:
        """Move queued inputs into `batch` in lane order while they fit; returns the batch's size.

        With other slots free too, the batch takes only its share of the queue: eight requests that
        arrive together at an ingress with two encoder replicas idle leave as two calls of four, not
        one of eight while the other replica waits."""
        limit = self.max_size
        if free_slots > 1:
            limit = min(limit, max(1, math.ceil((size + self.queued) / free_slots)))
        while (head := self._queue.peek()) is not None:
            if size + head.size > self.max_size or (batch and size + head.size > limit):
                break
            self._queue.pop()
            batch.append(head)
            size += head.size
        return size

    async def _run(self, batch: list[_Waiter]) -> None:
        live = [w for w in batch if not w.future.done()]
        if not live:
            return
        if self.on_batch is not None:
            now = time.monotonic()
            try:
                self.on_batch([now - w.queued_at for w in live], self.queued)
            except Exception:  # broad on purpose: a metrics hiccup must not strand the batch's callers
                log.warning("on_batch failed", exc_info=True)
        run = asyncio.ensure_future(self.run([w.item for w in live], [w.deadline for w in live],
                                             [w.trace for w in live]))

        def abandoned(_: asyncio.Future[Any]) -> None:
            # Every caller of the batch went away (clients gone): stop the work nobody waits for.
            if not run.done() and all(w.future.done() for w in live):
                run.cancel()

        for w in live:
            w.future.add_done_callback(abandoned)
        try:
            results = await run
        except asyncio.CancelledError:
            for w in live:
                if not w.future.done():
                    w.future.cancel()
            raise
        except Exception as exc:  # the batch failed: every one of its waiters hears it
            log.debug("a batch of %d input(s) failed: %r", len(live), exc)
            for w in live:
                if not w.future.done():
                    w.future.set_exception(exc)
            return
        if len(results) != len(live):
            error = RuntimeError(f"the batch returned {len(results)} results for {len(live)} inputs")
            results = [error] * len(live)
        for w, result in zip(live, results, strict=True):
            if w.future.done():
                continue
            if isinstance(result, BaseException):
                w.future.set_exception(result)
            else:
                w.future.set_result(result)

    def _cancel_queued(self) -> None:
        for w in self._queue.drain():
            if not w.future.done():
                w.future.cancel()
