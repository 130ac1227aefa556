"""Read a counter from Prometheus text (Ray's metrics export), summed over its series.

The cross-check compares the images the load test counted with the server's own
`ray_siglip_images_embedded_total` over the same window: scraped before and after, each time
summed over every series (one per ingress replica and endpoint), optionally only the series
whose labels match. No Locust here: the CLI runs it outside the Locust process.
"""

from __future__ import annotations

import math
import re
import time
import urllib.request
from collections.abc import Callable
from typing import Any

IMAGES_METRIC = "ray_siglip_images_embedded_total"

_SAMPLE = re.compile(r"^(?P<name>[a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(?P<labels>.*)\})?\s+(?P<value>\S+)(?:\s+\S+)?\s*$")
_LABEL = re.compile(r'\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*=\s*"((?:[^"\\]|\\.)*)"\s*,?')


class MetricsError(RuntimeError):
    """The metrics endpoint could not be read."""


def _unescape(value: str) -> str:
    return value.replace(r"\\", "\x00").replace(r"\"", '"').replace(r"\n", "\n").replace("\x00", "\\")


def parse_samples(text: str) -> list[tuple[str, dict[str, str], float]]:
    """(name, labels, value) of every sample line; comments and malformed lines are skipped."""
    samples = []
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        match = _SAMPLE.match(line)
        if not match:
            continue
        labels = {k: _unescape(v) for k, v in _LABEL.findall(match.group("labels") or "")}
        try:
            value = float(match.group("value"))
        except ValueError:
            continue
        samples.append((match.group("name"), labels, value))
    return samples


def sum_metric(text: str, name: str, match: dict[str, str] | None = None) -> float | None:
    """Sum of every series of `name` whose labels include `match`; None when there is no such series."""
    values = [value for sample_name, labels, value in parse_samples(text)
              if sample_name == name and all(labels.get(k) == v for k, v in (match or {}).items())
              and not math.isnan(value)]
    return sum(values) if values else None


def scrape(url: str, timeout_s: float = 10.0) -> str:
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as response:  # noqa: S310 - an operator-given URL
            return response.read().decode("utf-8", errors="replace")
    except OSError as exc:
        raise MetricsError(f"could not read metrics from {url}: {exc}") from None


def compare(server_images: float, client_images: int, tolerance: float) -> tuple[float, bool]:
    """Relative difference of the two counts (to the larger) and whether it is within tolerance."""
    larger = max(server_images, client_images)
    difference = abs(server_images - client_images) / larger if larger else 0.0
    return difference, difference <= tolerance


def cross_check(url: str, before: float | None, client_images: int, name: str = IMAGES_METRIC,
                match: dict[str, str] | None = None, tolerance: float = 0.05, wait_s: float = 30.0,
                read: Callable[[str], str] = scrape, sleep: Callable[[float], None] = time.sleep) -> dict[str, Any]:
    """Scrape after the test until the server's count has caught up, or `wait_s` passes.

    Ray exports a worker's metrics every `metrics_report_interval_ms` (10 s by default), so the
    last images of a run land late. The server answers every image the load test counted (and
    perhaps a few more the client gave up on), so its count has caught up once it reaches the
    client's; until then, keep polling. Agreement is judged on the last value read.
    """
    began = time.monotonic()
    after: float | None = None
    error: str | None = None
    while True:
        try:
            after = sum_metric(read(url), name, match)
            error = None
        except MetricsError as exc:
            error = str(exc)
        caught_up = after is not None and after - (before or 0.0) >= max(client_images, 1)
        if caught_up or time.monotonic() - began >= wait_s:
            break
        sleep(1.0)
    waited = round(time.monotonic() - began, 1)
    result: dict[str, Any] = {"url": url, "metric": name, "labels": match or {}, "tolerance": tolerance,
                              "server_before": before, "server_after": after, "client_images": client_images,
                              "waited_s": waited}
    if after is None:
        result.update(server_images=None, difference_ratio=None, agrees=None,
                      note=error or f"no series named {name} at {url}")
        return result
    server = after - (before or 0.0)
    difference, agrees = compare(server, client_images, tolerance)
    result.update(server_images=server, difference_ratio=difference, agrees=agrees,
                  note=None if before is not None else f"{name} had no series before the test: counted from 0")
    return result
