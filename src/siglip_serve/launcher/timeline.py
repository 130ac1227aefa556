"""`siglip-serve run --timings`: where a start's seconds go, phase by phase, without a profiler.

The service marks its own phases as they end (the relay and the interpreter, the checks before Ray, `ray.init`,
`serve.start`, the deployment until every replica is warm, in two waves where the start has them); each tower
replica marks its own (serve/towers/start_marks.py) and publishes them in the registry record that also makes it
count as warm. Once every replica is warm, the timeline prints both: the service's phases with their seconds and
when each ended, then one line per replica with its phases and when it was warm, all from the command's start.

The command's start is the creation of its first process (psutil's `create_time`, the wall clock): the relay
that runs the service in its own session (launcher/session.py), else the service itself. A replica on another
host is lined up by that host's clock.
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from typing import Any

import psutil

# The service's phases, in the order they end.
RELAY = "relay: Python, imports, the service's process"
INTERPRETER = "Python and imports"
ARGUMENTS = "arguments, port checks"
CHECKS = "config, backend, weights and tokenizer checks"
RAY_IMPORTS = "importing Ray and the application, the replica count"
RAY_INIT = "ray.init"
PLAN = "replica plan, building the application"
SERVE_START = "serve.start"
DEPLOY = "deploy until every replica is warm"
# A start in two waves (serve/plan/start_order.py) marks these two in DEPLOY's place.
FIRST_WAVE = "deploy until the first wave is warm (ready)"
SECOND_WAVE = "the other replicas, until every replica is warm"


class Timeline:
    """The service's phases so far, each with its seconds and when it ended, from the command's start."""

    def __init__(self, origin: float) -> None:
        self.origin = origin
        self._last = origin
        self.phases: list[tuple[str, float, float]] = []  # (phase, seconds, ended: seconds from the origin)

    @classmethod
    def of_command(cls, relayed: bool) -> Timeline:
        """From this process's creation or, `relayed` (the service the relay started), its parent's: the relay's
        seconds are then the first phase, and the interpreter's own the second (both end before any mark)."""
        here = psutil.Process()
        started = here.create_time()
        if not relayed:
            return cls(started)
        try:
            timeline = cls(psutil.Process(os.getppid()).create_time())
        except psutil.Error:  # the relay is gone already: the service stops too (launcher/session.py)
            return cls(started)
        timeline.mark(RELAY, at=started)
        return timeline

    def mark(self, phase: str, at: float | None = None) -> None:
        """`phase` ended now (or at `at`, the wall clock): it took the time since the last mark."""
        now = time.time() if at is None else at
        self.phases.append((phase, max(0.0, now - self._last), now - self.origin))
        self._last = max(self._last, now)

    def elapsed(self) -> float:
        return time.time() - self.origin

    def report(self, replicas: Sequence[dict[str, Any]]) -> str:
        return format_timeline(self.phases, self.origin, replicas)


def format_timeline(phases: Sequence[tuple[str, float, float]], origin: float,
                    replicas: Sequence[dict[str, Any]]) -> str:
    """The service's phases as a table (phase, seconds, ended at), then one line per replica record that holds
    its start's marks (serve/towers/start_marks.py), sorted by when each was warm."""
    width = max([len(phase) for phase, _, _ in phases] + [5])
    lines = ["start timeline (seconds; 'at': from the command's start):",
             f"  {'phase':<{width}}  {'took':>6}  {'at':>6}"]
    lines += [f"  {phase:<{width}}  {seconds:6.1f}  {ended:6.1f}" for phase, seconds, ended in phases]
    timed = [record for record in replicas if isinstance(record.get("start"), dict)]
    for record in sorted(timed, key=lambda r: float(r["start"].get("ready_at", 0.0))):
        lines.append("  " + replica_line(record, origin))
    untimed = len(replicas) - len(timed)
    if untimed:
        lines.append(f"  ({untimed} replica(s) published no start marks)")
    return "\n".join(lines)


def replica_line(record: dict[str, Any], origin: float) -> str:
    """'image replica 3f2a (pid 123): process at +9.1 s; worker start 2.0, imports 1.7, ...; warm at +16.4 s'."""
    start = record["start"]
    phases = ", ".join(f"{phase} {float(seconds):.2f}" for phase, seconds in start.get("phases", []))
    began = float(start.get("process_started", origin)) - origin
    warm = float(start.get("ready_at", origin)) - origin
    name = f"{record.get('tower', 'image')} replica {str(record.get('replica_id', '?'))[:8]}"
    return f"{name} (pid {record.get('pid', '?')}): process at +{began:.1f} s; {phases}; warm at +{warm:.1f} s"
