"""One replica shape for both towers (image and text); their deployments are the plan's (serve/plan/planner.py).

A replica loads and warms its tower in the constructor (Serve counts it RUNNING only once warm), runs
every forward pass on one thread of its own, and gathers the calls that arrive into batches with its
own Batcher (serve/shared/batcher.py). Each caller's chunk is answered on its own: its rows, or the error it
alone failed with (its deadline passed in the queue, or the tower refused it), so one late or bad
chunk never fails the others of its batch. The ingress reaches both towers the same way
(serve/ingress/tower_client.py: `embed_chunks`, a dead replica retried once), and counts both the same way: a warm
replica announces itself in the registry (serve/shared/registry.py, `publish`) with its tower, placement, warm-up and
description, which the ingress reads for readiness, coalescing and the tower's facts (serve/ingress/tower_link.py).
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
import ray
from ray import serve
from ray.serve.exceptions import RayServeException

from siglip_serve.core.errors import DeadlineExceeded
from siglip_serve.core.lanes import Lane, Ticket
from siglip_serve.models.image_only import leave_out_transformers
from siglip_serve.serve.plan.replica_slices import TowerRun
from siglip_serve.serve.plan.service_plan import TowerPlan
from siglip_serve.serve.shared import registry, tracing
from siglip_serve.serve.shared.batcher import Batcher
from siglip_serve.serve.shared.metrics import TowerMetrics
from siglip_serve.serve.shared.replica_grpc import bind_to_node_address
from siglip_serve.serve.shared.replica_logging import configure_replica_logging
from siglip_serve.serve.towers.replica_start import ReplicaRefused, start_tower, volume_unready, wait_for_artifact
from siglip_serve.serve.towers.start_marks import BUILD, REGISTRATION, START_KEY, StartMarks

log = logging.getLogger("siglip_serve.replica")

WARMUP_ITERATIONS = 2


class TowerReplica:
    """What both towers' replicas share; a tower says how it checks a chunk and encodes a batch."""

    def __init__(self, run: TowerRun, tower: Any, metrics: TowerMetrics,
                 start: StartMarks | None = None) -> None:
        """`run`: what its model's tower replicas run with (the plan's, serve/plan/replica_slices.py); `start`: the
        phases of this replica's start so far (serve/towers/start_marks.py), published with its record."""
        self.tower = tower
        self.metrics = metrics
        self.start = StartMarks() if start is None else start
        bind_to_node_address()
        tracing.configure(run.tracing, f"{tower.tower}-encoder")
        warm = self.tower.warmup(iterations=WARMUP_ITERATIONS, on_bucket=self.start.warmed)
        self.warmup_seconds = {str(b): round(s, 6) for b, s in warm.items()}
        # Every forward pass on one thread: torch's OpenMP keeps a thread team per calling thread, and
        # teams of asyncio.to_thread's rotating workers spin on the same cores after their pass.
        self.forward_thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="forward")
        self.batcher = Batcher(self._embed_batch, self.tower.max_batch_size, len, run.batch_wait_timeout_s,
                               on_batch=metrics.batch_started)

    # -- what a tower says -------------------------------------------------------------------

    def refusal(self, chunk: Any) -> Exception | None:
        """The error this chunk alone fails with before it may join a batch; None to run it."""
        return None

    def encode_chunks(self, chunks: list[Any]) -> list[Any]:
        """One forward pass over the chunks (on the forward thread): each chunk's rows or its own error."""
        raise NotImplementedError

    # -- shared ------------------------------------------------------------------------------

    def publish(self, extra: dict[str, Any] | None = None) -> dict[str, Any]:
        """This warm replica's record (its tower, placement, warm-up, the tower's description and `extra`),
        written to the registry so that the ingress counts it; the record. Outside a Serve replica (a test
        building the class) it is only returned."""
        self.info: dict[str, Any] = {"tower": self.tower.tower, **(extra or {}), "host": socket.gethostname(),
                                     "pid": os.getpid(), "warmup_seconds": self.warmup_seconds,
                                     **self.tower.describe()}
        try:
            context = serve.get_replica_context()
        except RayServeException:
            return self._with_start()
        self.app_name = context.app_name
        self.replica_actor_name = context.replica_id.to_full_id_str()
        self.info = {"replica_id": context.replica_id.unique_id, **self.info,
                     "node_id": ray.get_runtime_context().get_node_id()}
        registry.register_replica(self.app_name, self.replica_actor_name, self._with_start())
        registry.clear_refusal(self.app_name, self.info["tower"])
        return self.info

    def _with_start(self) -> dict[str, Any]:
        """The record with this replica's start phases, registration the last (up to the registry's write)."""
        self.start.mark(REGISTRATION)
        self.info[START_KEY] = self.start.record()
        return self.info

    def _first_answer(self) -> None:
        """Publish when this replica first answered (once): from its process's creation to here is what a
        replica added by autoscaling costs before it takes load."""
        if getattr(self, "replica_actor_name", None) is None:
            return  # outside a Serve replica: nothing was published
        self.info[START_KEY] = self.start.record()
        try:
            registry.register_replica(self.app_name, self.replica_actor_name, self.info)
        except Exception:  # broad on purpose: a figure for operators, never worth the batch's answers
            log.warning("could not publish this replica's first answer", exc_info=True)

    def __del__(self) -> None:
        try:
            registry.unregister_replica(self.app_name, self.replica_actor_name)
        except Exception:  # broad on purpose: best effort at shutdown (or never published); live_replicas prunes
            pass

    async def embed_chunks(self, chunks: list[Any], deadlines: list[float],
                           traces: list[tracing.Carrier | None] | None = None,
                           tickets: list[tuple[int, str, float]] | None = None) -> list[Any]:
        """Several callers' chunks in one call: one result per chunk, its float32 [n, D] or the
        exception it alone failed with; each joins the batch queue on its own, in its lane's order. `traces`:
        each chunk's request span (serve/shared/tracing.py), when tracing is on; `tickets`: each chunk's (lane,
        tenant, weight) (core/lanes.py), absent when all are the default."""
        queued: list[Any] = [None] * len(chunks) if traces is None or not tracing.enabled() else [
            (tracing.extract(carrier), time.time_ns()) for carrier in traces]
        ordered: list[Ticket | None] = ([None] * len(chunks) if tickets is None else
                                        [Ticket(tenant, Lane(lane), weight) for lane, tenant, weight in tickets])
        results = await asyncio.gather(*(self.batcher.submit(chunk, deadline, trace, ticket)
                                         for chunk, deadline, trace, ticket
                                         in zip(chunks, deadlines, queued, ordered, strict=True)),
                                       return_exceptions=True)
        # A cancellation (the replica stopping) is no answer to pickle back; the call as a whole fails.
        for result in results:
            if isinstance(result, BaseException) and not isinstance(result, Exception):
                raise result
        return list(results)

    async def _embed_batch(self, chunks: list[Any], deadlines: list[float], traces: list[Any]) -> list[Any]:
        if not tracing.enabled():
            return await self._run_batch(chunks, deadlines)
        began = time.time_ns()
        for trace in traces:  # each request's wait for this batch, in its own trace
            if trace:
                tracing.record("queue", trace[0], trace[1], began)
        size = sum(len(chunk) for chunk in chunks)
        bucket = next((b for b in self.tower.buckets if b >= size), self.tower.max_batch_size)
        with tracing.span("batch", links=[trace[0] for trace in traces if trace], tower=self.tower.tower,
                          size=size, bucket=bucket):
            return await self._run_batch(chunks, deadlines)

    async def _run_batch(self, chunks: list[Any], deadlines: list[float]) -> list[Any]:
        results: list[Any] = [None] * len(chunks)
        now = time.time()
        runnable = []
        for i, (chunk, deadline) in enumerate(zip(chunks, deadlines, strict=True)):
            refused = self.refusal(chunk)
            if refused is not None:
                results[i] = refused
            elif deadline < now:
                results[i] = DeadlineExceeded("deadline passed while queued")
            else:
                runnable.append(i)
        if runnable:
            # Off the event loop, so the replica keeps accepting and gathering the next batch.
            loop = asyncio.get_running_loop()
            with tracing.span("forward"):
                outcome = await loop.run_in_executor(self.forward_thread, self.encode_chunks,
                                                     [chunks[i] for i in runnable])
            for i, result in zip(runnable, outcome, strict=True):
                results[i] = result
            if self.start.answered():
                await loop.run_in_executor(None, self._first_answer)
        return results


def build_tower(run: TowerRun, plan: TowerPlan, tower: str) -> tuple[Any, StartMarks]:
    """`tower`'s model ("image" or "text") built in this replica, the start marked phase by phase up to the build:
    its logging, the backend's environment, then torch and the model (a refusal is one line naming the node)."""
    start = StartMarks.at_constructor()
    configure_replica_logging(run.log_level)
    settings = run.settings.model_copy(update={"torch_threads": plan.torch_threads})

    def build() -> Any:
        # Imported here, not at module level: the backend's environment must be set before torch is imported,
        # and the ingress's start stays free of torch.
        from siglip_serve.models.backends import implementation

        if tower == "image":
            leave_out_transformers(settings.model)
        start.imported(settings.backend)
        create = implementation.create_encoder if tower == "image" else implementation.create_text_encoder
        return create(settings)

    built = start_tower(f"{tower} encoder replica", settings, build, run.env_vars, refusal_recorder(tower))
    start.mark(BUILD)
    return built, start


async def start_served(tower: str, run: TowerRun, construct: Callable[[], None]) -> None:
    """`construct()` (a replica's synchronous constructor) once the artifact volume is whole, as the served
    replica's async constructor runs it (serve/towers/replica_start.py says why it waits); a volume emptied
    or refilled while `construct()` ran is waited for again instead of refused."""
    while True:
        await wait_for_artifact(f"{tower} encoder replica", run.settings, refusal_recorder(tower))
        try:
            construct()
            return
        except ReplicaRefused:
            if not volume_unready(run.settings):
                raise


def refusal_recorder(tower: str) -> Callable[[str], None] | None:
    """Where a replica of `tower` that refuses to start leaves its line for /readyz (serve/shared/registry.py);
    None outside a Serve replica (a test building the class)."""
    try:
        app_name = serve.get_replica_context().app_name
    except RayServeException:
        return None
    return lambda message: registry.record_refusal(app_name, tower, message)


def split_rows(embeddings: np.ndarray, sizes: list[int]) -> list[np.ndarray]:
    offsets = np.cumsum([0, *sizes])
    return [embeddings[start:stop] for start, stop in zip(offsets[:-1], offsets[1:], strict=True)]
