"""Inside Locust's master (or its only process): snapshot the stats, print progress, save results.

Imported only by the locustfile and the step shape, after Locust (gevent must patch first).
In a distributed run (--processes) the master's stats are the workers' reports merged, which
arrive every few seconds; windows of 10 s and more average that out.
"""

from __future__ import annotations

import csv
import logging
import os
import platform
import time
from pathlib import Path
from typing import Any

import gevent

from siglip_serve.loadtest import windows as win
from siglip_serve.loadtest.windows import Snapshot
from siglip_serve.measure.load_results import LatencyMs, RunResults, ServerInfo, Step
from siglip_serve.measure.results import Machine

log = logging.getLogger("siglip_loadtest")


class Recorder:
    def __init__(self, environment: Any, request_name: str, method: str, images_per_request: int,
                 interval_s: float = 1.0, progress_every_s: float = 5.0) -> None:
        self.environment = environment
        self.request_name = request_name
        self.method = method
        self.images_per_request = images_per_request
        self.interval_s = interval_s
        self.progress_every_s = progress_every_s
        self.timeline: list[Snapshot] = []
        self.closed_windows: list[Step] = []
        self.model: dict[str, Any] | None = None
        self.started: float | None = None
        self.started_wall: float | None = None
        self.notes: list[str] = []
        self._loop: gevent.Greenlet | None = None

    # -- snapshots -------------------------------------------------------------------------

    def _entry(self) -> Any:
        return self.environment.runner.stats.get(self.request_name, self.method)

    def snapshot(self) -> Snapshot:
        runner = self.environment.runner
        entry = self._entry()
        snap = {
            "t": time.monotonic() - (self.started or time.monotonic()),
            "users": int(runner.user_count),
            "state": str(runner.state),
            "requests": int(entry.num_requests),
            "failures": int(entry.num_failures),
            "hist": dict(entry.response_times),
        }
        self.timeline.append(snap)
        return snap

    def start(self) -> None:
        self.started = time.monotonic()
        self.started_wall = time.time()
        self.timeline.clear()
        self.closed_windows.clear()
        self._loop = gevent.spawn(self._run)

    def stop(self) -> None:
        if self._loop is not None:
            self.snapshot()
            self._loop.kill(block=False)
            self._loop = None

    def _run(self) -> None:
        last_progress = self.snapshot()
        while True:
            gevent.sleep(self.interval_s)
            snap = self.snapshot()
            if snap["t"] - last_progress["t"] >= self.progress_every_s:
                self._progress(last_progress, snap)
                last_progress = snap

    def _progress(self, before: Snapshot, now: Snapshot) -> None:
        seconds = now["t"] - before["t"]
        requests = now["requests"] - before["requests"]
        failures = now["failures"] - before["failures"]
        images = (requests - failures) * self.images_per_request
        p99 = win.percentile_ms(win.hist_diff(now["hist"], before["hist"]), 99)
        log.info("t=%5.0fs users=%3d  %7.1f img/s  p99=%s ms  failures=%d (total %d of %d requests)",
                 now["t"], now["users"], images / seconds if seconds else 0.0,
                 f"{p99:.0f}" if p99 is not None else "-", failures, now["failures"], now["requests"])

    def windows(self) -> list[Step]:
        """Every step's window. A step closed by the step shape keeps the window it was judged on
        (and printed), so the live step line and summary.json give the same img/s."""
        closed = {w.users for w in self.closed_windows}
        later = [w for w in win.windows(self.timeline, self.images_per_request) if w.users not in closed]
        return sorted(self.closed_windows + later, key=lambda w: w.t_start)

    def close_window(self, users: int) -> Step | None:
        """The window of the step at `users` as of now, frozen: later snapshots no longer change it."""
        self.snapshot()
        mine = [w for w in win.windows(self.timeline, self.images_per_request) if w.users == users]
        if not mine:
            return None
        self.closed_windows = [w for w in self.closed_windows if w.users != users] + [mine[-1]]
        return mine[-1]

    # -- results ---------------------------------------------------------------------------

    def results(self) -> RunResults:
        stats = self.environment.runner.stats
        entry = self._entry()
        # Locust's own req/s divides by the same span, so img/s here and its report agree.
        duration = max(stats.last_request_timestamp - stats.start_time, 0.0) if entry.num_requests else 0.0
        images = (entry.num_requests - entry.num_failures) * self.images_per_request
        reasons: dict[str, int] = {}
        for error in stats.errors.values():
            reason = _plain_reason(str(error.error))
            reasons[reason] = reasons.get(reason, 0) + int(error.occurrences)
        from locust import __version__ as locust_version

        return RunResults(
            started_at=self.started_wall,
            request_name=self.request_name,
            images_per_request=self.images_per_request,
            requests=int(entry.num_requests),
            failures=int(entry.num_failures),
            images=images,
            duration_s=duration,
            images_per_second=images / duration if duration > 0 else 0.0,
            requests_per_second=entry.num_requests / duration if duration > 0 else 0.0,
            latency_ms=self._latency(entry),
            failure_reasons=reasons,
            windows=self.windows(),
            timeline=[{k: v for k, v in s.items() if k != "hist"} for s in self.timeline],
            server=ServerInfo.model_validate(self.model) if self.model else None,
            client=Machine(host=platform.node(), platform=platform.platform(), cpus=os.cpu_count(),
                           locust=locust_version),
            notes=self.notes,
        )

    @staticmethod
    def _latency(entry: Any) -> LatencyMs:
        """The whole run's figures are Locust's own (its percentile rule), as its CSV and HTML show them."""
        if not entry.num_requests:
            return LatencyMs()
        p50, p95, p99 = (float(entry.get_response_time_percentile(q)) for q in (0.50, 0.95, 0.99))
        return LatencyMs(p50=p50, p95=p95, p99=p99, mean=entry.avg_response_time, max=entry.max_response_time)

    def write(self, path: str | Path) -> None:
        out = Path(path)
        out.parent.mkdir(parents=True, exist_ok=True)
        self.results().write(out)
        log.info("results written to %s", out)


def rewrite_final_csv(environment: Any, prefix: str) -> None:
    """Locust rewrites its CSVs once a second and not at exit, so they can miss the last second;
    write the final numbers so the CSV, the HTML and summary.json agree."""
    from locust import stats

    writer = stats.StatsCSV(environment, stats.PERCENTILES_TO_REPORT)
    for suffix, write in (("stats", writer.requests_csv), ("failures", writer.failures_csv),
                          ("exceptions", writer.exceptions_csv)):
        with open(f"{prefix}_{suffix}.csv", "w", newline="") as handle:
            write(csv.writer(handle))


def _plain_reason(error: str) -> str:
    """CatchResponseError('HTTP 400 invalid_image') -> HTTP 400 invalid_image."""
    for prefix in ("CatchResponseError(", "ResponseError("):
        if error.startswith(prefix) and error.endswith(")"):
            inner = error[len(prefix):-1]
            if len(inner) >= 2 and inner[0] == inner[-1] and inner[0] in "'\"":
                return inner[1:-1]
            return inner
    return error
