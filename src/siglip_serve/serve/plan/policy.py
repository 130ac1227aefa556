"""The rules that turn one model's settings into what the planner plans with, decided once per model: how many image
replicas are asked for, how many text replicas by default, whether the model runs on the host's cores, and where
Ray Serve's throughput mode runs. The config holds what a user wrote; this says what it means.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Protocol

from siglip_serve.core.backends import TEXT, backend_record
from siglip_serve.core.constants import SERVE_THROUGHPUT_ENV


class _MinMax(Protocol):
    @property
    def max_replicas(self) -> int: ...


class Settings(Protocol):
    """What the rules read of a model's config (serve/plan/config.py ServiceConfig, one per served model)."""

    @property
    def backend(self) -> str: ...
    @property
    def replicas(self) -> int | Literal["auto"] | None: ...
    @property
    def autoscaling(self) -> _MinMax | None: ...
    @property
    def text_replicas(self) -> int | None: ...
    @property
    def throughput_optimized(self) -> bool | None: ...


@dataclass(frozen=True)
class Policy:
    replica_setting: int | Literal["auto"]  # `replicas` as given, else the most autoscaling allows, else the default
    text_replicas: int
    # Whether the encoders' forward passes share the host's cores with the serving path (cpu).
    model_on_host_cores: bool
    towers_throughput_mode: bool
    ingress_throughput_mode: bool

    @property
    def tower_calls_by_grpc(self) -> bool:
        """Whether the ingress calls the towers over Serve's gRPC (else Ray actor tasks): wherever the ingress
        runs the mode. Every replica serves gRPC whatever its mode (ray/serve/_private/replica.py starts its
        inter-deployment server unconditionally); on cpu, gRPC calls to towers outside the mode measured
        level with actor tasks (docs/dev/benchmark-log.md, "Serve's mode per deployment")."""
        return self.ingress_throughput_mode

    def ingress_mode_env(self) -> dict[str, str]:
        """What the ingress replicas (and a Ray `siglip-serve run` starts) get in their runtime_env for Serve's
        mode."""
        return dict(SERVE_THROUGHPUT_ENV) if self.ingress_throughput_mode else {}

    def tower_mode_env(self) -> dict[str, str]:
        """What every tower replica (image and text) gets in its runtime_env for Serve's mode: the mode's
        variables where it is on there; where the Ray itself runs the mode (`siglip-serve run`) but the towers
        do not, RAY_SERVE_THROUGHPUT_OPTIMIZED=0, since a replica inherits the Ray's environment."""
        if self.towers_throughput_mode:
            return dict(SERVE_THROUGHPUT_ENV)
        return {"RAY_SERVE_THROUGHPUT_OPTIMIZED": "0"} if self.ingress_throughput_mode else {}


def policy_of(settings: Settings, text_off: str | None = None) -> Policy:
    """The rules applied to one model's `settings`:

    - image replicas: `replicas` as given, else the most autoscaling allows, else `auto` on the host's cores
      (serve/plan/cpu_plan.py) and 1 on a device;
    - text replicas: none where the start's checks turned the model's text tower off (`text_off`, why:
      serve/plan/model_checks.py); else as set; else one where the text tower runs on the host's cores, none
      where it would hold a device of its own (a GPU, a NeuronCore: opt in), none where the backend builds no text
      tower;
    - Serve's throughput mode: in the ingress unless `throughput_optimized: false` (it does the host's
      per-request work, where the mode saves most: docs/dev/benchmark-log.md, "Serve's mode per deployment");
      in the towers as set, else where the model is not on the host's cores (on cpu the mode cost ViT-B-16
      about 15 % of its images per second and doubled its p99, docs/capacity.md)."""
    record = backend_record(settings.backend)
    host = record.host_cores
    if settings.replicas is not None:
        replicas = settings.replicas
    elif settings.autoscaling is not None:
        replicas = settings.autoscaling.max_replicas
    else:
        replicas = "auto" if host else 1
    if text_off is not None:
        texts = 0
    elif settings.text_replicas is not None:
        texts = settings.text_replicas
    else:
        texts = 1 if host and record.builds(TEXT) else 0
    mode = settings.throughput_optimized
    return Policy(replica_setting=replicas, text_replicas=texts, model_on_host_cores=host,
                  towers_throughput_mode=mode if mode is not None else not host,
                  ingress_throughput_mode=mode is not False)
