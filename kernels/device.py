"""Where a benchmark runs (Neuron via torch-xla, CUDA, or the CPU fallback) and how it is timed.

Neuron and CUDA are imported lazily so this module loads on any machine. Timing
always brackets the measured call with a device synchronisation, otherwise an
asynchronous device would report dispatch time rather than execution time.
"""
from __future__ import annotations

import logging
import os
import platform
import time
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

log = logging.getLogger(__name__)

DEVICE_CHOICES = ("auto", "neuron", "cuda", "cpu")

CPU_FALLBACK_WARNING = (
    "running on the CPU fallback: latencies are host-CPU numbers, not NeuronCore (NPU) "
    "numbers; use them to exercise the tooling, never to judge trn2 performance"
)


class DeviceUnavailableError(RuntimeError):
    """The requested device (neuron or cuda) cannot be used on this machine."""


class RecompileError(RuntimeError):
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
    def from_seconds(cls, samples_s: list[float]) -> "LatencyStats":
        if not samples_s:
            raise ValueError("need at least one timed iteration")
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

    @property
    def is_npu(self) -> bool:
        return self.kind == "neuron"

    def synchronize(self) -> None:
        self._sync()

    def compile_count(self) -> int | None:
        """Graph compilations the backend has done so far, or None where it has no such counter."""
        return self._compile_count()

    def time_calls(self, fn: Callable[[], Any], iterations: int) -> list[float]:
        """Seconds per call, each call bracketed by device synchronisation."""
        if iterations < 1:
            raise ValueError(f"iterations must be >= 1, got {iterations}")
        if self.kind == "cuda":
            return self._time_cuda(fn, iterations)
        samples = []
        self.synchronize()
        for _ in range(iterations):
            start = time.perf_counter()
            fn()
            self.synchronize()
            samples.append(time.perf_counter() - start)
        return samples

    def _time_cuda(self, fn: Callable[[], Any], iterations: int) -> list[float]:
        # CUDA events time the device stream itself, not host dispatch.
        torch = _torch()
        samples = []
        torch.cuda.synchronize()
        for _ in range(iterations):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            samples.append(start.elapsed_time(end) / 1e3)
        return samples


def _neuron_device() -> Device:
    try:
        import torch_xla  # noqa: F401
        import torch_xla.core.xla_model as xm
        import torch_xla.debug.metrics as met
    except ImportError as exc:
        raise DeviceUnavailableError(f"torch-xla / torch-neuronx is not installed: {exc}") from exc
    try:
        import torch_neuronx  # noqa: F401  registers the Neuron PJRT plugin
    except ImportError as exc:
        raise DeviceUnavailableError(f"torch-neuronx is not installed: {exc}") from exc
    xla_device = torch_xla.device() if hasattr(torch_xla, "device") else xm.xla_device()
    if "xla" not in str(xla_device):
        raise DeviceUnavailableError(f"torch-xla returned a non-XLA device {xla_device!r}")

    def sync() -> None:
        # Cut the lazy graph (compiling it if new) and wait until the device has run it.
        if hasattr(torch_xla, "sync"):
            torch_xla.sync()
        else:
            xm.mark_step()
        xm.wait_device_ops()

    def compile_count() -> int | None:
        data = met.metric_data("CompileTime")
        return int(data[0]) if data else 0

    lnc = os.environ.get("NEURON_LOGICAL_NC_CONFIG", "default")
    return Device("neuron", xla_device, f"Neuron {xla_device} (NEURON_LOGICAL_NC_CONFIG={lnc})", sync, compile_count)


def _cuda_device() -> Device:
    torch = _torch()
    if not torch.cuda.is_available():
        raise DeviceUnavailableError("torch.cuda.is_available() is False")
    name = torch.cuda.get_device_name(0)
    return Device("cuda", torch.device("cuda:0"), f"CUDA {name}", torch.cuda.synchronize)


def _cpu_device() -> Device:
    log.warning(CPU_FALLBACK_WARNING)
    return Device("cpu", _torch().device("cpu"), describe_cpu())


def resolve_device(requested: str = "auto") -> Device:
    """``auto`` tries neuron, then cuda, then falls back to cpu (with a warning)."""
    if requested not in DEVICE_CHOICES:
        raise ValueError(f"device must be one of {DEVICE_CHOICES}, got {requested!r}")
    if requested == "neuron":
        return _neuron_device()
    if requested == "cuda":
        return _cuda_device()
    if requested == "cpu":
        return _cpu_device()
    for factory in (_neuron_device, _cuda_device):
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
        raise ValueError(f"unsupported dtype {name!r}; choose one of {sorted(table)}") from None
