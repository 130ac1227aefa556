"""`summary.json` (siglip_serve.measure.load_results.LoadTestSummary) from the recorder's results, the thresholds that
set the exit code, and a table.

summary.json (every key always present; null where it does not apply):
    images_per_second, requests_per_second, images, requests, failures, fail_ratio, duration_s,
    latency_ms {p50, p95, p99, mean, max}   whole run, every request (failed ones too)
    failure_reasons {reason: count}
    saturation {users, images_per_second, latency_ms, fail_ratio, p99_target_ms} | null
    steps [{users, t_start, t_end, seconds, images, requests, failures, fail_ratio, images_per_second,
            requests_per_second, latency_ms}]   (siglip_serve.measure.results.Step)
    server   what GET /v1/models said: id, embedding_dim, backend, lnc, buckets, replicas, ...
    server_cpu {ms_per_image, ms_per_image_by_kind {proxy, ingress, encoder, ...}, seconds, processes} | null
             (siglip_serve.measure.results.ServerCpuResult, as siglip-serve bench records it per concurrency)
             the whole service process tree's CPU over the run, when the service runs on this machine
    client   the machine that ran Locust
    metrics_check  siglip_serve.measure.results.MetricsCheck (siglip_serve.loadtest.promtext.cross_check) | null
    thresholds {max_fail_ratio, max_p99_ms, breached: [...]}
    exit_code, settings, outputs, notes
    price {usd_per_hour, accelerators, instance, region, date, source} | null  (--price-per-hour, --instance)
    usd_per_million_images   the whole run's, at that price | null; each step and the saturation point
                             carry their own
"""

from __future__ import annotations

from typing import Any

from siglip_serve.loadtest.windows import saturation
from siglip_serve.measure.load_results import LoadTestSummary, MetricsCheck, RunResults, Thresholds
from siglip_serve.measure.prices import Price, dollars, usd_per_million
from siglip_serve.measure.results import ServerCpuResult

EXIT_OK = 0
EXIT_THRESHOLD = 1
EXIT_ERROR = 2


def breached_thresholds(requests: int, failures: int, p99: float | None, max_fail_ratio: float | None,
                        max_p99_ms: float | None) -> list[str]:
    """What the run broke, in words; empty when it passed."""
    breached = []
    if requests == 0:
        breached.append("no requests were made")
    fail_ratio = failures / requests if requests else 1.0
    if max_fail_ratio is not None and fail_ratio > max_fail_ratio:
        breached.append(f"fail ratio {fail_ratio:.4f} > --max-fail-ratio {max_fail_ratio:g}")
    if max_p99_ms is not None and p99 is not None and p99 > max_p99_ms:
        breached.append(f"p99 {p99:g} ms > --max-p99-ms {max_p99_ms:g}")
    return breached


def build_summary(results: RunResults, settings: dict[str, Any], outputs: dict[str, Any],
                  metrics_check: MetricsCheck | None, max_fail_ratio: float | None,
                  max_p99_ms: float | None, p99_target_ms: float, step_max_fail_ratio: float,
                  server_cpu: ServerCpuResult | None = None, price: Price | None = None) -> LoadTestSummary:
    """The summary of the recorder's results.json (loadtest/recorder.py, written inside Locust); with `price`,
    dollars per million images for the run, each step and the saturation point."""
    requests, failures = results.requests, results.failures
    breached = breached_thresholds(requests, failures, results.latency_ms.p99, max_fail_ratio, max_p99_ms)
    steps = [step.model_copy() for step in results.windows]
    if price is not None:
        for step in steps:
            step.usd_per_million_images = usd_per_million(step.images_per_second, price.usd_per_hour)
    return LoadTestSummary(
        images_per_second=results.images_per_second,
        requests_per_second=results.requests_per_second,
        images=results.images,
        requests=requests,
        failures=failures,
        fail_ratio=failures / requests if requests else None,
        duration_s=results.duration_s,
        latency_ms=results.latency_ms,
        failure_reasons=results.failure_reasons,
        saturation=saturation(steps, p99_target_ms, step_max_fail_ratio),
        steps=steps,
        server=results.server,
        server_cpu=server_cpu,
        client=results.client,
        metrics_check=metrics_check,
        thresholds=Thresholds(max_fail_ratio=max_fail_ratio, max_p99_ms=max_p99_ms, breached=breached),
        exit_code=EXIT_THRESHOLD if breached else EXIT_OK,
        settings=settings,
        outputs=outputs,
        notes=list(results.notes),
        price=price,
        usd_per_million_images=usd_per_million(results.images_per_second, price.usd_per_hour) if price else None,
    )


def _fmt(value: Any, spec: str = ".1f") -> str:
    return "-" if value is None else format(value, spec)


def format_summary(summary: LoadTestSummary) -> str:
    lat = summary.latency_ms
    price = summary.price
    lines = [
        f"images/s {_fmt(summary.images_per_second)}   requests {summary.requests}   "
        f"failures {summary.failures}   p50/p95/p99 {_fmt(lat.p50, '.0f')}/{_fmt(lat.p95, '.0f')}/"
        f"{_fmt(lat.p99, '.0f')} ms",
    ]
    if price is not None:
        lines.append(f"{dollars(summary.usd_per_million_images)} per 1M images at {price.label()}")
    if summary.steps:
        lines.append(f"{'users':>6} {'img/s':>9} {'p50 ms':>8} {'p95 ms':>8} {'p99 ms':>8} {'fail':>7}"
                     + (f" {'$/1M img':>9}" if price is not None else ""))
        for step in summary.steps:
            sl = step.latency_ms
            lines.append(f"{step.users:>6} {step.images_per_second:>9.1f} {_fmt(sl.p50, '.0f'):>8} "
                         f"{_fmt(sl.p95, '.0f'):>8} {_fmt(sl.p99, '.0f'):>8} {step.fail_ratio:>7.3f}"
                         + (f" {dollars(step.usd_per_million_images):>9}" if price is not None else ""))
    cpu = summary.server_cpu
    if cpu and cpu.ms_per_image is not None:
        kinds = ", ".join(f"{kind} {ms:.1f}" for kind, ms in cpu.ms_per_image_by_kind.model_dump().items() if ms)
        lines.append(f"server CPU per image: {cpu.ms_per_image:.1f} ms ({kinds})")
    sat = summary.saturation
    if sat:
        lines.append(f"saturation: {sat.images_per_second:.1f} img/s at {sat.users} users "
                     f"(p99 {_fmt(sat.latency_ms.p99, '.0f')} ms <= {sat.p99_target_ms:g} ms)"
                     + (f", {dollars(sat.usd_per_million_images)} per 1M images" if price is not None else ""))
    else:
        lines.append("saturation: no step kept p99 under the target with few enough failures")
    for reason, count in summary.failure_reasons.items():
        lines.append(f"failure: {count} x {reason}")
    check = summary.metrics_check
    if check:
        if check.agrees is None:
            lines.append(f"metrics cross-check: unavailable ({check.note})")
        else:
            lines.append(f"metrics cross-check: server counted {check.server_images:.0f} images, load test "
                         f"{check.client_images} ({check.difference_ratio:.1%} apart, "
                         f"{'within' if check.agrees else 'OUTSIDE'} {check.tolerance:.0%})")
    for item in summary.thresholds.breached:
        lines.append(f"THRESHOLD: {item}")
    return "\n".join(lines)
