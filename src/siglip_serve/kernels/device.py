"""Where a benchmark runs (a NeuronCore on either Neuron line, CUDA, or the CPU fallback) and how it is timed.

The NeuronCore comes from :mod:`siglip_serve.kernels.device_neuron` (torch-xla on the 2.31 trace line,
TorchNeuron's ``neuron`` device on the 2.33 line). Neuron and CUDA are imported lazily so this module
loads on any machine. Timing
always brackets the measured call with a device synchronisation, otherwise an
asynchronous device would report dispatch time rather than execution time.
"""
from __future__ import annotations

import logging
import os
import platform
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from siglip_serve.kernels.errors import DeviceUnavailableError as DeviceUnavailableError
from siglip_serve.kernels.errors import KernelInputError, KernelUnavailable

log = logging.getLogger(__name__)

DEVICE_CHOICES = ("auto", "neuron", "cuda", "cpu")

CPU_FALLBACK_WARNING = (
    "running on the CPU fallback: latencies are host-CPU numbers, not NeuronCore (NPU) "
    "numbers; use them to exercise the tooling, never to judge trn2 performance"
)


# The two values of the ``timing`` field in every benchmark table and JSON.
WALL_CLOCK_TIMING = "wall_clock_including_dispatch"
DEVICE_TIMING = "device"


class ResultMismatch(KernelUnavailable):
    """A timed call returned a wrong result: the timing measured something other than the work."""


class RecompileError(KernelUnavailable):
    """A timed call triggered a compilation: its latency includes compile time."""


@dataclass(frozen=True)
class LatencyStats:
    """Latency percentiles of the timed iterations, in milliseconds."""

    latency_mean_ms: float
    latency_p50_ms: float
    latency_p99_ms: float
    latency_min_ms: float
    latency_max_ms: float
    iterations: int

    @classmethod
    def from_seconds(cls, samples_s: list[float]) -> LatencyStats:
        if not samples_s:
            raise KernelInputError("need at least one timed iteration")
        ms = np.asarray(samples_s, dtype=np.float64) * 1e3
        return cls(
            latency_mean_ms=float(ms.mean()),
            latency_p50_ms=float(np.percentile(ms, 50)),
            latency_p99_ms=float(np.percentile(ms, 99)),
            latency_min_ms=float(ms.min()),
            latency_max_ms=float(ms.max()),
            iterations=len(samples_s),
        )


def _torch():
    import torch

    return torch


@dataclass
class Device:
    """A resolved device: ``kind`` is neuron, cuda or cpu; ``torch_device`` is what tensors go to."""

    kind: str
    torch_device: Any
    description: str
    _sync: Callable[[], None] = field(repr=False, default=lambda: None)
    _compile_count: Callable[[], int | None] = field(repr=False, default=lambda: None)
    line: str | None = None  # on a NeuronCore: "trace" (torch-xla, Neuron 2.31) or "native" (TorchNeuron, 2.33)
    compile_backend: Any = None  # TorchNeuron's torch.compile backend ("neuron"; a test double's elsewhere)

    @property
    def is_npu(self) -> bool:
        return self.kind == "neuron"

    @property
    def launch_method(self) -> str:
        """How kernels reach the device here, as the timing tables name it."""
        return {"trace": "torch-xla", "native": "TorchNeuron eager"}.get(self.line or "", self.kind)

    @property
    def timing(self) -> str:
        """What :meth:`time_calls` measures here: CUDA events time the device stream itself;
        elsewhere it is host wall clock around call + sync, dispatch included."""
        return DEVICE_TIMING if self.kind == "cuda" else WALL_CLOCK_TIMING

    def synchronize(self) -> None:
        self._sync()

    def compile_count(self) -> int | None:
        """Graph compilations the backend has done so far, or None where it has no such counter."""
        return self._compile_count()

    def run_synced(self, fn: Callable[[], Any]) -> Any:
        """Call ``fn`` once and synchronise while its result is still referenced, then return it.

        Lazy backends (torch-xla) only execute work whose tensors are alive at the sync; a
        result dropped before the sync is never computed, so it must be held across it.
        """
        result = fn()
        self.synchronize()
        return result

    def time_calls(self, fn: Callable[[], Any], iterations: int,
                   check: Callable[[Any], None] | None = None) -> list[float]:
        """Seconds per call, each call bracketed by device synchronisation.

        Each result stays referenced across its sync (so lazy devices really run the timed
        work) and ``check`` is called once, after the loop, on the last result: the timed
        calls must have produced a usable answer, not just returned quickly.
        """
        if iterations < 1:
            raise KernelInputError(f"iterations must be >= 1, got {iterations}")
        if self.kind == "cuda":
            samples, result = self._time_cuda(fn, iterations)
        else:
            samples, result = [], None
            self.synchronize()
            for _ in range(iterations):
                start = time.perf_counter()
                result = fn()
                self.synchronize()
                samples.append(time.perf_counter() - start)
        if check is not None:
            check(result)
        return samples

    def _time_cuda(self, fn: Callable[[], Any], iterations: int) -> tuple[list[float], Any]:
        # CUDA events time the device stream itself, not host dispatch.
        torch = _torch()
        samples, result = [], None
        torch.cuda.synchronize()
        for _ in range(iterations):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            result = fn()
            end.record()
            end.synchronize()
            samples.append(start.elapsed_time(end) / 1e3)
        return samples, result


def _neuron_device(native_runtime: Any = None) -> Device:
    from siglip_serve.kernels.device_neuron import neuron_core

    core = neuron_core(native_runtime)
    return Device("neuron", core.torch_device, core.description, core.sync, core.compile_count, line=core.line,
                  compile_backend=core.compile_backend)


def _cuda_device() -> Device:
    torch = _torch()
    if not torch.cuda.is_available():
        raise DeviceUnavailableError("torch.cuda.is_available() is False")
    name = torch.cuda.get_device_name(0)
    return Device("cuda", torch.device("cuda:0"), f"CUDA {name}", torch.cuda.synchronize)


def _cpu_device() -> Device:
    log.warning(CPU_FALLBACK_WARNING)
    return Device("cpu", _torch().device("cpu"), describe_cpu())


def resolve_device(requested: str = "auto", native_runtime: Any = None) -> Device:
    """``auto`` tries neuron (the Neuron line installed here), then cuda, then falls back to cpu (with a
    warning). ``native_runtime``: the TorchNeuron seam to use (default the real one; tests pass a double)."""
    if requested not in DEVICE_CHOICES:
        raise KernelInputError(f"device must be one of {DEVICE_CHOICES}, got {requested!r}")
    if requested == "neuron":
        return _neuron_device(native_runtime)
    if requested == "cuda":
        return _cuda_device()
    if requested == "cpu":
        return _cpu_device()
    for factory in (lambda: _neuron_device(native_runtime), _cuda_device):
        try:
            return factory()
        except DeviceUnavailableError as exc:
            log.info("device auto-detection: %s", exc)
    return _cpu_device()


def describe_cpu() -> str:
    model = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as fh:
            for line in fh:
                if line.startswith("model name"):
                    model = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return f"CPU {model} ({os.cpu_count()} cores, torch threads={_torch().get_num_threads()})"


def torch_dtype(name: str):
    torch = _torch()
    table = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
    try:
        return table[name]
    except KeyError:
        raise KernelInputError(f"unsupported dtype {name!r}; choose one of {sorted(table)}") from None
