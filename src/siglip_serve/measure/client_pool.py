"""The served benchmark's load client: a closed-loop asyncio httpx driver, in one process or split over several.

One Python process with one asyncio client can spend a whole core on HTTP alone; on a many-core host that,
not the service, would then set the served figure. So a level's concurrency and requests are split over N
spawned client processes (spawn, not fork: the parent runs a Ray driver's threads), each driving its share
with its own event loop; the parent gathers every latency, so p50 and p99 are over all requests, and divides
the images by the wall time of the whole level. The client's own CPU (the bench process and its client
processes) is measured over each level, so a level the client could not drive any faster is said to be one
(measure/bound.py).

A spawned client process imports this module, which imports the standard library and psutil (httpx once it
drives) and nothing of Ray, torch or pydantic. A script that starts a pool of several needs the
`if __name__ == "__main__":` guard that spawn asks of any main module.
"""

from __future__ import annotations

import asyncio
import multiprocessing
import os
import time
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from typing import TYPE_CHECKING

import psutil

if TYPE_CHECKING:
    from siglip_serve.measure.results import ClientCpu

Bodies = list[tuple[bytes, str]]
# At most this many client processes for `auto`: past it the service, not the client, is what a host runs out of.
AUTO_MAX_PROCESSES = 8


def auto_client_processes(usable_cpus: int) -> int:
    """One client process on a small machine (more would take the service's cores); else one per four
    cores, up to AUTO_MAX_PROCESSES."""
    return 1 if usable_cpus <= 4 else min(AUTO_MAX_PROCESSES, usable_cpus // 4)


def parse_client_processes(text: str) -> int | None:
    """`--client-processes`: a positive count, or `auto` (None)."""
    if text == "auto":
        return None
    count = int(text)
    if count < 1:
        raise ValueError(f"--client-processes must be auto or at least 1, got {count}")
    return count


def split(total: int, parts: int) -> list[int]:
    """`total` in `parts` shares that differ by at most one, the larger first."""
    if parts < 1 or total < 0:
        raise ValueError(f"cannot split {total} in {parts} parts")
    share, extra = divmod(total, parts)
    return [share + (1 if i < extra else 0) for i in range(parts)]


@dataclass
class Share:
    """One client process's part of a level. `first` is its first body's index, so that the processes
    together post the bodies in the same mix as one process would."""

    url: str
    concurrency: int
    requests: int
    first: int = 0


@dataclass
class Driven:
    latencies: list[float] = field(default_factory=list)
    failures: int = 0


@dataclass
class Level:
    driven: Driven
    seconds: float
    client_cpu: ClientCpu


async def drive_share(bodies: Bodies, share: Share) -> Driven:
    """`share.concurrency` clients post `share.requests` bodies in all, each the next as soon as its answer is in."""
    import httpx

    driven = Driven()
    next_index = 0

    async def worker(client: httpx.AsyncClient) -> None:
        nonlocal next_index
        while next_index < share.requests:
            body, content_type = bodies[(share.first + next_index) % len(bodies)]
            next_index += 1
            began = time.perf_counter()
            response = await client.post(share.url, content=body, headers={"Content-Type": content_type})
            if response.status_code == 200:
                driven.latencies.append(time.perf_counter() - began)
            else:
                driven.failures += 1

    limits = httpx.Limits(max_connections=share.concurrency, max_keepalive_connections=share.concurrency)
    async with httpx.AsyncClient(timeout=120, limits=limits) as client:
        await asyncio.gather(*(worker(client) for _ in range(share.concurrency)))
    return driven


def _client_main(link: Connection) -> None:
    """A client process: take the bodies, then drive each share the parent sends, answering its result (or
    its error), until None."""
    bodies: Bodies = link.recv()
    while (share := link.recv()) is not None:
        try:
            link.send(asyncio.run(drive_share(bodies, share)))
        except Exception as exc:  # the parent raises it, naming the process
            link.send(f"{type(exc).__name__}: {exc}")


class ClientPool:
    """`processes` client processes, started once for the whole bench so that their pids are known to the
    server's CPU accounting (left out of it) and no level pays for their start. One process drives in
    this process itself, as a single client always did."""

    def __init__(self, bodies: Bodies, processes: int) -> None:
        self.bodies = bodies
        self.processes = processes
        self._links: list[Connection] = []
        self._procs: list[multiprocessing.process.BaseProcess] = []
        if processes > 1:
            context = multiprocessing.get_context("spawn")
            for _ in range(processes):
                mine, theirs = context.Pipe()
                # The bodies go over the link, not as the process's arguments: spawn writes those into a pipe it
                # keeps both ends of until written, which blocks forever if the child dies before reading them.
                proc = context.Process(target=_client_main, args=(theirs,), daemon=True, name="siglip-bench-client")
                proc.start()
                theirs.close()
                self._links.append(mine)
                self._procs.append(proc)
            for link in self._links:  # after every start, so that the processes start side by side
                link.send(bodies)

    @property
    def pids(self) -> set[int]:
        """The client processes, and spawn's resource tracker (a child of this process that is no part of the
        service)."""
        from multiprocessing import resource_tracker

        pids = {proc.pid for proc in self._procs if proc.pid is not None}
        tracker = getattr(getattr(resource_tracker, "_resource_tracker", None), "_pid", None)
        return pids | ({tracker} if self._procs and isinstance(tracker, int) else set())

    def run(self, url: str, concurrency: int, requests: int) -> Driven:
        """Every latency and failure of one level, the processes' shares gathered."""
        if not self._procs:
            return asyncio.run(drive_share(self.bodies, Share(url, concurrency, requests)))
        active = min(self.processes, concurrency)
        firsts = [0]
        for count in split(requests, active)[:-1]:
            firsts.append(firsts[-1] + count)
        for link, c, r, first in zip(self._links, split(concurrency, active), split(requests, active), firsts,
                                     strict=False):
            link.send(Share(url, c, r, first))
        gathered, errors = Driven(), []
        # Every answer is read before an error is raised, so that none is left for the next level to read.
        for index, link in enumerate(self._links[:active]):
            try:
                answer = link.recv()
            except EOFError:
                answer = f"exited with code {self._procs[index].exitcode}"
            if isinstance(answer, str):
                errors.append(f"client process {index} (pid {self._procs[index].pid}): {answer}")
            else:
                gathered.latencies += answer.latencies
                gathered.failures += answer.failures
        if errors:
            raise RuntimeError("; ".join(errors))
        return gathered

    def level(self, url: str, concurrency: int, requests: int) -> Level:
        """One level: every request's outcome, its whole wall time and the client's CPU over it."""
        cpu = ClientCpuWindow([os.getpid(), *(proc.pid for proc in self._procs if proc.pid is not None)])
        began = time.perf_counter()
        driven = self.run(url, concurrency, requests)
        return Level(driven, time.perf_counter() - began, cpu.result(self.processes))

    def close(self) -> None:
        for link in self._links:
            try:
                link.send(None)
            except (BrokenPipeError, OSError):
                pass
        for proc in self._procs:
            proc.join(timeout=10)
            if proc.is_alive():
                proc.kill()
                proc.join(timeout=5)
        for link in self._links:
            link.close()
        self._links, self._procs = [], []

    def __enter__(self) -> ClientPool:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()


class ClientCpuWindow:
    """The CPU seconds of the client's processes from its creation to `result`."""

    def __init__(self, pids: list[int]) -> None:
        self.procs = [psutil.Process(pid) for pid in pids]
        self.began = time.perf_counter()
        self.before = [_cpu_seconds(proc) for proc in self.procs]

    def result(self, client_processes: int) -> ClientCpu:
        from siglip_serve.measure.results import ClientCpu

        wall = max(time.perf_counter() - self.began, 1e-9)
        spent = [max(0.0, _cpu_seconds(proc) - before) for proc, before in zip(self.procs, self.before, strict=True)]
        return ClientCpu(client_processes=client_processes, processes=len(self.procs), seconds=sum(spent),
                         busiest_process_core_fraction=max(spent) / wall)


def _cpu_seconds(proc: psutil.Process) -> float:
    try:
        times = proc.cpu_times()
    except psutil.NoSuchProcess:  # a client process that died: the level fails on its missing answer
        return 0.0
    return float(times.user + times.system)
