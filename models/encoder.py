"""The `Encoder` interface every backend implements, batch bucketing, and the backend registry.

An encoder takes uint8 images [B, 3, H, W] and returns L2-normalised float32 embeddings [B, D].
Compiled backends have static shapes, so they run only their batch buckets: a batch is padded to
the smallest bucket that holds it and the padding is sliced off again. Eager backends (CPU, CUDA
without graphs) split a batch the same way but run each chunk at its real size: padding a batch
of 5 to 8 would cost them 60% more compute for nothing.
"""

from __future__ import annotations

import importlib
import logging
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import torch

from siglip_serve.models.loading import ModelInfo
from siglip_serve.models.settings import BACKENDS, ModelSettings

log = logging.getLogger(__name__)


class EncoderInputError(ValueError):
    """A batch that does not have the shape or dtype the compiled model takes."""


def pick_bucket(n: int, buckets: Sequence[int]) -> int:
    """The smallest bucket that holds n images. Callers split batches larger than the largest bucket."""
    if n < 1:
        raise ValueError(f"batch of {n} images")
    for bucket in buckets:
        if bucket >= n:
            return bucket
    raise ValueError(f"batch of {n} images exceeds the largest bucket {max(buckets)}")


def split_into_buckets(n: int, buckets: Sequence[int]) -> list[tuple[int, int, int]]:
    """(start, stop, bucket) chunks covering n images: full largest buckets, then one padded tail."""
    largest = max(buckets)
    chunks = []
    for start in range(0, n, largest):
        stop = min(start + largest, n)
        chunks.append((start, stop, pick_bucket(stop - start, buckets)))
    return chunks


class Encoder(ABC):
    """One model on one device (a CPU process, a GPU, a logical NeuronCore)."""

    backend: str = "abstract"
    # True where the model only runs its compiled bucket sizes (Neuron, CUDA graphs).
    static_shapes: bool = True

    def __init__(self, info: ModelInfo, buckets: Sequence[int]) -> None:
        self.info = info
        self.buckets: tuple[int, ...] = tuple(sorted(buckets))
        # Forward calls per batch size run (a bucket, or a real size on eager backends).
        self.forward_counts: dict[int, int] = {b: 0 for b in self.buckets}
        self.last_forward_seconds: float = 0.0
        # Called after each forward pass with (bucket, real images, seconds); the server's metrics hook.
        self.forward_observer: Callable[[int, int, float], None] | None = None

    @property
    def embed_dim(self) -> int:
        return self.info.embed_dim

    @property
    def image_size(self) -> tuple[int, int]:
        return self.info.image_size

    @property
    def max_batch_size(self) -> int:
        return self.buckets[-1]

    @abstractmethod
    def _forward(self, batch: torch.Tensor) -> torch.Tensor:
        """Run exactly one bucket: uint8 [bucket, 3, H, W] -> float32 [bucket, D]."""

    def check_input(self, images: np.ndarray | torch.Tensor) -> None:
        height, width = self.image_size
        if images.dtype not in (np.uint8, torch.uint8):
            raise EncoderInputError(f"images must be uint8, got {images.dtype}")
        if tuple(images.shape[1:]) != (3, height, width):
            raise EncoderInputError(
                f"images must be [B, 3, {height}, {width}], got {list(images.shape)}"
            )

    def encode(self, images: np.ndarray | torch.Tensor) -> np.ndarray:
        """uint8 [B, 3, H, W] -> float32 [B, D], L2-normalised, in input order."""
        self.check_input(images)
        batch = torch.as_tensor(images)
        n = int(batch.shape[0])
        out = np.empty((n, self.embed_dim), dtype=np.float32)
        for start, stop, bucket in split_into_buckets(n, self.buckets):
            chunk = batch[start:stop]
            if not self.static_shapes:
                bucket = stop - start
            elif stop - start < bucket:
                pad = chunk.new_zeros((bucket - (stop - start), *chunk.shape[1:]))
                chunk = torch.cat([chunk, pad])
            began = time.perf_counter()
            result = self._forward(chunk.contiguous())
            self.last_forward_seconds = time.perf_counter() - began
            self.forward_counts[bucket] = self.forward_counts.get(bucket, 0) + 1
            if self.forward_observer is not None:
                self.forward_observer(bucket, stop - start, self.last_forward_seconds)
            out[start:stop] = result[: stop - start].detach().float().cpu().numpy()
        return out

    def warmup(self, iterations: int = 1) -> dict[int, float]:
        """Run every bucket `iterations` times; returns the last forward seconds per bucket."""
        height, width = self.image_size
        seconds: dict[int, float] = {}
        for bucket in self.buckets:
            zeros = torch.zeros((bucket, 3, height, width), dtype=torch.uint8)
            for _ in range(max(1, iterations)):
                began = time.perf_counter()
                out = self._forward(zeros)
                seconds[bucket] = time.perf_counter() - began
            if tuple(out.shape) != (bucket, self.embed_dim):
                raise RuntimeError(f"{self.info.name} returned {list(out.shape)} for bucket {bucket}; "
                                   f"expected [{bucket}, {self.embed_dim}]")
        log.info("%s encoder warmed up: %s", self.backend, {b: f"{s * 1e3:.1f} ms" for b, s in seconds.items()})
        return seconds

    def describe(self) -> dict[str, Any]:
        return {"backend": self.backend, "buckets": list(self.buckets), "static_shapes": self.static_shapes,
                **self.info.as_dict()}


EncoderFactory = Callable[[ModelSettings], Encoder]

# Backends load lazily: importing the registry must not import CUDA or Neuron code. Backend
# `name` lives in models/backends/<name with _ for ->.py; the names are siglip_serve.models.settings.BACKENDS.
_BACKEND_MODULES = {name: f"siglip_serve.models.backends.{name.replace('-', '_')}" for name in BACKENDS}
_FACTORIES: dict[str, EncoderFactory] = {}


def register_backend(name: str) -> Callable[[EncoderFactory], EncoderFactory]:
    def decorate(factory: EncoderFactory) -> EncoderFactory:
        _FACTORIES[name] = factory
        return factory

    return decorate


def backend_names() -> list[str]:
    return sorted(set(_BACKEND_MODULES) | set(_FACTORIES))


def _backend_module(backend: str) -> Any:
    module = _BACKEND_MODULES.get(backend)
    if module is None:
        raise ValueError(f"unknown backend {backend!r}; choose from {backend_names()}")
    return importlib.import_module(module)


def create_encoder(settings: ModelSettings) -> Encoder:
    if settings.backend not in _FACTORIES:
        _backend_module(settings.backend)
    return _FACTORIES[settings.backend](settings)


def check_backend_available(settings: ModelSettings, env: Mapping[str, str] | None = None) -> None:
    """Raise BackendUnavailable (one line) if this machine cannot run `settings.backend`.

    Called before any Ray process starts, so a missing SDK or GPU fails in a second, not after the
    replicas have tried. `env` is the environment the replicas will see (None: skip the checks that
    depend on it, e.g. when joining a cluster whose nodes were started elsewhere). A backend module
    opts in by defining `check_available(settings, env)`.
    """
    check = getattr(_backend_module(settings.backend), "check_available", None)
    if check is not None:
        check(settings, env)


def backend_replica_env(settings: ModelSettings) -> dict[str, str]:
    """Environment a backend needs set before its replica process imports torch (Ray runtime_env).

    A backend module opts in by defining `replica_env(settings)`.
    """
    hook = getattr(_backend_module(settings.backend), "replica_env", None)
    return dict(hook(settings)) if hook is not None else {}
