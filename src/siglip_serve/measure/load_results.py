"""The results of load tests, of the instance report and of bulk runs, as typed models (measure/results.py holds
the base, the shared pieces and the benchmarks' models this module builds on).

    RunResults          Locust's recorder -> OUT/results.json  (loadtest/recorder.py)
    LoadTestSummary     siglip-serve loadtest -> OUT/summary.json (loadtest/cli.py, loadtest/summary.py)
    InstanceReport      siglip-serve report -> OUT/report.json (measure/report.py)
    BulkResult          siglip-serve embed -> OUT/summary.json  (bulk/job.py)
"""

from __future__ import annotations

from typing import Any, Literal

from siglip_serve.measure.prices import Price
from siglip_serve.measure.results import (
    Bound,
    Commented,
    Machine,
    MulticoreResult,
    Result,
    ServerCpuResult,
)
from siglip_serve.measure.seed import SeedRow

# -- siglip-serve loadtest -------------------------------------------------------------------

class LatencyMs(Result):
    """Request latency percentiles (Locust's response-time histogram); mean and max for a whole run."""

    p50: float | None = None
    p95: float | None = None
    p99: float | None = None
    mean: float | None = None
    max: float | None = None


class Step(Result):
    """One window at a constant user count (loadtest/windows.py)."""

    users: int
    t_start: float
    t_end: float
    seconds: float
    requests: int
    failures: int
    images: int
    fail_ratio: float
    images_per_second: float
    requests_per_second: float
    latency_ms: LatencyMs
    # The instance's hourly price over an hour of this step's images (loadtest --price-per-hour); None unpriced.
    usd_per_million_images: float | None = None


class OperatingPoint(Result):
    """A step judged against the p99 target: the saturation point, or the best step over it."""

    users: int | None
    images_per_second: float
    latency_ms: LatencyMs
    fail_ratio: float | None
    p99_target_ms: float | None
    usd_per_million_images: float | None = None

    @classmethod
    def of(cls, step: Step, p99_target_ms: float | None) -> OperatingPoint:
        return cls(users=step.users, images_per_second=step.images_per_second,
                   latency_ms=step.latency_ms.model_copy(), fail_ratio=step.fail_ratio, p99_target_ms=p99_target_ms,
                   usd_per_million_images=step.usd_per_million_images)


class ServerInfo(Result):
    """What GET /v1/models said about the served model."""

    id: str | None = None
    embedding_dim: int | None = None
    image_size: list[int] | None = None
    backend: str | None = None
    weights: str | None = None
    lnc: int | None = None
    buckets: list[int] | None = None
    replicas: int | None = None


class MetricsCheck(Result):
    """The load test's image count against the server's own counter over the same window."""

    url: str
    metric: str
    labels: dict[str, str]
    tolerance: float
    server_before: float | None
    server_after: float | None
    client_images: int
    waited_s: float
    server_images: float | None
    difference_ratio: float | None
    agrees: bool | None
    note: str | None


class Thresholds(Result):
    max_fail_ratio: float | None
    max_p99_ms: float | None
    breached: list[str]


class RunResults(Result):
    """What the recorder inside Locust hands the CLI (OUT/results.json): the whole run, its windows
    and the per-second timeline."""

    started_at: float | None
    request_name: str
    images_per_request: int
    requests: int
    failures: int
    images: int
    duration_s: float
    images_per_second: float
    requests_per_second: float
    latency_ms: LatencyMs
    failure_reasons: dict[str, int]
    windows: list[Step]
    # {t, users, state, requests, failures} about once a second
    timeline: list[dict[str, Any]]
    server: ServerInfo | None
    client: Machine
    notes: list[str]


class LoadTestSummary(Commented):
    images_per_second: float
    requests_per_second: float
    images: int
    requests: int
    failures: int
    fail_ratio: float | None
    duration_s: float | None
    latency_ms: LatencyMs
    failure_reasons: dict[str, int]
    saturation: OperatingPoint | None
    steps: list[Step]
    server: ServerInfo | None
    server_cpu: ServerCpuResult | None = None
    client: Machine | None
    metrics_check: MetricsCheck | None
    thresholds: Thresholds
    exit_code: int
    # The command line as run (siglip-serve loadtest's options, the API key as a yes/no).
    settings: dict[str, Any]
    outputs: dict[str, Any]
    notes: list[str]
    # --price-per-hour or --instance (measure/prices.py), and the whole run's dollars per million images.
    price: Price | None = None
    usd_per_million_images: float | None = None


# -- siglip-serve report -------------------------------------------------------------------

class SingleCore(Result):
    """(a) from a BenchResult: the bare encoder per bucket; batch 1 is the seed's per-core figure."""

    images_per_second: dict[int, float]
    latency_mean_ms: dict[int, float]
    batch1_images_per_second: float | None
    batch1_latency_mean_ms: float | None
    best_bucket: int
    best_images_per_second: float


class ReportContext(Result):
    machine: str
    backend: str
    model: str
    lnc: int | None
    buckets: list[int] | str
    replicas: int | None


class ReportRow(Result):
    source: str
    what: str
    lnc: int | None
    cores: int | None
    per_core: float | None
    instance: float | None
    latency_ms: float | None


class InstanceReport(Result):
    context: ReportContext
    rows: list[ReportRow]
    serving_efficiency: float | None
    single_core: SingleCore | None
    multi_core: MulticoreResult | None
    served: LoadTestSummary | None
    # The served figure when no step met the p99 target: measured, marked, not a saturation point.
    over_target: OperatingPoint | None
    seed_reference: dict[int, SeedRow]
    figures: dict[str, str | None]
    inputs: dict[str, str | None]
    missing: list[str]
    # Host- or device-bound, when the bench JSON holds a host ceiling (siglip-serve bench).
    bound: Bound | None = None


# -- siglip-serve embed ----------------------------------------------------------------------

class SteadyState(Result):
    """A bulk run between 20% and 90% of its items (bulk/job.py STEADY_FROM, STEADY_TO): start-up (Ray,
    model load, warm-up) and the draining tail left out, the figure to set beside a served run's."""

    items: int
    seconds: float
    items_per_second: float
    cpu_ms_per_item: float


class BulkResult(Result):
    """One bulk run: what it found done, what it wrote, and its throughput and host CPU per item.

    `seconds` and `cpu_ms_per_item` cover the whole run from Ray's start (model load and warm-up
    included) to the last shard; `cpu_ms_per_item` is this process's tree (the driver and, with a
    local Ray, every Ray process) per item embedded or refused. Items are images or texts (`modality`).
    """

    machine: Machine
    created_at: str
    source: str
    output: str
    modality: Literal["image", "text"]
    model: str
    backend: str
    weights: str
    preprocessing: str
    items: int
    shards: int
    shards_done_before: int
    shards_written: int
    embedded: int  # this run
    errors: int  # this run
    errors_in_output: int  # every shard's errors table, earlier runs' included
    encoders: int
    decode_workers: int
    seconds: float
    items_per_second: float | None
    cpu_ms_per_item: float | None
    wall_seconds: float
    steady: SteadyState | None = None
