"""What both towers are: a tower's own pre- and post-processing around one backend's Runner (Infinity's
pre / core / post; TEI's single backend trait). The image tower (`Encoder`, models/encoder.py) and the
text tower (`TextEncoder`, models/text.py) say only how an input becomes a tensor; the backend's Runner
(models/backends/<name>.py) holds the device, dtype and compiled buckets or graphs, the same for both
towers; bucketing, padding, warm-up and the forward hook are here, once.

A batch is split into the largest buckets first; a runner with static shapes (compiled buckets, CUDA
graphs) gets the last chunk padded up to its bucket and the padding is sliced off again. An eager one
runs the chunk at its real size: padding a batch of 5 to 8 would cost it 60% more compute for nothing.

A deterministic tower (`deterministic: true`) runs every chunk at the largest bucket's shape, padded, on any
runner: a row's floating-point result depends on the batch shape its kernels see (their blocking, and on cpu
how threads split the rows), so one shape makes an input's vector independent of what it rides with
(docs/reproducibility.md).
"""

from __future__ import annotations

import logging
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch

log = logging.getLogger(__name__)

# (batch size run: a bucket, or the real size on eager backends; real rows; seconds). The server's metrics
# hook; bulk embedding's too.
ForwardHook = Callable[[int, int, float], None]


def pick_bucket(n: int, buckets: Sequence[int]) -> int:
    """The smallest bucket that holds n inputs. Callers split batches larger than the largest bucket."""
    if n < 1:
        raise ValueError(f"batch of {n} inputs")
    for bucket in buckets:
        if bucket >= n:
            return bucket
    raise ValueError(f"batch of {n} inputs exceeds the largest bucket {max(buckets)}")


def fixed_chunks(n: int, bucket: int) -> list[tuple[int, int, int]]:
    """(start, stop, bucket) chunks covering n inputs, every one run at `bucket` (the last padded)."""
    return [(start, min(start + bucket, n), bucket) for start in range(0, n, bucket)]


def split_into_buckets(n: int, buckets: Sequence[int]) -> list[tuple[int, int, int]]:
    """(start, stop, bucket) chunks covering n inputs: full largest buckets, then the smallest bucket
    that holds the rest (padded by the caller)."""
    largest = max(buckets)
    chunks = []
    start = 0
    while n - start > largest:
        chunks.append((start, start + largest, largest))
        start += largest
    if n > start:
        chunks.append((start, n, pick_bucket(n - start, sorted(buckets))))
    return chunks


class Runner(ABC):
    """One backend on its device, for either tower: it was given the tower's model (or loaded the
    tower's compiled buckets) and runs one chunk of model inputs. Device setup, dtype and graphs live
    here, once per backend; a tower adds only its pre- and post-processing."""

    # Its record's name (core/backends.py).
    backend: str = "abstract"
    # True where it runs only its buckets' shapes (compiled graphs, CUDA graphs): chunks are padded.
    static_shapes: bool = False
    # Where its inputs may already be (device JPEG decode hands it tensors there).
    device: torch.device = torch.device("cpu")

    @abstractmethod
    def forward(self, batch: torch.Tensor) -> torch.Tensor:
        """Run exactly one bucket (or, eager, one chunk at its size): [n, ...] -> float [n, D] on any device."""

    def describe(self) -> dict[str, Any]:
        """What /v1/models shows of it (device, dtype, threads, artifact)."""
        return {}


# (the tower's buckets, a zero batch of one bucket) -> the backend's runner for that tower: a runner that
# compiles or captures does it per bucket at construction (per input shape of a bucket: `tower_examples`).
RunnerFactory = Callable[[Sequence[int], Callable[[int], torch.Tensor]], Runner]


def tower_examples(example: Callable[[int], torch.Tensor], bucket: int) -> list[torch.Tensor]:
    """A zero batch of every input shape a bucket takes, from the `example` a runner factory is given: the tower's
    own `Tower.examples` where it is a tower's method (a NaFlex image tower's bucket takes one shape per patch
    budget, each a graph of its own), else the one example."""
    tower = getattr(example, "__self__", None)
    return tower.examples(bucket) if isinstance(tower, Tower) else [example(bucket)]


class Tower(ABC):
    """One tower of the model on one backend's runner: inputs -> float32 [n, D], L2-normalised, in input order."""

    # What warm-up and errors call it ("image", "text").
    tower: str = "abstract"

    def __init__(self, buckets: Sequence[int], embed_dim: int, runner: RunnerFactory) -> None:
        self.buckets: tuple[int, ...] = tuple(sorted(buckets))
        self.embed_dim = embed_dim
        self.runner = runner(self.buckets, self.example)
        self.static_shapes = self.runner.static_shapes
        # Every chunk at the largest bucket's shape (models/backends/implementation.py sets it from the settings).
        self.deterministic = False
        # Forward calls per batch size run (a bucket, or a real size on eager backends).
        self.forward_counts: dict[int, int] = {b: 0 for b in self.buckets}
        self.last_forward_seconds: float = 0.0

    @property
    def backend(self) -> str:
        return self.runner.backend

    @property
    def device(self) -> torch.device:
        return self.runner.device

    @property
    def max_batch_size(self) -> int:
        return self.buckets[-1]

    def _forward(self, batch: torch.Tensor) -> torch.Tensor:
        return self.runner.forward(batch)

    @abstractmethod
    def encode(self, inputs: Any, on_forward: ForwardHook | None = None) -> np.ndarray:
        """The tower's inputs (images, texts) -> float32 [n, D], L2-normalised, in input order."""

    @abstractmethod
    def example(self, bucket: int) -> torch.Tensor:
        """A batch of `bucket` zero inputs of the tower's input shape and dtype (warm-up, graph capture)."""

    def examples(self, bucket: int) -> list[torch.Tensor]:
        """A zero batch of every input shape the bucket takes: one, `example(bucket)`, unless a tower says more."""
        return [self.example(bucket)]

    def run_batch(self, batch: torch.Tensor, on_forward: ForwardHook | None = None) -> np.ndarray:
        """[n, ...] model inputs -> float32 [n, D], one forward pass per bucket chunk; `on_forward` (the
        caller's metrics) sees each pass."""
        n = int(batch.shape[0])
        out = np.empty((n, self.embed_dim), dtype=np.float32)
        padded = self.static_shapes or self.deterministic
        chunks = (fixed_chunks(n, self.max_batch_size) if self.deterministic
                  else split_into_buckets(n, self.buckets))
        for start, stop, bucket in chunks:
            chunk = batch[start:stop]
            if not padded:
                bucket = stop - start
            elif stop - start < bucket:
                chunk = torch.cat([chunk, chunk.new_zeros((bucket - (stop - start), *chunk.shape[1:]))])
            began = time.perf_counter()
            result = self._forward(chunk.contiguous())
            self.last_forward_seconds = time.perf_counter() - began
            self.forward_counts[bucket] = self.forward_counts.get(bucket, 0) + 1
            if on_forward is not None:
                on_forward(bucket, stop - start, self.last_forward_seconds)
            out[start:stop] = result[: stop - start].detach().float().cpu().numpy()
        return out

    def warmup(self, iterations: int = 1, on_bucket: Callable[[int], None] | None = None) -> dict[int, float]:
        """Run every bucket `iterations` times; returns the last forward seconds per bucket. `on_bucket(bucket)`
        is called as each bucket is warm (a replica's start timeline, serve/towers/start_marks.py)."""
        seconds: dict[int, float] = {}
        for bucket in self.buckets:
            for example in self.examples(bucket):
                for _ in range(max(1, iterations)):
                    began = time.perf_counter()
                    out = self._forward(example)
                    seconds[bucket] = time.perf_counter() - began
            if tuple(out.shape) != (bucket, self.embed_dim):
                raise RuntimeError(f"the {self.tower} tower ({self.backend}) returned {list(out.shape)} for bucket "
                                   f"{bucket}; expected [{bucket}, {self.embed_dim}]")
            if on_bucket is not None:
                on_bucket(bucket)
        log.info("%s %s tower warmed up: %s", self.backend, self.tower,
                 {b: f"{s * 1e3:.1f} ms" for b, s in seconds.items()})
        return seconds

    def describe(self) -> dict[str, Any]:
        return {"backend": self.backend, "static_shapes": self.static_shapes, "deterministic": self.deterministic,
                **self.runner.describe()}
