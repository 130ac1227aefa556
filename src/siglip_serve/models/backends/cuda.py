"""The CUDA backend: either tower's model on one GPU, under autocast, per batch bucket.

uint8 images (and int64 token ids) cross PCIe and are normalised on the GPU inside the graph.
`cuda_dtype` picks the autocast dtype: bf16 (default; falls back to fp16 on GPUs without bf16, i.e.
before Ampere), fp16, or fp32 (no autocast).

CUDA graphs (`cuda_graphs`, default on): one graph captured per bucket of each tower replaces a batch's
kernel launches with one replay. It follows PyTorch's documented recipe (warm-up on a side stream, static
input/output buffers, autocast with its weight cache disabled inside capture); tests/device checks on a
GPU that graphed and eager towers give the same embeddings. Without graphs the replica's one Python
thread launching kernels is busy for the whole forward pass, and beside the ingress replicas' decoding it,
not the GPU, sets the served rate. With graphs both towers run their buckets' shapes only (padded);
`cuda_graphs: false` runs each batch eagerly at its real size.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
from torch import nn

from siglip_serve.core.errors import BackendUnavailable
from siglip_serve.models.backends.eager import eager_tower
from siglip_serve.models.backends.implementation import Implementation
from siglip_serve.models.settings import ModelSettings
from siglip_serve.models.tower import Runner, Tower, tower_examples

log = logging.getLogger(__name__)

_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}
GRAPH_WARMUP_ITERATIONS = 3


def choose_autocast_dtype(requested: str, bf16_supported: bool) -> torch.dtype | None:
    """The autocast dtype for `cuda_dtype`; None means run float32 without autocast."""
    if requested == "fp32":
        return None
    if requested not in _DTYPES:
        raise ValueError(f"cuda_dtype must be bf16, fp16 or fp32, got {requested!r}")
    if requested == "bf16" and not bf16_supported:
        log.warning("this GPU has no bf16 support; using fp16 autocast instead")
        return torch.float16
    return _DTYPES[requested]


def cuda_problem() -> str | None:
    """Why torch cannot use a GPU here, in one line, or None."""
    if torch.cuda.is_available():
        return None
    build = torch.version.cuda
    return (
        f"the cuda backend needs an NVIDIA GPU that torch can use, and torch {torch.__version__} "
        + (f"(CUDA {build}) sees none: check nvidia-smi and CUDA_VISIBLE_DEVICES"
           if build else "is a CPU-only build: install a CUDA build of torch (https://pytorch.org/get-started/locally/)")
    )


class CudaRunner(Runner):
    """One tower's model on the GPU: eager at each batch's size, or one captured graph per bucket."""

    backend = "cuda"

    def __init__(self, module: nn.Module, settings: ModelSettings, buckets: Sequence[int],
                 example: Callable[[int], torch.Tensor]) -> None:
        self.device = torch.device("cuda", torch.cuda.current_device())
        self.dtype = choose_autocast_dtype(settings.cuda_dtype, torch.cuda.is_bf16_supported())
        self.module = module.to(self.device)
        # By input shape: a bucket's batch size, and for a NaFlex model its patch budget too.
        self.graphs: dict[tuple[int, ...], tuple[torch.cuda.CUDAGraph, torch.Tensor, torch.Tensor]] = {}
        # A CUDA graph replays one captured shape; without graphs, a batch runs at its real size.
        self.static_shapes = settings.cuda_graphs
        if settings.cuda_graphs:
            for bucket in buckets:
                for each in tower_examples(example, bucket):
                    self.graphs[tuple(each.shape)] = self._capture(each)
            log.info("captured CUDA graphs for buckets %s", list(self.graphs))

    def _run(self, batch: torch.Tensor) -> torch.Tensor:
        # cache_enabled=False: autocast's cast-weight cache must not hold tensors made during capture.
        with torch.autocast("cuda", dtype=self.dtype or torch.float32, enabled=self.dtype is not None,
                            cache_enabled=False):
            return self.module(batch)

    def _capture(self, example: torch.Tensor) -> tuple[torch.cuda.CUDAGraph, torch.Tensor, torch.Tensor]:
        """One bucket's graph, from a zero batch of the tower's input shape and dtype."""
        static_in = example.to(self.device)
        side = torch.cuda.Stream(self.device)
        side.wait_stream(torch.cuda.current_stream(self.device))
        with torch.no_grad(), torch.cuda.stream(side):
            for _ in range(GRAPH_WARMUP_ITERATIONS):
                self._run(static_in)
        torch.cuda.current_stream(self.device).wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.no_grad(), torch.cuda.graph(graph):
            static_out = self._run(static_in)
        return graph, static_in, static_out

    def forward(self, batch: torch.Tensor) -> torch.Tensor:
        captured = self.graphs.get(tuple(batch.shape))
        with torch.no_grad():
            if captured is not None:
                graph, static_in, static_out = captured
                static_in.copy_(batch)
                graph.replay()
                # A copy: the next replay overwrites static_out.
                return static_out.float().cpu()
            return self._run(batch.to(self.device, non_blocking=True)).float().cpu()

    def describe(self) -> dict[str, Any]:
        return {
            "device": torch.cuda.get_device_name(self.device),
            "autocast_dtype": str(self.dtype).replace("torch.", "") if self.dtype else "fp32",
            "cuda_graphs": sorted({shape[0] for shape in self.graphs}),
        }


def check_available(settings: ModelSettings, env: Mapping[str, str] | None = None) -> None:
    problem = cuda_problem()
    if problem is not None:
        raise BackendUnavailable(problem)


def build(settings: ModelSettings, tower: str) -> Tower:
    check_available(settings)

    def runner(module: nn.Module, buckets: Sequence[int], example: Callable[[int], torch.Tensor]) -> CudaRunner:
        made = CudaRunner(module, settings, buckets, example)
        log.info("cuda runner on %s, autocast %s", torch.cuda.get_device_name(made.device), made.dtype or "off (fp32)")
        return made

    return eager_tower(settings, tower, runner)


IMPLEMENTATION = Implementation(build=build, check_available=check_available)
