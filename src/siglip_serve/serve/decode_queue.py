"""Fair, cost-weighted admission of image decodes to the ingress's decode threads.

Decoding is the ingress's expensive step: a 40-megapixel PNG holds ~300 MB and a thread for
half a second or more. A plain thread pool runs submissions in order, so one request of 64
heavy images holds every thread while another client's small image waits behind all 64. Here
each request has its own queue and a free thread takes the next decode round-robin across
requests; a decode starts only while the decodes running hold less than `budget_bytes` (their
header-declared cost, `ImageHeader.decode_bytes`), so concurrent heavy images cannot add up to
gigabytes. A decode that would not fit alone still runs, but only when nothing else does.

Everything here runs on the replica's event loop; only the decode functions run on threads.
A decode whose request is cancelled (deadline passed, client gone) before it started never runs.
"""

from __future__ import annotations

import asyncio
import functools
from collections import OrderedDict, deque
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any


@dataclass
class _Job:
    fn: Callable[[], Any]
    cost: int
    future: asyncio.Future[Any]


@dataclass
class _Queues:
    by_request: OrderedDict[object, deque[_Job]] = field(default_factory=OrderedDict)

    def next_job(self) -> _Job | None:
        """The head job of the request whose turn it is (that request then goes to the back)."""
        while self.by_request:
            key, jobs = next(iter(self.by_request.items()))
            while jobs and jobs[0].future.done():  # cancelled while waiting
                jobs.popleft()
            if not jobs:
                del self.by_request[key]
                continue
            return jobs[0]
        return None

    def pop(self, job: _Job) -> None:
        key, jobs = next(iter(self.by_request.items()))
        jobs.popleft()
        self.by_request.move_to_end(key)
        if not jobs:
            del self.by_request[key]


class FairDecodeQueue:
    def __init__(self, threads: int, budget_bytes: int) -> None:
        self.threads = threads
        self.budget_bytes = budget_bytes
        self.pool = ThreadPoolExecutor(threads, thread_name_prefix="decode")
        self.running = 0
        self.running_bytes = 0
        self._queues = _Queues()

    def waiting(self) -> int:
        return sum(len(jobs) for jobs in self._queues.by_request.values())

    async def run(self, request: object, fn: Callable[[], Any], cost: int) -> Any:
        """fn() on a decode thread, when `request`'s turn comes and its cost fits."""
        job = _Job(fn, max(int(cost), 0), asyncio.get_running_loop().create_future())
        self._queues.by_request.setdefault(request, deque()).append(job)
        self._dispatch()
        return await job.future  # cancelling it before it starts drops the job (next_job skips it)

    def _dispatch(self) -> None:
        loop = asyncio.get_running_loop()
        while self.running < self.threads:
            job = self._queues.next_job()
            if job is None:
                return
            if self.running and self.running_bytes + job.cost > self.budget_bytes:
                return  # wait for running decodes to free their bytes; the turn stays with this job
            self._queues.pop(job)
            self.running += 1
            self.running_bytes += job.cost
            work = loop.run_in_executor(self.pool, job.fn)
            work.add_done_callback(functools.partial(self._finished, job))

    def _finished(self, job: _Job, done: asyncio.Future[Any]) -> None:
        self.running -= 1
        self.running_bytes -= job.cost
        if not job.future.done():
            if done.cancelled():
                job.future.cancel()
            elif done.exception() is not None:
                job.future.set_exception(done.exception())  # type: ignore[arg-type]
            else:
                job.future.set_result(done.result())
        elif not done.cancelled():
            done.exception()  # the waiter left: retrieve the outcome so asyncio does not log it
        self._dispatch()
