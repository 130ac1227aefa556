"""A burst of requests written at once, and a busy core beside a measurement: what the slow-hour measurements
(tools/deadline_burst.py, tools/start_time.py) and the front door's burst test share.

`burst` opens every connection first and only then writes the request on all of them, so the burst arrives within
milliseconds instead of at the pace connections are made; each answer is read to its end (the request says
`Connection: close`). `busy_core` keeps one core busy with a plain shell loop at nice 0, as a neighbour on a shared
machine does (tools/busy_core.sh does the same around any command).
"""

from __future__ import annotations

import asyncio
import contextlib
import subprocess
import time
from collections.abc import Iterator


async def burst(port: int, request: bytes, count: int, host: str = "127.0.0.1") -> list[tuple[bytes, float]]:
    """`count` connections to `host`:`port` opened first, then `request` written on all of them at once: each reply
    (read to the end) and the seconds from its write."""
    connections = [await asyncio.open_connection(host, port) for _ in range(count)]
    go = asyncio.Event()

    async def one(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> tuple[bytes, float]:
        await go.wait()
        began = time.monotonic()
        writer.write(request)
        await writer.drain()
        reply = await reader.read()
        writer.close()
        return reply, time.monotonic() - began

    tasks = [asyncio.ensure_future(one(*connection)) for connection in connections]
    await asyncio.sleep(0.1)
    go.set()
    return list(await asyncio.gather(*tasks))


def status_of(reply: bytes) -> int:
    """The HTTP status of a whole reply; 0 where the connection closed without one."""
    return int(reply.split(b" ", 2)[1]) if reply else 0


@contextlib.contextmanager
def busy_core(on: bool = True) -> Iterator[None]:
    """One core kept busy while the block runs (nothing where `on` is false)."""
    if not on:
        yield
        return
    loop = subprocess.Popen(["sh", "-c", "while :; do :; done"])
    try:
        yield
    finally:
        loop.kill()
        loop.wait()
