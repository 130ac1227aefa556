"""The CPU backend: the embedded default, float32 (CPUs here have no bf16 units), at each batch's real
size (no padding: an eager model gains nothing from it), for either tower."""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import nn

from siglip_serve.core.host import usable_cpus
from siglip_serve.models.backends.eager import eager_tower
from siglip_serve.models.backends.implementation import Implementation
from siglip_serve.models.settings import ModelSettings
from siglip_serve.models.tower import Runner, Tower

log = logging.getLogger(__name__)


def set_torch_threads(requested: int | None) -> int:
    # Ray starts workers with OMP_NUM_THREADS=1; torch would then run a replica on a single core.
    threads = requested or usable_cpus()
    torch.set_num_threads(threads)
    return threads


class CpuRunner(Runner):
    backend = "cpu"

    def __init__(self, module: nn.Module, settings: ModelSettings) -> None:
        self.module = module
        self.threads = set_torch_threads(settings.torch_threads)
        log.info("cpu runner: %d torch threads", self.threads)

    def forward(self, batch: torch.Tensor) -> torch.Tensor:
        with torch.inference_mode():
            return self.module(batch)

    def describe(self) -> dict[str, Any]:
        return {"torch_threads": self.threads}


def build(settings: ModelSettings, tower: str) -> Tower:
    def runner(module: nn.Module, buckets: Sequence[int], example: Callable[[int], torch.Tensor]) -> CpuRunner:
        return CpuRunner(module, settings)

    return eager_tower(settings, tower, runner)


IMPLEMENTATION = Implementation(build=build)
