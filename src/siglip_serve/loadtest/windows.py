"""Measurement windows from a timeline of cumulative snapshots, and the saturation point.

The recorder inside Locust snapshots the cumulative counters (and the response-time histogram,
Locust's {rounded ms: count}) about once a second. A window is a stretch at a constant user
count while Locust is running (not spawning); its first `settle_fraction` is dropped so queues
can fill after a step up. Everything here is plain data, so it is tested without Locust (whose
helpers cannot be imported outside its process: `import locust.<anything>` monkey-patches gevent).
"""

from __future__ import annotations

from typing import Any

from siglip_serve.measure.load_results import LatencyMs, OperatingPoint, Step

SETTLE_FRACTION = 0.2

Snapshot = dict[str, Any]  # {"t", "users", "state", "requests", "failures", "hist": {ms: count}}


def percentile_ms(hist: dict[int, int] | dict[str, int], q: float) -> float | None:
    """Nearest-rank percentile (q in 0..100) of a {ms: count} histogram; None when it is empty."""
    items = sorted((float(k), int(v)) for k, v in hist.items() if int(v) > 0)
    total = sum(count for _, count in items)
    if total == 0:
        return None
    rank = max(1, -(-q * total // 100))  # ceil(q/100 * total), at least the first sample
    seen = 0
    for value, count in items:
        seen += count
        if seen >= rank:
            return value
    return items[-1][0]


def latency_summary(hist: dict[int, int] | dict[str, int]) -> LatencyMs:
    return LatencyMs(p50=percentile_ms(hist, 50), p95=percentile_ms(hist, 95), p99=percentile_ms(hist, 99))


def hist_diff(later: dict[Any, int], earlier: dict[Any, int]) -> dict[int, int]:
    keys = {int(k) for k in later} | {int(k) for k in earlier}
    out = {}
    for key in keys:
        count = int(later.get(key, later.get(str(key), 0))) - int(earlier.get(key, earlier.get(str(key), 0)))
        if count > 0:
            out[key] = count
    return out


def _window(first: Snapshot, last: Snapshot, images_per_request: int) -> Step:
    seconds = last["t"] - first["t"]
    requests = last["requests"] - first["requests"]
    failures = last["failures"] - first["failures"]
    images = (requests - failures) * images_per_request
    return Step(
        users=first["users"],
        t_start=round(first["t"], 3),
        t_end=round(last["t"], 3),
        seconds=round(seconds, 3),
        requests=requests,
        failures=failures,
        images=images,
        fail_ratio=failures / requests if requests else 0.0,
        images_per_second=images / seconds if seconds > 0 else 0.0,
        requests_per_second=requests / seconds if seconds > 0 else 0.0,
        latency_ms=latency_summary(hist_diff(last["hist"], first["hist"])),
    )


def windows(timeline: list[Snapshot], images_per_request: int,
            settle_fraction: float = SETTLE_FRACTION) -> list[Step]:
    """One window per run of 'running' snapshots at a constant user count (at least 2 snapshots)."""
    groups: list[list[Snapshot]] = []
    for snap in timeline:
        if snap["state"] != "running" or snap["users"] < 1:
            groups.append([])
            continue
        if groups and groups[-1] and groups[-1][-1]["users"] == snap["users"]:
            groups[-1].append(snap)
        else:
            groups.append([snap])
    out = []
    for group in groups:
        if len(group) < 2:
            continue
        settle_until = group[0]["t"] + settle_fraction * (group[-1]["t"] - group[0]["t"])
        first = next((s for s in group[:-1] if s["t"] >= settle_until), group[0])
        out.append(_window(first, group[-1], images_per_request))
    return out


def saturation(steps: list[Step], p99_target_ms: float, step_max_fail_ratio: float) -> OperatingPoint | None:
    """The window with the most img/s whose p99 stays at or under the target and whose failures
    stay under step_max_fail_ratio (a fast stream of 503s is not throughput)."""
    healthy = [w for w in steps
               if w.latency_ms.p99 is not None and w.latency_ms.p99 <= p99_target_ms
               and w.fail_ratio <= step_max_fail_ratio and w.images > 0]
    if not healthy:
        return None
    return OperatingPoint.of(max(healthy, key=lambda w: w.images_per_second), p99_target_ms)
