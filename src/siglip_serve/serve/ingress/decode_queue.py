"""Fair, cost-weighted admission of image decodes to the ingress's decode threads.

Decoding is the ingress's expensive step: a 40-megapixel PNG holds ~300 MB and a thread for
half a second or more. A plain thread pool runs submissions in order, so one request of 64
heavy images holds every thread while another client's small image waits behind all 64. Here
decodes take turns through FairSlots (serve/ingress/fair_slots.py): each request has its own queue and a
free thread takes the next decode round-robin across requests; a decode starts only while the
decodes running hold less than `budget_bytes` (their header-declared cost,
`ImageHeader.decode_bytes`), so concurrent heavy images cannot add up to gigabytes. A decode that
would not fit alone still runs, but only when nothing else does.

Everything here runs on the replica's event loop; only the decode functions run on threads.
A decode whose request is cancelled (deadline passed, client gone) before it started never runs;
one already on a thread keeps its slot and its bytes until the thread is done with it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from siglip_serve.serve.ingress.fair_slots import FairSlots


class FairDecodeQueue:
    def __init__(self, threads: int, budget_bytes: int) -> None:
        self.threads = threads
        self.budget_bytes = budget_bytes
        self.pool = ThreadPoolExecutor(threads, thread_name_prefix="decode")
        self.slots = FairSlots(threads, budget_bytes)

    @property
    def running(self) -> int:
        return self.slots.held

    def waiting(self) -> int:
        return self.slots.waiting()

    async def run(self, request: object, fn: Callable[[], Any], cost: int) -> Any:
        """fn() on a decode thread, when `request`'s turn comes and its cost fits."""
        await self.slots.acquire(request, cost)
        work = asyncio.get_running_loop().run_in_executor(self.pool, fn)
        # The thread's slot and bytes are freed when the thread is done, not when the waiter leaves.
        work.add_done_callback(lambda _: self.slots.release(request, cost))
        return await asyncio.shield(work)
