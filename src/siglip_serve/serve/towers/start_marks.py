"""A replica's start, phase by phase: seconds from its process's creation to each mark.

A tower replica (serve/towers/tower_replica.py) marks the phases of its start (the worker's own start up to the
constructor, its imports, the model's build or artifact load, each bucket's warm-up, its registration) and
publishes them in the record it writes to the registry once warm (serve/shared/registry.py), the same record the
ingress counts for readiness; `siglip-serve run --timings` reads them back (launcher/timeline.py).

Times are the wall clock (`time.time()`): the process's creation, which the kernel records, is one too
(psutil's `create_time`), and the service lines the replicas' marks up with its own start by it.
"""

from __future__ import annotations

import time
from typing import Any

import psutil

# The record's key (serve/towers/tower_replica.py `publish`).
START_KEY = "start"
# The phases every tower replica marks, in order (warm-up: one phase per bucket, WARMUP + the bucket).
WORKER = "worker start"  # Ray's worker process up to the replica's constructor: Ray, Serve, our modules
IMPORTS = "imports"  # torch and the backend's module
BUILD = "model build"  # open_clip, the weights or the compiled artifact, onto the device
WARMUP = "warm-up "
REGISTRATION = "registration"  # its record, up to the registry's write


class StartMarks:
    """The phases of this process's start so far: each phase's seconds since the mark before it."""

    def __init__(self, process_started: float | None = None) -> None:
        self.process_started = psutil.Process().create_time() if process_started is None else process_started
        self._last = self.process_started
        self.phases: list[tuple[str, float]] = []
        self.first_answer_at: float | None = None

    @classmethod
    def at_constructor(cls) -> StartMarks:
        """Marks whose first phase, the worker's own start, ends now: a replica's constructor calls this first."""
        marks = cls()
        marks.mark(WORKER)
        return marks

    def imported(self, backend: str) -> None:
        """Import `backend`'s module (torch with it), marked as the imports phase; the build then reuses it."""
        from siglip_serve.models.backends.implementation import implementation

        implementation(backend)
        self.mark(IMPORTS)

    def warmed(self, bucket: int) -> None:
        """`bucket` is warm (the tower's warmup calls this after each)."""
        self.mark(f"{WARMUP}{bucket}")

    def mark(self, phase: str) -> None:
        """`phase` ended now: it took the time since the last mark (or since the process started)."""
        now = time.time()
        self.phases.append((phase, max(0.0, now - self._last)))
        self._last = now

    def answered(self) -> bool:
        """A batch of this replica was answered now: True the first time (the record then gains
        `first_answer_at`), False after. A replica added by autoscaling is worth its start only from here."""
        if self.first_answer_at is not None:
            return False
        self.first_answer_at = time.time()
        return True

    def record(self) -> dict[str, Any]:
        """What the replica publishes: when its process started, each phase's seconds, in order, when it was
        warm and, once it has answered, when it first did."""
        record: dict[str, Any] = {"process_started": round(self.process_started, 3),
                                  "phases": [[phase, round(seconds, 3)] for phase, seconds in self.phases],
                                  "ready_at": round(self._last, 3)}
        if self.first_answer_at is not None:
            record["first_answer_at"] = round(self.first_answer_at, 3)
        return record
