"""Every measurement's result as a typed model: the producers write these, the report reads them.

One key name per quantity, everywhere: `images_per_second` for a throughput, `latency_mean_ms`,
`latency_p50_ms`, `latency_p99_ms` for one encode call's latency, `cores` for logical cores,
`instance_images_per_second` for all cores at once. The files are `model_dump_json` of these
models and are read back with `model_validate_json`; a file in another shape is an error that
names the file and the field, not a silently missing row.

    BenchResult         siglip-serve bench --json FILE        (measure/bench.py, measure/served.py)
    MulticoreResult     python -m siglip_serve.measure.multicore --json    (measure/multicore.py)
    RunResults          Locust's recorder -> OUT/results.json  (loadtest/recorder.py)
    LoadTestSummary     siglip-serve loadtest -> OUT/summary.json (loadtest/cli.py, loadtest/summary.py)
    InstanceReport      siglip-serve report -> OUT/report.json (measure/report.py)
    BulkResult          siglip-serve embed -> OUT/summary.json  (bulk/job.py)
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from siglip_serve.core.errors import UserError
from siglip_serve.measure.seed import SeedRow

Model = TypeVar("Model", bound="Result")


class ResultFileError(UserError, ValueError):
    """A recorded result file is not in the shape its producer writes."""


class Result(BaseModel):
    # An unknown key is a file from another producer (or an old one): said, not silently dropped.
    model_config = ConfigDict(extra="forbid")

    @classmethod
    def read(cls: type[Model], path: str | Path) -> Model:
        try:
            return cls.model_validate_json(Path(path).read_text())
        except ValidationError as exc:
            raise ResultFileError(f"{path} is not a {cls.__name__} ({exc.error_count()} problem(s)): "
                                  f"{exc.errors()[0]['loc']}: {exc.errors()[0]['msg']}") from None

    def write(self, path: str | Path) -> None:
        Path(path).write_text(self.model_dump_json(indent=2, by_alias=True, exclude=self._absent()) + "\n")

    def _absent(self) -> set[str]:
        """Top-level parts that were not measured (left out of the file rather than written as null)."""
        return set()


class Commented(Result):
    """A result that may say what it is (test fixtures: "synthetic, not a measurement")."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)
    comment: str | None = Field(default=None, alias="_comment")

    def _absent(self) -> set[str]:
        return {"comment"} if self.comment is None else set()


# -- shared pieces ---------------------------------------------------------------------------

class Machine(Result):
    host: str
    cpu: str | None = None
    platform: str | None = None
    cpus: int | None = None
    locust: str | None = None  # the load-test client's Locust version


class CpuMsByKind(Result):
    """Server CPU-ms per image by process kind (server_cpu.KINDS); None where no image was served."""

    proxy: float | None = None
    ingress: float | None = None
    encoder: float | None = None
    serve_controller: float | None = None
    ray_daemons: float | None = None
    other: float | None = None


class ServerCpuResult(Result):
    """The service's whole process tree's CPU over a measured window, per image served."""

    ms_per_image: float | None
    ms_per_image_by_kind: CpuMsByKind
    seconds: float
    processes: int


# -- siglip-serve bench ----------------------------------------------------------------------

class EncoderRow(Result):
    """Bare `Encoder.encode` on one bucket: `iterations` timed calls after `warmup`."""

    bucket: int
    images_per_second: float
    latency_mean_ms: float
    latency_p50_ms: float
    latency_p99_ms: float
    warmup: int
    iterations: int


class PreprocessResult(Result):
    images: int
    images_per_second: float
    image_size_in: list[int]
    image_size_out: list[int]
    threads: int
    fast_jpeg_decode: bool


class ClientCpu(Result):
    """The load client's own CPU over one served level: the bench process and its client processes
    (measure/client_pool.py). A busiest process near a whole core means the client set the level's rate."""

    client_processes: int
    # Those measured: the client processes and the bench process (one and the same with one client process).
    processes: int
    seconds: float
    busiest_process_core_fraction: float


class ServedRow(Result):
    """The served HTTP API at one client concurrency (closed loop)."""

    concurrency: int
    requests: int
    failures: int
    images_per_request: int
    images_per_second: float
    latency_p50_ms: float | None
    latency_p99_ms: float | None
    server_cpu: ServerCpuResult | None = None
    client_cpu: ClientCpu | None = None


class HostCeiling(Result):
    """The served path with the model taken out (backend zeros-no-model, same replicas, same client):
    what this host's serving side alone carries. Per core = 1000 / server CPU-ms per image."""

    concurrency: int
    replicas: int | None
    ingress_replicas: int | None
    images_per_second: float
    images_per_second_per_core: float | None
    server_cpu: ServerCpuResult | None
    client_cpu: ClientCpu | None = None


class ProfileFile(Result):
    """One process's flame graph from `bench --profile` (measure/profile.py), or why there is none."""

    kind: str
    pid: int
    path: str | None
    error: str | None = None


class Bound(Result):
    """Which side limits a deployment: the host's ceiling against the device's own rate (docs/capacity.md)."""

    verdict: Literal["host-bound", "device-bound", "client-bound"]
    host_ceiling_images_per_second: float
    device_images_per_second: float
    served_images_per_second: float | None
    # served / the lower of the two: how close the service came to what it could do here.
    served_over_limit: float | None
    explanation: str
    # The busiest client process's share of a core at the top level (served's or the ceiling's, the higher).
    client_busiest_core_fraction: float | None = None


# -- multi-core (seed 000's method) ----------------------------------------------------------

class MulticoreWorker(Result):
    core: str | None
    pid: int
    images: int
    seconds: float
    images_per_second: float
    latency_mean_ms: float
    latency_p50_ms: float
    latency_p99_ms: float
    start: float
    end: float
    lnc_env: str | None


class MulticoreResult(Commented):
    backend: str
    model: str
    lnc: int | None
    auto_cast: str | None
    bucket: int
    cores: int
    warmup: int
    iterations: int
    workers: list[MulticoreWorker]
    per_core_images_per_second: float
    latency_mean_ms: float
    instance_images_per_second: float
    wall_images_per_second: float
    method: str
    machine: Machine
    seed_reference: list[SeedRow] = []


class BenchResult(Commented):
    machine: Machine
    model: str
    backend: str
    weights: str
    buckets: list[int]
    created_at: str
    encoder: list[EncoderRow] | None = None
    preprocess: PreprocessResult | None = None
    served: list[ServedRow] | None = None
    # The HTTP front end of the served part: "haproxy" or "python" (launcher/haproxy_front.py).
    front_end: str | None = None
    # The served part's encoder replicas and the torch threads each ran (cpu: serve/plan/cpu_plan.py).
    replicas: int | None = None
    torch_threads: int | None = None
    multicore: MulticoreResult | None = None
    served_over_bare: float | None = None
    # The served part's request body: raw bytes, multipart or JSON base64 (measure/corpus.py).
    endpoint: str | None = None
    ingress_replicas: int | None = None
    host_ceiling: HostCeiling | None = None
    bound: Bound | None = None
    profiles: list[ProfileFile] | None = None

    def _absent(self) -> set[str]:
        parts = ("encoder", "preprocess", "served", "front_end", "replicas", "torch_threads", "multicore",
                 "served_over_bare", "endpoint", "ingress_replicas", "host_ceiling", "bound", "profiles")
        return super()._absent() | {part for part in parts if getattr(self, part) is None}


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


class OperatingPoint(Result):
    """A step judged against the p99 target: the saturation point, or the best step over it."""

    users: int | None
    images_per_second: float
    latency_ms: LatencyMs
    fail_ratio: float | None
    p99_target_ms: float | None

    @classmethod
    def of(cls, step: Step, p99_target_ms: float | None) -> OperatingPoint:
        return cls(users=step.users, images_per_second=step.images_per_second,
                   latency_ms=step.latency_ms.model_copy(), fail_ratio=step.fail_ratio, p99_target_ms=p99_target_ms)


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
