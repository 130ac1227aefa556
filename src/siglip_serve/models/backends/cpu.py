"""The CPU backend: the embedded default, float32 (CPUs here have no bf16 units)."""

from __future__ import annotations

import logging
import os

import torch

from siglip_serve.models.encoder import Backend, Encoder, register_backend
from siglip_serve.models.loading import ImageEmbedder, ModelInfo, load_embedder
from siglip_serve.models.settings import ModelSettings
from siglip_serve.models.text import TextEmbedder, TextEncoder, TextInfo, Tokenizer, load_text_tower

log = logging.getLogger(__name__)


def usable_cpus() -> int:
    """Cores this process may run on (its affinity mask), not the machine's count."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def set_torch_threads(requested: int | None) -> int:
    # Ray starts workers with OMP_NUM_THREADS=1; torch would then run a replica on a single core.
    threads = requested or usable_cpus()
    torch.set_num_threads(threads)
    return threads


class CpuEncoder(Encoder):
    backend = "cpu"
    static_shapes = False

    def __init__(self, embedder: ImageEmbedder, info: ModelInfo, settings: ModelSettings) -> None:
        super().__init__(info, settings.buckets)
        self.embedder = embedder
        self.threads = set_torch_threads(settings.torch_threads)
        log.info("cpu encoder: %d torch threads", self.threads)

    def _forward(self, batch: torch.Tensor) -> torch.Tensor:
        with torch.inference_mode():
            return self.embedder(batch)

    def describe(self) -> dict[str, object]:
        return {**super().describe(), "torch_threads": self.threads}


def create_cpu_encoder(settings: ModelSettings) -> CpuEncoder:
    embedder, info = load_embedder(settings)
    return CpuEncoder(embedder, info, settings)


class CpuTextEncoder(TextEncoder):
    backend = "cpu"

    def __init__(self, embedder: TextEmbedder, tokenizer: Tokenizer, info: TextInfo, settings: ModelSettings) -> None:
        super().__init__(tokenizer, info, settings.text_buckets)
        self.embedder = embedder
        self.threads = set_torch_threads(settings.torch_threads)

    def _forward(self, ids: torch.Tensor) -> torch.Tensor:
        with torch.inference_mode():
            return self.embedder(ids)


def create_cpu_text_encoder(settings: ModelSettings) -> CpuTextEncoder:
    return CpuTextEncoder(*load_text_tower(settings), settings)


register_backend("cpu", Backend(image=create_cpu_encoder, text=create_cpu_text_encoder))
