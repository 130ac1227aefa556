"""Read a counter from Prometheus text (Ray's metrics export), summed over its series.

The cross-check compares the images the load test counted with the server's own
`ray_siglip_images_embedded_total` over the same window: scraped before and after, each time
summed over every series (one per ingress replica and endpoint), optionally only the series
whose labels match. The text is parsed by prometheus_client's parser. No Locust here: the CLI
runs it outside the Locust process.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable

from prometheus_client.parser import text_string_to_metric_families

from siglip_serve.core.poll import poll
from siglip_serve.measure.load_results import MetricsCheck

IMAGES_METRIC = "ray_siglip_images_embedded_total"


class MetricsError(RuntimeError):
    """The metrics endpoint could not be read, or did not answer Prometheus text."""


def parse_samples(text: str) -> list[tuple[str, dict[str, str], float]]:
    """(name, labels, value) of every sample; MetricsError when the text is not Prometheus text."""
    try:
        return [(sample.name, dict(sample.labels), float(sample.value))
                for family in text_string_to_metric_families(text) for sample in family.samples]
    except ValueError as exc:
        raise MetricsError(f"not Prometheus text: {exc}") from None


def sum_metric(text: str, name: str, match: dict[str, str] | None = None) -> float | None:
    """Sum of every series of `name` whose labels include `match`; None when there is no such series."""
    values = [value for sample_name, labels, value in parse_samples(text)
              if sample_name == name and all(labels.get(k) == v for k, v in (match or {}).items())
              and not math.isnan(value)]
    return sum(values) if values else None


def scrape(url: str, timeout_s: float = 10.0) -> str:
    import httpx

    try:
        response = httpx.get(url, timeout=timeout_s)
        response.raise_for_status()
    except httpx.HTTPError as exc:
        raise MetricsError(f"could not read metrics from {url}: {exc}") from None
    return response.text


def compare(server_images: float, client_images: int, tolerance: float) -> tuple[float, bool]:
    """Relative difference of the two counts (to the larger) and whether it is within tolerance."""
    larger = max(server_images, client_images)
    difference = abs(server_images - client_images) / larger if larger else 0.0
    return difference, difference <= tolerance


def cross_check(url: str, before: float | None, client_images: int, name: str = IMAGES_METRIC,
                match: dict[str, str] | None = None, tolerance: float = 0.05, wait_s: float = 30.0,
                read: Callable[[str], str] = scrape, sleep: Callable[[float], None] = time.sleep) -> MetricsCheck:
    """Scrape after the test until the server's count has caught up, or `wait_s` passes.

    Ray exports a worker's metrics every `metrics_report_interval_ms` (10 s by default), so the
    last images of a run land late. The server answers every image the load test counted (and
    perhaps a few more the client gave up on: the load test waits for its requests in flight at
    the end, `--stop-timeout`, so only those unanswered by then), so its count has caught up once
    it reaches the client's; until then, keep polling. Agreement is judged on the last value read.
    """
    def attempt() -> tuple[float | None, str | None]:
        try:
            return sum_metric(read(url), name, match), None
        except MetricsError as exc:
            return None, str(exc)

    def caught_up(read_back: tuple[float | None, str | None]) -> bool:
        after = read_back[0]
        return after is not None and after - (before or 0.0) >= max(client_images, 1)

    (after, error), _, waited = poll(attempt, caught_up, wait_s, interval_s=1.0, sleep=sleep)
    check = MetricsCheck(url=url, metric=name, labels=match or {}, tolerance=tolerance, server_before=before,
                         server_after=after, client_images=client_images, waited_s=round(waited, 1),
                         server_images=None, difference_ratio=None, agrees=None,
                         note=error or f"no series named {name} at {url}")
    if after is None:
        return check
    server = after - (before or 0.0)
    difference, agrees = compare(server, client_images, tolerance)
    return check.model_copy(update={
        "server_images": server, "difference_ratio": difference, "agrees": agrees,
        "note": None if before is not None else f"{name} had no series before the test: counted from 0"})
