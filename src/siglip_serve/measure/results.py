"""Every measurement's result as a typed model: the producers write these, the report reads them.

One key name per quantity, everywhere: `images_per_second` for a throughput, `latency_mean_ms`,
`latency_p50_ms`, `latency_p99_ms` for one encode call's latency, `cores` for logical cores,
`instance_images_per_second` for all cores at once. The files are `model_dump_json` of these
models and are read back with `model_validate_json`; a file in another shape is an error that
names the file and the field, not a silently missing row.

    BenchResult         siglip-serve bench --json FILE        (measure/bench.py, measure/served.py)
    MulticoreResult     python -m siglip_serve.measure.multicore --json    (measure/multicore.py)

The load tests', the report's and bulk runs' models are in measure/load_results.py.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from siglip_serve.core.errors import UserError
from siglip_serve.measure.prices import BarePrice, Price
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
    # The instance's hourly price over an hour of this row's images (measure/prices.py); None unpriced.
    usd_per_million_images: float | None = None


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
    # --price-per-hour or --instance: the price of the served rows, and the bare encoder's best bucket priced for
    # the instance (its accelerators, capped at the host ceiling).
    price: Price | None = None
    bare_price: BarePrice | None = None

    def _absent(self) -> set[str]:
        parts = ("encoder", "preprocess", "served", "front_end", "replicas", "torch_threads", "multicore",
                 "served_over_bare", "endpoint", "ingress_replicas", "host_ceiling", "bound", "profiles", "price",
                 "bare_price")
        return super()._absent() | {part for part in parts if getattr(self, part) is None}
